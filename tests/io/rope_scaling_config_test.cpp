// Rope scaling types dynamic, yarn and longrope in config.json (old rope_scaling and new rope_parameters forms):
// the keys transformers 5 reads and the defaults it fills in, the attention factors it derives, the inverse
// frequencies against independent double-precision formulas (modeling_rope_utils.py), and errors naming the key.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "core/error.h"
#include "io/gguf_model.h"
#include "io/hf_config.h"

namespace lmtune {
namespace {

// A small llama: head_dim 16 (8 frequencies), max_position_embeddings 4096. `extra` is spliced into the object.
std::string llama(const std::string& extra) {
  return R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "vocab_size": 100, "max_position_embeddings": 4096, "rope_theta": 10000.0, )" +
         extra + "}";
}

std::string error_of(const std::string& text) {
  try {
    parse_model_config(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError for " << text;
  return "";
}

double yarn_mscale(double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; }

// transformers' _compute_yarn_parameters in double.
std::vector<double> yarn_expected(double base, int dim, double factor, double old_len, double fast, double slow,
                                  bool truncate) {
  auto corr = [&](double rot) {
    return dim * std::log(old_len / (rot * 2 * std::numbers::pi)) / (2 * std::log(base));
  };
  double low = corr(fast), high = corr(slow);
  if (truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0), high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;
  std::vector<double> out;
  for (int i = 0; i < dim / 2; ++i) {
    double inv = std::pow(base, -2.0 * i / dim);
    double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    out.push_back(inv / factor * ramp + inv * (1 - ramp));
  }
  return out;
}

void expect_near_all(const std::vector<float>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], rel * want[i]) << "i=" << i;
}

TEST(RopeScalingConfig, YarnKeysAndFrequencies) {
  ModelConfig c = parse_model_config(llama(R"("rope_scaling": {"rope_type": "yarn", "factor": 8.0,
      "original_max_position_embeddings": 512, "beta_fast": 16, "beta_slow": 2, "truncate": false})"));
  const RopeConfig& r = c.rope;
  EXPECT_EQ(r.type, RopeType::yarn);
  EXPECT_EQ(r.original_max_pos, 512);
  EXPECT_DOUBLE_EQ(r.beta_fast, 16);
  EXPECT_DOUBLE_EQ(r.beta_slow, 2);
  EXPECT_FALSE(r.truncate);
  EXPECT_DOUBLE_EQ(r.attention_factor, 0.1 * std::log(8.0) + 1.0);  // get_mscale(factor)
  EXPECT_EQ(c.layers[1].rope, r);
  expect_near_all(rope_inv_freq(r, 16), yarn_expected(10000.0, 16, 8.0, 512, 16, 2, false), 2e-6);
  // Frequencies do not depend on the call's length.
  EXPECT_EQ(rope_inv_freq(r, 16, 100000), rope_inv_freq(r, 16, 3));
  EXPECT_FALSE(rope_depends_on_length(r));

  // Defaults: betas 32 / 1 (also for 0: `beta_fast or 32`), truncate on; the ramp over whole dimensions.
  c = parse_model_config(llama(R"("rope_scaling": {"type": "yarn", "factor": 4.0, "beta_fast": 0,
      "original_max_position_embeddings": 1024})"));
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 32);
  EXPECT_DOUBLE_EQ(c.rope.beta_slow, 1);
  EXPECT_TRUE(c.rope.truncate);
  expect_near_all(rope_inv_freq(c.rope, 16), yarn_expected(10000.0, 16, 4.0, 1024, 32, 1, true), 2e-6);
}

TEST(RopeScalingConfig, YarnAttentionFactorAndOriginalLength) {
  // DeepSeek style: mscale / mscale_all_dim.
  ModelConfig c = parse_model_config(llama(R"("rope_parameters": {"rope_type": "yarn", "factor": 40,
      "original_max_position_embeddings": 4096, "mscale": 1.0, "mscale_all_dim": 0.707, "rope_theta": 50000})"));
  EXPECT_DOUBLE_EQ(c.rope.theta, 50000);
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, yarn_mscale(40, 1.0) / yarn_mscale(40, 0.707));
  // An explicit attention_factor wins.
  c = parse_model_config(llama(R"("rope_scaling": {"rope_type": "yarn", "factor": 4, "attention_factor": 0.9,
      "mscale": 1.0, "mscale_all_dim": 0.5})"));
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, 0.9);
  // original_max_position_embeddings: defaults to max_position_embeddings; a top-level key (Phi-3 style) wins
  // over the dict's; factor null is max_position_embeddings / original.
  EXPECT_EQ(c.rope.original_max_pos, 4096);
  c = parse_model_config(llama(R"("original_max_position_embeddings": 1024, "rope_scaling": {"rope_type": "yarn",
      "factor": null, "original_max_position_embeddings": 2048})"));
  EXPECT_EQ(c.rope.original_max_pos, 1024);
  EXPECT_DOUBLE_EQ(c.rope.factor, 4.0);
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, yarn_mscale(4.0, 1.0));
}

TEST(RopeScalingConfig, DynamicGrowsItsBasePastMaxPositions) {
  ModelConfig c = parse_model_config(llama(R"("rope_scaling": {"type": "dynamic", "factor": 2.0})"));
  const RopeConfig& r = c.rope;
  EXPECT_EQ(r.type, RopeType::dynamic);
  EXPECT_EQ(r.original_max_pos, 4096);  // max_position_embeddings
  EXPECT_DOUBLE_EQ(r.attention_factor, 1.0);
  EXPECT_TRUE(rope_depends_on_length(r));
  RopeConfig plain;
  plain.theta = 10000.0;
  EXPECT_EQ(rope_inv_freq(r, 16, 0), rope_inv_freq(plain, 16));
  EXPECT_EQ(rope_inv_freq(r, 16, 4096), rope_inv_freq(plain, 16));
  for (int64_t len : {4097, 10000}) {
    double base = 10000.0 * std::pow(2.0 * double(len) / 4096 - 1.0, 16.0 / 14.0);
    std::vector<double> want;
    for (int i = 0; i < 8; ++i) want.push_back(std::pow(base, -2.0 * i / 16));
    expect_near_all(rope_inv_freq(r, 16, len), want, 2e-6);
  }
}

TEST(RopeScalingConfig, LongropeFactorsByLength) {
  ModelConfig c = parse_model_config(llama(R"("original_max_position_embeddings": 1024, "rope_scaling": {
      "rope_type": "longrope", "short_factor": [1, 1, 1.5, 2, 2, 3, 4, 5],
      "long_factor": [1, 2, 3, 4, 5, 6, 7, 8.5]})"));
  const RopeConfig& r = c.rope;
  EXPECT_EQ(r.type, RopeType::longrope);
  EXPECT_EQ(r.original_max_pos, 1024);
  // Phi-3: no factor, so max_position_embeddings / original = 4 sets the attention factor.
  EXPECT_DOUBLE_EQ(r.attention_factor, std::sqrt(1 + std::log(4.0) / std::log(1024.0)));
  EXPECT_TRUE(rope_depends_on_length(r));
  for (int64_t len : {0, 1024, 1025}) {
    const std::vector<double>& ext = len > 1024 ? r.long_factor : r.short_factor;
    std::vector<double> want;
    for (int i = 0; i < 8; ++i) want.push_back(std::pow(10000.0, -2.0 * i / 16) / ext[size_t(i)]);
    expect_near_all(rope_inv_freq(r, 16, len), want, 2e-6);
  }
  // factor given: it sets the attention factor; factor <= 1: none; attention_factor given: that.
  c = parse_model_config(llama(R"("rope_parameters": {"rope_type": "longrope", "factor": 16,
      "original_max_position_embeddings": 256, "short_factor": [1, 1, 1, 1, 1, 1, 1, 1],
      "long_factor": [1, 1, 1, 1, 1, 1, 1, 1]})"));
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, std::sqrt(1 + std::log(16.0) / std::log(256.0)));
  c = parse_model_config(llama(R"("rope_scaling": {"rope_type": "longrope", "short_factor": [1, 1, 1, 1, 1, 1, 1, 1],
      "long_factor": [1, 1, 1, 1, 1, 1, 1, 1]})"));
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, 1.0);  // original = max_position_embeddings: factor 1
  // Partial rotary: one factor per rotated frequency.
  c = parse_model_config(llama(R"("partial_rotary_factor": 0.5, "rope_scaling": {"rope_type": "longrope",
      "attention_factor": 1.2, "short_factor": [1, 1, 1, 1], "long_factor": [2, 2, 2, 2]})"));
  EXPECT_EQ(c.rotary_dim, 8);
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, 1.2);
  EXPECT_EQ(rope_inv_freq(c.rope, 8, 5000).size(), 4u);
}

TEST(RopeScalingConfig, ErrorsNameTheKeyPath) {
  struct Case {
    std::string extra, message;
  };
  const Case cases[] = {
      {R"("rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 512})",
       "config.json: key 'rope_scaling.factor': missing (required for rope type 'yarn')"},
      {R"("rope_scaling": {"rope_type": "yarn", "factor": -2})", "key 'rope_scaling.factor': must be positive"},
      {R"("rope_scaling": {"rope_type": "yarn", "factor": 4, "beta_fast": "fast"})",
       "key 'rope_scaling.beta_fast': expected a number"},
      {R"("rope_scaling": {"rope_type": "yarn", "factor": 4, "truncate": "yes"})",
       "key 'rope_scaling.truncate': expected true or false"},
      {R"("rope_scaling": {"rope_type": "yarn", "factor": 4, "attention_factor": 0})",
       "key 'rope_scaling.attention_factor': must be positive"},
      {R"("rope_scaling": {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 0})",
       "key 'rope_scaling.original_max_position_embeddings': must be positive"},
      {R"("rope_scaling": {"type": "dynamic"})",
       "key 'rope_scaling.factor': missing (required for rope type 'dynamic')"},
      {R"("rope_parameters": {"rope_type": "longrope", "long_factor": [1, 1, 1, 1, 1, 1, 1, 1]})",
       "key 'rope_parameters.short_factor': missing (required for rope type 'longrope')"},
      {R"("rope_scaling": {"rope_type": "longrope", "short_factor": [1, 1, 1, 1, 1, 1, 1, 1],
          "long_factor": [1, 2, 3]})",
       "key 'rope_scaling.long_factor': has 3 entries; expected 8 (rotary dimension / 2)"},
      {R"("rope_scaling": {"rope_type": "longrope", "short_factor": [1, 1, 1, 1, 1, 1, 1, "x"],
          "long_factor": [1, 1, 1, 1, 1, 1, 1, 1]})",
       "key 'rope_scaling.short_factor': expected a list of numbers"},
      {R"("rope_scaling": {"rope_type": "longrope", "short_factor": 2, "long_factor": [1, 1, 1, 1, 1, 1, 1, 1]})",
       "key 'rope_scaling.short_factor': expected a list of numbers"},
      {R"("rope_scaling": {"rope_type": "longrope", "short_factor": [1, 1, 1, 1, 1, 1, 1, 0],
          "long_factor": [1, 1, 1, 1, 1, 1, 1, 1]})",
       "key 'rope_scaling.short_factor': must be positive"},
      {R"("original_max_position_embeddings": "long", "rope_scaling": {"rope_type": "yarn", "factor": 2})",
       "key 'original_max_position_embeddings': expected an integer"},
  };
  for (const Case& c : cases) {
    std::string msg = error_of(llama(c.extra));
    EXPECT_NE(msg.find(c.message), std::string::npos) << "got: " << msg << "\nwanted: " << c.message;
  }
}

TEST(RopeScalingConfig, GgufExportRefusesTheNewTypes) {
  for (const char* scaling : {R"({"type": "dynamic", "factor": 2})", R"({"rope_type": "yarn", "factor": 2})",
                              R"({"rope_type": "longrope", "short_factor": [1, 1, 1, 1, 1, 1, 1, 1],
                                  "long_factor": [1, 1, 1, 1, 1, 1, 1, 1]})"}) {
    ModelConfig c = parse_model_config(llama(std::string(R"("rope_scaling": )") + scaling));
    try {
      gguf_config_metadata(c, "m", 0);
      ADD_FAILURE() << "exported " << scaling;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(rope_type_name(c.rope.type)) + " rope scaling"),
                std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace lmtune
