// Vulkan kernels for reductions and top-k (placeholder until the kernels land).
#include "core/error.h"
#include "core/ops/reduce.h"

namespace lmtune {

void Reduce::eval_vulkan(const std::vector<Tensor>&, std::vector<Tensor>&) {
  throw DeviceError("vulkan: reduce kernel not implemented yet");
}
void TopK::eval_vulkan(const std::vector<Tensor>&, std::vector<Tensor>&) {
  throw DeviceError("vulkan: topk kernel not implemented yet");
}

}  // namespace lmtune
