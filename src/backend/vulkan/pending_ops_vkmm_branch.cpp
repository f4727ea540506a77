// TEMPORARY (branch vkmm): stand-ins for symbols that other branches define, so that test_vulkan and the
// lmtune binary link here. The merger deletes this file. Every stand-in fails loudly.
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/matmul.h"

namespace lmtune {

void Matmul::eval_cpu(const std::vector<Tensor>&, std::vector<Tensor>&) {
  throw DeviceError("matmul: the CPU kernel is on branch ops");
}
std::vector<Tensor> Matmul::vjp(const Node&, const std::vector<Tensor>&, const std::vector<bool>&) {
  throw AutodiffError("matmul: vjp is on branch ops");
}
std::vector<Tensor> Matmul::jvp(const Node&, const std::vector<Tensor>&) {
  throw AutodiffError("matmul: jvp is on branch ops");
}

namespace ops {
// Minimal op function: shapes only (the real one, on branch ops, also checks dtypes and layouts).
Tensor matmul(const Tensor& a, const Tensor& b) {
  if (a.ndim() < 2 || b.ndim() < 2 || a.dim(-1) != b.dim(-2))
    throw ShapeError("matmul: " + to_string(a.shape()) + " x " + to_string(b.shape()));
  Shape batch = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                                 Shape(b.shape().begin(), b.shape().end() - 2), "matmul");
  batch.push_back(a.dim(-2));
  batch.push_back(b.dim(-1));
  return apply1(std::make_shared<Matmul>(), {a, b}, {batch, a.dtype()});
}
Tensor rms_norm(const Tensor&, const Tensor&, float) { throw DeviceError("rms_norm: on branch ops"); }
Tensor softmax(const Tensor&, int) { throw DeviceError("softmax: on branch ops"); }
}  // namespace ops

}  // namespace lmtune
