// Recipe parsing: defaults, overrides, bases, and errors that name the key and line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "train/recipe.h"

using namespace lmtune;

namespace {
const char* kMinimal = "model: m\ndata:\n  train: t.jsonl\n";

std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_recipe(yaml, "r.yaml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Recipe, DefaultsAndValues) {
  Recipe r = parse_recipe(std::string(kMinimal) + "lora:\n  rank: 8\n  targets: all-linear\noptimizer:\n  betas: [0.8, 0.95]\n", "r.yaml");
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.lora.rank, 8);
  EXPECT_EQ(r.lora.alpha, 32);
  ASSERT_EQ(r.lora.targets.size(), 1u);
  EXPECT_EQ(r.lora.targets[0], "all-linear");
  EXPECT_DOUBLE_EQ(r.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(r.optimizer.beta2, 0.95);
  EXPECT_EQ(r.schedule.name, "cosine");
}

TEST(Recipe, DottedOverrides) {
  Recipe r = parse_recipe(kMinimal, "r.yaml", {"lora.rank=4", "optimizer.lr=1e-3", "train.grad_checkpointing=false",
                                              "lora.targets=[q_proj, v_proj]"});
  EXPECT_EQ(r.lora.rank, 4);
  EXPECT_DOUBLE_EQ(r.optimizer.lr, 1e-3);
  EXPECT_FALSE(r.train.grad_checkpointing);
  EXPECT_EQ(r.lora.targets, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_NE(r.resolved_yaml.find("rank: 4"), std::string::npos);
}

TEST(Recipe, UnknownKeysNameKeyAndLine) {
  std::string e = error_of(std::string(kMinimal) + "lora:\n  rnk: 8\n");
  EXPECT_NE(e.find("r.yaml:5"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key 'lora.rnk'"), std::string::npos) << e;
  EXPECT_NE(e.find("rank"), std::string::npos) << e;
  e = error_of(kMinimal, {"train.stpes=3"});
  EXPECT_NE(e.find("unknown key 'train.stpes'"), std::string::npos) << e;
}

// Found by fuzz_recipe: a complex key ("? :" or "? [a, b]") escaped as yaml-cpp's bad conversion.
TEST(Recipe, ComplexKeysAreErrors) {
  for (const std::string extra : {"? :\n", "? [a, b]\n: 1\n", "lora:\n  ? {x: 1}\n  : 2\n"}) {
    const std::string e = error_of(std::string(kMinimal) + extra);
    EXPECT_NE(e.find("must be a plain name"), std::string::npos) << extra << ": " << e;
    EXPECT_NE(e.find("r.yaml:"), std::string::npos) << e;
  }
}

TEST(Recipe, WrongTypesAndValues) {
  EXPECT_NE(error_of(kMinimal, {"lora.rank=abc"}).find("key 'lora.rank': expected an integer"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"precision=fp8"}).find("'fp8' is not one of fp32, fp16, bf16"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"train.steps=0"}).find("'train.steps' must be a finite number > 0"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"lora.dropout=1.5"}).find("lora.dropout"), std::string::npos);
  EXPECT_NE(error_of("data:\n  train: x\n").find("'model' is required"), std::string::npos);
  EXPECT_NE(error_of("model: [unclosed\n").find("invalid YAML"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"noequals"}).find("key.sub=value"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"train.router_aux_loss_coef=-0.1"})
                .find("'train.router_aux_loss_coef' must be a non-negative number"),
            std::string::npos);
  EXPECT_FALSE(parse_recipe(kMinimal, "r").train.router_aux_loss_coef);
  EXPECT_EQ(*parse_recipe(kMinimal, "r", {"train.router_aux_loss_coef=0.02"}).train.router_aux_loss_coef, 0.02);
}

// Values that used to train (a NaN adapter, a negative learning rate) or be ignored are refused with the key.
TEST(Recipe, NonFiniteAndOutOfRangeValues) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"optimizer.lr=.nan", "'optimizer.lr' must be a finite number > 0"},
      {"optimizer.lr=.inf", "'optimizer.lr' must be a finite number > 0"},
      {"lora.alpha=-2", "'lora.alpha' must be a finite number > 0"},
      {"schedule.min_lr_ratio=-1", "'schedule.min_lr_ratio' must be in [0, 1]"},
      {"optimizer.momentum=-1", "'optimizer.momentum' must be in [0, 1)"},
      {"eval.batches=-1", "'eval.batches' must be a finite number >= 0"},
      {"train.grad_clip=.nan", "'train.grad_clip' must be a finite number >= 0"},
      {"lora.dropout=.nan", "'lora.dropout' must be in [0, 1)"},
  };
  for (const auto& [item, want] : cases) {
    const std::string e = error_of(kMinimal, {item});
    EXPECT_NE(e.find(want), std::string::npos) << item << ": " << e;
  }
  EXPECT_EQ(error_of(kMinimal, {"schedule.min_lr_ratio=1", "optimizer.momentum=0.9"}), "");
  const std::string e = error_of(std::string(kMinimal) + "lora:\n  rank: 8\n  rank: 16\n");
  EXPECT_NE(e.find("r.yaml:6"), std::string::npos) << e;
  EXPECT_NE(e.find("key 'lora.rank' is set twice"), std::string::npos) << e;
}

// Sizes no device could hold are refused by the parser, before any data or model is read.
TEST(Recipe, AbsurdSizesAreRefused) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"lora.rank=1000000", "'lora.rank' must be in [1, 65536]"},
      {"train.batch_size=1000000000", "'train.batch_size' must be in [1, 65536]"},
      {"data.max_seq_len=1000000000", "'data.max_seq_len' must be in [2, 16777216]"},
      {"train.grad_accum=100000", "'train.grad_accum' must be in [1, 65536]"},
  };
  for (const auto& [item, want] : cases) {
    const std::string e = error_of(kMinimal, {item});
    EXPECT_NE(e.find(want), std::string::npos) << item << ": " << e;
  }
  const std::string e = error_of(kMinimal, {"train.batch_size=65536", "data.max_seq_len=16777216"});
  EXPECT_NE(e.find("train.batch_size 65536 x data.max_seq_len 16777216 x train.grad_accum 1 is beyond 67108864 "
                   "tokens per micro-batch"), std::string::npos) << e;
  EXPECT_NE(error_of(kMinimal, {"train.batch_size=4096", "data.max_seq_len=16384", "train.grad_accum=64"}), "");
  EXPECT_EQ(error_of(kMinimal, {"train.batch_size=65536", "data.max_seq_len=1024", "lora.rank=65536"}), "");
}

TEST(Recipe, BaseFilesLayer) {
  auto dir = std::filesystem::temp_directory_path() / "lmtune_recipe_test";
  std::filesystem::create_directories(dir / "configs");
  std::ofstream(dir / "configs" / "base.yaml") << "lora:\n  rank: 32\n  alpha: 64\ntrain:\n  steps: 7\n";
  std::ofstream(dir / "r.yaml") << "base: configs/base.yaml\nmodel: m\ndata:\n  train: t\nlora:\n  rank: 8\n";
  Recipe r = load_recipe(dir / "r.yaml", {"train.seed=3"});
  EXPECT_EQ(r.lora.rank, 8);
  EXPECT_EQ(r.lora.alpha, 64);
  EXPECT_EQ(r.train.steps, 7);
  EXPECT_EQ(r.train.seed, 3u);
  EXPECT_THROW(load_recipe(dir / "missing.yaml"), ConfigError);
  // A complex key over a base file is refused like one without (fuzz_recipe's finding, through the overlay).
  std::ofstream(dir / "c.yaml") << "base: configs/base.yaml\nmodel: m\ndata:\n  train: t\n? [a, b]\n: 1\n";
  EXPECT_THROW(load_recipe(dir / "c.yaml"), ConfigError);
  std::filesystem::remove_all(dir);
}

TEST(Recipe, ShippedRecipesParse) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(LMTUNE_SOURCE_DIR) / "recipes")) {
    if (e.path().extension() != ".yaml") continue;
    Recipe r = load_recipe(e.path());
    EXPECT_FALSE(r.model.empty()) << e.path();
    ++n;
  }
  EXPECT_GE(n, 5);
}

TEST(Recipe, PreferenceObjectiveKeys) {
  Recipe sft = parse_recipe(kMinimal, "r.yaml");
  EXPECT_EQ(sft.objective, Objective::sft);
  Recipe r = parse_recipe(std::string(kMinimal) + "objective: simpo\npreference: {beta: 2.5, gamma: 1.0}\n", "r.yaml",
                          {"preference.label_smoothing=0.1"});
  EXPECT_EQ(r.objective, Objective::simpo);
  EXPECT_DOUBLE_EQ(r.preference.beta, 2.5);
  EXPECT_DOUBLE_EQ(r.preference.gamma, 1.0);
  EXPECT_DOUBLE_EQ(r.preference.label_smoothing, 0.1);
  EXPECT_NE(error_of(kMinimal, {"objective=ppo"}).find("'ppo' is not one of sft, dpo, orpo, simpo"),
            std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "objective: dpo\nfinetune: full\n")
                .find("key 'objective': dpo needs finetune: lora"),
            std::string::npos);
  EXPECT_EQ(error_of(kMinimal, {"objective=orpo", "finetune=full"}), "");
  EXPECT_NE(error_of(kMinimal, {"preference.beta=0"}).find("key 'preference.beta'"), std::string::npos);
  EXPECT_NE(error_of(kMinimal, {"preference.label_smoothing=0.5"}).find("key 'preference.label_smoothing'"),
            std::string::npos);
}
