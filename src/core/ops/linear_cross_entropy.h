// Fused linear + cross-entropy (the language-model loss) over vocabulary chunks: per-row loss of
// softcap(hidden · weightᵀ) against the targets without ever holding the [N, V] logits, forward or backward.
//
// A composite primitive: its forward, vjp and jvp are written with other ops (matmul on a slice of the weight,
// logsumexp, the CrossEntropyGrad kernel with chunk-local targets, ...), so it runs on every backend as it is.
// eval_cpu and eval_vulkan are therefore defined here, both as the same chunked computation.
#pragma once
#include <cstdint>
#include <vector>

#include "core/primitive.h"

namespace lmtune {

// Inputs: hidden [N, C] (any float dtype), weight [V, C] (any float dtype), targets i32 [N].
// Outputs: loss f32 [N] (0 where target == ignore_index) and lse f32 [N] (log-sum-exp of each row's logits,
// kept for the backward; the op function returns only the loss). Products accumulate in f32 and logits are f32,
// except in a forward that computes d hidden on a backend whose products take f16 operands (logits_dtype);
// with softcap > 0 they are softcap · tanh(logits / softcap).
// Saved for the vjp: the inputs (hidden, the weight — a view, not a copy — and targets) and lse. With
// hidden_grad_in_forward (set by the op function when reverse mode wants d hidden but not d weight) a third output,
// U f32 [N, C], is d loss / d hidden for a unit upstream gradient, and the vjp scales its rows by g.
class LinearCrossEntropy final : public Primitive {
 public:
  LinearCrossEntropy(std::vector<int32_t> host_targets, int ignore_index, float softcap, int64_t chunk,
                     bool hidden_grad_in_forward, Tensor weight_t = Tensor())
      : host_targets(std::move(host_targets)), ignore_index(ignore_index), softcap(softcap), chunk(chunk),
        hidden_grad_in_forward(hidden_grad_in_forward), weight_t(std::move(weight_t)) {}
  const char* name() const override { return "linear_cross_entropy"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override { forward(in, out); }
  void eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) override { forward(in, out); }
  LMTUNE_PRIMITIVE_VJP_JVP();
  bool vjp_needs_inputs() const override { return true; }
  bool vjp_needs_outputs() const override { return true; }

  std::vector<int32_t> host_targets;  // the targets on the host (validated by the op function; N ints)
  int ignore_index;
  float softcap;  // 0: none
  int64_t chunk;  // vocabulary rows per chunk (> 0)
  bool hidden_grad_in_forward;  // a third output U = d loss / d hidden for g = 1 (see above)
  Tensor weight_t;              // the frozen weight stored transposed ([C, V]) for the logits products, or undefined
  DType logits_dtype = DType::f32;  // the chunks' logits with hidden_grad_in_forward (f16 on tensor-core backends)

 private:
  void forward(const std::vector<Tensor>& in, std::vector<Tensor>& out);
};

// Vocabulary rows per chunk when the caller leaves it to the op: at most ~256 MiB of f32 logits per chunk
// (N rows × chunk), a multiple of 64 when that large, and never more than V.
int64_t default_vocab_chunk(int64_t rows, int64_t vocab);

}  // namespace lmtune
