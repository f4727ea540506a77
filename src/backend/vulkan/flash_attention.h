// Vulkan fused attention: which kernels run (tests force them through Context::kernel_choice()). The kernels are
// kernels/attention/flash_attention_*.comp: portable f32 ones on every device, and tensor-core ones (f16 products
// through VK_NV_cooperative_matrix, f32 softmax and accumulation): *_rs.comp keep the scores in registers where the
// device's fragment layout is NVIDIA's mma.sync one (checked on the device; every head dim up to 512), *_cm.comp
// pass them through shared memory elsewhere (head dims up to 64). The ops themselves are
// FlashAttention(Backward)::eval_vulkan in flash_attention.cpp.
#pragma once
#include <string>

#include "core/device.h"
#include "core/dtype.h"
#include "core/ops/flash_attention.h"

namespace lmtune::vk {

class Context;

// Whether the fused attention's kernels run on this device for these inputs (and their backward, with `backward`):
// head dims up to 256 with 32 KiB of shared memory; up to 512 where the tensor-core kernels with the scores in
// registers take them, or forward only where the decode kernel does (at most 16 rows per kv head, no documents,
// head dims in multiples of 8): the other portable kernels have no 512 class.
bool flash_attention_runs(Context& ctx, const FlashAttentionParams& p, DType q_dtype, bool backward);

// Which kernels the fused attention takes on device d: "portable", "coopmat" (*_rs.comp) or "coopmat-shared"
// (*_cm.comp). Automatically (KernelChoice::flash) the tensor-core kernels where the device has them (for D > 64
// the register-softmax ones), for at least 64 rows (queries x heads per kv head: not decoding) and 16-bit inputs
// on a device whose matmuls are not forced to the scalar kernel. Forcing coopmat or coopmat_shared throws
// DeviceError / ShapeError where they cannot run.
std::string flash_kernel_family(Device d, const FlashAttentionParams& p, DType q_dtype);

}  // namespace lmtune::vk
