// Loading a decoder's weights from a GGUF model (see load_gguf_weights in weights.h). Names come from
// gguf_tensor_name (weights.cpp, the one place that maps names); this file undoes what convert_hf_to_gguf.py does to
// the values: the llama architecture's q/k row permutation and Gemma's +1 on norm weights.
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstring>
#include <set>

#include "core/backend.h"
#include "core/error.h"
#include "core/quant.h"
#include "io/gguf.h"
#include "io/gguf_model.h"
#include "io/safetensors.h"
#include "models/weights.h"

namespace lmtune::models {
namespace fs = std::filesystem;

namespace {

// convert_hf_to_gguf.py's LlamaModel.permute interleaves the two rotary halves of every head's rows:
// GGUF row h*D + 2k + j holds HF row h*D + j*D/2 + k. Returns, for each HF row, the GGUF row it comes from.
std::vector<int64_t> unpermute_rows(int64_t rows, int64_t heads) {
  const int64_t D = rows / heads, half = D / 2;
  std::vector<int64_t> from(static_cast<size_t>(rows));
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t k = 0; k < half; ++k) from[size_t(h * D + j * half + k)] = h * D + 2 * k + j;
  return from;
}

// Rows of `row_bytes` bytes reordered so that out row r is in row from[r].
std::vector<std::byte> gather_rows(std::span<const std::byte> in, const std::vector<int64_t>& from,
                                   size_t row_bytes) {
  std::vector<std::byte> out(in.size());
  for (size_t r = 0; r < from.size(); ++r)
    std::memcpy(out.data() + r * row_bytes, in.data() + size_t(from[r]) * row_bytes, row_bytes);
  return out;
}

struct Loader {
  const ModelConfig& config;
  const GgufFile& file;
  DType dtype;
  Device device;
  bool llama_arch;  // q/k rows are permuted
  bool gemma;       // norms are stored as 1 + w

  [[noreturn]] void fail(const GgufTensor& t, const std::string& problem) const {
    throw FileError(file.path().string() + ": tensor '" + t.name + "' " + problem);
  }

  // The row order to undo for this parameter, or empty.
  std::vector<int64_t> row_order(const std::string& hf_name, int64_t rows) const {
    if (!llama_arch) return {};
    if (hf_name.find("self_attn.q_proj.") != std::string::npos)
      return unpermute_rows(rows, config.num_attention_heads);
    if (hf_name.find("self_attn.k_proj.") != std::string::npos)
      return unpermute_rows(rows, config.num_key_value_heads);
    return {};
  }

  // Elements as f32 (dequantizing a block format), rows in HF order.
  std::vector<float> floats(const GgufTensor& t, const Shape& shape) const {
    const int64_t cols = shape.back(), rows = t.numel() / std::max<int64_t>(cols, 1);
    std::vector<float> v;
    switch (t.type) {
      case GgmlType::F32: v = convert_to_f32(t.data, DType::f32); break;
      case GgmlType::F16: v = convert_to_f32(t.data, DType::f16); break;
      case GgmlType::BF16: v = convert_to_f32(t.data, DType::bf16); break;
      default: {
        auto format = quant::from_ggml_type(int(t.type));
        if (!format) fail(t, "has type " + std::string(ggml_type_info(t.type).name) + unsupported_types());
        v.resize(size_t(t.numel()));
        const size_t rb = quant::row_bytes(*format, cols);
        for (int64_t r = 0; r < rows; ++r)
          quant::dequantize_row(*format, t.data.data() + size_t(r) * rb, cols, v.data() + r * cols);
      }
    }
    for (size_t i = 0; i < v.size(); ++i)
      if (!std::isfinite(v[i])) fail(t, "holds a non-finite value (NaN or infinity) at element " + std::to_string(i));
    return v;
  }

  static std::string unsupported_types() {
    return "; lmtune reads F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K and Q6_K (re-quantize the model with one of these)";
  }

  Tensor dense(const std::string& hf_name, const GgufTensor& t, const Shape& shape, ParamInit init) const {
    std::vector<float> v = floats(t, shape);
    const int64_t cols = shape.back();
    if (auto order = row_order(hf_name, shape[0]); !order.empty()) {
      std::vector<float> out(v.size());
      for (size_t r = 0; r < order.size(); ++r)
        std::copy_n(v.begin() + order[r] * cols, cols, out.begin() + int64_t(r) * cols);
      v = std::move(out);
    }
    if (gemma && init == ParamInit::norm)
      for (float& x : v) x -= 1.0f;  // lmtune keeps Gemma's norms as offsets from 1, as transformers does
    std::vector<std::byte> bytes = convert_from_f32(v, dtype);
    Tensor out = Tensor::empty(shape, dtype, device);
    if (!bytes.empty()) backend(device).write(*out.buffer(), 0, bytes.data(), bytes.size());
    return out;
  }

  quant::QuantizedTensor blocks(const std::string& hf_name, const GgufTensor& t, const Shape& shape,
                                quant::Format format) const {
    const size_t rb = quant::row_bytes(format, shape[1]);
    if (auto order = row_order(hf_name, shape[0]); !order.empty())
      return quant::from_blocks(format, shape, gather_rows(t.data, order, rb), device);
    return quant::from_blocks(format, shape, t.data, device);
  }

  void load(const ParamRef& p, std::set<std::string>& used) const {
    const std::string name = gguf_tensor_name(p.name, config);
    const GgufTensor* t = file.find_tensor(name);
    if (!t)
      throw FileError(file.path().string() + ": missing tensor '" + name + "' (required by " + config.model_type +
                      " with " + std::to_string(config.num_hidden_layers) + " layers)");
    if (t->shape() != p.shape)
      fail(*t, "has shape " + to_string(t->shape()) + " but the model's metadata implies " + to_string(p.shape));
    used.insert(name);
    auto format = quant::from_ggml_type(int(t->type));
    if (p.linear && format && p.slot == &p.linear->weight) {
      p.linear->qweight = blocks(p.name, *t, p.shape, *format);
      return;
    }
    *p.slot = dense(p.name, *t, p.shape, p.init);
  }
};

}  // namespace

DecoderWeights load_gguf_weights(const ModelConfig& config, const fs::path& path, DType dtype, Device device) {
  if (!is_float(dtype)) throw ConfigError("load_weights: weight dtype must be f32, f16 or bf16");
  GgufFile file(path);
  const std::string arch = file.get_string("general.architecture");
  Loader loader{config, file, dtype, device, arch == "llama", config.norm_style == NormStyle::one_plus_weight};
  DecoderWeights w;
  std::set<std::string> used = {"rope_freqs.weight"};  // read by gguf_model_config
  for (const ParamRef& p : parameter_map(config, w)) loader.load(p, used);
  if (config.tie_word_embeddings) w.lm_head = w.embed;
  std::vector<std::string> unused;
  for (const GgufTensor& t : file.tensors())
    if (!used.count(t.name)) unused.push_back(t.name);
  if (!unused.empty())
    spdlog::warn("{}: {} tensor(s) not used by the {} decoder: {}{}", path.string(), unused.size(), config.model_type,
                 unused[0], unused.size() > 1 ? ", ..." : "");
  return w;
}

}  // namespace lmtune::models
