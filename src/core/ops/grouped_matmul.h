// Products over groups of rows: the experts of a mixture-of-experts layer (models/moe.cpp). The tokens routed to
// each expert are one block of rows; each block is multiplied by its expert's matrix of a stacked weight
// [G, P, Q]. One primitive for all experts instead of one op each keeps the autodiff graph small and every
// gradient the size of the rows it belongs to (slicing a block out of the rows would give each expert's slice a
// zero-filled gradient of all the rows).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "core/ops.h"
#include "core/ops/elementwise.h"
#include "core/primitive.h"

namespace lmtune {

// Inputs: x [R, K], w [G, P, Q]. Output [R, P] (transposed: x W_gᵀ, K = Q) or [R, Q] (x W_g, K = P): rows
// [offsets[g], offsets[g + 1]) take matrix g. On a device with workgroup-scope cooperative matrices all groups are
// one dispatch (backend/vulkan/matmul.cpp); elsewhere each group is one product on its block of rows (Matmul's
// kernels).
class GroupedMatmul final : public Primitive {
 public:
  GroupedMatmul(std::vector<int64_t> offsets, bool transposed) : offsets(std::move(offsets)), transposed(transposed) {}
  const char* name() const override { return "grouped_matmul"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override { forward(in, out); }
  void eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  LMTUNE_PRIMITIVE_VJP_JVP();

  const std::vector<int64_t> offsets;
  const bool transposed;

 private:
  void forward(const std::vector<Tensor>& in, std::vector<Tensor>& out);
};

// Inputs: a [R, A], b [R, B]. Output [G, A, B]: block g is a_gᵀ b_g over the rows of group g (zero for a group
// without rows). The stacked weight's gradient of GroupedMatmul; no gradient of its own. On a device with
// workgroup-scope cooperative matrices all groups are one dispatch; elsewhere a product per group.
class GroupedOuter final : public Primitive {
 public:
  explicit GroupedOuter(std::vector<int64_t> offsets) : offsets(std::move(offsets)) {}
  const char* name() const override { return "grouped_outer"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override { forward(in, out); }
  void eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;

  const std::vector<int64_t> offsets;

 private:
  void forward(const std::vector<Tensor>& in, std::vector<Tensor>& out);
};

// Inputs: x [X, K], w [E, P, K] (stacked linear weights), ids [R] int32 (on the device). Output [R, P], or with a
// gate activation [R, P / 2] = act(y[:, :P / 2]) * y[:, P / 2:] (gate and up rounded to the output's dtype
// first): row r is x[r / x_div] W[ids[r]]ᵀ. A mixture of experts' products in decoding, routed without reading the
// ids back: on Vulkan devices with subgroup arithmetic one matmul_gemv dispatch (a workgroup per row); elsewhere
// the ids are read back and each row is a product of its own. Inference only (no gradient).
class MatmulById final : public Primitive {
 public:
  MatmulById(int64_t x_div, std::optional<UnaryOp> act) : x_div(x_div), act(act) {}
  const char* name() const override { return "matmul_by_id"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override { forward(in, out); }
  void eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;

  const int64_t x_div;
  const std::optional<UnaryOp> act;

 private:
  void forward(const std::vector<Tensor>& in, std::vector<Tensor>& out);
};

namespace ops {

// Row r of the result is x [X, K] row r / x_div times W[ids[r]]ᵀ of the stacked weight w [E, P, K] (ids [R] int32,
// R = X x_div, every id below E); with `act`, act(gate) * up of those products' halves ([R, P / 2]). Output in
// out_dtype (default x's), f32 sums. Not differentiable: for decoding (experts, per-row LoRA adapters).
Tensor matmul_by_id(const Tensor& x, const Tensor& w, const Tensor& ids, int64_t x_div,
                    std::optional<GateActivation> act = std::nullopt, std::optional<DType> out_dtype = std::nullopt);

// x [R, K] times the matrices of w [G, P, Q] by groups of rows (offsets: G + 1 ascending row offsets from 0 to R):
// transposed, rows of group g times W_gᵀ ([R, P], the layout of stacked linear weights); else times W_g ([R, Q]).
// Output in x's dtype, f32 accumulation.
Tensor grouped_matmul(const Tensor& x, const Tensor& w, const std::vector<int64_t>& offsets, bool transposed);

}  // namespace ops
}  // namespace lmtune
