// The decoder: one implementation of the Llama / Mistral / Mixtral / Qwen2 / Qwen3 / Qwen3-MoE / Gemma 2 / Gemma 3 /
// Gemma 4 text families,
// used alike by training, evaluation, generation and serving. Everything that differs between families is a
// field of ModelConfig (io/hf_config.h) — norm style, sandwich norms, q/k norms, biases, embedding scale,
// soft-capping, per-layer windows, rotary frequencies, per-layer head sizes, shared key/value layers, per-layer
// inputs and mixtures of experts — never a model_type test.
//
// Shapes: B batch, T tokens in this call, S keys seen (cache + T), C hidden, H query heads, KV key/value heads,
// D head_dim, I intermediate, V vocab.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "io/hf_config.h"
#include "models/linear.h"

namespace lmtune::models {

struct AttentionWeights {
  Linear q, k, v, o;  // k and v undefined on a layer that shares another's keys; v on a k_eq_v layer
  Tensor q_norm, k_norm;  // [D], when config.qk_norm
  LinearGroup qkv;        // q, k and v as one product (inference, fuse_projections), else undefined
};

struct MlpWeights {
  Linear gate, up, down;
  LinearGroup gate_up;  // gate and up as one product (inference, fuse_projections), else undefined
};

// A mixture-of-experts MLP (models/moe.h), stored as transformers 5 does: the experts' gate and up projections
// stacked in one tensor, their down projections in another.
// LoRA on a stacked expert weight W [E, out, in] (PEFT's target_parameters): expert e's weight is used as
// W[e] + scale · B[e] A[e]. f32, requiring grad when trained; B is zero when fresh. No dropout (PEFT has none there).
struct ExpertAdapter {
  std::string name = "default";
  Tensor A;  // [E, R, in]
  Tensor B;  // [E, out, R]
  float scale = 1.0f;
};

struct MoeWeights {
  Tensor router;   // [E, C] (mlp.gate.weight; Gemma 4: router.proj.weight)
  Tensor gate_up;  // [E, 2 I, C] (mlp.experts.gate_up_proj): rows [0, I) of expert e are its gate, [I, 2 I) its up
  Tensor down;     // [E, C, I] (mlp.experts.down_proj)
  std::vector<ExpertAdapter> gate_up_adapters, down_adapters;
  Tensor router_scale;      // Gemma 4: [C], the router input's scale (router.scale), else undefined
  Tensor per_expert_scale;  // Gemma 4: [E], each chosen expert's weight is multiplied by its entry
  // qwen3_next's shared expert (mlp.shared_expert.*) and its gate [1, C] (mlp.shared_expert_gate), else undefined.
  MlpWeights shared;
  Linear shared_gate;
};

// A Gated DeltaNet layer (qwen3_next's and Qwen3.5's linear_attn; models/gated_deltanet.h), in transformers'
// layout: in_qkvz yields per key head its query, key, values and gates, in_ba per key head the values' beta and
// decay inputs (Qwen3.5: one projection each).
struct DeltaNetWeights {
  Linear in_qkvz;   // [2 Hk Dk + 2 Hv Dv, C]
  Linear in_ba;     // [2 Hv, C]
  // Qwen3.5's separate projections (LinearAttentionConfig::split_projections) instead of the two above.
  Linear in_qkv;    // [2 Hk Dk + Hv Dv, C]: queries, keys, values
  Linear in_z;      // [Hv Dv, C]
  Linear in_b, in_a;  // [Hv, C]
  Tensor conv;      // [Hk Dk + Hk Dk + Hv Dv, 1, K]: the depthwise causal convolution over queries, keys, values
  Tensor dt_bias;   // [Hv]
  Tensor a_log;     // [Hv]: the decay rate's log (A_log)
  Tensor norm;      // [Dv]: the gated RMSNorm's weight (plain, w not 1 + w)
  Linear out;       // [C, Hv Dv]
};

struct LayerWeights {
  Tensor input_norm;      // input_layernorm, before attention
  Tensor post_attn_norm;  // sandwich norms only: post_attention_layernorm on the attention output
  Tensor pre_mlp_norm;    // before the MLP: post_attention_layernorm (Llama naming) or pre_feedforward_layernorm
  Tensor post_mlp_norm;   // sandwich norms only: post_feedforward_layernorm on the MLP output
  // Gemma 4's experts beside the MLP: pre_feedforward_layernorm_2 on their input, post_feedforward_layernorm_1 on
  // the dense MLP's output and post_feedforward_layernorm_2 on theirs, before the two are summed.
  Tensor experts_in_norm, mlp_out_norm, experts_out_norm;
  AttentionWeights attn;  // undefined on a Gated DeltaNet layer
  DeltaNetWeights delta;  // LayerConfig::linear_attention layers
  MlpWeights mlp;  // dense layers
  MoeWeights moe;  // mixture-of-experts layers (LayerConfig::moe; Gemma 4: beside the dense MLP)
  // Gemma 4's per-layer input (ModelConfig::per_layer_input_size P): x += norm(ple_proj(act(ple_gate(x)) · p_i)).
  Linear ple_gate;      // per_layer_input_gate [P, C]
  Linear ple_proj;      // per_layer_projection [C, P]
  Tensor ple_norm;      // post_per_layer_input_norm [C]
  Tensor layer_scalar;  // [1]: Gemma 4 multiplies the layer's output by it (a buffer there: never trained)

  // Every Linear slot of the layer, defined or not.
  std::vector<Linear*> linears();
  std::vector<const Linear*> linears() const;
  // This layer's tensors that require grad (adapters, or weights being fully trained).
  std::vector<Tensor> trainable() const;
};

struct DecoderWeights {
  Tensor embed;       // [V, C]
  // Gemma 4's per-layer inputs: a token's P values for every layer (embed_tokens_per_layer [Vp, L P]), mixed with
  // a projection of its embedding (per_layer_model_projection [L P, C], normed by per_layer_projection_norm [P]).
  Tensor ple_embed;
  // Where ple_embed is larger than one kernel can address it is held in host memory (weights.h), and its rows are
  // also on the device in consecutive blocks of at most that size, which the decoder gathers from.
  std::vector<Tensor> ple_blocks;
  Linear ple_model_proj;
  Tensor ple_proj_norm;
  std::vector<LayerWeights> layers;
  Tensor final_norm;  // [C]
  Tensor lm_head;     // [V, C]; the same tensor as embed when tie_word_embeddings
  Tensor lm_head_t;   // [C, V]: the frozen lm_head stored transposed too, or undefined (train.transposed_weights)

  // Every Linear of every layer (q, k, v, o, and gate, up, down of dense MLPs), e.g. to merge adapters.
  std::vector<Linear*> linears();
  // Trainable tensors: the adapters' A and B (and anything else set to require grad).
  std::vector<Tensor> trainable();
};

// Inference: each layer's q, k, v and a dense MLP's gate and up become one product each (LinearGroup), so that
// decoding runs one matrix-vector product for each group. For the commands that only run the model (generate,
// chat, eval, score, bench generate), after loading; not for training (adapters there change in place).
void fuse_projections(DecoderWeights& weights);

// A Gated DeltaNet layer's state between decoding calls (models/gated_deltanet.h), held by KvCache.
struct DeltaNetState {
  Tensor conv;   // f32 [B, K - 1, channels]: the convolution's last K - 1 inputs
  Tensor delta;  // f32 [B, Hv, Dk, Dv]
};
struct DeltaNetMasks;

// Per-layer key/value cache for incremental decoding. Each layer's keys and values live in a buffer
// [B, capacity, KV, D] (that layer's KV and D; none for a layer that attends to another's) that grows in chunks
// of `chunk` tokens (amortised copies). With bound_sliding, a sliding-window layer keeps only the last window - 1
// tokens between calls (its buffer never exceeds window - 1 + the longest call), which is all its attention can
// see.
class KvCache {
 public:
  KvCache(const ModelConfig& config, int64_t batch, DType dtype, Device device, int64_t chunk = 256,
          bool bound_sliding = true);

  // Tokens appended so far (the position index of the next token in a single-sequence cache).
  int64_t length() const { return length_; }
  int64_t batch() const { return batch_; }
  DType dtype() const { return dtype_; }
  // Forgets everything (keeps the buffers for reuse).
  void clear();

  // Called by the decoder for each layer: stores k, v [B, T, KV, D] and returns the keys and values the new
  // queries attend to ([B, S, KV, D] views of the buffer) and the index of the first new query among them.
  struct View {
    Tensor k, v;
    int64_t q_offset = 0;
    Tensor key_mask;  // i32 [B, S] when padding was recorded, else undefined
  };
  View append(int layer, const Tensor& k, const Tensor& v);
  // The same for the fused q, k, v product of inference: its queries and keys qk [B, T, H + KV, D] rotated
  // (ops::rope_append: half_split at positions with inv_freq, cos and sin times `scale`), the keys stored with
  // v. Returns the rotated queries [B, T, H, D] and the view. Inference only (nothing recorded for autodiff).
  std::pair<Tensor, View> append_rotated(int layer, const Tensor& qk, const Tensor& v, const Tensor& positions,
                                         const Tensor& inv_freq, float scale);
  // Called by the decoder once every layer has appended T tokens.
  void advance(int64_t tokens) { length_ += tokens; }
  // Padding (batched generation of prompts of different lengths): called by the decoder before the layers with
  // the next call's attend mask (host, [B * T], 0 = a padding token no query may attend to, now or later).
  // Once any padding is recorded, View::key_mask marks the padding keys of each view.
  void record_attend_mask(const std::vector<int32_t>& mask, int64_t tokens);

  // Continuous batching (serving): sequences join and leave between calls. All rows share the column timeline
  // and each row's tokens end at the last column (earlier columns are padding), so the decoder's causal and
  // window masks hold for every row. regroup makes row i a copy of rows[i] — a row of this cache or of another
  // one of the same model (e.g. the prefill of new prompts) — right-aligned on a timeline just long enough for
  // the longest of them: rows left out are dropped, and columns no row uses any more are trimmed. Needs caches
  // made with bound_sliding = false (their layers hold every token).
  struct RowRef {
    const KvCache* cache;
    int64_t row;
  };
  void regroup(const std::vector<RowRef>& rows);
  // The state of Gated DeltaNet layer `layer` (which stores no keys or values), updated by the decoder.
  DeltaNetState& delta_state(int layer);
  // Real (non-padding) tokens of row b.
  int64_t row_tokens(int64_t b) const;
  // Bytes held by the buffers.
  size_t bytes() const;

 private:
  struct Layer {
    Tensor k, v;           // [B, capacity, KV, D]
    int64_t used = 0;      // tokens stored
    int64_t window = 0;    // > 0: keep only the last window - 1 tokens between calls
    int64_t kv_heads = 0, head_dim = 0;
    bool shared = false;   // attends to another layer's keys and values: stores none
    bool linear = false;   // a Gated DeltaNet layer: its state instead of keys and values
    DeltaNetState state;
  };
  void reserve(Layer& l, int64_t tokens);
  DeltaNetState regrouped_state(const std::vector<RowRef>& rows, size_t layer) const;
  // Checks layer and the keys' shape, drops what a bounded sliding layer no longer needs and makes room for t
  // more tokens: then [l.used, l.used + t) are the new tokens' slots.
  Layer& make_room(int layer, const Shape& keys);
  // The view of layer l once t tokens are stored after its l.used; advances l.used.
  View stored(Layer& l, int64_t t);
  std::vector<Layer> layers_;
  std::vector<std::vector<uint8_t>> valid_;  // per row, per token appended: 0 = padding (only once any padding)
  bool padded_ = false;
  int64_t batch_, chunk_, length_ = 0;
  DType dtype_;
  Device device_;
};

struct ForwardOptions {
  Tensor doc_ids;                 // optional i32 [B, T]: packed documents never attend to each other
  // optional i32 [B, T]: 0 marks padding tokens that no query attends to (batched prompts of different lengths).
  // With a cache the mask is recorded there and keeps applying to later calls.
  Tensor attend_mask;
  KvCache* cache = nullptr;       // optional: append this call's keys/values and attend to the cached ones
  // The ids were made on the device (a decode step's argmax of the step before): embedded as they lie, without
  // the host's range check, so that recording the call does not wait for them.
  bool ids_on_device = false;
  bool checkpoint_layers = false; // gradient checkpointing: each layer recomputes its activations in backward
  int64_t unchecked_layers = 0;   // with checkpoint_layers: the last N layers keep their activations instead
  // optional (serving): the adapter of each batch row; every Linear then applies only that adapter to that row.
  const RowAdapters* row_adapters = nullptr;
  // optional: each mixture-of-experts layer appends its router logits (f32 [B * T, E]), for the load-balancing
  // loss (router_aux_loss in models/moe.h).
  std::vector<Tensor>* router_logits = nullptr;
};

// Where the decoder has a fused op and its composition from separate ops, which one it runs. The fused forms are
// the product; the compositions are their oracles in tests.
struct DecoderPaths {
  bool fused_loss = true;        // ops::linear_cross_entropy, else logits + ops::cross_entropy (full [rows, V] f32)
  int64_t loss_vocab_chunk = 0;  // vocabulary rows per chunk of the fused loss; 0: automatic (~256 MiB of logits)
  bool fused_glu = true;         // ops::gated_activation, else ops::gated_activation_reference
};

class Decoder {
 public:
  // compute_dtype: f32, or f16/bf16 for mixed precision (weights stay in their dtype and are cast per use;
  // activations are in compute_dtype; norms, softmax and the loss compute in f32 inside their kernels;
  // logits are returned in f32).
  Decoder(ModelConfig config, DecoderWeights weights, DType compute_dtype = DType::f32);

  const ModelConfig& config() const { return config_; }
  DecoderWeights& weights() { return weights_; }
  const DecoderWeights& weights() const { return weights_; }
  DType compute_dtype() const { return compute_dtype_; }
  void set_compute_dtype(DType dtype) { compute_dtype_ = dtype; }
  Device device() const { return weights_.embed.device(); }
  const DecoderPaths& paths() const { return paths_; }
  void set_paths(const DecoderPaths& paths) { paths_ = paths; }

  // ids, positions i32 [B, T] -> logits f32 [B, T, V].
  Tensor forward(const Tensor& ids, const Tensor& positions, const ForwardOptions& options = {}) const;
  // The final hidden states after the last norm [B, T, C] (compute dtype), for a chunked loss.
  Tensor forward_hidden(const Tensor& ids, const Tensor& positions, const ForwardOptions& options = {}) const;
  // hidden [..., C] -> logits f32 [..., V] (lm_head and final soft-capping).
  Tensor logits(const Tensor& hidden) const;
  // The per-token loss: cross-entropy of logits(hidden) against targets (i32, one per row of hidden [..., C];
  // -100 = ignored, giving 0) -> f32 [rows]. Fused (ops::linear_cross_entropy: the [rows, V] logits are never
  // held, forward or backward) unless paths().fused_loss is off; then logits + ops::cross_entropy.
  Tensor token_losses(const Tensor& hidden, const Tensor& targets) const;

 private:
  // What one layer's forward takes besides x and hands on: Gemma 4's per-layer input p_i [B, T, P], the keys and
  // values of the layer it shares them with (kv_source), and where it leaves its own for later layers.
  struct LayerIo {
    Tensor per_layer_input;
    const KvCache::View* shared_kv = nullptr;
    KvCache::View* kv_out = nullptr;
    Tensor* router_logits = nullptr;  // a mixture-of-experts layer sets it when given
    const DeltaNetMasks* delta_masks = nullptr;  // Gated DeltaNet layers: what the call's positions imply
  };
  Tensor layer_forward(int index, const Tensor& x, const Tensor& positions, const Tensor& inv_freq,
                       const ForwardOptions& options, const LayerIo& io) const;
  // Attention's queries, keys and values of one layer ([B, T, H|KV, D], rotated, keys and values as stored in the
  // cache where there is one).
  // gate: where the model gates attention's output (qwen3_next), the gate [B, T, H D] from q_proj's output.
  std::pair<Tensor, KvCache::View> attention_inputs(int index, const Tensor& h, const Tensor& positions,
                                                    const Tensor& inv_freq, const ForwardOptions& options,
                                                    const LayerIo& io, Tensor* gate) const;
  // x + the layer's attention (or Gated DeltaNet) output, sandwich-normed where the model has those norms.
  Tensor attention_residual(int index, const Tensor& x, const Tensor& positions, const Tensor& inv_freq,
                            const ForwardOptions& options, const LayerIo& io) const;
  // Gemma 4's per-layer inputs of a call, [B, T, L, P] (undefined for other models).
  Tensor per_layer_inputs(const Tensor& ids, const Tensor& embedded) const;
  ops::GateActivation gate_activation() const;  // the MLP's activation (config hidden_act)
  // act(gate(h)) * up(h), and down of it without the residual (Gemma 4's MLP beside its experts, shared experts).
  Tensor gated_product(const MlpWeights& w, const Tensor& h, const ForwardOptions& options) const;
  Tensor dense_mlp(const MlpWeights& w, const Tensor& h, const ForwardOptions& options) const;
  Tensor mlp_forward(const LayerWeights& w, const LayerConfig& lc, const Tensor& h, const Tensor& residual,
                     const ForwardOptions& options, Tensor* router_logits) const;
  // Each layer's inverse frequencies for a call at these positions. dynamic and longrope rope depend on the
  // call's largest position (read back from positions: one small device read for those types only), as
  // transformers recomputes them per forward call; with a KV cache, cached keys keep the rotation of the call
  // that stored them, as in transformers' generate.
  std::vector<Tensor> call_frequencies(const Tensor& positions) const;
  Tensor norm(const Tensor& x, const Tensor& weight) const;
  // What norm multiplies by: Gemma's (1 + w) in f32, made once per frozen weight (NormShift), else w.
  Tensor norm_weight(const Tensor& weight) const;
  // Gemma's shifted norm weights, by the weight they were made from (held, so that its storage is not reused by
  // another tensor); shared by copies of the decoder. Weights that require grad are never cached.
  struct NormShift {
    std::mutex mutex;
    std::unordered_map<const TensorImpl*, std::pair<Tensor, Tensor>> shifted;  // (weight, 1 + weight in f32)
  };
  std::shared_ptr<NormShift> norm_shift_ = std::make_shared<NormShift>();
  ModelConfig config_;
  DecoderWeights weights_;
  DType compute_dtype_;
  DecoderPaths paths_;
  std::vector<Tensor> inv_freq_;       // per layer, f32 [rotary_dim / 2] on the weights' device (short calls)
  std::vector<float> layer_scalars_;   // per layer: Gemma 4's layer_scalar (1 elsewhere)
  std::vector<bool> kv_provider_;      // per layer: a later layer attends to its keys and values
  std::unordered_map<int64_t, Tensor> unit_weights_;  // ones [D] per head size: the weight of Gemma 4's value norm
  std::vector<Tensor> long_inv_freq_;  // per layer: longrope's long_factor frequencies, else undefined
  bool length_dependent_rope_ = false; // some layer's frequencies depend on the call's length
  bool has_linear_attention_ = false;  // some layer is a Gated DeltaNet
};

// Positions 0..T-1 for every row: i32 [B, T].
Tensor default_positions(int64_t batch, int64_t tokens, Device device);
// Positions that restart at 0 at each document boundary of doc_ids [B, T] (host computation).
Tensor positions_from_doc_ids(const Tensor& doc_ids);

// Mean cross-entropy of logits [B, T, V] (or [N, V]) against targets i32 [B, T] over targets != -100.
// mask (optional, i32 [B, T]): 0 excludes a target as -100 does. Returns an f32 scalar (0 when nothing counts).
Tensor mean_cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& mask = Tensor());
// The training loss: the mean over counted targets (as mean_cross_entropy) of forward_hidden + token_losses.
// positions undefined -> default_positions (or, with doc_ids, positions_from_doc_ids).
Tensor loss(const Decoder& model, const Tensor& ids, const Tensor& targets, const Tensor& mask = Tensor(),
            const Tensor& positions = Tensor(), const ForwardOptions& options = {});

}  // namespace lmtune::models
