// HF name <-> decoder parameter mapping, loading, saving and random initialisation (see weights.h).
#include "models/weights.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/strided.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/random.h"
#include "io/atomic_file.h"
#include "io/gguf.h"
#include "io/safetensors.h"

namespace lmtune::models {
namespace fs = std::filesystem;

std::vector<ParamRef> parameter_map(const ModelConfig& c, DecoderWeights& w) {
  const int64_t C = c.hidden_size, H = c.num_attention_heads, V = c.vocab_size, P = c.per_layer_input_size;
  std::vector<ParamRef> out;
  auto add = [&](std::string name, Shape shape, Tensor* slot, ParamInit init) {
    out.push_back({std::move(name), std::move(shape), slot, init});
  };
  auto linear = [&](const std::string& name, Linear& l, int64_t out_dim, int64_t in_dim, bool bias) {
    add(name + ".weight", {out_dim, in_dim}, &l.weight, ParamInit::normal);
    out.back().linear = &l;
    if (bias) add(name + ".bias", {out_dim}, &l.bias, ParamInit::zeros);
  };

  add("model.embed_tokens.weight", {V, C}, &w.embed, ParamInit::normal);
  if (P > 0) {
    const int64_t LP = c.num_hidden_layers * P;
    add("model.embed_tokens_per_layer.weight", {c.per_layer_vocab_size, LP}, &w.ple_embed, ParamInit::normal);
    out.back().host_if_too_large = true;
    add("model.per_layer_model_projection.weight", {LP, C}, &w.ple_model_proj.weight, ParamInit::normal);
    add("model.per_layer_projection_norm.weight", {P}, &w.ple_proj_norm, ParamInit::norm);
  }
  w.layers.resize(size_t(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights& l = w.layers[size_t(i)];
    const LayerConfig& lc = c.layers[size_t(i)];
    const int64_t D = lc.head_dim, HD = H * D, KVD = lc.kv_heads * D, I = lc.intermediate_size;
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {C}, &l.input_norm, ParamInit::norm);
    if (c.sandwich_norms) {
      add(p + "post_attention_layernorm.weight", {C}, &l.post_attn_norm, ParamInit::norm);
      add(p + "pre_feedforward_layernorm.weight", {C}, &l.pre_mlp_norm, ParamInit::norm);
      add(p + "post_feedforward_layernorm.weight", {C}, &l.post_mlp_norm, ParamInit::norm);
    } else {
      add(p + "post_attention_layernorm.weight", {C}, &l.pre_mlp_norm, ParamInit::norm);
    }
    const bool own_kv = lc.kv_source < 0;
    if (lc.linear_attention) {
      const LinearAttentionConfig& la = c.linear_attention;
      const int64_t KD = la.key_heads * la.key_head_dim, VD = la.value_heads * la.value_head_dim;
      if (la.split_projections) {
        linear(p + "linear_attn.in_proj_qkv", l.delta.in_qkv, 2 * KD + VD, C, false);
        linear(p + "linear_attn.in_proj_z", l.delta.in_z, VD, C, false);
        linear(p + "linear_attn.in_proj_b", l.delta.in_b, la.value_heads, C, false);
        linear(p + "linear_attn.in_proj_a", l.delta.in_a, la.value_heads, C, false);
      } else {
        linear(p + "linear_attn.in_proj_qkvz", l.delta.in_qkvz, 2 * KD + 2 * VD, C, false);
        linear(p + "linear_attn.in_proj_ba", l.delta.in_ba, 2 * la.value_heads, C, false);
      }
      add(p + "linear_attn.conv1d.weight", {la.conv_channels(), 1, la.conv_kernel}, &l.delta.conv, ParamInit::normal);
      add(p + "linear_attn.dt_bias", {la.value_heads}, &l.delta.dt_bias, ParamInit::ones);
      add(p + "linear_attn.A_log", {la.value_heads}, &l.delta.a_log, ParamInit::zeros);
      add(p + "linear_attn.norm.weight", {la.value_head_dim}, &l.delta.norm, ParamInit::ones);
      linear(p + "linear_attn.out_proj", l.delta.out, C, VD, false);
    } else {
      linear(p + "self_attn.q_proj", l.attn.q, c.gated_attention ? 2 * HD : HD, C, c.qkv_bias);
      if (own_kv) linear(p + "self_attn.k_proj", l.attn.k, KVD, C, c.qkv_bias);
      if (own_kv && !lc.k_eq_v) linear(p + "self_attn.v_proj", l.attn.v, KVD, C, c.qkv_bias);
      linear(p + "self_attn.o_proj", l.attn.o, C, HD, c.o_bias);
      if (c.qk_norm) {
        add(p + "self_attn.q_norm.weight", {D}, &l.attn.q_norm, ParamInit::norm);
        if (own_kv) add(p + "self_attn.k_norm.weight", {D}, &l.attn.k_norm, ParamInit::norm);
      }
    }
    if (lc.moe && c.experts_beside_mlp) {  // Gemma 4: experts beside the dense MLP
      const int64_t E = c.num_experts, EI = c.moe_intermediate_size;
      add(p + "router.proj.weight", {E, C}, &l.moe.router, ParamInit::normal);
      add(p + "router.scale", {C}, &l.moe.router_scale, ParamInit::norm);
      add(p + "router.per_expert_scale", {E}, &l.moe.per_expert_scale, ParamInit::norm);
      add(p + "experts.gate_up_proj", {E, 2 * EI, C}, &l.moe.gate_up, ParamInit::normal);
      add(p + "experts.down_proj", {E, C, EI}, &l.moe.down, ParamInit::normal);
      add(p + "pre_feedforward_layernorm_2.weight", {C}, &l.experts_in_norm, ParamInit::norm);
      add(p + "post_feedforward_layernorm_1.weight", {C}, &l.mlp_out_norm, ParamInit::norm);
      add(p + "post_feedforward_layernorm_2.weight", {C}, &l.experts_out_norm, ParamInit::norm);
    } else if (lc.moe) {
      const int64_t E = c.num_experts, EI = c.moe_intermediate_size;
      add(p + "mlp.gate.weight", {E, C}, &l.moe.router, ParamInit::normal);
      add(p + "mlp.experts.gate_up_proj", {E, 2 * EI, C}, &l.moe.gate_up, ParamInit::normal);
      add(p + "mlp.experts.down_proj", {E, C, EI}, &l.moe.down, ParamInit::normal);
      if (const int64_t SI = c.shared_expert_intermediate_size; SI > 0) {
        linear(p + "mlp.shared_expert.gate_proj", l.moe.shared.gate, SI, C, false);
        linear(p + "mlp.shared_expert.up_proj", l.moe.shared.up, SI, C, false);
        linear(p + "mlp.shared_expert.down_proj", l.moe.shared.down, C, SI, false);
        linear(p + "mlp.shared_expert_gate", l.moe.shared_gate, 1, C, false);
      }
      continue;
    }
    linear(p + "mlp.gate_proj", l.mlp.gate, I, C, c.mlp_bias);
    linear(p + "mlp.up_proj", l.mlp.up, I, C, c.mlp_bias);
    linear(p + "mlp.down_proj", l.mlp.down, C, I, c.mlp_bias);
    if (P > 0) {  // plain weights: never quantized, no adapters
      add(p + "per_layer_input_gate.weight", {P, C}, &l.ple_gate.weight, ParamInit::normal);
      add(p + "per_layer_projection.weight", {C, P}, &l.ple_proj.weight, ParamInit::normal);
      add(p + "post_per_layer_input_norm.weight", {C}, &l.ple_norm, ParamInit::norm);
    }
    if (c.layer_scalar) {
      add(p + "layer_scalar", {1}, &l.layer_scalar, ParamInit::norm);
      out.back().trainable = false;  // a buffer in transformers
    }
  }
  add("model.norm.weight", {C}, &w.final_norm, ParamInit::norm);
  if (!c.tie_word_embeddings) add("lm_head.weight", {V, C}, &w.lm_head, ParamInit::normal);
  return out;
}

std::string gguf_tensor_name(const std::string& hf, const ModelConfig& config) {
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  const std::string layers = "model.layers.";
  if (hf.rfind(layers, 0) != 0) throw ConfigError("gguf_tensor_name: no GGUF name for '" + hf + "'");
  const size_t dot = hf.find('.', layers.size());
  const std::string block = "blk." + hf.substr(layers.size(), dot - layers.size()) + ".";
  const std::string rest = hf.substr(dot + 1);  // e.g. "self_attn.q_proj.weight"
  const size_t last = rest.rfind('.');
  const std::string module = rest.substr(0, last), suffix = rest.substr(last);  // ".weight" / ".bias"
  static const std::pair<const char*, const char*> kModules[] = {
      {"input_layernorm", "attn_norm"},       {"self_attn.q_proj", "attn_q"},
      {"self_attn.k_proj", "attn_k"},         {"self_attn.v_proj", "attn_v"},
      {"self_attn.o_proj", "attn_output"},    {"self_attn.q_norm", "attn_q_norm"},
      {"self_attn.k_norm", "attn_k_norm"},    {"pre_feedforward_layernorm", "ffn_norm"},
      {"post_feedforward_layernorm", "post_ffw_norm"}, {"mlp.gate_proj", "ffn_gate"},
      {"mlp.up_proj", "ffn_up"},              {"mlp.down_proj", "ffn_down"},
  };
  if (module == "post_attention_layernorm")
    return block + (config.sandwich_norms ? "post_attention_norm" : "ffn_norm") + suffix;
  for (const auto& [from, to] : kModules)
    if (module == from) return block + to + suffix;
  throw ConfigError("gguf_tensor_name: no GGUF name for '" + hf + "'");
}

std::vector<int64_t> gguf_row_order(const std::string& hf_name, const ModelConfig& config,
                                    const std::string& gguf_arch) {
  if (gguf_arch != "llama") return {};
  int64_t heads = 0;
  if (hf_name.find("self_attn.q_proj.") != std::string::npos) heads = config.num_attention_heads;
  if (hf_name.find("self_attn.k_proj.") != std::string::npos) heads = config.num_key_value_heads;
  if (heads == 0) return {};
  const int64_t D = config.head_dim, half = D / 2;
  std::vector<int64_t> hf_row(size_t(heads * D));
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t k = 0; k < half; ++k)
      for (int64_t j = 0; j < 2; ++j) hf_row[size_t(h * D + 2 * k + j)] = h * D + j * half + k;
  return hf_row;
}

int64_t parameter_count(const ModelConfig& config) {
  DecoderWeights w;
  int64_t n = 0;
  for (const ParamRef& p : parameter_map(config, w))
    if (p.trainable) n += numel(p.shape);  // as transformers counts: parameters, not buffers
  return n;
}

int64_t active_parameter_count(const ModelConfig& config) {
  int64_t idle = 0;  // the experts a token skips, per expert layer
  for (const LayerConfig& l : config.layers)
    if (l.moe)
      idle += (config.num_experts - config.experts_per_token) * 3 * config.hidden_size * config.moe_intermediate_size;
  return parameter_count(config) - idle;
}

namespace {

// Where the plain names live in a checkpoint.
struct NameLayout {
  std::string model;    // replaces the leading "model."
  std::string lm_head;  // replaces the leading "lm_head."
  std::string stored(const std::string& name) const {
    if (name.rfind("model.", 0) == 0) return model + name.substr(6);
    if (name.rfind("lm_head.", 0) == 0) return lm_head + name.substr(8);
    return name;
  }
};

const NameLayout kLayouts[] = {
    {"model.", "lm_head."},
    {"model.language_model.", "lm_head."},
    {"language_model.model.", "language_model.lm_head."},
};

const NameLayout& detect_layout(const SafetensorsCheckpoint& ckpt) {
  for (const NameLayout& l : kLayouts)
    if (ckpt.contains(l.stored("model.embed_tokens.weight"))) return l;
  throw FileError(ckpt.path().string() +
                  ": no embedding tensor found (looked for 'model.embed_tokens.weight', "
                  "'model.language_model.embed_tokens.weight' and 'language_model.model.embed_tokens.weight')");
}

// Decoder weights are floating-point: an integer or bool tensor (a relabelled dtype, say) would be converted
// to meaningless floats.
DType weight_dtype(const SafetensorsTensor& st) {
  auto t = to_lmtune_dtype(st.st_dtype);
  if (!t || !is_float(*t))
    throw FileError(st.file.string() + ": tensor '" + st.name + "' has dtype " +
                    std::string(st_dtype_name(st.st_dtype)) + "; decoder weights must be F32, F16 or BF16");
  return *t;
}

bool finite_element(const std::byte* p, DType t) {
  if (t == DType::f32) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return (v & 0x7f800000u) != 0x7f800000u;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return t == DType::f16 ? (h & 0x7c00u) != 0x7c00u : (h & 0x7f80u) != 0x7f80u;  // bf16: f32's exponent
}

// One pass over the stored bytes on the CPU threads: a NaN or infinity in a checkpoint would only surface as
// a NaN loss or garbage text much later.
void check_finite(const SafetensorsTensor& st, DType t) {
  const size_t es = dtype_size(t);
  const int64_t n = int64_t(st.data.size() / es);
  std::atomic<int64_t> count{0}, first{n};
  cpu::parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
    int64_t c = 0, f = n;
    for (int64_t i = b; i < e; ++i)
      if (!finite_element(st.data.data() + size_t(i) * es, t) && c++ == 0) f = i;
    if (c == 0) return;
    count += c;
    for (int64_t cur = first.load(); f < cur && !first.compare_exchange_weak(cur, f);) {}
  });
  if (count > 0)
    throw FileError(st.file.string() + ": tensor '" + st.name + "' holds " + std::to_string(count.load()) +
                    " non-finite value(s) (NaN or infinity), the first at element " + std::to_string(first.load()));
}

Tensor upload(const SafetensorsTensor& st, DType dtype, Device device) {
  DType src = weight_dtype(st);
  check_finite(st, src);
  Tensor t = Tensor::empty(st.shape, dtype, device);
  if (st.data.empty()) return t;
  if (src == dtype) {
    backend(device).write(*t.buffer(), 0, st.data.data(), st.data.size());
  } else {
    std::vector<std::byte> bytes = convert_dtype(st.data, src, dtype);
    backend(device).write(*t.buffer(), 0, bytes.data(), bytes.size());
  }
  return t;
}

// A projection's weight quantized as it is read: each row converted to f32 and quantized on the CPU threads
// (one row of floats per thread), the blocks uploaded once.
quant::QuantizedTensor upload_quantized(const SafetensorsTensor& st, quant::Format format, Device device) {
  const DType src = weight_dtype(st);
  check_finite(st, src);
  const int64_t rows = st.shape.at(0), cols = st.shape.at(1), qk = quant::info(format).block_elems;
  if (cols % qk != 0)
    throw ConfigError(st.file.string() + ": tensor '" + st.name + "' " + to_string(st.shape) +
                      " cannot be quantized to " + std::string(quant::info(format).name) + ": its " +
                      std::to_string(cols) + " columns are not a multiple of the format's " + std::to_string(qk) +
                      "-element blocks" +
                      (qk > 32 ? " (q8_0 and q4_0 take multiples of 32)" : ""));
  const size_t rb = quant::row_bytes(format, cols), es = dtype_size(src);
  std::vector<std::byte> blocks(size_t(rows) * rb);
  cpu::parallel_for(rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = r0; r < r1; ++r) {
      cpu::load_row(reinterpret_cast<const char*>(st.data.data()) + size_t(r * cols) * es, src, 1, cols, row.data());
      quant::quantize_row(format, row.data(), cols, blocks.data() + size_t(r) * rb);
    }
  });
  return quant::from_blocks(format, st.shape, blocks, device);
}

// Tensors of shape `part` stacked in order into one tensor of `shape` (the per-expert layout of earlier transformers
// versions, read into transformers 5's stacked experts).
Tensor upload_stacked(const std::vector<const SafetensorsTensor*>& parts, const Shape& part, const Shape& shape,
                      DType dtype, Device device) {
  // Every part's shape is checked before anything is allocated: the stacked size comes from config.json.
  for (const SafetensorsTensor* st : parts)
    if (st->shape != part)
      throw FileError(st->file.string() + ": tensor '" + st->name + "' has shape " + to_string(st->shape) +
                      " but config.json implies " + to_string(part));
  Tensor t = Tensor::empty(shape, dtype, device);
  size_t offset = 0;
  for (const SafetensorsTensor* st : parts) {
    const DType src = weight_dtype(*st);
    check_finite(*st, src);
    std::vector<std::byte> converted;
    std::span<const std::byte> bytes = st->data;
    if (src != dtype) bytes = converted = convert_dtype(st->data, src, dtype);
    backend(device).write(*t.buffer(), offset, bytes.data(), bytes.size());
    offset += bytes.size();
  }
  return t;
}

// A mixture-of-experts tensor of the plain layout (model.layers.N.mlp.gate.weight, mlp.experts.gate_up_proj,
// mlp.experts.down_proj) from the per-expert layout, or nullopt when `name` is none of those. Throws FileError
// naming both layouts when neither is there.
std::optional<Tensor> load_per_expert(const SafetensorsCheckpoint& ckpt, const NameLayout& layout,
                                      const ParamRef& p, DType dtype, Device device, std::set<std::string>& used,
                                      const std::string& where) {
  const size_t mlp = p.name.find(".mlp.");
  if (mlp == std::string::npos) return std::nullopt;
  const std::string layer = p.name.substr(0, mlp + 1), what = p.name.substr(mlp + 5);
  if (what != "gate.weight" && what != "experts.gate_up_proj" && what != "experts.down_proj") return std::nullopt;
  const bool mixtral = ckpt.contains(layout.stored(layer + "block_sparse_moe.gate.weight"));
  const std::string block = layer + (mixtral ? "block_sparse_moe." : "mlp.");
  std::vector<std::string> names;
  Shape part = p.shape;  // the router is one tensor; experts' projections one per expert (gate and up: two)
  if (what == "gate.weight") names.push_back(block + "gate.weight");
  for (int64_t e = 0; what != "gate.weight" && e < p.shape[0]; ++e) {
    const std::string ex = block + "experts." + std::to_string(e) + ".";
    if (what == "experts.down_proj") {
      names.push_back(ex + (mixtral ? "w2.weight" : "down_proj.weight"));
      part = {p.shape[1], p.shape[2]};
    } else {
      names.push_back(ex + (mixtral ? "w1.weight" : "gate_proj.weight"));
      names.push_back(ex + (mixtral ? "w3.weight" : "up_proj.weight"));
      part = {p.shape[1] / 2, p.shape[2]};
    }
  }
  std::vector<const SafetensorsTensor*> parts;
  for (const std::string& n : names) {
    const SafetensorsTensor* st = ckpt.find(layout.stored(n));
    if (!st)
      throw FileError(where + ": missing tensor '" + layout.stored(p.name) + "' (or, per expert, '" +
                      layout.stored(n) + "')");
    parts.push_back(st);
    used.insert(layout.stored(n));
  }
  return upload_stacked(parts, part, p.shape, dtype, device);
}

bool ignorable(const std::string& name) {
  for (const char* part : {"rotary_emb.inv_freq", "vision_tower.", "multi_modal_projector.", "vision_model."})
    if (name.find(part) != std::string::npos) return true;
  return false;
}

}  // namespace

std::vector<Tensor> row_blocks(const Tensor& table, Device device, size_t max_bytes) {
  const int64_t rows = table.dim(0), row_bytes = int64_t(table.nbytes()) / std::max<int64_t>(rows, 1);
  const int64_t per_block = std::max<int64_t>(1, int64_t(max_bytes) / std::max<int64_t>(row_bytes, 1));
  std::vector<Tensor> blocks;
  for (int64_t r = 0; r < rows; r += per_block)
    blocks.push_back(ops::contiguous(ops::slice(table, 0, r, std::min(rows, r + per_block))).to(device));
  return blocks;
}

DecoderWeights load_weights(const ModelConfig& config, const fs::path& checkpoint, DType dtype, Device device,
                            std::optional<quant::Format> quantize) {
  if (!is_float(dtype)) throw ConfigError("load_weights: weight dtype must be f32, f16 or bf16");
  if (auto gguf = find_gguf_model(checkpoint)) {
    // A GGUF model's tensors keep their own types (its block-quantized projections already are a QLoRA base).
    if (quantize)
      throw ConfigError(gguf->string() + ": quantize " + std::string(quant::info(*quantize).name) +
                        " applies to safetensors checkpoints; a GGUF model keeps its tensors' own types (use a "
                        "quantized GGUF, or quantize none)");
    return load_gguf_weights(config, *gguf, dtype, device);
  }
  SafetensorsCheckpoint ckpt(checkpoint);
  const NameLayout& layout = detect_layout(ckpt);
  // Errors name the file: the one .safetensors file, or the index of a sharded checkpoint.
  const std::string where = ckpt.files().size() == 1 ? ckpt.files()[0].path().string() : ckpt.path().string();
  DecoderWeights w;
  std::set<std::string> used;
  for (const ParamRef& p : parameter_map(config, w)) {
    const std::string name = layout.stored(p.name);
    const SafetensorsTensor* st = ckpt.find(name);
    if (!st) {
      if (auto stacked = load_per_expert(ckpt, layout, p, dtype, device, used, where)) {
        *p.slot = *stacked;
        continue;
      }
    }
    if (!st)
      throw FileError(where + ": missing tensor '" + name + "' (required by " + config.model_type +
                      " with " + std::to_string(config.num_hidden_layers) + " layers" +
                      (p.name == "lm_head.weight" ? ", tie_word_embeddings false" : "") + ")");
    if (st->shape != p.shape)
      throw FileError(st->file.string() + ": tensor '" + name + "' has shape " + to_string(st->shape) +
                      " but config.json implies " + to_string(p.shape));
    const bool too_large = uint64_t(numel(p.shape)) * dtype_size(dtype) > backend(device).max_tensor_bytes();
    if (quantize && p.linear) p.linear->qweight = upload_quantized(*st, *quantize, device);
    else *p.slot = upload(*st, dtype, p.host_if_too_large && too_large ? Device::cpu() : device);
    used.insert(name);
  }
  if (config.tie_word_embeddings) {
    w.lm_head = w.embed;
    used.insert(layout.stored("lm_head.weight"));  // some tied checkpoints store a copy; transformers ignores it
  }
  if (w.ple_embed.defined() && w.ple_embed.device() != device)
    w.ple_blocks = row_blocks(w.ple_embed, device, backend(device).max_tensor_bytes());
  std::vector<std::string> unused;
  for (const std::string& n : ckpt.names())
    if (!used.count(n) && !ignorable(n)) unused.push_back(n);
  if (!unused.empty()) {
    std::string list;
    for (size_t i = 0; i < unused.size() && i < 5; ++i) list += (i ? ", " : "") + unused[i];
    spdlog::warn("{}: {} tensor(s) not used by the {} decoder: {}{}", ckpt.path().string(), unused.size(),
                 config.model_type, list, unused.size() > 5 ? ", ..." : "");
  }
  return w;
}

Decoder load_decoder(const fs::path& model_dir, DType weight_dtype, DType compute_dtype, Device device,
                     std::optional<quant::Format> quantize) {
  ModelConfig config = load_model_config(model_dir);
  DecoderWeights w = load_weights(config, model_dir, weight_dtype, device, quantize);
  return Decoder(std::move(config), std::move(w), compute_dtype);
}

namespace {

// Writes the parameters `params` of a model in the plain HF layout into `dir` (model.safetensors, or shards of at
// most max_shard_bytes and their index), each tensor's bytes in `dtype` made by fill(param, out) as it is
// written.
void write_weight_files(const std::vector<ParamRef>& params, const fs::path& dir, DType dtype,
                        uint64_t max_shard_bytes, const std::function<void(const ParamRef&, std::span<std::byte>)>& fill) {
  if (!is_float(dtype)) throw ConfigError("save_weights: dtype must be f32, f16 or bf16");
  std::vector<std::vector<const ParamRef*>> shards(1);  // in map order
  uint64_t in_shard = 0;
  for (const ParamRef& p : params) {
    uint64_t bytes = uint64_t(numel(p.shape)) * dtype_size(dtype);
    if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(&p);
    in_shard += bytes;
  }
  fs::create_directories(dir);
  const std::map<std::string, std::string> metadata{{"format", "pt"}};
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    char fname[64];
    if (shards.size() == 1)
      std::snprintf(fname, sizeof fname, "model.safetensors");
    else
      std::snprintf(fname, sizeof fname, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    std::vector<TensorToStream> entries;
    for (const ParamRef* p : shards[s]) {
      entries.push_back({p->name, to_st_dtype(dtype), p->shape});
      weight_map[p->name] = fname;
      total += uint64_t(numel(p->shape)) * dtype_size(dtype);
    }
    write_safetensors_streamed(dir / fname, entries, metadata,
                               [&](size_t i, std::span<std::byte> out) { fill(*shards[s][i], out); });
  }
  if (shards.size() > 1) {
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    write_file_atomic(dir / "model.safetensors.index.json", index.dump(2) + "\n");
  } else {
    std::error_code ec;
    fs::remove(dir / "model.safetensors.index.json", ec);  // a stale index would shadow the single file
  }
}

// The seed of the k-th parameter (1-based, map order) of a model initialised with `seed`.
uint64_t param_seed(uint64_t seed, uint64_t k) { return seed * 0x9e3779b97f4a7c15ull + k; }

}  // namespace

void save_weights(const ModelConfig& config, const DecoderWeights& weights, const fs::path& dir, DType dtype,
                  uint64_t max_shard_bytes) {
  DecoderWeights copy = weights;  // handles only; parameter_map wants mutable slots
  std::vector<ParamRef> params = parameter_map(config, copy);
  for (const ParamRef& p : params) {
    if (!p.slot->defined()) throw ShapeError("save_weights: parameter '" + p.name + "' is not set");
    if (p.slot->shape() != p.shape)
      throw ShapeError("save_weights: parameter '" + p.name + "' has shape " + to_string(p.slot->shape()) +
                       ", the config implies " + to_string(p.shape));
  }
  write_weight_files(params, dir, dtype, max_shard_bytes, [&](const ParamRef& p, std::span<std::byte> out) {
    std::vector<std::byte> bytes = convert_from_f32(p.slot->to_floats(), dtype);
    std::copy(bytes.begin(), bytes.end(), out.begin());
  });
}

void save_random_weights(const ModelConfig& config, uint64_t seed, double std, const fs::path& dir, DType dtype,
                         uint64_t max_shard_bytes) {
  DecoderWeights none;
  std::vector<ParamRef> params = parameter_map(config, none);
  const float norm_value = config.norm_style == NormStyle::one_plus_weight ? 0.0f : 1.0f;
  const size_t es = dtype_size(dtype);
  write_weight_files(params, dir, dtype, max_shard_bytes, [&](const ParamRef& p, std::span<std::byte> out) {
    const int64_t n = int64_t(out.size() / es);
    const uint64_t p_seed = param_seed(seed, uint64_t(&p - params.data()) + 1);  // p's place in the map, from 1
    // 64K-element chunks on the CPU backend's threads, each converted to `dtype` in place.
    cpu::parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
      std::vector<float> v(size_t(e - b));
      if (p.init == ParamInit::normal) Rng::fill_normal(v.data(), uint64_t(b), uint64_t(e), p_seed, float(std));
      else std::fill(v.begin(), v.end(), p.init == ParamInit::norm ? norm_value : p.init == ParamInit::ones ? 1 : 0);
      std::vector<std::byte> bytes = convert_from_f32(v, dtype);
      std::copy(bytes.begin(), bytes.end(), out.begin() + b * int64_t(es));
    });
  });
}

DecoderWeights init_weights(const ModelConfig& config, uint64_t seed, double std, DType dtype, Device device) {
  DecoderWeights w;
  uint64_t k = 0;
  const float norm_value = config.norm_style == NormStyle::one_plus_weight ? 0.0f : 1.0f;
  for (const ParamRef& p : parameter_map(config, w)) {
    ++k;
    switch (p.init) {
      case ParamInit::normal:
        *p.slot = Tensor::randn(p.shape, param_seed(seed, k), float(std), dtype, device);
        break;
      case ParamInit::zeros: *p.slot = Tensor::zeros(p.shape, dtype, device); break;
      case ParamInit::norm: *p.slot = Tensor::full(p.shape, norm_value, dtype, device); break;
      case ParamInit::ones: *p.slot = Tensor::full(p.shape, 1.0f, dtype, device); break;
    }
  }
  if (config.tie_word_embeddings) w.lm_head = w.embed;
  return w;
}

}  // namespace lmtune::models
