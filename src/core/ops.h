// The op library: every differentiable operation on tensors. Each family lives in core/ops/<family>.cpp
// (shape checks, primitive, vjp, jvp), with kernels in backend/cpu/<family>.cpp and
// backend/vulkan/<family>.cpp + kernels/<family>/<op>.comp. Inputs must share one device; float ops compute in f32
// (f16/bf16 inputs are widened) and write their inputs' dtype unless stated otherwise.
// Axes may be negative. Shape/dtype errors throw ShapeError naming the op and the shapes.
#pragma once
#include <optional>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace lmtune::quant {
struct QuantizedTensor;
}

namespace lmtune::ops {

// ---- views and layout (core/ops/view.cpp): no copies where the layout allows ----
Tensor reshape(const Tensor& x, const Shape& shape);            // one dim may be -1; copies if not viewable
Tensor transpose(const Tensor& x, int axis0 = -2, int axis1 = -1);
Tensor permute(const Tensor& x, const std::vector<int>& axes);
Tensor slice(const Tensor& x, int axis, int64_t start, int64_t end, int64_t step = 1);
Tensor expand(const Tensor& x, const Shape& shape);              // broadcast view (stride 0)
Tensor contiguous(const Tensor& x);                              // strided copy when not contiguous
Tensor cast(const Tensor& x, DType dtype);
Tensor concat(const std::vector<Tensor>& xs, int axis);
// Sum of x over the axes broadcast to reach its shape from `shape` (the vjp of broadcasting).
Tensor sum_to_shape(const Tensor& x, const Shape& shape);

// ---- elementwise (core/ops/elementwise.cpp): binary ops broadcast numpy-style ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, float s);                          // s * x
Tensor add_scalar(const Tensor& x, float s);                     // x + s
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor square(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor silu(const Tensor& x);
Tensor gelu_tanh(const Tensor& x);                               // 0.5 x (1 + tanh(√(2/π)(x + 0.044715 x³)))
Tensor gelu_erf(const Tensor& x);                                // 0.5 x (1 + erf(x/√2))
Tensor erf(const Tensor& x);
Tensor greater_equal(const Tensor& a, const Tensor& b);          // 1 where a >= b else 0 (a's dtype); no vjp
// where(cond, a, b): cond is i32 (nonzero = take a) or float (nonzero = take a); all three broadcast.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, float value);  // value where mask != 0
// The gated MLP activation act(gate) * up in one pass (SwiGLU: silu, GeGLU: gelu_tanh / gelu_erf); gate and up
// have one shape and float dtype. Its vjp is one fused kernel producing both gradients and saves only gate and up.
enum class GateActivation { silu, gelu_tanh, gelu_erf };
Tensor gated_activation(const Tensor& gate, const Tensor& up, GateActivation act);
// The same as a composition of unary ops and mul: the oracle of the tests (and DecoderPaths::fused_glu off).
Tensor gated_activation_reference(const Tensor& gate, const Tensor& up, GateActivation act);

// ---- reductions (core/ops/reduce.cpp) ----
Tensor sum(const Tensor& x, const std::vector<int>& axes, bool keepdims = false);
Tensor sum_all(const Tensor& x);                                 // scalar (shape [])
Tensor mean(const Tensor& x, const std::vector<int>& axes, bool keepdims = false);
Tensor max(const Tensor& x, int axis, bool keepdims = false);
Tensor logsumexp(const Tensor& x, int axis, bool keepdims = false);
Tensor argmax(const Tensor& x, int axis);                        // i32, not differentiable
// Largest k along the last axis, sorted descending: values (x's dtype) and indices (i32).
std::pair<Tensor, Tensor> topk(const Tensor& x, int k);

// ---- softmax and losses (core/ops/softmax.cpp) ----
Tensor softmax(const Tensor& x, int axis = -1);                  // stable; -inf entries get probability 0
Tensor log_softmax(const Tensor& x, int axis = -1);
// Per-row cross-entropy of logits [N, V] against i32 targets [N]; rows whose target == ignore_index give 0.
// Returns f32 [N]. Callers divide the sum by the count of non-ignored rows.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int ignore_index = -100);
// The language-model loss without the [N, V] logits (core/ops/linear_cross_entropy.cpp): per-row
// cross_entropy(softcap(linear(hidden [N, C] widened to f32, weight [V, C]))) against i32 targets [N], f32 [N],
// 0 where target == ignore_index. softcap > 0: logits = softcap * tanh(logits / softcap). Forward and backward
// go over the vocabulary in chunks of `chunk` weight rows (0 = automatic: ~256 MiB of f32 logits per chunk);
// with a frozen weight the forward computes d hidden as it goes, else the backward recomputes each chunk's
// logits; the weight's gradient is computed only when it wants one. weight_t: the frozen weight stored
// transposed ([C, V]), read by the logits products in place of weightᵀ (faster on tensor cores).
// logits_dtype: the chunks' logits in a forward that computes d hidden; unset, f16 where the backend's products
// take f16 operands anyway and there is no soft-cap, else f32 (core/ops/linear_cross_entropy.cpp).
Tensor linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& targets,
                            int ignore_index = -100, float softcap = 0, int64_t chunk = 0,
                            const Tensor& weight_t = Tensor(), std::optional<DType> logits_dtype = std::nullopt);

// ---- matmul (core/ops/matmul.cpp) ----
// [..., M, K] x [..., K, N] -> [..., M, N] with broadcast batch dims. Operands may be transposed views
// (either of the last two strides equal to 1); f16/bf16/f32 inputs, f32 accumulation, output dtype of a.
Tensor matmul(const Tensor& a, const Tensor& b);
// The same with the output in out_dtype (e.g. f32 results of bf16 operands, without rounding them to bf16), times
// alpha (applied to the f32 accumulators where the kernel can, e.g. LoRA's scale on its rank-R intermediates).
Tensor matmul(const Tensor& a, const Tensor& b, DType out_dtype, float alpha = 1.0f);
// a [M, K] x b [K, N] + alpha * u [M, R] x v [R, N] in one pass over the output (a LoRA delta fused into the base
// product); output in out_dtype.
// c = c * row_scale[:, None] + a b, in place (see MatmulAccumulate in core/ops/matmul.h); row_scale may be undefined.
void matmul_accumulate(const Tensor& c, const Tensor& a, const Tensor& b, const Tensor& row_scale);
Tensor matmul_low_rank(const Tensor& a, const Tensor& b, const Tensor& u, const Tensor& v, float alpha,
                       DType out_dtype);
// x [..., K] times weight [N, K] transposed (+ bias [N]): the layout of HF linear layers.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// f16/bf16 x [..., K] times an f32 weight [N, K] transposed, on the 16-bit path, with the weight's gradient in f32
// (core/ops/autocast_linear.cpp): how 16-bit training runs the LoRA factors.
Tensor autocast_linear(const Tensor& x, const Tensor& weight);
// x Wᵀ + scale (x_in Aᵀ) Bᵀ for f16/bf16 x [..., K], weight [N, K], f32 LoRA factors A [R, K], B [N, R], the delta
// fused into the base product (and, when the adapter's input x_in is x itself, into dx's), the factors' gradients
// in f32 (core/ops/lora_linear.cpp). x_in: x after LoRA dropout; undefined = x. weight_t: the frozen weight
// stored transposed ([K, N]), read by the forward product in place of weightᵀ (faster on tensor cores).
Tensor lora_linear(const Tensor& x, const Tensor& weight, const Tensor& a, const Tensor& b, float scale,
                   const Tensor& x_in = Tensor(), const Tensor& weight_t = Tensor());
// Products with a frozen block-quantized weight W [N, K] (core/ops/quant_matmul.cpp; decoded inside the kernels):
// quantized_linear: x [..., K] Wᵀ (+ bias [N]) in x's dtype; quantized_matmul: x [..., N] W -> [..., K] (the input
// gradient's layout). x: any float dtype. Only x gets a gradient.
Tensor quantized_linear(const Tensor& x, const quant::QuantizedTensor& weight, const Tensor& bias = Tensor());
Tensor quantized_matmul(const Tensor& x, const quant::QuantizedTensor& weight, DType out_dtype);

// ---- normalization, rotary embedding, embedding (core/ops/nn.cpp) ----
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps);                     // over the last axis
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps);
enum class RopeLayout { half_split, interleaved };
// x [B, T, H, D]; positions i32 [B, T] (per-token, so packing can reset them); inv_freq f32 [R/2] rotates the
// first R dims of each head (R = 2 * inv_freq size <= D); the rest pass through. The rotated dims are also
// multiplied by `scale` (transformers' attention_scaling for yarn and longrope: cos and sin times the factor).
Tensor rope(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, RopeLayout layout, float scale = 1.0f);
// Inverted dropout (zero with probability p, else times 1 / (1 - p)), the mask a pure function of `key` and the
// element's index: the same on every backend, and the backward pass recomputes it (core/ops/nn.cpp).
Tensor dropout(const Tensor& x, float p, uint64_t key);
// weight [V, C], ids i32 [...] -> [..., C]. The vjp scatter-adds into a [V, C] gradient.
// ids are read back and checked against the vocabulary (a clear error), except `device_ids` on a GPU: ids the
// device made and that are in range by construction (top-k's, argmax's), where a read-back would stall the queue
// (the kernel gives a zero row for an id outside; the CPU checks them anyway, at no cost).
Tensor embedding(const Tensor& weight, const Tensor& ids, bool device_ids = false);
Tensor embedding_backward(const Tensor& grad, const Tensor& ids, int64_t vocab);       // scatter-add

// ---- attention (core/ops/attention.cpp, core/ops/flash_attention.cpp) ----
struct AttentionOptions {
  float scale = 0;               // 0 -> 1/sqrt(D)
  bool causal = true;
  int64_t window = 0;            // > 0: sliding window, key j visible from query i iff i - j < window
  float softcap = 0;             // > 0: scores = softcap * tanh(scores / softcap)
  Tensor doc_ids;                // optional i32 [B, T]: packed documents; no attention across documents
  int64_t q_offset = 0;          // position of the first query among the keys (KV cache decoding)
  Tensor key_mask;               // optional i32 [B, S]: 0 marks a padding key that no query attends to
};
// q [B, T, H, D], k and v [B, S, KV, D] with H a multiple of KV (grouped-query attention) -> [B, T, H, D].
// The fused kernel (flash_attention), or attention_reference where the backend cannot run it for this head dim.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt);
// The same, composed from the ops above (matmul, softmax, ...): materializes the [B, H, T, S] scores. The oracle.
Tensor attention_reference(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt);
// Fused attention that stores no [T, S] matrix, forward or backward: (O [B, T, H, D], LSE f32 [B, H, T]), LSE being
// the log-sum-exp of each query row's masked scores (-inf where a row sees no key; O is 0 there).
std::pair<Tensor, Tensor> flash_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const AttentionOptions& opt);

}  // namespace lmtune::ops
