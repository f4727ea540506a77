// Linear layer with LoRA adapters (see linear.h).
#include "models/linear.h"

#include <cmath>

#include "core/autodiff.h"
#include "core/ops.h"

namespace lmtune::models {

Tensor Linear::operator()(const Tensor& x) const {
  // matmul takes mixed operand dtypes (f32 accumulation) and writes x's dtype, so no weight copies are made.
  Tensor y = ops::linear(x, weight, bias);
  for (const LoraAdapter& a : adapters) {
    // (x Aᵀ) Bᵀ costs R·(in + out) per token instead of materialising B A.
    Tensor low = ops::linear(x, a.A);
    Tensor up = ops::linear(low, a.B);
    y = ops::add(y, a.scale == 1.0f ? up : ops::scale(up, a.scale));
  }
  return y;
}

LoraAdapter& Linear::add_adapter(int64_t rank, float scale, uint64_t seed, const std::string& name) {
  LoraAdapter a;
  a.name = name;
  a.scale = scale;
  const float bound = float(1.0 / std::sqrt(double(in_features())));
  a.A = Tensor::uniform({rank, in_features()}, seed, -bound, bound, DType::f32, weight.device());
  a.B = Tensor::zeros({out_features(), rank}, DType::f32, weight.device());
  a.A.set_requires_grad(true);
  a.B.set_requires_grad(true);
  adapters.push_back(std::move(a));
  return adapters.back();
}

Tensor Linear::merged_weight() const {
  NoGrad no_grad;
  Tensor w = ops::cast(weight, DType::f32);
  for (const LoraAdapter& a : adapters)
    w = ops::add(w, ops::scale(ops::matmul(ops::cast(a.B, DType::f32), ops::cast(a.A, DType::f32)), a.scale));
  return ops::cast(w, weight.dtype());
}

}  // namespace lmtune::models
