// Whether a device lays 16x16 cooperative-matrix fragments out as NVIDIA's mma.sync does: the layout the kernels
// that build or read fragments element by element take (the register-softmax flash kernels, *_rs.comp; the skinny
// matmul, matmul_skinny.comp).
#pragma once
#include "backend/vulkan/context.h"

namespace lmtune::vk {

// kernels/matmul/coopmat_layout.comp reports the (row, column) of every lane's elements of an f32 and an f16
// fragment, and whether fragments built element by element multiply as the same matrices, as the A and as the B
// operand. Checked once per device.
bool fragment_layout_is_mma(Context& ctx);

}  // namespace lmtune::vk
