// Rope and KV-cache append as one op (see rope_append.h): checks and the composition the CPU runs.
#include "core/ops/rope_append.h"

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/nn.h"
#include "core/ops/view.h"

namespace lmtune {

void RopeAppend::compose(const std::vector<Tensor>& in, std::vector<Tensor>& out) const {
  NoGrad no_grad;
  const Tensor& qk = in[0];
  const int64_t H = out[0].dim(2), KV = out[1].dim(2);
  const Tensor r = ops::rope(qk, in[2], in[3], ops::RopeLayout::half_split, scale);
  const Device d = out[0].device();
  Copy copy;
  std::vector<Tensor> q{out[0]}, k{out[1]}, v{out[2]};
  eval_on(d, copy, {ops::slice(r, 2, 0, H)}, q);
  eval_on(d, copy, {ops::slice(r, 2, H, H + KV)}, k);
  eval_on(d, copy, {in[1]}, v);
}

namespace ops {

Tensor rope_append(const Tensor& qk, const Tensor& v, const Tensor& positions, const Tensor& inv_freq, float scale,
                   const Tensor& k_slots, const Tensor& v_slots) {
  auto shapes = [&] {
    return "qk " + to_string(qk.shape()) + ", v " + to_string(v.shape()) + ", slots " + to_string(k_slots.shape()) +
           " and " + to_string(v_slots.shape());
  };
  if (on_tape(qk) || on_tape(v)) throw AutodiffError("rope_append: inference only (its inputs are recorded)");
  if (qk.ndim() != 4 || v.ndim() != 4 || !is_float(qk.dtype()) || !is_float(v.dtype()))
    throw ShapeError("rope_append: expected float qk [B, T, H + KV, D] and v [B, T, KV, D], got " + shapes());
  const int64_t B = qk.dim(0), T = qk.dim(1), KV = v.dim(2), D = qk.dim(3), H = qk.dim(2) - KV;
  const Shape kv{B, T, KV, D};
  if (H <= 0 || v.shape() != kv || k_slots.shape() != kv || v_slots.shape() != kv)
    throw ShapeError("rope_append: shapes do not fit: " + shapes());
  if (positions.dtype() != DType::i32 || positions.shape() != Shape{B, T})
    throw ShapeError("rope_append: positions must be i32 [B, T], got " + to_string(positions.shape()));
  if (inv_freq.dtype() != DType::f32 || inv_freq.ndim() != 1 || 2 * inv_freq.dim(0) > D)
    throw ShapeError("rope_append: inv_freq " + to_string(inv_freq.shape()) + " does not fit head dim " +
                     std::to_string(D));
  for (const Tensor* t : {&qk, &v, &k_slots, &v_slots})
    if (t->device() != qk.device() || t->strides()[3] != 1 || (t->dim(2) > 1 && t->strides()[2] != D))
      throw ShapeError("rope_append: heads and dims must be dense and on one device: " + shapes());
  Tensor q = Tensor::empty({B, T, H, D}, qk.dtype(), qk.device());
  RopeAppend prim(scale);
  std::vector<Tensor> out{q, k_slots, v_slots};
  eval_on(qk.device(), prim, {qk, v, contiguous(positions), contiguous(inv_freq)}, out);
  return q;
}

}  // namespace ops
}  // namespace lmtune
