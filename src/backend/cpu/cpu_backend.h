// The CPU backend: host memory buffers and the threading helper the CPU kernels share.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "core/backend.h"

namespace lmtune::cpu {

std::unique_ptr<Backend> make_backend();

// Number of worker threads CPU kernels use (LMTUNE_THREADS, else set_num_threads, else hardware concurrency).
int num_threads();
// Sets the worker threads of the CPU kernels and OpenBLAS (several ranks on one host share its cores). Takes
// effect only before the first CPU kernel runs; LMTUNE_THREADS, when set, wins.
void set_num_threads(int n);
// Runs fn(begin, end) over [0, n) split into chunks on the worker threads; small n runs inline.
// `grain` is the smallest chunk worth a thread.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// Host pointer to element 0 of a CPU tensor's view (buffer base + offset * element size).
}  // namespace lmtune::cpu
