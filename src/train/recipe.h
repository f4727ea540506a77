// Training recipes: YAML files (optionally layered on a `base:` file from configs/) plus dotted key=value
// overrides from the command line, validated into a typed Recipe. Unknown keys and wrong types are errors naming
// the file, key and line. docs/recipes.md documents every key.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/quant.h"

namespace lmtune {

enum class Precision { fp32, fp16, bf16 };  // the compute dtype
enum class Finetune { lora, full };
enum class OptimizerName { adamw, sgd };
// What a step minimises: token cross-entropy on SFT data, or a preference objective on prompt/chosen/rejected
// pairs (train/preference.h).
enum class Objective { sft, dpo, orpo, simpo };
// The recipe's spelling of each value ("bf16", "lora", "adamw").
std::string to_string(Precision p);
std::string to_string(Finetune f);
std::string to_string(OptimizerName o);
std::string to_string(Objective o);
// The recipe's spelling of a quantize value: the format's name, or "none".
std::string quantize_name(const std::optional<quant::Format>& f);

struct Recipe {
  std::string model;                 // HF model directory
  std::string device = "auto";       // auto | cpu | vulkan[:N]
  Precision precision = Precision::bf16;  // compute dtype; trainable weights and optimizer state stay fp32
  Finetune finetune = Finetune::lora;
  Objective objective = Objective::sft;
  // Preference objectives (docs/training.md): beta scales the rewards (DPO, SimPO) or weighs ORPO's odds-ratio
  // term; label_smoothing is the assumed fraction of flipped labels (DPO, SimPO); gamma is SimPO's target margin.
  struct Preference {
    double beta = 0.1;
    double label_smoothing = 0;
    double gamma = 0.5;
  } preference;
  // quantize: nf4 | q4_0 | q4_k | q5_k | q6_k | q8_0 | none. The decoder layers' projections are quantized at load
  // and stay frozen (QLoRA); nullopt = none.
  std::optional<quant::Format> quantize;

  struct Data {
    std::string train;
    std::string valid;               // a file, or empty with valid_split
    double valid_split = 0;          // fraction of train held out when valid is empty
    std::string format = "auto";     // auto | text | completion | chat
    int max_seq_len = 1024;
    bool packing = true;
    std::string overlong = "truncate";  // truncate | drop | error
  } data;

  struct Lora {
    int rank = 16;
    double alpha = 32;
    double dropout = 0.05;
    std::vector<std::string> targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    bool rslora = false;
    std::string init_from;           // an existing PEFT adapter directory
  } lora;

  struct Optimizer {
    OptimizerName name = OptimizerName::adamw;
    double lr = 2e-4;
    double beta1 = 0.9, beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0;
    double momentum = 0;             // sgd only
  } optimizer;

  struct Schedule {
    std::string name = "cosine";     // constant | linear | cosine
    int warmup_steps = 0;
    double min_lr_ratio = 0;         // final lr as a fraction of lr (linear, cosine)
  } schedule;

  struct Train {
    int batch_size = 8;
    int grad_accum = 1;
    int steps = 1000;
    double grad_clip = 1.0;          // global-norm clip; 0 disables
    bool grad_checkpointing = true;
    std::string checkpoint_layers = "auto";   // auto | all: with grad_checkpointing, which layers recompute
    std::string transposed_weights = "auto";  // auto | on | off: frozen weights also kept transposed (faster forward)
    uint64_t seed = 42;
    int max_skipped_steps = 10;      // consecutive NaN/Inf steps before stopping
    // Mixture-of-experts models: weight of the router's load-balancing loss added to the training loss. Unset: the
    // model config's router_aux_loss_coef when it sets output_router_logits, else 0 (as transformers trains).
    std::optional<double> router_aux_loss_coef;
  } train;

  struct Eval {
    int every = 100;                 // 0 disables
    int batches = 0;                 // 0: the whole validation set
  } eval;

  struct Save {
    int every = 200;                 // 0: only at the end
    std::string dir = "out/run";
  } save;

  bool resume = false;

  std::filesystem::path source;      // the recipe file
  std::string resolved_yaml;         // the recipe after bases and overrides, for --dry-run and checkpoints
};

// Tokens per micro-batch (batch_size x max_seq_len) and per optimizer step (x grad_accum) a recipe may ask for:
// far beyond any device, and low enough that memory estimates cannot overflow.
constexpr int64_t kMaxMicroBatchTokens = int64_t(1) << 26;
constexpr int64_t kMaxStepTokens = int64_t(1) << 30;

// Loads `file`, layers it over its `base:` chain (paths relative to the including file), applies overrides
// ("lora.rank=16", values parsed as YAML scalars or flow sequences) and validates. Throws ConfigError.
Recipe load_recipe(const std::filesystem::path& file, const std::vector<std::string>& overrides = {});
// Parses a recipe from YAML text (`name` is used in messages).
Recipe parse_recipe(const std::string& yaml_text, const std::string& name, const std::vector<std::string>& overrides = {});

}  // namespace lmtune
