// Softmax, log-softmax and cross-entropy over the last axis. Kernels: backend/{cpu,vulkan}/softmax.cpp.
#pragma once
#include "core/primitive.h"

namespace lmtune {

// Stable (log-)softmax over the last axis; rows that are all -inf give 0 (softmax) / -inf (log_softmax).
class Softmax final : public Primitive {
 public:
  explicit Softmax(bool log) : log(log) {}
  const char* name() const override { return log ? "log_softmax" : "softmax"; }
  LMTUNE_PRIMITIVE_EVAL();
  LMTUNE_PRIMITIVE_VJP_JVP();
  bool vjp_needs_inputs() const override { return false; }
  bool vjp_needs_outputs() const override { return true; }
  bool log;
};

// logits [N, V] (any float dtype), targets i32 [N] -> loss f32 [N] (0 where target == ignore_index) and
// lse f32 [N] (log-sum-exp of each row, kept for the backward). Targets outside [0, V) (other than
// ignore_index) raise ShapeError.
class CrossEntropy final : public Primitive {
 public:
  explicit CrossEntropy(int ignore_index) : ignore_index(ignore_index) {}
  const char* name() const override { return "cross_entropy"; }
  LMTUNE_PRIMITIVE_EVAL();
  LMTUNE_PRIMITIVE_VJP_JVP();
  bool vjp_needs_outputs() const override { return true; }
  int ignore_index;
};

// dlogits [N, V] (logits' dtype) = (softmax(logits) - onehot(targets)) * g[:, None], zero rows where ignored.
// Inputs: logits, targets, lse [N], g f32 [N]. Used by CrossEntropy's vjp and jvp; not differentiable itself.
// A target outside [0, V) (other than ignore_index) gets no one-hot term: linear_cross_entropy passes the
// targets local to a vocabulary chunk, and the lse of the whole vocabulary.
class CrossEntropyGrad final : public Primitive {
 public:
  explicit CrossEntropyGrad(int ignore_index) : ignore_index(ignore_index) {}
  const char* name() const override { return "cross_entropy_grad"; }
  LMTUNE_PRIMITIVE_EVAL();
  int ignore_index;
};

// One vocabulary chunk of the fused loss's forward (linear_cross_entropy with the hidden gradient in the forward):
// inputs z [N, c] f32 or 16-bit (the chunk's soft-capped logits), ignored i32 [N] (!= 0: a zero row) and, with
// has_prev, prev f32 [N] (the log-sum-exp of the columns before). Outputs p [N, c] (any float dtype) and lse f32
// [N]:
//   lse = logaddexp(prev, logsumexp(z))   (logsumexp(z) alone without prev)
//   p   = exp(z - lse) · (1 - (z / softcap)²)   (the soft-cap's slope only when softcap > 0)
// In one pass over z (Vulkan: kernels/reduce/softmax.comp -DCHUNK). Not differentiable.
class SoftmaxChunk final : public Primitive {
 public:
  SoftmaxChunk(float softcap, bool has_prev) : softcap(softcap), has_prev(has_prev) {}
  const char* name() const override { return "softmax_chunk"; }
  LMTUNE_PRIMITIVE_EVAL();
  float softcap;
  bool has_prev;
};

}  // namespace lmtune
