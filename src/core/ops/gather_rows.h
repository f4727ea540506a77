// Row gathers with known inverses: how a mixture-of-experts layer moves tokens to their experts' blocks of rows and
// back (models/moe.cpp). The gradient of such a gather is a gather too (by the inverse, summed in a fixed order),
// so forward and backward are deterministic on every device: no atomic scatter-adds.
#pragma once
#include <cstdint>
#include <vector>

#include "core/primitive.h"

namespace lmtune {

// Inputs: x [N, C], index i32 [R], inverse i32 [N, U]. Output [R, C]: row r = x[index[r]], where every row n of x
// is taken exactly U times, by the rows inverse[n, :] (a token goes to k experts; an expert's output row goes back
// to one token).
class GatherRows final : public Primitive {
 public:
  const char* name() const override { return "gather_rows"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override { forward(in, out); }
  void eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) override { forward(in, out); }
  LMTUNE_PRIMITIVE_VJP_JVP();

 private:
  void forward(const std::vector<Tensor>& in, std::vector<Tensor>& out);
};

namespace ops {

// Rows of x [N, C] gathered by index (N x uses entries in [0, N)), where every row of x occurs exactly `uses` times.
Tensor gather_rows(const Tensor& x, const std::vector<int32_t>& index, int64_t uses);

}  // namespace ops
}  // namespace lmtune
