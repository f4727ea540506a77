// Neural-network primitives: RMSNorm, LayerNorm, rotary embedding, embedding gather and its scatter-add.
// Kernels: backend/{cpu,vulkan}/nn.cpp.
#pragma once
#include "core/ops.h"
#include "core/primitive.h"

namespace lmtune {

// y = x * rstd * w over the last axis, rstd = 1/sqrt(mean(x²) + eps). Outputs: y (x's dtype), rstd f32 [...].
class RmsNorm final : public Primitive {
 public:
  explicit RmsNorm(float eps) : eps(eps) {}
  const char* name() const override { return "rms_norm"; }
  LMTUNE_PRIMITIVE_EVAL();
  LMTUNE_PRIMITIVE_VJP_JVP();
  bool vjp_needs_outputs() const override { return true; }
  // The fused gradient pass adds dx into x's collected gradient (the residual stream's).
  std::vector<Tensor> vjp_into(const Node& node, const std::vector<Tensor>& cot, const std::vector<bool>& wanted,
                               const std::vector<Tensor>& into, std::vector<bool>& added) override;
  float eps;
};

// The input gradient of RmsNorm in one pass over the rows: inputs x, w, rstd (RmsNorm's second output) and the
// cotangent g of y; output dx (x's dtype) = rstd (ĝ - x̂ mean(ĝ x̂)), ĝ = g w, x̂ = x rstd, in f32. Only run by
// RmsNorm::vjp, under NoGrad (backward is never differentiated), so it has no vjp or jvp of its own. With
// accumulate, dx is added to the output's contents (RmsNorm::vjp_into).
class RmsNormGrad final : public Primitive {
 public:
  explicit RmsNormGrad(bool accumulate = false) : accumulate(accumulate) {}
  const char* name() const override { return "rms_norm_grad"; }
  LMTUNE_PRIMITIVE_EVAL();
  const bool accumulate;
};

// y = (x - mean) * rstd * w + b over the last axis. Outputs: y, mean f32 [...], rstd f32 [...].
class LayerNorm final : public Primitive {
 public:
  explicit LayerNorm(float eps) : eps(eps) {}
  const char* name() const override { return "layer_norm"; }
  LMTUNE_PRIMITIVE_EVAL();
  LMTUNE_PRIMITIVE_VJP_JVP();
  bool vjp_needs_outputs() const override { return true; }
  float eps;
};

// Rotary embedding of x [B, T, H, D] at positions i32 [B, T] with inv_freq f32 [R/2] (R <= D rotated dims).
// half_split pairs (i, i + R/2) (HF "rotate_half"); interleaved pairs (2i, 2i + 1). inverse rotates by -angle
// (the vjp, since the rotation is orthogonal).
class Rope final : public Primitive {
 public:
  Rope(ops::RopeLayout layout, bool inverse, float scale) : layout(layout), inverse(inverse), scale(scale) {}
  const char* name() const override { return "rope"; }
  LMTUNE_PRIMITIVE_EVAL();
  LMTUNE_PRIMITIVE_VJP_JVP();
  ops::RopeLayout layout;
  bool inverse;
  float scale;  // multiplies cos and sin: a scaled rotation, whose transpose is the inverse one, equally scaled
};

// Inverted dropout with the mask drawn from `key`: element i of x (row-major order) is zeroed with probability p
// and otherwise scaled by 1 / (1 - p), decided by a counter-based hash of (i, key), the same on every backend.
// Linear in x, so its vjp and jvp are the same op (same key) on the cotangent or tangent: no mask is stored.
class Dropout final : public Primitive {
 public:
  Dropout(float p, uint64_t key) : p(p), key(key) {}
  const char* name() const override { return "dropout"; }
  LMTUNE_PRIMITIVE_EVAL();
  LMTUNE_PRIMITIVE_VJP_JVP();
  bool vjp_needs_inputs() const override { return false; }
  // The drop threshold on the 32-bit hash (p * 2^32) and the keep scale.
  uint32_t threshold() const { return uint32_t(double(p) * 4294967296.0); }
  float scale() const { return 1.0f / (1.0f - p); }
  float p;
  uint64_t key;
};

// out[..., :] = weight[ids[...], :]; ids outside [0, V) raise ShapeError before the kernel runs.
class Embedding final : public Primitive {
 public:
  const char* name() const override { return "embedding"; }
  LMTUNE_PRIMITIVE_EVAL();
  LMTUNE_PRIMITIVE_VJP_JVP();
};

// out [V, C] = scatter-add of grad [..., C] rows into rows ids[...] (f32 accumulation).
class EmbeddingBackward final : public Primitive {
 public:
  explicit EmbeddingBackward(int64_t vocab) : vocab(vocab) {}
  const char* name() const override { return "embedding_backward"; }
  LMTUNE_PRIMITIVE_EVAL();
  LMTUNE_PRIMITIVE_VJP_JVP();
  int64_t vocab;
};

}  // namespace lmtune
