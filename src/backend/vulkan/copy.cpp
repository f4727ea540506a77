// Vulkan kernel for the strided copy / cast (the Copy primitive, copy_into and concat):
// kernels/elementwise/elementwise.comp built as "copy"; same-dtype copies move raw bits (i32 stays exact).
#include "backend/vulkan/kernel_util.h"
#include "core/error.h"
#include "core/ops/view.h"

namespace lmtune::vk {

void copy_tensor(const Tensor& src, const Tensor& dst) { run_elementwise("copy", {src, dst}, 0, 0); }

Tensor dense(const Tensor& x) {
  if (x.is_contiguous()) return x;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  copy_tensor(x, y);
  return y;
}

}  // namespace lmtune::vk

namespace lmtune {

void Copy::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) { vk::copy_tensor(in[0], out[0]); }

}  // namespace lmtune
