// Timing shared by the `lmtune bench` commands: the median time of an op on a device (GPU timestamps on
// Vulkan, wall clock plus a synchronize on the CPU) and the device's matmul throughput.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace lmtune::cli {

struct TimingOptions {
  double warmup_s = 1.0;  // the GPU's clock takes a while to come up after host-side gaps
  bool stream = false;    // mean wall time of `reps` calls queued back to back (one synchronize)
};

// Median time of fn in ms over `reps` runs after warm-up (the first use of a pipeline compiles it, and the clocks
// drop meanwhile). Vulkan: GPU time summed over the call's dispatches (the runtime's profiler).
double time_op(const std::function<Tensor()>& fn, Device dev, int reps, const TimingOptions& timing = {});

// TFLOP/s of one n x n x n matmul through ops::matmul in `dtype` (median of `reps`, default timing).
double matmul_tflops(Device dev, DType dtype, int64_t n, int reps);

// "vulkan:0 NVIDIA H100 80GB HBM3 (NVIDIA 580.x)" or "cpu".
std::string device_description(Device dev);
// A CPU device, or a Vulkan device that runs on the CPU (lavapipe): benchmarks use small sizes there.
bool is_cpu_class(Device dev);

}  // namespace lmtune::cli
