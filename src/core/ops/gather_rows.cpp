// Row gathers with known inverses (see gather_rows.h).
#include "core/ops/gather_rows.h"

#include <string>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/nn.h"

namespace lmtune {

void GatherRows::forward(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  Embedding gather;
  const std::vector<Tensor> operands{in[0], in[1]};
  eval_on(in[0].device(), gather, operands, out);
}

std::vector<Tensor> GatherRows::vjp(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted) {
  if (!cot[0].defined() || !wanted[0]) return {Tensor(), Tensor(), Tensor()};
  const Tensor& inverse = node.inputs[2];
  const int64_t N = inverse.dim(0), U = inverse.dim(1), C = cot[0].dim(1);
  // Row n's gradient: the sum of the rows that took it, in the order of `inverse` (no atomics).
  const Tensor each = apply1(std::make_shared<Embedding>(), {ops::contiguous(cot[0]), inverse},
                             {{N, U, C}, cot[0].dtype()});
  return {U == 1 ? ops::reshape(each, {N, C}) : ops::sum(each, {1}), Tensor(), Tensor()};
}

std::vector<Tensor> GatherRows::jvp(const Node& node, const std::vector<Tensor>& t) {
  if (!t[0].defined()) return {Tensor()};
  const Tensor& index = node.inputs[1];
  return {apply1(std::make_shared<GatherRows>(), {ops::contiguous(t[0]), index, node.inputs[2]},
                 {{index.dim(0), t[0].dim(1)}, node.output_dtypes[0]})};
}

namespace ops {

Tensor gather_rows(const Tensor& x, const std::vector<int32_t>& index, int64_t uses) {
  if (x.ndim() != 2 || !is_float(x.dtype()) || uses < 1 || int64_t(index.size()) != x.dim(0) * uses)
    throw ShapeError("gather_rows: expected float x [N, C] and N x uses indices, got x " + to_string(x.shape()) +
                     ", " + std::to_string(index.size()) + " indices, uses " + std::to_string(uses));
  const int64_t N = x.dim(0);
  std::vector<int32_t> inverse(index.size());
  std::vector<int64_t> taken(size_t(N), 0);
  for (size_t r = 0; r < index.size(); ++r) {
    const int32_t n = index[r];
    if (n < 0 || n >= N || taken[size_t(n)] == uses)
      throw ShapeError("gather_rows: index " + std::to_string(n) + " at " + std::to_string(r) +
                       (n < 0 || n >= N ? " is outside the " + std::to_string(N) + " rows"
                                        : " takes its row more than " + std::to_string(uses) + " times"));
    inverse[size_t(n * uses + taken[size_t(n)]++)] = int32_t(r);
  }
  const Device d = x.device();
  return apply1(std::make_shared<GatherRows>(),
                {contiguous(x), Tensor::from_ints(index, {int64_t(index.size())}, d),
                 Tensor::from_ints(inverse, {N, uses}, d)},
                {{int64_t(index.size()), x.dim(1)}, x.dtype()});
}

}  // namespace ops
}  // namespace lmtune
