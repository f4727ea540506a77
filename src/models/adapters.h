// LoRA adapters on a decoder: which linears a recipe targets, attaching fresh or PEFT-loaded adapters, and
// turning trained adapters back into the PEFT form (io/peft_adapter.h). Used by training, eval, generation,
// export and serving alike.
#pragma once
#include <string>
#include <vector>

#include "io/peft_adapter.h"
#include "models/decoder.h"

namespace lmtune::models {

struct NamedLinear {
  std::string module;  // HF module path, e.g. "model.layers.3.self_attn.q_proj"
  std::string kind;    // "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
  Linear* linear;
};

// A stacked expert weight of a mixture-of-experts layer and its LoRA adapters (lora.targets: experts).
struct NamedExperts {
  std::string module;  // HF module path, e.g. "model.layers.3.mlp.experts"
  std::string param;   // "gate_up_proj" or "down_proj"
  Tensor* weight;  // [E, out, in]
  std::vector<ExpertAdapter>* adapters;
};

// Every stacked expert weight, in layer order, gate_up_proj before down_proj.
std::vector<NamedExperts> named_experts(DecoderWeights& weights);

// Every linear of the decoder (not lm_head), in layer order.
std::vector<NamedLinear> named_linears(DecoderWeights& weights);
// The linears whose kind is in `targets` ("all-linear" selects all; "experts", the stacked expert weights, selects
// no linear). Unknown target names throw ConfigError listing the valid ones.
std::vector<NamedLinear> select_targets(DecoderWeights& weights, const std::vector<std::string>& targets);

// Adds a fresh adapter named `name` (A kaiming-uniform, B zero, f32, requiring grad) to every targeted linear, and
// with "experts" in `targets` to both stacked expert weights of every expert layer (ConfigError if there is none);
// returns the new trainable tensors (A, B per linear, then per expert weight). Seeds differ per adapter but derive
// from `seed`.
std::vector<Tensor> add_lora(DecoderWeights& weights, const std::vector<std::string>& targets, int rank, float scale,
                             uint64_t seed, const std::string& name = "default");

// Attaches a PEFT adapter as adapter `name` with scale adapter.scale() * multiplier. Modules the decoder does not
// have, or whose A/B shapes do not fit the linear, throw FileError naming the module and shapes. LoRA on the
// experts (target_parameters) comes in PEFT's ParamWrapper layout: lora_A [R E, in] with expert e's rows at
// e R .. e R + R - 1, lora_B [out, R E] with expert e's column j at j E + e; PEFT wraps the experts module once per
// targeted parameter in declaration order (gate_up_proj innermost), so with both targeted gate_up_proj's factors
// are "<layer>.mlp.experts.base_layer.lora_*" and down_proj's "<layer>.mlp.experts.lora_*". The adapter's
// tensors are frozen unless `trainable`.
void attach_peft(DecoderWeights& weights, const PeftAdapter& adapter, const std::string& name, float multiplier,
                 bool trainable = false);

// The adapter `name` as PEFT data (A, B copied to the host as f32). target_modules lists the kinds present,
// target_parameters the expert weights ("mlp.experts.gate_up_proj", "mlp.experts.down_proj") if adapted.
PeftAdapter extract_peft(DecoderWeights& weights, const std::string& name, int rank, double alpha, bool rslora,
                         double dropout, const std::string& base_model);

// The modules of `adapter` that peft (0.21, under transformers 5) leaves out on a model of `model_type`: on the
// types whose experts transformers 5 fused (mixtral, qwen3_moe, qwen3_next) peft reads gate_proj / up_proj /
// down_proj in target_modules as the experts' fused parameters, so LoRA on a shared expert's or a dense layer's
// MLP does not load there (docs/models.md). warn_unless_peft_reads logs them (spdlog) when there are any.
std::vector<std::string> modules_peft_skips(const std::string& model_type, const PeftAdapter& adapter);
void warn_unless_peft_reads(const std::string& model_type, const PeftAdapter& adapter);

// Removes adapter `name` from every linear.
void remove_adapter(DecoderWeights& weights, const std::string& name);

}  // namespace lmtune::models
