// TEMPORARY — exists only so that branch `ops` links without the Vulkan backend. The merger deletes this file
// when the `vk`/`vkmm` branches (which define the real eval_vulkan kernels, vk::list_devices and
// vk::make_backend) are merged. Every definition here fails loudly with DeviceError.
#include "backend/vulkan/vulkan_backend.h"
#include "core/error.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"
#include "core/ops/nn.h"
#include "core/ops/reduce.h"
#include "core/ops/softmax.h"
#include "core/ops/view.h"

namespace lmtune {

#define LMTUNE_PENDING_VULKAN_KERNEL(Class, op)                                        \
  void Class::eval_vulkan(const std::vector<Tensor>&, std::vector<Tensor>&) {          \
    throw DeviceError(op " has no Vulkan kernel yet");                                 \
  }

LMTUNE_PENDING_VULKAN_KERNEL(Unary, "unary")
LMTUNE_PENDING_VULKAN_KERNEL(Binary, "binary")
LMTUNE_PENDING_VULKAN_KERNEL(Where, "where")
LMTUNE_PENDING_VULKAN_KERNEL(Copy, "copy")
LMTUNE_PENDING_VULKAN_KERNEL(Reduce, "reduce")
LMTUNE_PENDING_VULKAN_KERNEL(TopK, "topk")
LMTUNE_PENDING_VULKAN_KERNEL(Matmul, "matmul")
LMTUNE_PENDING_VULKAN_KERNEL(RmsNorm, "rms_norm")
LMTUNE_PENDING_VULKAN_KERNEL(LayerNorm, "layer_norm")
LMTUNE_PENDING_VULKAN_KERNEL(Rope, "rope")
LMTUNE_PENDING_VULKAN_KERNEL(Embedding, "embedding")
LMTUNE_PENDING_VULKAN_KERNEL(EmbeddingBackward, "embedding_backward")
LMTUNE_PENDING_VULKAN_KERNEL(Softmax, "softmax")
LMTUNE_PENDING_VULKAN_KERNEL(CrossEntropy, "cross_entropy")
LMTUNE_PENDING_VULKAN_KERNEL(CrossEntropyGrad, "cross_entropy_grad")

#undef LMTUNE_PENDING_VULKAN_KERNEL

namespace vk {
std::vector<DeviceInfo> list_devices() { return {}; }
std::unique_ptr<Backend> make_backend(int index) {
  throw DeviceError("vulkan:" + std::to_string(index) + ": the Vulkan backend is not part of this branch yet");
}
}  // namespace vk

}  // namespace lmtune
