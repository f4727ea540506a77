// `lmtune info MODEL_DIR`: what a model directory holds (architecture, sizes, parameters, dtype, layer types) and
// an estimate of the memory LoRA training needs (formula: docs/models.md, "Memory estimate").
#include <CLI/CLI.hpp>

#include <cstdio>
#include <map>

#include "cli/commands.h"
#include "cli/infer_options.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "models/memory.h"
#include "models/weights.h"

namespace lmtune::cli {
namespace {

std::string gib(uint64_t bytes) {
  char buf[32];
  if (bytes >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(1ull << 30));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / double(1ull << 20));
  return buf;
}

}  // namespace

void print_model_info(const std::string& model_dir, const ModelInfoOptions& opt) {
  ModelConfig c = load_model_config(model_dir);
  // The dtype of the stored weights (the most common one), when weights are present.
  std::string stored = c.torch_dtype.empty() ? "unknown" : c.torch_dtype;
  DType weight_dtype = c.torch_dtype == "float32" ? DType::f32 : c.torch_dtype == "float16" ? DType::f16 : DType::bf16;
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(model_dir) / "model.safetensors", ec) ||
      std::filesystem::exists(std::filesystem::path(model_dir) / "model.safetensors.index.json", ec)) {
    SafetensorsCheckpoint ckpt(model_dir);
    std::map<std::string, int64_t> counts;
    for (const std::string& n : ckpt.names()) counts[std::string(st_dtype_name(ckpt.at(n).st_dtype))]++;
    std::string most;
    for (const auto& [name, n] : counts)
      if (most.empty() || n > counts[most]) most = name;
    stored = most + " (" + std::to_string(ckpt.size()) + " tensors in " + std::to_string(ckpt.files().size()) +
             " file" + (ckpt.files().size() == 1 ? "" : "s") + ")";
    if (auto d = parse_st_dtype(most); d && to_lmtune_dtype(*d)) weight_dtype = *to_lmtune_dtype(*d);
  }
  int64_t sliding = 0, linear = 0;
  for (const LayerConfig& l : c.layers) {
    sliding += l.attention == AttentionKind::sliding && !l.linear_attention;
    linear += l.linear_attention;
  }
  const int64_t params = models::parameter_count(c);

  std::printf("model %s\n", model_dir.c_str());
  std::printf("  architecture    %s%s\n", c.model_type.c_str(),
              c.architecture.empty() ? "" : (" (" + c.architecture + ")").c_str());
  if (linear > 0)
    std::printf("  layers          %lld (%lld gated attention, %lld Gated DeltaNet)\n",
                (long long)c.num_hidden_layers, (long long)(c.num_hidden_layers - linear), (long long)linear);
  else
    std::printf("  layers          %lld (%lld full attention, %lld sliding window%s)\n",
                (long long)c.num_hidden_layers, (long long)(c.num_hidden_layers - sliding), (long long)sliding,
                c.sliding_window ? (" " + std::to_string(*c.sliding_window)).c_str() : "");
  std::printf("  heads           %lld query, %lld key/value, head_dim %lld%s\n", (long long)c.num_attention_heads,
              (long long)c.num_key_value_heads, (long long)c.head_dim,
              c.rotary_dim != c.head_dim ? (", rotary " + std::to_string(c.rotary_dim)).c_str() : "");
  if (linear > 0) {
    const LinearAttentionConfig& la = c.linear_attention;
    std::printf("  Gated DeltaNet  %lld key heads of %lld, %lld value heads of %lld, convolution %lld\n",
                (long long)la.key_heads, (long long)la.key_head_dim, (long long)la.value_heads,
                (long long)la.value_head_dim, (long long)la.conv_kernel);
  }
  int64_t shared = 0;
  for (const LayerConfig& l : c.layers) shared += l.kv_source >= 0;
  for (const LayerConfig& l : c.layers)
    if (l.head_dim != c.head_dim || l.kv_heads != c.num_key_value_heads) {
      std::printf("  full layers     %lld key/value heads, head_dim %lld\n", (long long)l.kv_heads,
                  (long long)l.head_dim);
      break;
    }
  if (shared > 0)
    std::printf("  shared k/v      the last %lld layers attend to earlier layers' keys\n", (long long)shared);
  if (c.per_layer_input_size > 0)
    std::printf("  per-layer input %lld per layer (vocabulary %lld)\n", (long long)c.per_layer_input_size,
                (long long)c.per_layer_vocab_size);
  std::printf("  hidden          %lld, intermediate %lld, vocab %lld\n", (long long)c.hidden_size,
              (long long)c.intermediate_size, (long long)c.vocab_size);
  std::printf("  parameters      %lld (%.1fM)%s\n", (long long)params, double(params) / 1e6,
              c.tie_word_embeddings ? ", tied embeddings" : "");
  if (c.num_experts > 0) {
    int64_t moe = 0;
    for (const LayerConfig& l : c.layers) moe += l.moe;
    const int64_t active = models::active_parameter_count(c);
    std::printf("  experts         %lld per layer in %lld of %lld layers, %lld per token (intermediate %lld)\n",
                (long long)c.num_experts, (long long)moe, (long long)c.num_hidden_layers,
                (long long)c.experts_per_token, (long long)c.moe_intermediate_size);
    if (c.shared_expert_intermediate_size > 0)
      std::printf("  shared expert   intermediate %lld, gated\n", (long long)c.shared_expert_intermediate_size);
    std::printf("  active          %lld parameters per token (%.1fM)\n", (long long)active, double(active) / 1e6);
  }
  std::printf("  dtype           %s\n", stored.c_str());
  std::string scaling(rope_type_name(c.rope.type));
  if (c.rope.type != RopeType::standard && c.rope.type != RopeType::longrope)
    scaling += " factor " + std::to_string(c.rope.factor);
  if (c.rope.attention_factor != 1.0) scaling += ", attention factor " + std::to_string(c.rope.attention_factor);
  std::printf("  rope            theta %g, %s%s\n", c.rope.theta, scaling.c_str(),
              c.rope_local ? (", sliding layers theta " + std::to_string(c.rope_local->theta)).c_str() : "");
  if (c.attn_logit_softcapping > 0 || c.final_logit_softcapping > 0)
    std::printf("  soft-capping    attention %g, final %g\n", c.attn_logit_softcapping, c.final_logit_softcapping);

  models::TrainingMemoryOptions mo;
  mo.batch = opt.batch;
  mo.seq = opt.seq;
  mo.rank = opt.rank;
  mo.weight_dtype = weight_dtype;
  mo.compute_dtype = weight_dtype;
  mo.quantize = quantize_option(opt.quantize);
  models::TrainingMemoryEstimate e = models::estimate_training_memory(c, mo);
  const std::string base = mo.quantize ? std::string(dtype_name(weight_dtype)) + ", projections " + opt.quantize
                                       : std::string(dtype_name(weight_dtype));
  std::printf("memory estimate, %s training (batch %lld, seq %lld, rank %lld on q/k/v/o/gate/up/down, %s):\n",
              mo.quantize ? "QLoRA" : "LoRA", (long long)opt.batch, (long long)opt.seq, (long long)opt.rank,
              base.c_str());
  std::printf("  weights         %s\n", gib(e.weights).c_str());
  std::printf("  LoRA params     %s (%lld parameters)\n", gib(e.lora_params).c_str(), (long long)e.lora_param_count);
  std::printf("  LoRA grads      %s\n", gib(e.lora_grads).c_str());
  std::printf("  AdamW moments   %s\n", gib(e.optimizer).c_str());
  std::printf("  activations     %s without checkpointing, %s with (loss chunk %s)\n", gib(e.activations).c_str(),
              gib(e.activations_checkpointed).c_str(), gib(e.logits).c_str());
  std::printf("  total           %s without checkpointing, %s with\n", gib(e.total(false)).c_str(),
              gib(e.total(true)).c_str());
}

}  // namespace lmtune::cli
