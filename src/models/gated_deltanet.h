// Qwen3-Next's Gated DeltaNet layer (transformers' Qwen3NextGatedDeltaNet), built from differentiable ops:
//   q, k, v, z = in_proj_qkvz(h), beta, a = in_proj_ba(h)      per key head, as transformers splits them
//   q, k, v = silu(causal_conv1d(q, k, v))                     depthwise, kernel K, within each sequence
//   q, k = l2norm(q), l2norm(k);  q *= Dk^-1/2;  both repeated to the value heads
//   beta = sigmoid(beta);  g = -exp(A_log) softplus(a + dt_bias)
//   S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - (exp(g_t) S_{t-1})ᵀ k_t))ᵀ,  o_t = S_tᵀ q_t   (gated delta rule)
//   y = out_proj(rms_norm(o, norm) * silu(z))
// The rule runs in transformers' chunked form (torch_chunk_gated_delta_rule) for calls of more than one token:
// chunks of 64 tokens, each chunk's (I + L)^-1 by repeated squaring (L is strictly lower triangular, so its 64th
// power vanishes), then a scan over chunks carrying the [Dk, Dv] state. Autodiff keeps one state per chunk, so
// memory stays linear in the sequence length. A one-token call (decoding) takes the recurrent step instead.
// Positions restart at 0 where a sequence starts (packed documents, left padding): the state and the
// convolution's window never reach across such a start.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "io/hf_config.h"
#include "models/decoder.h"

namespace lmtune::models {

// What a call's positions imply for every Gated DeltaNet layer of the model; made once per forward call.
struct DeltaNetMasks {
  int64_t batch = 0, tokens = 0, chunk = 0, chunks = 0;
  Tensor conv;      // f32 [K - 1, B, T, 1]: 1 where token t - j - 1 belongs to token t's sequence
  Tensor lower;     // f32 [B, 1, n, c, c]: j <= i within chunk n and both in one sequence
  Tensor strict;    // lower without its diagonal
  Tensor sees_prev; // f32 [B, 1, n, c, 1]: no sequence starts in chunk n at or before token i
  Tensor last;      // f32 [B, 1, n, c, 1]: token j is in the sequence of chunk n's last token
  Tensor carry;     // f32 [B, 1, n, 1, 1]: chunk n starts no sequence (the state carries over)
  Tensor resets;    // f32 [B, T, 1] for the recurrent step: 0 where a sequence starts, else 1
};
// positions: host copy of the call's i32 [B, T] positions. One-token calls get only conv and resets.
DeltaNetMasks delta_net_masks(const std::vector<int32_t>& positions, int64_t batch, int64_t tokens,
                              int64_t conv_kernel, Device device);
// The same for a one-token call (conv and resets), made on the device from its i32 [B, 1] positions.
DeltaNetMasks delta_net_step_masks(const Tensor& positions, int64_t conv_kernel);

// h [B, T, C] (the normed layer input, compute dtype) -> [B, T, C]. state: read and updated when given.
Tensor gated_deltanet(const DeltaNetWeights& w, const LinearAttentionConfig& la, const Tensor& h,
                      const DeltaNetMasks& masks, DeltaNetState* state, const RowAdapters* row_adapters, float eps);

// The gated delta rule on q, k [B, T, H, Dk], v [B, T, H, Dv], g, beta [B, T, H] (all f32; q and k as the rule
// takes them, normalized and scaled) -> o f32 [B, T, H, Dv]; state f32 [B, H, Dk, Dv]: the initial state when
// defined (else zeros), replaced by the final one. Chunked form; the recurrent one is its oracle in tests.
Tensor gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                        const DeltaNetMasks& masks, Tensor* state);
Tensor gated_delta_rule_recurrent(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                  const Tensor& beta, const DeltaNetMasks& masks, Tensor* state);

}  // namespace lmtune::models
