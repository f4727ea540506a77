// GGUF output checks that need no quantized products: the type table (llama-quantize's choices), a q8_0 and a q4_k
// export of a model wide enough for 256-element blocks (file type, each tensor's type, and every block dequantized
// back within the format's error of the dense weights, q/k permutation undone), the LoRA form (keys, names, ggml
// dims, lora_a = PEFT's A, lora_b = B with the llama q/k rows permuted, alpha folding the spec's multiplier), and
// @huggingface/gguf reading the files as lmtune does.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "common/gguf_oracle.h"
#include "core/autodiff.h"
#include "core/error.h"
#include "core/quant.h"
#include "infer/export_gguf.h"
#include "infer_test_util.h"
#include "io/safetensors.h"
#include "models/adapters.h"
#include "models/init_model.h"
#include "models/weights.h"

namespace lmtune::infer {
namespace {

using test::TempDir;
namespace fs = std::filesystem;

TEST(GgufExport, TensorTypesFollowLlamaQuantize) {
  const std::vector<int64_t> mat{256, 512}, odd{64, 512}, vec{256};
  EXPECT_EQ(gguf_tensor_type("blk.0.attn_q.weight", mat, GgufQuant::q4_k, false), GgmlType::Q4_K);
  EXPECT_EQ(gguf_tensor_type("output.weight", mat, GgufQuant::q4_k, false), GgmlType::Q6_K);
  EXPECT_EQ(gguf_tensor_type("token_embd.weight", mat, GgufQuant::q4_k, false), GgmlType::Q4_K);
  EXPECT_EQ(gguf_tensor_type("token_embd.weight", mat, GgufQuant::q4_k, true), GgmlType::Q6_K);  // the tied head
  EXPECT_EQ(gguf_tensor_type("blk.0.attn_q.weight", odd, GgufQuant::q4_k, false), GgmlType::F16);
  EXPECT_EQ(gguf_tensor_type("blk.0.attn_q.weight", odd, GgufQuant::q8_0, false), GgmlType::Q8_0);
  EXPECT_EQ(gguf_tensor_type("blk.0.attn_norm.weight", vec, GgufQuant::q8_0, false), GgmlType::F32);
  EXPECT_EQ(gguf_tensor_type("blk.0.attn_q.weight", mat, GgufQuant::f16, false), GgmlType::F16);
  EXPECT_EQ(gguf_tensor_type("blk.0.attn_q.weight", mat, GgufQuant::f32, false), GgmlType::F32);
  EXPECT_THROW(parse_gguf_quant("q3_k"), ConfigError);
  EXPECT_EQ(parse_gguf_quant("Q8_0"), GgufQuant::q8_0);
}

// A random llama model with 256-wide rows (untied, so output.weight is its own tensor) and the llama2 tokenizer.
const fs::path& wide_model() {
  static TempDir dir;
  static fs::path model = [] {
    std::ofstream(dir.path / "wide.yaml") << "model_type: llama\nhidden_size: 256\nintermediate_size: 512\n"
                                             "num_hidden_layers: 1\nnum_attention_heads: 4\nnum_key_value_heads: 2\n"
                                             "max_position_embeddings: 256\ntie_word_embeddings: false\n";
    models::InitOptions o;
    o.preset = dir.path / "wide.yaml";
    o.tokenizer_dir = fs::path(LMTUNE_SOURCE_DIR) / "tests/fixtures/npm/llama2/models";
    o.out = dir.path / "wide";
    o.seed = 5;
    o.dtype = DType::f32;
    models::init_model_dir(o);
    return o.out;
  }();
  return model;
}

// sqrt(mean (a - b)^2 / mean b^2).
double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

void expect_quantized_export(GgufQuant quant, int file_type, GgmlType linear, GgmlType head, double tol) {
  NoGrad no_grad;
  TempDir out;
  const fs::path file = out.path / "m.gguf";
  export_merged_gguf(wide_model(), {}, file, quant);
  GgufFile f(file);
  EXPECT_EQ(f.get_int("general.file_type"), file_type);
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight").type, linear);
  EXPECT_EQ(f.tensor("blk.0.ffn_down.weight").type, linear);
  EXPECT_EQ(f.tensor("token_embd.weight").type, linear);
  EXPECT_EQ(f.tensor("output.weight").type, head);
  EXPECT_EQ(f.tensor("blk.0.attn_norm.weight").type, GgmlType::F32);
  EXPECT_EQ(f.tensor("output_norm.weight").type, GgmlType::F32);
  // Every block of ffn_down (not permuted) dequantized by quant.h against the dense weight.
  models::Decoder src = models::load_decoder(wide_model(), DType::f32, DType::f32, Device::cpu());
  const GgufTensor& down = f.tensor("blk.0.ffn_down.weight");
  const int64_t cols = down.dims[0], rows = down.dims[1];
  const auto format = *quant::from_ggml_type(int(down.type));
  std::vector<float> deq(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    quant::dequantize_row(format, down.data.data() + size_t(r) * quant::row_bytes(format, cols), cols,
                          deq.data() + r * cols);
  EXPECT_LT(rel_rms(deq, src.weights().layers[0].mlp.down.weight.to_floats()), tol);
  // Every tensor as lmtune reads the file back (q/k permutation undone, quantized linears dequantized).
  ModelConfig config = load_model_config(file);
  models::DecoderWeights back = models::load_gguf_weights(config, file, DType::f32, Device::cpu());
  std::vector<models::ParamRef> want = models::parameter_map(src.config(), src.weights());
  std::vector<models::ParamRef> got = models::parameter_map(config, back);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const models::ParamRef& g = got[i];
    std::vector<float> v = g.slot->defined() ? g.slot->to_floats()
                                             : quant::dequantize(g.linear->qweight, DType::f32).to_floats();
    EXPECT_LT(rel_rms(v, want[i].slot->to_floats()), want[i].init == models::ParamInit::norm ? 1e-7 : tol)
        << want[i].name;
  }
  if (auto why = lmtune::test::gguf_oracle_unavailable()) GTEST_SKIP() << "GGUF oracle unavailable: " << *why;
  lmtune::test::expect_oracle_agrees(file);
}

TEST(GgufExport, Q8_0BlocksMatchTheDenseWeights) {
  expect_quantized_export(GgufQuant::q8_0, 7, GgmlType::Q8_0, GgmlType::Q8_0, 0.01);
}

TEST(GgufExport, Q4_KBlocksMatchTheDenseWeights) {
  expect_quantized_export(GgufQuant::q4_k, 14, GgmlType::Q4_K, GgmlType::Q6_K, 0.12);
}

std::vector<float> floats_of(const GgufTensor& t) {
  std::vector<float> v(size_t(t.numel()));
  std::memcpy(v.data(), t.data.data(), v.size() * 4);
  return v;
}

TEST(GgufExport, LoraKeysNamesShapesAndValues) {
  NoGrad no_grad;
  TempDir dir;
  const fs::path model = test::model_fixture("llama");  // hidden 32, 4 heads of 8, 2 kv heads
  models::Decoder m = models::load_decoder(model, DType::f32, DType::f32, Device::cpu());
  models::add_lora(m.weights(), {"q_proj", "k_proj", "v_proj"}, 2, 1.0f, 7, "t");
  uint64_t seed = 70;
  for (models::Linear* l : m.weights().linears())
    for (auto& a : l->adapters) a.B = Tensor::randn(a.B.shape(), seed++, 0.2f);
  PeftAdapter peft = models::extract_peft(m.weights(), "t", 2, 4.0, false, 0.0, "fixture");
  save_peft_adapter(peft, dir.path / "ad");
  export_adapter_gguf(model, parse_adapter_spec((dir.path / "ad").string() + ":0.5"), dir.path / "out/a.gguf");

  GgufFile f(dir.path / "out/a.gguf");
  EXPECT_EQ(f.get_string("general.type"), "adapter");
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_string("adapter.type"), "lora");
  EXPECT_FLOAT_EQ(float(f.get_float("adapter.lora.alpha")), 2.0f);  // alpha 4 at multiplier 0.5
  EXPECT_EQ(f.tensors().size(), 2 * peft.modules.size());
  for (const auto& [module, lw] : peft.modules) {
    const std::string base = models::gguf_tensor_name(module + ".weight", m.config());
    const GgufTensor& a = f.tensor(base + ".lora_a");
    const GgufTensor& b = f.tensor(base + ".lora_b");
    const int64_t out = lw.b_shape[0], in = lw.a_shape[1];
    EXPECT_EQ(a.dims, (std::vector<int64_t>{in, 2})) << base;  // llama.cpp: a->ne[0] = the weight's ne[0]
    EXPECT_EQ(b.dims, (std::vector<int64_t>{2, out})) << base;  // b->ne[1] = the weight's ne[1], a->ne[1] = b->ne[0]
    EXPECT_EQ(floats_of(a), lw.a) << base;
    std::vector<float> want = lw.b;
    if (module.find("q_proj") != std::string::npos || module.find("k_proj") != std::string::npos) {
      const int64_t D = 8, half = 4;  // GGUF row h·D + 2k + j holds HF row h·D + j·half + k
      for (int64_t h = 0; h < out / D; ++h)
        for (int64_t k = 0; k < half; ++k)
          for (int64_t j = 0; j < 2; ++j)
            for (int64_t c = 0; c < 2; ++c)
              want[size_t((h * D + 2 * k + j) * 2 + c)] = lw.b[size_t((h * D + j * half + k) * 2 + c)];
      EXPECT_NE(want, lw.b) << base;
    }
    EXPECT_EQ(floats_of(b), want) << base;
  }
  std::ifstream modelfile(dir.path / "out/Modelfile");
  std::string text((std::istreambuf_iterator<char>(modelfile)), {});
  EXPECT_NE(text.find("\nFROM " + fs::absolute(model).lexically_normal().string() + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nADAPTER ./a.gguf\n"), std::string::npos) << text;
  if (auto why = lmtune::test::gguf_oracle_unavailable()) GTEST_SKIP() << "GGUF oracle unavailable: " << *why;
  lmtune::test::expect_oracle_agrees(dir.path / "out/a.gguf");
}

}  // namespace
}  // namespace lmtune::infer
