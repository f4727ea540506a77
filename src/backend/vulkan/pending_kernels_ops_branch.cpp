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

LMTUNE_PENDING_VULKAN_KERNEL(Matmul, "matmul")

#undef LMTUNE_PENDING_VULKAN_KERNEL

}  // namespace lmtune
