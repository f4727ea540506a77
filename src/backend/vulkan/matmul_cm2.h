// Products on workgroup-scope cooperative matrices (kernels/matmul/matmul_cm2.comp, VK_NV_cooperative_matrix2): the
// large products of training (a layer's weights against a batch of tokens) in real f16 or bf16.
#pragma once
#include <vector>

#include "backend/vulkan/context.h"
#include "backend/vulkan/matmul.h"

namespace lmtune::vk {

// The kernel's name for c = a b (+ lr's u v, alpha 1) where it takes the product, else "": it takes a device with
// cooperative_matrix2 (and bf16_cooperative_matrix for bf16), 2-dim a and b of one 16-bit type, a row-major, b
// row-major or stored transposed, u and v 16-bit with v laid out as b, c of the operands' type or f32 with unit
// column stride (a column slice of a wider matrix too), every row and offset a multiple of 8 elements, K >= 1024,
// and at least a wave of 128x256 tiles, little of their area outside C.
std::string cm2_kernel(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& c, const LowRankTerm* lr);
// Records the product on `kernel` (from cm2_kernel).
void record_cm2(Context& ctx, const std::string& kernel, const Tensor& a, const Tensor& b, Tensor& c,
                const LowRankTerm* lr);

// GroupedMatmul's products (core/ops/grouped_matmul.h) in one dispatch: y [R, *] = rows of group g of x [R, K]
// times matrix g of w [G, P, Q] (or its transpose). The kernel's name where it takes them, else "": a device with
// cooperative_matrix2 (and bf16_cooperative_matrix for bf16), x, w and y of one 16-bit type, contiguous, with
// rows, matrices and offsets multiples of 8 elements.
std::string cm2_grouped_kernel(Context& ctx, const Tensor& x, const Tensor& w, const Tensor& y, bool transposed);
// Records them on `kernel` (from cm2_grouped_kernel); offsets as GroupedMatmul's.
void record_cm2_grouped(Context& ctx, const std::string& kernel, const Tensor& x, const Tensor& w,
                        const std::vector<int64_t>& offsets, Tensor& y);

// GroupedOuter (the stacked weight's gradient) in one dispatch: y[g] = a_gᵀ b_g over the rows of group g, a [R, M],
// b [R, N], y [G, M, N]. The kernel's name where it takes it, else "": as cm2_grouped_kernel, and G within the
// device's grid depth.
std::string cm2_outer_kernel(Context& ctx, const Tensor& a, const Tensor& b, const Tensor& y);
// Records it on `kernel` (from cm2_outer_kernel); offsets as GroupedOuter's.
void record_cm2_outer(Context& ctx, const std::string& kernel, const Tensor& a, const Tensor& b,
                      const std::vector<int64_t>& offsets, Tensor& y);

}  // namespace lmtune::vk
