// The decoder forward pass (see decoder.h), the KV cache and the loss.
//
// One layer, with x the residual stream [B, T, C]:
//   h = norm(x, input_norm)
//   q, k, v = q_proj(h), k_proj(h), v_proj(h)            heads split: [B, T, H|KV, D] (D, KV per layer)
//   q, k = norm(q, q_norm), norm(k, k_norm)               qk_norm (Qwen3, Gemma 3/4), over D
//   v = norm(v)                                           v_norm (Gemma 4: no weight)
//   q, k = rope(q), rope(k)                              per-layer inverse frequencies
//   a = attention(q, k, v)                               causal, window, soft-cap, GQA, documents, cache;
//                                                        Gemma 4's shared layers take an earlier layer's k, v
//   a = o_proj(a);  a = norm(a, post_attn_norm)           the latter with sandwich norms (Gemma 2/3/4)
//   x = x + a
//   h = norm(x, pre_mlp_norm)
//   m = down_proj(act(gate_proj(h)) * up_proj(h));  m = norm(m, post_mlp_norm)   (sandwich norms)
//       or, on a mixture-of-experts layer, the routed experts' weighted sum (models/moe.h)
//   x = x + m
//   x = x + norm(ple_proj(act(ple_gate(x)) * p_i), ple_norm)   Gemma 4's per-layer input p_i
//   x = x * layer_scalar                                  Gemma 4
// followed by the final norm, lm_head and optional final soft-capping. Norms are RMSNorm with weight w or
// (1 + w) (Gemma 2/3). The embedding is scaled by sqrt(C) for Gemma, the scale rounded to the compute dtype as
// transformers does.
#include "models/decoder.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/rope_append.h"
#include "core/ops/view.h"
#include "models/gated_deltanet.h"
#include "models/moe.h"

namespace lmtune::models {

namespace {


// A host float rounded to what a tensor of `dtype` would hold.
float round_to(float v, DType dtype) {
  switch (dtype) {
    case DType::bf16: return bf16_to_f32(f32_to_bf16(v));
    case DType::f16: return f16_to_f32(f32_to_f16(v));
    default: return v;
  }
}

Tensor softcap(const Tensor& x, double cap) {
  return ops::scale(ops::tanh(ops::scale(x, float(1.0 / cap))), float(cap));
}

void check_ids(const Tensor& t, const char* what, const Shape& shape) {
  if (t.dtype() != DType::i32 || t.shape() != shape)
    throw ShapeError(std::string("decoder: ") + what + " must be i32 " + to_string(shape) + ", got " +
                     std::string(dtype_name(t.dtype())) + " " + to_string(t.shape()));
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Weights

std::vector<Linear*> DecoderWeights::linears() {
  std::vector<Linear*> out;
  for (LayerWeights& l : layers)
    for (Linear* p : l.linears())
      if (p->present()) out.push_back(p);  // expert layers have no dense MLP
  return out;
}

namespace {
template <typename Layer>
auto layer_linears(Layer& l) {
  return std::vector{&l.attn.q,         &l.attn.k,        &l.attn.v,           &l.attn.o,
                     &l.delta.in_qkvz,  &l.delta.in_ba,   &l.delta.in_qkv,     &l.delta.in_z,
                     &l.delta.in_b,     &l.delta.in_a,    &l.delta.out,        &l.mlp.gate,
                     &l.mlp.up,         &l.mlp.down,      &l.moe.shared.gate,  &l.moe.shared.up,
                     &l.moe.shared.down, &l.moe.shared_gate};
}
}  // namespace

std::vector<Linear*> LayerWeights::linears() { return layer_linears(*this); }
std::vector<const Linear*> LayerWeights::linears() const { return layer_linears(*this); }

std::vector<Tensor> LayerWeights::trainable() const {
  std::vector<Tensor> out;
  auto add = [&](const Tensor& t) {
    if (t.defined() && t.requires_grad()) out.push_back(t);
  };
  for (const Tensor* t : {&input_norm, &post_attn_norm, &pre_mlp_norm, &post_mlp_norm, &attn.q_norm, &attn.k_norm,
                          &moe.router, &moe.gate_up, &moe.down, &ple_gate.weight, &ple_proj.weight, &ple_norm,
                          &moe.router_scale, &moe.per_expert_scale, &experts_in_norm, &mlp_out_norm,
                          &experts_out_norm, &delta.conv, &delta.dt_bias, &delta.a_log, &delta.norm})
    add(*t);
  for (const auto* adapters : {&moe.gate_up_adapters, &moe.down_adapters})
    for (const ExpertAdapter& a : *adapters) {
      add(a.A);
      add(a.B);
    }
  for (const Linear* lin : linears()) {
    add(lin->weight);
    add(lin->bias);
    for (const LoraAdapter& a : lin->adapters) {
      add(a.A);
      add(a.B);
    }
  }
  return out;
}

std::vector<Tensor> DecoderWeights::trainable() {
  std::vector<Tensor> out;
  auto add = [&](const Tensor& t) {
    if (t.defined() && t.requires_grad()) out.push_back(t);
  };
  add(embed);
  add(ple_embed);
  add(ple_model_proj.weight);
  add(ple_proj_norm);
  for (const LayerWeights& l : layers)
    for (const Tensor& t : l.trainable()) out.push_back(t);
  add(final_norm);
  if (lm_head.impl() != embed.impl()) add(lm_head);
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// KV cache

KvCache::KvCache(const ModelConfig& config, int64_t batch, DType dtype, Device device, int64_t chunk,
                 bool bound_sliding)
    : layers_(size_t(config.num_hidden_layers)),
      batch_(batch),
      chunk_(chunk > 0 ? chunk : 256),
      dtype_(dtype),
      device_(device) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerConfig& lc = config.layers[i];
    if (bound_sliding && lc.attention == AttentionKind::sliding) layers_[i].window = lc.sliding_window;
    layers_[i].kv_heads = lc.kv_heads;
    layers_[i].head_dim = lc.head_dim;
    layers_[i].shared = lc.kv_source >= 0;
    layers_[i].linear = lc.linear_attention;
  }
}

void KvCache::clear() {
  for (Layer& l : layers_) {
    l.used = 0;
    l.state = {};
  }
  length_ = 0;
  valid_.clear();
  padded_ = false;
}

void KvCache::record_attend_mask(const std::vector<int32_t>& mask, int64_t tokens) {
  if (int64_t(mask.size()) != batch_ * tokens)
    throw ShapeError("kv cache: attend mask of " + std::to_string(mask.size()) + " entries for batch " +
                     std::to_string(batch_) + " x " + std::to_string(tokens) + " tokens");
  if (!padded_) {
    bool any = false;
    for (int32_t m : mask) any |= m == 0;
    if (!any) return;  // no padding yet: keep the unmasked fast path
    valid_.assign(size_t(batch_), std::vector<uint8_t>(size_t(length_), 1));
    padded_ = true;
  }
  for (int64_t b = 0; b < batch_; ++b)
    for (int64_t t = 0; t < tokens; ++t) valid_[size_t(b)].push_back(mask[size_t(b * tokens + t)] != 0);
}

size_t KvCache::bytes() const {
  size_t n = 0;
  for (const Layer& l : layers_) {
    if (l.k.defined()) n += l.k.nbytes() + l.v.nbytes();
    for (const Tensor* t : {&l.state.conv, &l.state.delta})
      if (t->defined()) n += t->nbytes();
  }
  return n;
}

DeltaNetState& KvCache::delta_state(int layer) {
  if (layer < 0 || size_t(layer) >= layers_.size() || !layers_[size_t(layer)].linear)
    throw ShapeError("kv cache: layer " + std::to_string(layer) + " is not a Gated DeltaNet layer");
  return layers_[size_t(layer)].state;
}

void KvCache::reserve(Layer& l, int64_t tokens) {
  int64_t capacity = l.k.defined() ? l.k.dim(1) : 0;
  if (tokens <= capacity) return;
  int64_t grown = (tokens + chunk_ - 1) / chunk_ * chunk_;
  Shape shape{batch_, grown, l.kv_heads, l.head_dim};
  Tensor k = Tensor::empty(shape, dtype_, device_), v = Tensor::empty(shape, dtype_, device_);
  if (l.used > 0) {
    copy_into(Slice(1, 0, l.used, 1).apply_to(k), Slice(1, 0, l.used, 1).apply_to(l.k));
    copy_into(Slice(1, 0, l.used, 1).apply_to(v), Slice(1, 0, l.used, 1).apply_to(l.v));
  }
  l.k = k;
  l.v = v;
}

KvCache::Layer& KvCache::make_room(int layer, const Shape& keys) {
  if (layer < 0 || size_t(layer) >= layers_.size())
    throw ShapeError("kv cache: layer " + std::to_string(layer) + " out of range");
  Layer& l = layers_[size_t(layer)];
  if (l.shared || l.linear)
    throw ShapeError("kv cache: layer " + std::to_string(layer) + " stores no keys (" +
                     (l.shared ? "it attends to another layer's" : "a Gated DeltaNet layer") + ")");
  Shape expect{batch_, keys.size() == 4 ? keys[1] : 0, l.kv_heads, l.head_dim};
  if (keys != expect)
    throw ShapeError("kv cache: expected keys/values " + to_string(expect) + ", got " + to_string(keys));
  // A bounded sliding layer drops what no future query can see: keep the last window - 1 tokens.
  if (l.window > 0 && l.used > l.window - 1) {
    int64_t keep = l.window - 1;
    if (keep > 0) {
      // Through a copy: the tail and the head overlap (with one row, the tail slice is already contiguous, and
      // one copy from it into the head would read what it writes).
      for (Tensor* buf : {&l.k, &l.v}) {
        const Tensor tail = Slice(1, l.used - keep, l.used, 1).apply_to(*buf);
        Tensor staged = Tensor::empty(tail.shape(), tail.dtype(), tail.device());
        copy_into(staged, tail);
        copy_into(Slice(1, 0, keep, 1).apply_to(*buf), staged);
      }
    }
    l.used = keep;
  }
  reserve(l, l.used + keys[1]);
  return l;
}

KvCache::View KvCache::stored(Layer& l, int64_t t) {
  View view{Slice(1, 0, l.used + t, 1).apply_to(l.k), Slice(1, 0, l.used + t, 1).apply_to(l.v), l.used, Tensor()};
  if (padded_) {
    // The view holds tokens [length_ - used, length_ + t) of the sequence; record_attend_mask has run for t.
    const int64_t S = l.used + t, start = length_ - l.used;
    std::vector<int32_t> m(size_t(batch_ * S), 1);
    for (int64_t b = 0; b < batch_; ++b) {
      const auto& row = valid_[size_t(b)];
      for (int64_t j = 0; j < S && size_t(start + j) < row.size(); ++j) m[size_t(b * S + j)] = row[size_t(start + j)];
    }
    view.key_mask = Tensor::from_ints(m, {batch_, S}, device_);
  }
  l.used += t;
  return view;
}

KvCache::View KvCache::append(int layer, const Tensor& k, const Tensor& v) {
  if (v.shape() != k.shape())
    throw ShapeError("kv cache: keys " + to_string(k.shape()) + " and values " + to_string(v.shape()) + " differ");
  Layer& l = make_room(layer, k.shape());
  const int64_t t = k.dim(1);
  copy_into(Slice(1, l.used, l.used + t, 1).apply_to(l.k), k);
  copy_into(Slice(1, l.used, l.used + t, 1).apply_to(l.v), v);
  return stored(l, t);
}

std::pair<Tensor, KvCache::View> KvCache::append_rotated(int layer, const Tensor& qk, const Tensor& v,
                                                         const Tensor& positions, const Tensor& inv_freq,
                                                         float scale) {
  Layer& l = make_room(layer, v.shape());
  const int64_t t = v.dim(1);
  const Tensor q = ops::rope_append(qk, v, positions, inv_freq, scale, Slice(1, l.used, l.used + t, 1).apply_to(l.k),
                                    Slice(1, l.used, l.used + t, 1).apply_to(l.v));
  return {q, stored(l, t)};
}

int64_t KvCache::row_tokens(int64_t b) const {
  if (b < 0 || b >= batch_) throw ShapeError("kv cache: row " + std::to_string(b) + " of " + std::to_string(batch_));
  if (!padded_) return length_;
  int64_t n = 0;
  for (uint8_t v : valid_[size_t(b)]) n += v;
  return n;
}

DeltaNetState KvCache::regrouped_state(const std::vector<RowRef>& rows, size_t layer) const {
  // A recurrent state has no timeline: row i's is rows[i]'s (zeros where that row has seen no token yet).
  DeltaNetState out;
  for (Tensor DeltaNetState::*part : {&DeltaNetState::conv, &DeltaNetState::delta}) {
    Shape row_shape;
    for (const RowRef& r : rows)
      if (const Tensor& t = r.cache->layers_[layer].state.*part; t.defined()) row_shape = t.shape();
    if (row_shape.empty()) continue;
    row_shape[0] = 1;
    std::vector<Tensor> picked;
    for (const RowRef& r : rows) {
      const Tensor& t = r.cache->layers_[layer].state.*part;
      picked.push_back(t.defined() ? ops::slice(t, 0, r.row, r.row + 1)
                                   : Tensor::zeros(row_shape, DType::f32, device_));
    }
    out.*part = ops::contiguous(ops::concat(picked, 0));
  }
  return out;
}

namespace {

// Column ranges of cache rows ([rows, capacity, heads, head dim] tensors of one dtype) copied between caches as
// byte ranges, one Backend::copy per pair of tensors: a copy kernel per row and layer took ~1,500 dispatches per
// regroup of 32 rows of Qwen2.5-0.5B.
class RowCopies {
 public:
  void add(const Tensor& src, int64_t src_row, int64_t src_col, const Tensor& dst, int64_t dst_row, int64_t dst_col,
           int64_t cols) {
    auto& regions = pairs_[{src.buffer().get(), dst.buffer().get()}];
    if (regions.empty()) tensors_.push_back({src, dst});
    regions.push_back({byte_at(src, src_row, src_col), byte_at(dst, dst_row, dst_col),
                       size_t(cols * src.strides()[1]) * dtype_size(src.dtype())});
  }
  void run() {
    for (const auto& [src, dst] : tensors_)
      backend(dst.device()).copy(*src.buffer(), *dst.buffer(), pairs_.at({src.buffer().get(), dst.buffer().get()}));
  }

 private:
  // Where (row, col) begins; a row's columns are contiguous (checked).
  static size_t byte_at(const Tensor& t, int64_t row, int64_t col) {
    const Strides& st = t.strides();
    if (t.ndim() != 4 || st[3] != 1 || st[2] != t.dim(3) || st[1] != t.dim(2) * t.dim(3))
      throw ShapeError("kv cache: rows of " + to_string(t.shape()) + " are not contiguous columns");
    return size_t(t.offset() + row * st[0] + col * st[1]) * dtype_size(t.dtype());
  }
  std::map<std::pair<const Buffer*, const Buffer*>, std::vector<CopyRegion>> pairs_;
  std::vector<std::pair<Tensor, Tensor>> tensors_;
};

}  // namespace

void KvCache::regroup(const std::vector<RowRef>& rows) {
  // Each source row keeps its columns from its first real token on ("extent"); the new timeline is the longest
  // extent, and shorter rows are padded on the left.
  for (const Layer& l : layers_)
    if (l.window > 0) throw ShapeError("kv cache: regroup needs a cache made with bound_sliding = false");
  std::vector<int64_t> extent(rows.size(), 0);
  int64_t L = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const KvCache& src = *rows[i].cache;
    if (rows[i].row < 0 || rows[i].row >= src.batch_)
      throw ShapeError("kv cache: regroup of row " + std::to_string(rows[i].row) + " of a batch of " +
                       std::to_string(src.batch_));
    bool same_shapes = src.layers_.size() == layers_.size();
    for (size_t li = 0; same_shapes && li < layers_.size(); ++li) {
      const Layer &a = src.layers_[li], &b = layers_[li];
      same_shapes =
          a.kv_heads == b.kv_heads && a.head_dim == b.head_dim && a.shared == b.shared && a.linear == b.linear;
    }
    if (!same_shapes || src.dtype_ != dtype_ || src.device_ != device_)
      throw ShapeError("kv cache: regroup across caches of different models, dtypes or devices");
    for (const Layer& l : src.layers_)
      if (!l.shared && !l.linear && (l.window > 0 || l.used != src.length_))
        throw ShapeError("kv cache: regroup needs caches that keep every token (bound_sliding = false)");
    int64_t first = 0;
    if (src.padded_) {
      const auto& v = src.valid_[size_t(rows[i].row)];
      while (first < src.length_ && !v[size_t(first)]) ++first;
    }
    extent[i] = src.length_ - first;
    L = std::max(L, extent[i]);
  }
  const int64_t n = int64_t(rows.size());
  const int64_t capacity = (L + 1 + chunk_ - 1) / chunk_ * chunk_;
  // Zero-filled: padding keys and values are masked out of the softmax, but 0 · NaN would still poison a sum.
  std::vector<Layer> layers(layers_.size());
  std::vector<std::vector<uint8_t>> valid(static_cast<size_t>(n));
  for (size_t li = 0; li < layers_.size(); ++li) {
    Layer& dst = layers[li];
    dst.kv_heads = layers_[li].kv_heads;
    dst.head_dim = layers_[li].head_dim;
    dst.shared = layers_[li].shared;
    dst.linear = layers_[li].linear;
    if (dst.linear) {
      dst.state = regrouped_state(rows, li);
      continue;
    }
    if (n == 0 || dst.shared) continue;
    dst.k = Tensor::zeros({n, capacity, dst.kv_heads, dst.head_dim}, dtype_, device_);
    dst.v = Tensor::zeros({n, capacity, dst.kv_heads, dst.head_dim}, dtype_, device_);
    dst.used = L;
    RowCopies copies;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t e = extent[size_t(i)];
      if (e == 0) continue;
      const KvCache& src = *rows[size_t(i)].cache;
      const Layer& s = src.layers_[li];
      const int64_t r = rows[size_t(i)].row;
      copies.add(s.k, r, src.length_ - e, dst.k, i, L - e, e);
      copies.add(s.v, r, src.length_ - e, dst.v, i, L - e, e);
    }
    copies.run();
  }
  for (int64_t i = 0; i < n; ++i) {
    const KvCache& src = *rows[size_t(i)].cache;
    const int64_t e = extent[size_t(i)];
    std::vector<uint8_t>& v = valid[size_t(i)];
    v.assign(size_t(L - e), 0);
    for (int64_t j = src.length_ - e; j < src.length_; ++j)
      v.push_back(src.padded_ ? src.valid_[size_t(rows[size_t(i)].row)][size_t(j)] : 1);
  }
  layers_ = std::move(layers);
  valid_ = std::move(valid);
  padded_ = true;
  batch_ = n;
  length_ = L;
}

// ---------------------------------------------------------------------------------------------------------------
// Decoder

Decoder::Decoder(ModelConfig config, DecoderWeights weights, DType compute_dtype)
    : config_(std::move(config)), weights_(std::move(weights)), compute_dtype_(compute_dtype) {
  if (!is_float(compute_dtype_)) throw ConfigError("decoder: compute dtype must be f32, f16 or bf16");
  if (weights_.layers.size() != size_t(config_.num_hidden_layers) ||
      config_.layers.size() != size_t(config_.num_hidden_layers))
    throw ConfigError("decoder: " + std::to_string(weights_.layers.size()) + " layers of weights for a config with " +
                      std::to_string(config_.num_hidden_layers) + " layers");
  // Layers with the same rope settings share one inverse-frequency tensor.
  auto upload = [&](const RopeConfig& rope, int64_t rotary_dim, int64_t seq_len) {
    std::vector<float> f = rope_inv_freq(rope, int(rotary_dim), seq_len);
    return Tensor::from_floats(f, {int64_t(f.size())}, DType::f32, device());
  };
  auto same_rope = [&](size_t i, size_t j) {
    return config_.layers[j].rope == config_.layers[i].rope &&
           config_.layers[j].rotary_dim == config_.layers[i].rotary_dim;
  };
  kv_provider_.assign(config_.layers.size(), false);
  for (size_t i = 0; i < config_.layers.size(); ++i) {
    const LayerConfig& lc = config_.layers[i];
    if (lc.kv_source >= 0) kv_provider_[size_t(lc.kv_source)] = true;
    has_linear_attention_ = has_linear_attention_ || lc.linear_attention;
    const Tensor& scalar = weights_.layers[i].layer_scalar;
    layer_scalars_.push_back(config_.layer_scalar && scalar.defined() ? scalar.to_floats().at(0) : 1.0f);
    if (config_.v_norm && !unit_weights_.count(lc.head_dim))
      unit_weights_[lc.head_dim] = Tensor::full({lc.head_dim}, 1.0f, DType::f32, device());
  }
  for (size_t i = 0; i < config_.layers.size(); ++i) {
    const RopeConfig& rope = config_.layers[i].rope;
    const int64_t rotary_dim = config_.layers[i].rotary_dim;
    size_t j = 0;
    while (j < i && !same_rope(i, j)) ++j;
    inv_freq_.push_back(j < i ? inv_freq_[j] : upload(rope, rotary_dim, 0));
    Tensor long_freq;
    if (rope.type == RopeType::longrope)
      long_freq = j < i ? long_inv_freq_[j] : upload(rope, rotary_dim, rope.original_max_pos + 1);
    long_inv_freq_.push_back(long_freq);
    length_dependent_rope_ = length_dependent_rope_ || rope_depends_on_length(rope);
  }
}

std::vector<Tensor> Decoder::call_frequencies(const Tensor& positions) const {
  if (!length_dependent_rope_) return inv_freq_;
  // transformers' seq_len: the largest position over the whole batch (packed rows included) + 1.
  int64_t seq_len = 0;
  for (int32_t p : positions.to_ints()) seq_len = std::max<int64_t>(seq_len, int64_t(p) + 1);
  std::vector<Tensor> out = inv_freq_;
  for (size_t i = 0; i < out.size(); ++i) {
    const RopeConfig& rope = config_.layers[i].rope;
    if (seq_len <= rope.original_max_pos) continue;  // both types keep their initial frequencies
    if (rope.type == RopeType::longrope) {
      out[i] = long_inv_freq_[i];
    } else if (rope.type == RopeType::dynamic) {
      size_t j = 0;  // layers with the same rope share this call's tensor
      const int64_t dim = config_.layers[i].rotary_dim;
      while (j < i && !(config_.layers[j].rope == rope && config_.layers[j].rotary_dim == dim)) ++j;
      if (j < i) {
        out[i] = out[j];
      } else {
        std::vector<float> f = rope_inv_freq(rope, int(config_.layers[i].rotary_dim), seq_len);
        out[i] = Tensor::from_floats(f, {int64_t(f.size())}, DType::f32, device());
      }
    }
  }
  return out;
}

Tensor Decoder::norm_weight(const Tensor& weight) const {
  if (config_.norm_style != NormStyle::one_plus_weight) return weight;
  // (1 + w) is formed in f32 as in transformers' Gemma RMSNorm; rms_norm accepts a weight of another dtype.
  auto shift = [&] { return ops::add_scalar(ops::cast(weight, DType::f32), 1.0f); };
  if (weight.requires_grad() || on_tape(weight)) return shift();
  // A frozen weight's shift is made once: per call it cost a cast and an add per norm (six per Gemma 3 layer).
  std::lock_guard<std::mutex> lock(norm_shift_->mutex);
  auto [it, made] = norm_shift_->shifted.try_emplace(weight.impl());
  if (made) {
    NoGrad no_grad;
    it->second = {weight, shift()};
  }
  return it->second.second;
}

Tensor Decoder::norm(const Tensor& x, const Tensor& weight) const {
  return ops::rms_norm(x, norm_weight(weight), float(config_.rms_norm_eps));
}

namespace {

// RoPE of a layer's queries and keys; yarn and longrope scale cos and sin by their attention factor (transformers'
// attention_scaling). With `qk`, the queries' and keys' heads as one [B, T, H + KV, D] tensor (the fused q, k, v
// product of inference), one rope over both.
std::pair<Tensor, Tensor> rope_pair(const Tensor& q, const Tensor& k, const Tensor& qk, const Tensor& positions,
                                    const Tensor& inv_freq, float scale) {
  if (!qk.defined()) {
    return {ops::rope(q, positions, inv_freq, ops::RopeLayout::half_split, scale),
            ops::rope(k, positions, inv_freq, ops::RopeLayout::half_split, scale)};
  }
  const int64_t H = q.dim(2), KV = k.dim(2);
  const Tensor r = ops::rope(qk, positions, inv_freq, ops::RopeLayout::half_split, scale);
  return {ops::slice(r, 2, 0, H), ops::slice(r, 2, H, H + KV)};
}

}  // namespace

namespace {
// The projections a layer computes attention's inputs with: q, k and v; q and k where the values are the keys
// (k_eq_v); q alone where the layer takes another's keys and values.
template <typename Attention>
std::vector<decltype(&std::declval<Attention&>().q)> attention_parts(Attention& a) {
  std::vector<decltype(&a.q)> parts{&a.q};
  if (a.k.present()) parts.push_back(&a.k);
  if (a.v.present()) parts.push_back(&a.v);
  return parts;
}
}  // namespace

void fuse_projections(DecoderWeights& weights) {
  for (LayerWeights& l : weights.layers) {
    const std::vector<Linear*> parts = attention_parts(l.attn);
    if (parts.size() > 1) l.attn.qkv = LinearGroup(parts);
    l.mlp.gate_up = LinearGroup({&l.mlp.gate, &l.mlp.up});  // stays undefined in expert layers (no dense MLP)
  }
}

std::pair<Tensor, KvCache::View> Decoder::attention_inputs(int index, const Tensor& h, const Tensor& positions,
                                                           const Tensor& inv_freq, const ForwardOptions& options,
                                                           const LayerIo& io, Tensor* gate) const {
  const LayerWeights& w = weights_.layers[size_t(index)];
  const LayerConfig& lc = config_.layers[size_t(index)];
  const int64_t B = h.dim(0), T = h.dim(1);
  const int64_t H = config_.num_attention_heads, KV = lc.kv_heads, D = lc.head_dim;
  const float rope_scale = float(lc.rope.attention_factor);
  const std::vector<const Linear*> parts = attention_parts(w.attn);
  Tensor whole;  // the group's product [B, T, (H + 2 KV) D] where it takes q, k and v as one
  const std::vector<Tensor> qkv = w.attn.qkv(parts, h, options.row_adapters, &whole);
  Tensor q;
  if (gate) {  // per head: D queries, then D gate values
    const Tensor qg = ops::reshape(qkv[0], {B, T, H, 2 * D});
    q = ops::slice(qg, 3, 0, D);
    *gate = ops::reshape(ops::slice(qg, 3, D, 2 * D), {B, T, H * D});
  } else {
    q = ops::reshape(qkv[0], {B, T, H, D});
  }
  if (config_.qk_norm) q = norm(q, w.attn.q_norm);
  if (io.shared_kv) {  // Gemma 4: keys and values (and their cache view) are the source layer's
    q = ops::rope(q, positions, inv_freq, ops::RopeLayout::half_split, rope_scale);
    return {q, *io.shared_kv};
  }
  Tensor k = ops::reshape(qkv[1], {B, T, KV, D});
  Tensor v = lc.k_eq_v ? k : ops::reshape(qkv[2], {B, T, KV, D});
  Tensor qk;  // queries' and keys' heads side by side, where no q/k norm sits between the product and the rope
  if (config_.qk_norm) {
    k = norm(k, w.attn.k_norm);
  } else if (whole.defined() && !gate) {
    qk = ops::reshape(ops::slice(whole, -1, 0, (H + KV) * D), {B, T, H + KV, D});
  }
  if (config_.v_norm) v = ops::rms_norm(v, unit_weights_.at(D), float(config_.rms_norm_eps));
  // With a cache, the one [q | k] block of inference is rotated and its keys stored with the values in one op.
  const bool rotate_into_cache = options.cache && qk.defined() && !on_tape(qk) && !on_tape(v);
  KvCache::View view;
  if (rotate_into_cache) {
    std::tie(q, view) = options.cache->append_rotated(index, qk, v, positions, inv_freq, rope_scale);
  } else {
    std::tie(q, k) = rope_pair(q, k, qk, positions, inv_freq, rope_scale);
    if (options.cache) view = options.cache->append(index, k, v);
    else view = {k, v, 0, Tensor()};
  }
  return {q, view};
}

Tensor Decoder::attention_residual(int index, const Tensor& x, const Tensor& positions, const Tensor& inv_freq,
                                   const ForwardOptions& options, const LayerIo& io) const {
  const LayerWeights& w = weights_.layers[size_t(index)];
  const LayerConfig& lc = config_.layers[size_t(index)];
  const int64_t B = x.dim(0), T = x.dim(1);
  if (lc.linear_attention) {
    DeltaNetState* state = options.cache ? &options.cache->delta_state(index) : nullptr;
    return ops::add(x, gated_deltanet(w.delta, config_.linear_attention, norm(x, w.input_norm), *io.delta_masks,
                                      state, options.row_adapters, float(config_.rms_norm_eps)));
  }
  Tensor gate;
  auto [q, view] = attention_inputs(index, norm(x, w.input_norm), positions, inv_freq, options, io,
                                    config_.gated_attention ? &gate : nullptr);
  if (io.kv_out) *io.kv_out = view;
  ops::AttentionOptions ao;
  ao.scale = config_.attn_scale;
  ao.causal = true;
  ao.window = lc.attention == AttentionKind::sliding ? lc.sliding_window : 0;
  ao.softcap = float(config_.attn_logit_softcapping);
  ao.doc_ids = options.doc_ids;
  ao.q_offset = view.q_offset;
  ao.key_mask = options.cache ? view.key_mask : options.attend_mask;
  // x + o_proj(a): the sum in the product's epilogue where it can be (Linear::add_to); sandwich norms come first.
  const int64_t HD = config_.num_attention_heads * lc.head_dim;
  Tensor a = ops::reshape(ops::attention(q, view.k, view.v, ao), {B, T, HD});
  if (gate.defined()) a = ops::mul(a, ops::sigmoid(gate));
  return config_.sandwich_norms ? ops::add(x, norm(w.attn.o(a, options.row_adapters), w.post_attn_norm))
                                : w.attn.o.add_to(x, a, options.row_adapters);
}

Tensor Decoder::layer_forward(int index, const Tensor& x, const Tensor& positions, const Tensor& inv_freq,
                              const ForwardOptions& options, const LayerIo& io) const {
  const LayerWeights& w = weights_.layers[size_t(index)];
  const LayerConfig& lc = config_.layers[size_t(index)];
  const Tensor r = attention_residual(index, x, positions, inv_freq, options, io);
  Tensor y = mlp_forward(w, lc, norm(r, w.pre_mlp_norm), r, options, io.router_logits);
  if (io.per_layer_input.defined()) {
    const Tensor g = ops::gated_activation(w.ple_gate(y), io.per_layer_input, gate_activation());
    y = ops::add(y, norm(w.ple_proj(g), w.ple_norm));
  }
  const float scalar = layer_scalars_[size_t(index)];
  return scalar == 1.0f ? y : ops::scale(y, scalar);
}

ops::GateActivation Decoder::gate_activation() const {
  switch (config_.hidden_act) {
    case Activation::silu: return ops::GateActivation::silu;
    case Activation::gelu_tanh: return ops::GateActivation::gelu_tanh;
    case Activation::gelu_erf: return ops::GateActivation::gelu_erf;
  }
  return ops::GateActivation::silu;
}

Tensor Decoder::mlp_forward(const LayerWeights& w, const LayerConfig& lc, const Tensor& h, const Tensor& r,
                            const ForwardOptions& options, Tensor* router_logits) const {
  const ops::GateActivation act = gate_activation();
  if (lc.moe && config_.experts_beside_mlp) {  // Gemma 4: norm(norm(mlp(h)) + norm(experts(norm(r))))
    const Tensor dense = norm(dense_mlp(w.mlp, h, options), w.mlp_out_norm);
    const Tensor experts = moe_mlp(w.moe, norm(r, w.experts_in_norm), config_, act, router_logits,
                                   options.row_adapters, r);
    return ops::add(r, norm(ops::add(dense, norm(experts, w.experts_out_norm)), w.post_mlp_norm));
  }
  if (lc.moe) {
    Tensor m = moe_mlp(w.moe, h, config_, act, router_logits, options.row_adapters);
    if (w.moe.shared_gate.present())  // qwen3_next: + sigmoid(shared_gate(h)) * shared_expert(h)
      m = ops::add(m, ops::mul(ops::sigmoid(w.moe.shared_gate(h, options.row_adapters)),
                               dense_mlp(w.moe.shared, h, options)));
    return ops::add(r, config_.sandwich_norms ? norm(m, w.post_mlp_norm) : m);
  }
  if (config_.sandwich_norms) return ops::add(r, norm(dense_mlp(w.mlp, h, options), w.post_mlp_norm));
  return w.mlp.down.add_to(r, gated_product(w.mlp, h, options), options.row_adapters);
}

Tensor Decoder::gated_product(const MlpWeights& w, const Tensor& h, const ForwardOptions& options) const {
  // act(gate) * up: in the one product of gate and up where their group takes it (decoding), else in one fused
  // kernel after the products (its backward saves only gate and up).
  const ops::GateActivation act = gate_activation();
  Tensor gated;
  if (paths_.fused_glu) gated = w.gate_up.gated(w.gate, w.up, h, act, options.row_adapters);
  if (gated.defined()) return gated;
  const std::vector<Tensor> gate_up = w.gate_up({&w.gate, &w.up}, h, options.row_adapters);
  return paths_.fused_glu ? ops::gated_activation(gate_up[0], gate_up[1], act)
                          : ops::gated_activation_reference(gate_up[0], gate_up[1], act);
}

Tensor Decoder::dense_mlp(const MlpWeights& w, const Tensor& h, const ForwardOptions& options) const {
  return w.down(gated_product(w, h, options), options.row_adapters);
}

Tensor Decoder::forward_hidden(const Tensor& ids, const Tensor& positions, const ForwardOptions& options) const {
  if (ids.ndim() != 2) throw ShapeError("decoder: ids must be i32 [B, T], got " + to_string(ids.shape()));
  check_ids(ids, "ids", ids.shape());
  check_ids(positions, "positions", ids.shape());
  if (options.doc_ids.defined()) {
    check_ids(options.doc_ids, "doc_ids", ids.shape());
    if (options.cache) throw ShapeError("decoder: doc_ids (packed sequences) cannot be used with a KV cache");
  }
  if (options.cache && options.cache->batch() != ids.dim(0))
    throw ShapeError("decoder: KV cache for batch " + std::to_string(options.cache->batch()) + ", ids " +
                     to_string(ids.shape()));
  if (options.attend_mask.defined()) check_ids(options.attend_mask, "attend_mask", ids.shape());
  if (options.cache) {
    // Recorded even without a mask once the cache holds padding, so that its rows stay aligned.
    std::vector<int32_t> m = options.attend_mask.defined() ? options.attend_mask.to_ints()
                                                           : std::vector<int32_t>(size_t(ids.numel()), 1);
    options.cache->record_attend_mask(m, ids.dim(1));
  }

  Tensor x = ops::cast(ops::embedding(weights_.embed, ids, options.ids_on_device), compute_dtype_);
  if (config_.embed_scale != 1.0f) x = ops::scale(x, round_to(config_.embed_scale, compute_dtype_));
  const Tensor ple = per_layer_inputs(ids, x);

  const std::vector<Tensor> inv_freq = call_frequencies(positions);
  // Gated DeltaNet layers see where sequences start: masks made once per call and shared by the layers (from a
  // host read of the positions, except in one-token calls, which make theirs on the device).
  auto delta_masks = std::make_shared<DeltaNetMasks>();
  const int64_t conv_kernel = config_.linear_attention.conv_kernel;
  if (has_linear_attention_)
    *delta_masks = ids.dim(1) == 1
                       ? delta_net_step_masks(positions, conv_kernel)
                       : delta_net_masks(positions.to_ints(), ids.dim(0), ids.dim(1), conv_kernel, device());
  const bool checkpointing = options.checkpoint_layers && grad_enabled() && !options.cache;
  const int layers = int(weights_.layers.size());
  // Keys and values of the layers that later layers attend to (Gemma 4).
  std::vector<KvCache::View> kv(static_cast<size_t>(layers));
  for (int i = 0; i < layers; ++i) {
    const LayerConfig& lc = config_.layers[size_t(i)];
    // Expert layers hand their router logits out when the load-balancing loss wants them.
    const bool wants_logits = options.router_logits && lc.moe;
    const bool provides = kv_provider_[size_t(i)], shares = lc.kv_source >= 0;
    Tensor logits, p_i;
    if (ple.defined()) p_i = ops::reshape(ops::slice(ple, 2, i, i + 1), {ids.dim(0), ids.dim(1), ple.dim(3)});
    if (checkpointing && i < layers - options.unchecked_layers) {
      // The recomputation runs during backward, after this call returns: capture by value. Inputs: x, then the
      // per-layer input and the shared keys and values where there are; outputs: y, then the router logits and
      // the keys and values later layers take.
      ForwardOptions opt = options;
      opt.cache = nullptr;
      opt.checkpoint_layers = false;
      opt.router_logits = nullptr;
      const bool has_p = p_i.defined();
      Fn layer = [this, i, positions, freq = inv_freq[size_t(i)], opt, wants_logits, provides, shares, has_p,
                  delta_masks](const std::vector<Tensor>& in) {
        LayerIo io;
        io.delta_masks = delta_masks.get();
        size_t next = 1;
        if (has_p) io.per_layer_input = in[next++];
        KvCache::View shared, produced;
        if (shares) {
          shared = {in[next], in[next + 1], 0, Tensor()};
          io.shared_kv = &shared;
        }
        Tensor l;
        if (wants_logits) io.router_logits = &l;
        if (provides) io.kv_out = &produced;
        std::vector<Tensor> out{layer_forward(i, in[0], positions, freq, opt, io)};
        if (wants_logits) out.push_back(l);
        if (provides) {
          out.push_back(produced.k);
          out.push_back(produced.v);
        }
        return out;
      };
      std::vector<Tensor> in{x};
      if (has_p) in.push_back(p_i);
      if (shares) {
        in.push_back(kv[size_t(lc.kv_source)].k);
        in.push_back(kv[size_t(lc.kv_source)].v);
      }
      // Parameters (adapters) are captured, not passed: checkpoint's backward gives captured leaves their
      // gradients even below the first trainable layer, where x itself needs none.
      std::vector<Tensor> out = checkpoint(layer)(in);
      x = out[0];
      size_t next = 1;
      if (wants_logits) logits = out[next++];
      if (provides) kv[size_t(i)] = {out[next], out[next + 1], 0, Tensor()};
    } else {
      LayerIo io;
      io.delta_masks = delta_masks.get();
      io.per_layer_input = p_i;
      if (shares) io.shared_kv = &kv[size_t(lc.kv_source)];
      if (provides) io.kv_out = &kv[size_t(i)];
      if (wants_logits) io.router_logits = &logits;
      x = layer_forward(i, x, positions, inv_freq[size_t(i)], options, io);
    }
    if (wants_logits) options.router_logits->push_back(logits);
  }
  if (options.cache) options.cache->advance(ids.dim(1));
  return norm(x, weights_.final_norm);
}

namespace {

// table[ids] for a table held as consecutive row blocks: each block gathers the ids it holds (the others read its
// row 0), and a select per block keeps its rows.
Tensor gather_row_blocks(const std::vector<Tensor>& blocks, const Tensor& ids) {
  const std::vector<int32_t> all = ids.to_ints();
  int64_t total = 0;
  for (const Tensor& b : blocks) total += b.dim(0);
  for (size_t i = 0; i < all.size(); ++i)
    if (all[i] < 0 || all[i] >= total)
      throw ShapeError("per-layer inputs: id " + std::to_string(all[i]) + " at flat index " + std::to_string(i) +
                       " is outside the table's " + std::to_string(total) + " rows");
  Shape row_shape = ids.shape();
  row_shape.push_back(1);
  Tensor out;
  int64_t first = 0;
  for (const Tensor& block : blocks) {
    const int64_t end = first + block.dim(0);
    std::vector<int32_t> local(all.size()), held(all.size());
    bool any = false;
    for (size_t i = 0; i < all.size(); ++i) {
      held[i] = all[i] >= first && all[i] < end;
      local[i] = held[i] ? int32_t(all[i] - first) : 0;
      any = any || held[i];
    }
    first = end;
    if (!any) continue;
    const Tensor rows = ops::embedding(block, Tensor::from_ints(local, ids.shape(), ids.device()));
    out = out.defined() ? ops::where(Tensor::from_ints(held, row_shape, ids.device()), rows, out) : rows;
  }
  return out;
}

}  // namespace

Tensor Decoder::per_layer_inputs(const Tensor& ids, const Tensor& embedded) const {
  const int64_t P = config_.per_layer_input_size;
  if (P == 0) return Tensor();
  const int64_t B = ids.dim(0), T = ids.dim(1), L = config_.num_hidden_layers;
  // As Gemma4TextModel: the token's own values (scaled by sqrt(P) rounded to the weights' dtype) and a normed
  // projection of its embedding (scaled by C^-1/2), averaged by a factor of 2^-1/2.
  const Tensor& table = weights_.ple_embed;
  Tensor own;
  if (table.device() == ids.device()) {
    own = ops::embedding(table, ids);
  } else {  // a table beyond the device's addressable range stays in host memory (weights.h)
    if (table.requires_grad())
      throw ConfigError("decoder: the per-layer-input table is held in host memory (beyond what the device's "
                        "kernels address); it cannot be trained there (LoRA trains Gemma 4)");
    if (weights_.ple_blocks.empty())
      throw ShapeError("decoder: the per-layer-input table is in host memory without its rows on the device "
                       "(models::row_blocks)");
    NoGrad no_grad;
    own = gather_row_blocks(weights_.ple_blocks, ids);
  }
  own = ops::cast(own, compute_dtype_);
  own = ops::scale(own, round_to(float(std::sqrt(double(P))), weights_.ple_embed.dtype()));
  Tensor mixed = ops::scale(weights_.ple_model_proj(embedded), float(1.0 / std::sqrt(double(config_.hidden_size))));
  mixed = norm(ops::reshape(mixed, {B, T, L, P}), weights_.ple_proj_norm);
  return ops::scale(ops::add(mixed, ops::reshape(own, {B, T, L, P})), float(1.0 / std::sqrt(2.0)));
}

Tensor Decoder::logits(const Tensor& hidden) const {
  // f32 logits, not rounded to bf16. 16-bit hidden states and weights go into the product as they are, which
  // accumulates and writes in f32: the same numbers as widening the hidden states first (exact), but an f32 operand
  // would take the exact scalar kernel instead of the tensor cores (1.8 ms per step for 32 rows of Qwen2.5-0.5B).
  const Tensor& w = weights_.lm_head;
  Tensor y;
  if (hidden.dtype() != DType::f32 && hidden.dtype() == w.dtype() && hidden.ndim() >= 1) {
    Shape out = hidden.shape();
    out.back() = w.dim(0);
    y = ops::reshape(ops::matmul(ops::reshape(hidden, {-1, hidden.dim(-1)}), ops::transpose(w), DType::f32), out);
  } else {
    y = ops::linear(ops::cast(hidden, DType::f32), w);
  }
  if (config_.final_logit_softcapping > 0) y = softcap(y, config_.final_logit_softcapping);
  return y;
}

Tensor Decoder::token_losses(const Tensor& hidden, const Tensor& targets) const {
  const int64_t C = hidden.dim(-1), N = hidden.numel() / std::max<int64_t>(C, 1);
  if (targets.dtype() != DType::i32 || targets.numel() != N)
    throw ShapeError("loss: targets must be i32 with one entry per hidden row: hidden " + to_string(hidden.shape()) +
                     ", targets " + to_string(targets.shape()));
  Tensor h = ops::reshape(hidden, {N, C}), t = ops::reshape(targets, {N});
  if (!paths_.fused_loss) return ops::cross_entropy(logits(h), t, -100);
  return ops::linear_cross_entropy(h, weights_.lm_head, t, -100, float(config_.final_logit_softcapping),
                                   paths_.loss_vocab_chunk, weights_.lm_head_t);
}

Tensor Decoder::forward(const Tensor& ids, const Tensor& positions, const ForwardOptions& options) const {
  return logits(forward_hidden(ids, positions, options));
}

// ---------------------------------------------------------------------------------------------------------------
// Positions and loss

Tensor default_positions(int64_t batch, int64_t tokens, Device device) {
  std::vector<int32_t> p(size_t(batch * tokens));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < tokens; ++t) p[size_t(b * tokens + t)] = int32_t(t);
  return Tensor::from_ints(p, {batch, tokens}, device);
}

Tensor positions_from_doc_ids(const Tensor& doc_ids) {
  if (doc_ids.ndim() != 2 || doc_ids.dtype() != DType::i32)
    throw ShapeError("positions_from_doc_ids: expected i32 [B, T], got " + to_string(doc_ids.shape()));
  std::vector<int32_t> d = doc_ids.to_ints(), p(d.size());
  const int64_t B = doc_ids.dim(0), T = doc_ids.dim(1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      size_t i = size_t(b * T + t);
      p[i] = t > 0 && d[i] == d[i - 1] ? p[i - 1] + 1 : 0;
    }
  return Tensor::from_ints(p, doc_ids.shape(), doc_ids.device());
}

namespace {

// Targets [N] with the mask applied (0 -> -100) and the count of those that take part: needed on the host
// anyway, so the mask is applied there too.
struct CountedTargets {
  Tensor flat;
  int64_t count = 0;
};

CountedTargets counted_targets(const Tensor& targets, const Tensor& mask, int64_t N, const std::string& rows) {
  if (targets.dtype() != DType::i32 || targets.numel() != N)
    throw ShapeError("loss: targets must be i32 with one entry per row: " + rows + ", targets " +
                     to_string(targets.shape()));
  std::vector<int32_t> t = targets.to_ints();
  if (mask.defined()) {
    if (mask.numel() != N) throw ShapeError("loss: mask " + to_string(mask.shape()) + " does not match targets");
    std::vector<int32_t> m = mask.to_ints();
    for (size_t i = 0; i < t.size(); ++i)
      if (m[i] == 0) t[i] = -100;
  }
  CountedTargets r;
  for (int32_t v : t) r.count += v != -100;
  r.flat = mask.defined() ? Tensor::from_ints(t, {N}, targets.device()) : ops::reshape(targets, {N});
  return r;
}

Tensor mean_over(const Tensor& per_row, int64_t count) {
  return ops::scale(ops::sum_all(per_row), count > 0 ? float(1.0 / double(count)) : 0.0f);
}

}  // namespace

Tensor mean_cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& mask) {
  const int64_t V = logits.dim(-1);
  const int64_t N = logits.numel() / V;
  CountedTargets t = counted_targets(targets, mask, N, "logits " + to_string(logits.shape()));
  return mean_over(ops::cross_entropy(ops::reshape(logits, {N, V}), t.flat, -100), t.count);
}

Tensor loss(const Decoder& model, const Tensor& ids, const Tensor& targets, const Tensor& mask,
            const Tensor& positions, const ForwardOptions& options) {
  Tensor pos = positions;
  if (!pos.defined())
    pos = options.doc_ids.defined() ? positions_from_doc_ids(options.doc_ids)
                                    : default_positions(ids.dim(0), ids.dim(1), ids.device());
  Tensor hidden = model.forward_hidden(ids, pos, options);
  CountedTargets t = counted_targets(targets, mask, hidden.numel() / hidden.dim(-1),
                                     "hidden " + to_string(hidden.shape()));
  return mean_over(model.token_losses(hidden, t.flat), t.count);
}

}  // namespace lmtune::models
