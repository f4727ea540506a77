// Vulkan fused attention: which kernels run (tests and benchmarks can override), and which ran last. The
// kernels are kernels/flash_attention_*.comp: portable f32 ones on every device, and tensor-core ones (f16
// products through VK_NV_cooperative_matrix, f32 softmax and accumulation): *_rs.comp keep the scores in
// registers where the device's fragment layout is NVIDIA's mma.sync one (checked on the device; every head dim up
// to 256), *_cm.comp pass them through shared memory elsewhere (head dims up to 64). The ops themselves are FlashAttention(Backward)::eval_vulkan
// in flash_attention.cpp.
#pragma once
#include <string>

namespace lmtune::vk {

enum class FlashKernel { automatic, portable, coopmat, coopmat_shared };

// LMTUNE_FLASH_KERNEL=portable|coopmat|coopmat-shared|auto gives the default. automatic takes the tensor-core
// kernels where the device has them (for D > 64 the register-softmax ones), at least 64 rows (queries x heads per kv head: not decoding), and
// the matmuls would use tensor cores on these inputs (matmul_options(): not the scalar kernel; f32 inputs only with
// LMTUNE_MATMUL_F32=fp16). coopmat forces them (DeviceError / ShapeError where they cannot run), coopmat_shared
// forces the *_cm.comp ones. Process-wide.
FlashKernel& flash_kernel();

// "portable", "coopmat" (*_rs.comp) or "coopmat-shared" (*_cm.comp): the kernels of the last Vulkan flash attention
// call (forward or backward).
std::string last_flash_kernel();

}  // namespace lmtune::vk
