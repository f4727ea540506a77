// The CPU backend: host memory buffers and the threading helper the CPU kernels share.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "core/backend.h"

namespace lmtune::cpu {

std::unique_ptr<Backend> make_backend();

// Number of worker threads CPU kernels use (LMTUNE_THREADS, else hardware concurrency).
int num_threads();
// Runs fn(begin, end) over [0, n) split into chunks on the worker threads; small n runs inline.
// `grain` is the smallest chunk worth a thread.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// Host pointer to element 0 of a CPU tensor's view (buffer base + offset * element size).
}  // namespace lmtune::cpu
