// GGUF export of merged models and LoRA adapters (see export_gguf.h). The model side follows convert_hf_to_gguf.py
// (names, the llama q/k permutation, Gemma's +1 norms, rope_freqs) and llama-quantize's default type choices; the
// adapter side follows convert_lora_to_gguf.py and what llama.cpp's llama-adapter.cpp checks when it loads one.
#include "infer/export_gguf.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <numbers>

#include "backend/cpu/cpu_backend.h"
#include "core/autodiff.h"
#include "core/error.h"
#include "core/quant.h"
#include "infer/export.h"
#include "io/atomic_file.h"
#include "io/gguf_model.h"
#include "io/safetensors.h"
#include "models/weights.h"
#include "tokenizer/gguf_vocab.h"

namespace lmtune::infer {
namespace fs = std::filesystem;

GgufQuant parse_gguf_quant(std::string_view name) {
  std::string n(name);
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (n == "f32") return GgufQuant::f32;
  if (n == "f16") return GgufQuant::f16;
  if (n == "q8_0") return GgufQuant::q8_0;
  if (n == "q4_k") return GgufQuant::q4_k;
  throw ConfigError("export: --quantize '" + std::string(name) + "' (expected f32, f16, q8_0 or q4_k)");
}

int gguf_file_type(GgufQuant quant) {
  switch (quant) {
    case GgufQuant::f32: return 0;
    case GgufQuant::f16: return 1;
    case GgufQuant::q8_0: return 7;
    case GgufQuant::q4_k: return 14;
  }
  return 0;
}

GgmlType gguf_tensor_type(const std::string& name, std::span<const int64_t> dims, GgufQuant quant, bool tied_head) {
  if (dims.size() < 2 || quant == GgufQuant::f32) return GgmlType::F32;
  GgmlType want = GgmlType::F16;
  if (quant == GgufQuant::q8_0) want = GgmlType::Q8_0;
  if (quant == GgufQuant::q4_k) {
    const bool head = name == "output.weight" || (tied_head && name == "token_embd.weight");
    want = head ? GgmlType::Q6_K : GgmlType::Q4_K;
  }
  return dims[0] % ggml_type_info(want).block_elems == 0 ? want : GgmlType::F16;
}

fs::path gguf_output_file(const fs::path& out, const std::string& default_name) {
  return out.extension() == ".gguf" ? out : out / default_name;
}

namespace {

// v (rows of `cols` floats) as `type`'s bytes into out (exactly gguf_tensor_bytes long).
void encode_rows(GgmlType type, const std::vector<float>& v, int64_t cols, std::span<std::byte> out) {
  if (type == GgmlType::F32) {
    std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
    return;
  }
  if (type == GgmlType::F16) {
    std::vector<std::byte> bytes = convert_from_f32(v, DType::f16);
    std::copy(bytes.begin(), bytes.end(), out.begin());
    return;
  }
  const quant::Format format = *quant::from_ggml_type(int(type));
  const size_t rb = quant::row_bytes(format, cols);
  const int64_t rows = int64_t(v.size()) / cols;
  cpu::parallel_for(rows, 8, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      quant::quantize_row(format, v.data() + r * cols, cols, out.data() + size_t(r) * rb);
  });
}

std::vector<int64_t> ggml_dims(const Shape& shape) { return std::vector<int64_t>(shape.rbegin(), shape.rend()); }

// Rows reordered so that row g is row from[g] of v.
std::vector<float> reorder_rows(const std::vector<float>& v, const std::vector<int64_t>& from) {
  if (from.empty()) return v;
  const size_t cols = v.size() / from.size();
  std::vector<float> out(v.size());
  for (size_t g = 0; g < from.size(); ++g)
    std::copy_n(v.begin() + from[g] * int64_t(cols), cols, out.begin() + int64_t(g * cols));
  return out;
}

// A parameter's values on the host in f32 (a quantized base weight dequantized).
std::vector<float> host_floats(const models::ParamRef& p) {
  if (p.slot->defined()) return p.slot->to_floats();
  if (p.linear && p.linear->qweight.defined()) return quant::dequantize(p.linear->qweight, DType::f32).to_floats();
  throw ShapeError("GGUF export: parameter '" + p.name + "' is not set");
}

// rope_freqs.weight: a GGUF model's own factors, or Llama 3 rope scaling as LlamaModel.generate_extra_tensors
// writes it (llama.cpp divides each rotary frequency by its factor).
std::vector<float> rope_freq_factors(const ModelConfig& c) {
  if (!c.rope.freq_factors.empty()) return c.rope.freq_factors;
  if (c.rope.type != RopeType::llama3) return {};
  const RopeConfig& r = c.rope;
  const double old_len = double(r.original_max_pos), low = r.low_freq_factor, high = r.high_freq_factor;
  std::vector<float> out;
  for (int64_t i = 0; i < c.rotary_dim; i += 2) {
    const double freq = 1.0 / std::pow(r.theta, double(i) / double(c.rotary_dim));
    const double wavelen = 2 * std::numbers::pi / freq;
    if (wavelen < old_len / high) {
      out.push_back(1.0f);
    } else if (wavelen > old_len / low) {
      out.push_back(float(r.factor));
    } else {
      const double smooth = (old_len / wavelen - low) / (high - low);
      out.push_back(float(1.0 / ((1 - smooth) / r.factor + smooth)));
    }
  }
  return out;
}

std::string model_name(const fs::path& model) {
  const fs::path p = model.has_filename() ? model : model.parent_path();
  return p.extension() == ".gguf" ? p.stem().string() : p.filename().string();
}

// The tensors of the merged model in file order and the parameter each comes from (null: rope_freqs.weight).
struct ModelTensors {
  std::vector<GgufTensorToWrite> infos;
  std::vector<const models::ParamRef*> params;
};

ModelTensors model_tensors(const ModelConfig& c, const std::vector<models::ParamRef>& params,
                           const std::vector<float>& rope_freqs, GgufQuant quant) {
  ModelTensors t;
  if (!rope_freqs.empty()) {
    t.infos.push_back({"rope_freqs.weight", GgmlType::F32, {int64_t(rope_freqs.size())}, {}});
    t.params.push_back(nullptr);
  }
  for (const models::ParamRef& p : params) {
    GgufTensorToWrite info{models::gguf_tensor_name(p.name, c), GgmlType::F32, ggml_dims(p.shape), {}};
    info.type = gguf_tensor_type(info.name, info.dims, quant, c.tie_word_embeddings);
    t.infos.push_back(std::move(info));
    t.params.push_back(&p);
  }
  return t;
}

std::string stored_modelfile_path(const fs::path& file) { return "./" + file.filename().string(); }

// A Modelfile value: quoted when it holds whitespace or a quote.
std::string modelfile_value(const std::string& v) {
  if (v.find_first_of(" \t\"") == std::string::npos) return v;
  std::string q = "\"";
  for (char ch : v) q += ch == '"' || ch == '\\' ? std::string("\\") + ch : std::string(1, ch);
  return q + "\"";
}

}  // namespace

void export_merged_gguf(const fs::path& model, const std::vector<AdapterSpec>& adapters, const fs::path& file,
                        GgufQuant quant) {
  NoGrad no_grad;
  models::Decoder decoder = models::load_decoder(model, DType::f32, DType::f32, Device::cpu());
  merge_adapters(decoder, adapters);
  const ModelConfig& c = decoder.config();
  const std::string arch = gguf_arch_name(c);
  GgufMetadata metadata = gguf_config_metadata(c, model_name(model), gguf_file_type(quant));
  for (auto& kv : gguf_tokenizer_metadata(Tokenizer::load(model), c.vocab_size)) metadata.push_back(std::move(kv));

  std::vector<models::ParamRef> params = models::parameter_map(c, decoder.weights());
  const std::vector<float> rope_freqs = rope_freq_factors(c);
  const ModelTensors tensors = model_tensors(c, params, rope_freqs, quant);
  const bool gemma = c.norm_style == NormStyle::one_plus_weight;
  if (file.has_parent_path()) fs::create_directories(file.parent_path());
  write_gguf_streamed(file, metadata, tensors.infos, [&](size_t i, std::span<std::byte> out) {
    const models::ParamRef* p = tensors.params[i];
    if (!p) return encode_rows(GgmlType::F32, rope_freqs, int64_t(rope_freqs.size()), out);
    std::vector<float> v = reorder_rows(host_floats(*p), models::gguf_row_order(p->name, c, arch));
    if (gemma && p->init == models::ParamInit::norm)
      for (float& x : v) x += 1.0f;  // convert_hf_to_gguf.py stores Gemma's norms as 1 + w
    encode_rows(tensors.infos[i].type, v, p->shape.back(), out);
  });
  write_modelfile(file.parent_path(), stored_modelfile_path(file), std::nullopt);
}

void export_adapter_gguf(const fs::path& model, const AdapterSpec& spec, const fs::path& file) {
  NoGrad no_grad;
  models::Decoder decoder = models::load_decoder(model, DType::f32, DType::f32, Device::cpu());
  const PeftAdapter a = load_adapter(decoder, spec);
  const ModelConfig& c = decoder.config();
  const std::string arch = gguf_arch_name(c);
  // llama.cpp scales B·A by alpha / r: this alpha gives PEFT's scale (rsLoRA's too) times the spec's multiplier.
  const double alpha = a.scale() * a.rank * spec.multiplier;
  if (alpha == 0)
    throw ConfigError("export: adapter " + spec.dir.string() + " has scale 0, which GGUF cannot express (llama.cpp "
                      "reads alpha 0 as 'no scaling')");
  GgufMetadata metadata;
  metadata.emplace_back("general.architecture", GgufValue::of_string(arch));
  metadata.emplace_back("general.type", GgufValue::of_string("adapter"));
  metadata.emplace_back("general.name", GgufValue::of_string(spec.name));
  metadata.emplace_back("general.file_type", GgufValue::of_u32(0));
  metadata.emplace_back("adapter.type", GgufValue::of_string("lora"));
  metadata.emplace_back("adapter.lora.alpha", GgufValue::of_f32(float(alpha)));

  std::vector<GgufTensorToWrite> infos;
  std::vector<std::pair<const LoraWeights*, std::vector<int64_t>>> sources;  // weights, lora_b row order
  for (const auto& [module, lw] : a.modules) {
    const std::string base = models::gguf_tensor_name(module + ".weight", c);
    infos.push_back({base + ".lora_a", GgmlType::F32, ggml_dims(lw.a_shape), {}});
    infos.push_back({base + ".lora_b", GgmlType::F32, ggml_dims(lw.b_shape), {}});
    sources.emplace_back(&lw, models::gguf_row_order(module + ".weight", c, arch));
  }
  if (file.has_parent_path()) fs::create_directories(file.parent_path());
  write_gguf_streamed(file, metadata, infos, [&](size_t i, std::span<std::byte> out) {
    const auto& [lw, order] = sources[i / 2];
    const std::vector<float> v = i % 2 == 0 ? lw->a : reorder_rows(lw->b, order);
    encode_rows(GgmlType::F32, v, 1, out);
  });
  const fs::path base = find_gguf_model(model).value_or(model);
  write_modelfile(file.parent_path(), fs::absolute(base).lexically_normal().string(), stored_modelfile_path(file));
}

void write_modelfile(const fs::path& dir, const std::string& from, const std::optional<std::string>& adapter) {
  std::string text = "# Ollama Modelfile written by lmtune export: ollama create NAME -f Modelfile\n";
  text += "FROM " + modelfile_value(from) + "\n";
  if (adapter) text += "ADAPTER " + modelfile_value(*adapter) + "\n";
  write_file_atomic((dir.empty() ? fs::path(".") : dir) / "Modelfile", text);
}

}  // namespace lmtune::infer
