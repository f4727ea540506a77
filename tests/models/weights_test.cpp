// HF name mapping: malformed checkpoints give clear errors; multimodal name prefixes load; save -> load round
// trips (single file and shards, f32 and bf16); random initialisation; config.json writing round trips;
// parameter counts of real models; the memory estimate.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>

#include "core/autodiff.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "models/decoder.h"
#include "models/hf_config_writer.h"
#include "models/memory.h"
#include "models/weights.h"
#include "models_test_util.h"

namespace lmtune::models {
namespace {
namespace fs = std::filesystem;
using test::fixture_dir;
using test::rel_err;

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::path(LMTUNE_BINARY_DIR) / "test_models_tmp" / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// Copies a single-file fixture, renaming (empty new name: dropping) or reshaping tensors on the way.
fs::path rewrite_fixture(const std::string& arch, const std::string& out_name,
                         const std::function<std::string(const std::string&)>& rename,
                         const std::string& reshape_name = "", const Shape& new_shape = {}) {
  fs::path dir = temp_dir(out_name);
  fs::copy_file(fixture_dir(arch) / "config.json", dir / "config.json");
  SafetensorsFile in(fixture_dir(arch) / "model.safetensors");
  std::vector<TensorToWrite> out;
  for (const SafetensorsTensor& t : in.tensors()) {
    std::string n = rename(t.name);
    if (n.empty()) continue;
    Shape s = t.name == reshape_name ? new_shape : t.shape;
    out.push_back({n, t.st_dtype, s, t.data});
  }
  write_safetensors(dir / "model.safetensors", out);
  return dir;
}

std::string keep(const std::string& n) { return n; }

// Copies a single-file fixture with tensor `name` stored as `dtype` and `edit` applied to its values first.
fs::path rewrite_tensor(const std::string& arch, const std::string& out_name, const std::string& name, StDType dtype,
                        const std::function<void(std::vector<float>&)>& edit) {
  fs::path dir = temp_dir(out_name);
  fs::copy_file(fixture_dir(arch) / "config.json", dir / "config.json");
  SafetensorsFile in(fixture_dir(arch) / "model.safetensors");
  std::vector<TensorToWrite> out;
  std::vector<std::byte> bytes;
  for (const SafetensorsTensor& t : in.tensors()) {
    if (t.name != name) {
      out.push_back({t.name, t.st_dtype, t.shape, t.data});
      continue;
    }
    std::vector<float> v = t.to_f32();
    edit(v);
    if (auto lm = to_lmtune_dtype(dtype)) bytes = convert_from_f32(v, *lm);
    else bytes.assign(size_t(t.numel()) * st_dtype_bits(dtype) / 8, std::byte{1});  // integer or bool flags
    out.push_back({t.name, dtype, t.shape, bytes});
  }
  write_safetensors(dir / "model.safetensors", out);
  return dir;
}

template <class E>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Weights, MissingTensorNamesTensorAndFile) {
  const std::string gone = "model.layers.1.mlp.up_proj.weight";
  fs::path dir = rewrite_fixture("llama", "missing", [&](const std::string& n) { return n == gone ? "" : n; });
  std::string msg = error_of<FileError>([&] { load_decoder(dir, DType::f32, DType::f32, Device::cpu()); });
  EXPECT_NE(msg.find(gone), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
}

TEST(Weights, UntiedModelWithoutLmHeadIsAnError) {
  fs::path dir = rewrite_fixture("llama", "no_head", [](const std::string& n) { return n == "lm_head.weight" ? "" : n; });
  std::string msg = error_of<FileError>([&] { load_decoder(dir, DType::f32, DType::f32, Device::cpu()); });
  EXPECT_NE(msg.find("lm_head.weight"), std::string::npos) << msg;
}

TEST(Weights, WrongShapeNamesTensorAndShapes) {
  const std::string name = "model.layers.0.self_attn.k_proj.weight";  // [16, 32] in the fixture
  fs::path dir = rewrite_fixture("llama", "bad_shape", keep, name, {32, 16});
  std::string msg = error_of<FileError>([&] { load_decoder(dir, DType::f32, DType::f32, Device::cpu()); });
  EXPECT_NE(msg.find(name), std::string::npos) << msg;
  EXPECT_NE(msg.find("[32, 16]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[16, 32]"), std::string::npos) << msg;
}

TEST(Weights, IntegerOrBoolDtypeNamesTensorAndFile) {
  const std::string name = "model.layers.0.mlp.down_proj.weight";
  for (StDType dt : {StDType::I32, StDType::U32, StDType::I8, StDType::BOOL}) {
    fs::path dir = rewrite_tensor("llama", "int_dtype", name, dt, [](std::vector<float>&) {});
    std::string msg = error_of<FileError>([&] { load_decoder(dir, DType::f32, DType::f32, Device::cpu()); });
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("dtype " + std::string(st_dtype_name(dt))), std::string::npos) << msg;
  }
}

TEST(Weights, NonFiniteValuesNameTensorCountAndFirstIndex) {
  const std::string name = "model.layers.1.self_attn.v_proj.weight";
  for (StDType dt : {StDType::F32, StDType::F16, StDType::BF16}) {
    fs::path dir = rewrite_tensor("llama", "nonfinite", name, dt, [](std::vector<float>& v) {
      v[300] = std::numeric_limits<float>::infinity();
      v[7] = std::nanf("");
      v[v.size() - 1] = -std::numeric_limits<float>::infinity();
    });
    for (DType to : {DType::f32, DType::bf16}) {
      std::string msg = error_of<FileError>([&] { load_decoder(dir, to, DType::f32, Device::cpu()); });
      EXPECT_NE(msg.find(name), std::string::npos) << msg;
      EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
      EXPECT_NE(msg.find("holds 3 non-finite value(s)"), std::string::npos) << msg;
      EXPECT_NE(msg.find("first at element 7"), std::string::npos) << msg;
    }
  }
  // The largest finite values are fine.
  fs::path dir = rewrite_tensor("llama", "large_finite", name, StDType::F32,
                                [](std::vector<float>& v) { v[0] = std::numeric_limits<float>::max(); });
  EXPECT_NO_THROW(load_decoder(dir, DType::f32, DType::f32, Device::cpu()));
}

TEST(Weights, UnknownModelTypeIsAConfigError) {
  fs::path dir = temp_dir("gpt2");
  fs::copy_file(fixture_dir("llama") / "model.safetensors", dir / "model.safetensors");
  write_file_atomic(dir / "config.json", std::string(R"({"model_type": "gpt2", "vocab_size": 128})"));
  std::string msg = error_of<ConfigError>([&] { load_decoder(dir, DType::f32, DType::f32, Device::cpu()); });
  EXPECT_NE(msg.find("gpt2"), std::string::npos) << msg;
}

TEST(Weights, MultimodalPrefixesLoad) {
  NoGrad no_grad;
  Tensor ids = Tensor::from_ints({5, 17, 99, 3, 42, 7}, {1, 6}, Device::cpu());
  Tensor pos = default_positions(1, 6, Device::cpu());
  auto logits = [&](const fs::path& dir) {
    return load_decoder(dir, DType::f32, DType::f32, Device::cpu()).forward(ids, pos).to_floats();
  };
  std::vector<float> want = logits(fixture_dir("gemma3_text"));
  fs::path newer = rewrite_fixture("gemma3_text", "prefix_new", [](const std::string& n) {
    return "model.language_model." + n.substr(6);  // model.X -> model.language_model.X
  });
  fs::path older = rewrite_fixture("llama", "prefix_old", [](const std::string& n) {
    return "language_model." + n;  // model.X -> language_model.model.X, lm_head -> language_model.lm_head
  });
  EXPECT_EQ(rel_err(logits(newer), want), 0.0);
  EXPECT_EQ(rel_err(logits(older), logits(fixture_dir("llama"))), 0.0);
}

// A gemma-3 multimodal wrapper: text settings under text_config, weights under model.language_model.
TEST(Weights, Gemma3WrapperConfigAndNamesLoad) {
  NoGrad no_grad;
  fs::path dir = rewrite_fixture("gemma3_text", "gemma3_wrapper", [](const std::string& n) {
    return "model.language_model." + n.substr(6);
  });
  nlohmann::json text = nlohmann::json::parse(read_file_text(fixture_dir("gemma3_text") / "config.json"));
  text.erase("architectures");
  nlohmann::json wrapper = {{"model_type", "gemma3"}, {"architectures", {"Gemma3ForConditionalGeneration"}},
                            {"text_config", text}, {"vision_config", {{"hidden_size", 8}}}};
  write_file_atomic(dir / "config.json", wrapper.dump());
  Tensor ids = Tensor::from_ints({5, 17, 99, 3, 42, 7}, {1, 6}, Device::cpu());
  Tensor pos = default_positions(1, 6, Device::cpu());
  std::vector<float> want =
      load_decoder(fixture_dir("gemma3_text"), DType::f32, DType::f32, Device::cpu()).forward(ids, pos).to_floats();
  EXPECT_EQ(rel_err(load_decoder(dir, DType::f32, DType::f32, Device::cpu()).forward(ids, pos).to_floats(), want), 0.0);
}

void expect_same_weights(const ModelConfig& c, DecoderWeights a, DecoderWeights b) {
  std::vector<ParamRef> pa = parameter_map(c, a), pb = parameter_map(c, b);
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].slot->dtype(), pb[i].slot->dtype()) << pa[i].name;
    EXPECT_EQ(pa[i].slot->to_floats(), pb[i].slot->to_floats()) << pa[i].name;
  }
}

TEST(Weights, SaveLoadRoundTripsSingleAndSharded) {
  for (std::string arch : {"qwen2", "mistral", "gemma3_text"}) {
    ModelConfig c = load_model_config(fixture_dir(arch));
    DecoderWeights w = load_weights(c, fixture_dir(arch), DType::f32, Device::cpu());
    fs::path one = temp_dir("save_one_" + arch), many = temp_dir("save_many_" + arch);
    save_weights(c, w, one, DType::f32);
    save_weights(c, w, many, DType::f32, /*max_shard_bytes=*/40000);
    EXPECT_TRUE(fs::exists(one / "model.safetensors"));
    EXPECT_TRUE(fs::exists(many / "model.safetensors.index.json"));
    expect_same_weights(c, w, load_weights(c, one, DType::f32, Device::cpu()));
    expect_same_weights(c, w, load_weights(c, many, DType::f32, Device::cpu()));
    // bf16 on disk and on the device: loading converts exactly once.
    fs::path half = temp_dir("save_bf16_" + arch);
    DecoderWeights wb = load_weights(c, fixture_dir(arch), DType::bf16, Device::cpu());
    save_weights(c, wb, half, DType::bf16);
    SafetensorsCheckpoint ck(half);
    EXPECT_EQ(ck.at("model.norm.weight").st_dtype, StDType::BF16);
    expect_same_weights(c, wb, load_weights(c, half, DType::bf16, Device::cpu()));
  }
}

TEST(Weights, InitWeightsFollowsTheNormStyle) {
  for (std::string arch : {"llama", "gemma2"}) {
    ModelConfig c = load_model_config(fixture_dir(arch));
    DecoderWeights w = init_weights(c, 7, 0.02, DType::f32, Device::cpu());
    const float norm = c.norm_style == NormStyle::one_plus_weight ? 0.0f : 1.0f;
    for (float v : w.final_norm.to_floats()) EXPECT_EQ(v, norm);
    std::vector<float> q = w.layers[0].attn.q.weight.to_floats();
    double ss = 0;
    for (float v : q) ss += double(v) * v;
    EXPECT_NEAR(std::sqrt(ss / double(q.size())), 0.02, 0.003);
    EXPECT_EQ(w.lm_head.impl() == w.embed.impl(), c.tie_word_embeddings);
    // Deterministic per seed; different tensors get different values.
    DecoderWeights w2 = init_weights(c, 7, 0.02, DType::f32, Device::cpu());
    EXPECT_EQ(w2.layers[0].attn.q.weight.to_floats(), q);
    EXPECT_NE(w.layers[0].attn.k.weight.to_floats()[0], q[0]);
  }
}

TEST(HfConfigWriter, WrittenConfigsParseBackToTheSameModel) {
  for (const std::string& arch : test::fixture_names()) {
    ModelConfig a = load_model_config(fixture_dir(arch));
    nlohmann::json j = hf_config_json(a, {{"initializer_range", 0.02}});
    ModelConfig b = parse_model_config(j.dump(), arch + " (written)");
    EXPECT_EQ(j["initializer_range"], 0.02);
    EXPECT_EQ(b.model_type, a.model_type);
    EXPECT_EQ(b.architecture, a.architecture);
    EXPECT_EQ(b.hidden_size, a.hidden_size);
    EXPECT_EQ(b.head_dim, a.head_dim);
    EXPECT_EQ(b.num_key_value_heads, a.num_key_value_heads);
    EXPECT_EQ(b.tie_word_embeddings, a.tie_word_embeddings);
    EXPECT_EQ(b.qkv_bias, a.qkv_bias);
    EXPECT_EQ(b.attn_scale, a.attn_scale);
    EXPECT_EQ(b.attn_logit_softcapping, a.attn_logit_softcapping);
    EXPECT_EQ(b.final_logit_softcapping, a.final_logit_softcapping);
    EXPECT_EQ(b.layer_types, a.layer_types) << arch;
    ASSERT_EQ(b.layers.size(), a.layers.size());
    for (size_t i = 0; i < a.layers.size(); ++i) {
      EXPECT_EQ(b.layers[i].sliding_window, a.layers[i].sliding_window) << arch << " layer " << i;
      EXPECT_TRUE(b.layers[i].rope == a.layers[i].rope) << arch << " layer " << i;
      EXPECT_EQ(b.layers[i].head_dim, a.layers[i].head_dim) << arch << " layer " << i;
      EXPECT_EQ(b.layers[i].kv_heads, a.layers[i].kv_heads) << arch << " layer " << i;
      EXPECT_EQ(b.layers[i].kv_source, a.layers[i].kv_source) << arch << " layer " << i;
      EXPECT_EQ(b.layers[i].k_eq_v, a.layers[i].k_eq_v) << arch << " layer " << i;
      EXPECT_EQ(b.layers[i].intermediate_size, a.layers[i].intermediate_size) << arch << " layer " << i;
    }
    EXPECT_EQ(b.per_layer_input_size, a.per_layer_input_size);
    EXPECT_EQ(b.norm_style, a.norm_style);
    EXPECT_EQ(b.v_norm, a.v_norm);
    EXPECT_EQ(b.eos_token_ids, a.eos_token_ids);
  }
}

ModelConfig preset(const std::string& name) {
  // configs/presets/*.yaml hold the same keys as config.json; the CLI converts them. Here: the known shapes.
  if (name == "qwen2.5-0.5b")
    return parse_model_config(R"({"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
      "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
      "tie_word_embeddings": true})");
  return parse_model_config(R"({"model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
      "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
      "head_dim": 64, "tie_word_embeddings": true})");
}

TEST(ParameterCount, MatchesPublishedModels) {
  EXPECT_EQ(parameter_count(preset("qwen2.5-0.5b")), 494032768);  // Qwen2.5-0.5B
  EXPECT_EQ(parameter_count(preset("llama-3.2-1b")), 1235814400);  // Llama-3.2-1B
}

TEST(MemoryEstimate, CheckpointingSavesActivationsAndLoraIsSmall) {
  ModelConfig c = preset("llama-3.2-1b");
  TrainingMemoryOptions o;
  o.batch = 4;
  o.seq = 1024;
  o.rank = 16;
  TrainingMemoryEstimate e = estimate_training_memory(c, o);
  EXPECT_EQ(e.weights, uint64_t(1235814400) * 2);
  // LoRA r=16 on all projections of Llama-3.2-1B: 11,272,192 parameters (PEFT's count).
  EXPECT_EQ(e.lora_param_count, 11272192);
  EXPECT_EQ(e.optimizer, 2 * e.lora_params);
  // Checkpointing keeps one layer's activations instead of 16 (the logits are the same either way).
  EXPECT_LT(e.activations_checkpointed - e.logits, (e.activations - e.logits) / 4);
  EXPECT_GT(e.activations_checkpointed, e.logits);
  // The PyTorch floor: weights, adapter state, 16 checkpointed [4096, 2048] bf16 layer inputs and one recomputed
  // layer, and the [4096, 128256] logits: bf16 as returned, their f32 copy and its gradient.
  const uint64_t N = 4096, logits = N * 128256 * (2 + 4 + 4);
  EXPECT_EQ(e.floor(true), e.fixed() + 16 * N * 2048 * 2 + e.layer_activations + logits);
  EXPECT_EQ(e.floor(false), e.fixed() + e.activations - e.logits + logits);
  // lmtune's own estimate stays under it (the fused loss never holds [N, V] logits), with room for caches.
  EXPECT_LT(e.total(true), e.floor(true));
  EXPECT_LT(e.total(false), e.floor(false));
}

// QLoRA: the seven projections at the format's block bytes (nf4: 136 per 256 elements) and the one bf16 panel the
// quantized products decode at a time (Llama-3.2-1B's largest projection, 8192 x 2048).
TEST(MemoryEstimate, QuantizedProjectionsCountTheirBlocksAndOneDecodedPanel) {
  ModelConfig c = preset("llama-3.2-1b");
  TrainingMemoryOptions o;
  const uint64_t dense = estimate_training_memory(c, o).weights;
  o.quantize = quant::Format::nf4;
  const uint64_t projections = 16 * uint64_t(2048 * 2048 * 2 + 2048 * 512 * 2 + 3 * 2048 * 8192);
  EXPECT_EQ(estimate_training_memory(c, o).weights,
            dense - projections * 2 + projections * 136 / 256 + uint64_t(8192) * 2048 * 2);
}

// train.checkpoint_layers auto: leaving u layers unchecked swaps u layer inputs for whole layers, and the count
// chosen is the largest whose estimate stays within the floor and what the device has.
TEST(MemoryEstimate, UncheckedLayersStayWithinTheFloor) {
  ModelConfig c = preset("llama-3.2-1b");
  TrainingMemoryOptions o;
  o.batch = 8;
  o.seq = 2048;
  const TrainingMemoryEstimate e = estimate_training_memory(c, o);
  EXPECT_EQ(e.total_checkpointing_all_but(0), e.total(true));
  EXPECT_EQ(e.total_checkpointing_all_but(3), e.total(true) + 3 * (e.layer_activations - e.layer_input));
  EXPECT_EQ(e.total_checkpointing_all_but(e.layers), e.total(false));
  const int64_t u = layers_to_leave_unchecked(e, 0);
  ASSERT_GT(u, 0);
  ASSERT_LT(u, e.layers);  // at batch 8 the PyTorch floor has room for some layers, not all 16
  EXPECT_LE(e.total_checkpointing_all_but(u), e.floor(true));
  EXPECT_GT(e.total_checkpointing_all_but(u + 1), e.floor(true));
  // A device with less memory than the floor bounds it further; one without room for any layer gets none.
  const uint64_t tight = e.total_checkpointing_all_but(2) * 3 / 2;
  EXPECT_LT(layers_to_leave_unchecked(e, tight), u);
  EXPECT_EQ(layers_to_leave_unchecked(e, e.total(true)), 0);
}

}  // namespace
}  // namespace lmtune::models
