// Model loading and trainable tensors for a recipe (see model_setup.h).
#include "train/model_setup.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/backend.h"
#include "core/error.h"
#include "core/ops.h"
#include "io/gguf.h"
#include "io/hf_config.h"
#include "infer/model_checks.h"
#include "io/peft_adapter.h"
#include "models/adapters.h"
#include "models/memory.h"
#include "models/weights.h"

namespace lmtune {

int64_t TrainableModel::trainable_count() const {
  int64_t n = 0;
  for (const NamedParam& p : params) n += p.tensor.numel();
  return n;
}

Device training_device(const Recipe& recipe, const std::string& override_spec) {
  const std::string& spec = override_spec.empty() ? recipe.device : override_spec;
  return spec == "auto" ? choose_device() : parse_device(spec);
}

DType compute_dtype(const Recipe& recipe) {
  if (recipe.precision == Precision::fp16) return DType::f16;
  if (recipe.precision == Precision::bf16) return DType::bf16;
  return DType::f32;
}

double lora_scale(int rank, double alpha, bool rslora) {
  return rslora ? alpha / std::sqrt(double(rank)) : alpha / double(rank);
}

namespace {

// The checkpoint's own dtype from config.json (f32 when unknown).
DType stored_dtype(const ModelConfig& config) {
  if (config.torch_dtype == "bfloat16") return DType::bf16;
  if (config.torch_dtype == "float16") return DType::f16;
  return DType::f32;
}

std::string gib(uint64_t bytes) { return fmt::format("{:.2f} GiB", double(bytes) / double(1ull << 30)); }

models::TrainingMemoryEstimate estimate_for(const Recipe& r, const TrainableModel& tm) {
  models::TrainingMemoryOptions mo;
  mo.batch = sequences_per_micro_batch(r);
  mo.seq = r.data.max_seq_len;
  mo.rank = tm.lora_rank;
  mo.expert_lora = std::find(r.lora.targets.begin(), r.lora.targets.end(), "experts") != r.lora.targets.end();
  mo.weight_dtype = tm.weight_dtype;
  mo.quantize = r.quantize;
  mo.compute_dtype = compute_dtype(r);
  return models::estimate_training_memory(tm.decoder->config(), mo);
}

// The estimated peak with the layers train.checkpoint_layers left unchecked.
uint64_t estimated_peak(const Recipe& r, const TrainableModel& tm, const models::TrainingMemoryEstimate& e) {
  return r.train.grad_checkpointing ? e.total_checkpointing_all_but(tm.unchecked_layers) : e.total(false);
}

// train.checkpoint_layers auto: with gradient checkpointing, the last layers keep their activations instead of
// recomputing them in backward, as many as keep the estimated peak within the least a PyTorch + PEFT step at this
// batch holds (TrainingMemoryEstimate::floor) and within what the device has beside half the training state
// again. That floor holds f32 [N, V] logits and their gradient, which the fused loss never makes: the memory a
// PyTorch step spends there buys skipped recomputation here, at no more memory than the peer's.
int64_t choose_unchecked_layers(const Recipe& r, const TrainableModel& tm, Device device) {
  if (!r.train.grad_checkpointing || r.train.checkpoint_layers != "auto" || tm.lora_rank == 0) return 0;
  const models::TrainingMemoryEstimate e = estimate_for(r, tm);
  const int64_t n = models::layers_to_leave_unchecked(e, backend(device).available_bytes());
  if (n > 0)
    spdlog::info("train.checkpoint_layers auto: the last {} of {} layers keep their activations (estimated peak "
                 "{}, within the ~{} a PyTorch step at this batch holds)", n, e.layers,
                 gib(e.total_checkpointing_all_but(n)), gib(e.floor(true)));
  return n;
}

// train.transposed_weights: the frozen weights of the adapted layers and lm_head are also kept transposed, so that
// their forward products (x Wᵀ) read the layout the backend multiplies fastest (x · W). auto: where the backend
// prefers it, the estimated peak with the copies stays within the least a PyTorch step at this batch holds
// (TrainingMemoryEstimate::floor: no more memory than the peer), and the copies fit beside 1.5x the estimated
// activations, adapters and optimizer state in what the device has.
void keep_transposed_weights(const Recipe& r, TrainableModel& tm, Device device) {
  const std::string& mode = r.train.transposed_weights;
  const DType compute = compute_dtype(r);
  if (mode == "off" || (compute != DType::f16 && compute != DType::bf16)) return;  // f32: the unfused layers
  models::DecoderWeights& w = tm.decoder->weights();
  std::vector<models::Linear*> linears;
  uint64_t bytes = w.lm_head.nbytes();
  for (const models::NamedLinear& nl : models::named_linears(w))
    if (nl.linear->adapters.size() == 1 && !nl.linear->bias.defined() && !nl.linear->qweight.defined()) {
      linears.push_back(nl.linear);
      bytes += nl.linear->weight.nbytes();
    }
  if (mode == "auto") {
    Backend& be = backend(device);
    if (!be.prefers_transposed_weights()) return;
    const models::TrainingMemoryEstimate e = estimate_for(r, tm);
    const bool ckpt = r.train.grad_checkpointing;
    const uint64_t peak = estimated_peak(r, tm, e);
    const uint64_t rest = peak - e.weights, available = be.available_bytes();
    if (peak + bytes > e.floor(ckpt)) {
      spdlog::info("train.transposed_weights auto: not keeping transposed weights ({} more than the ~{} estimated "
                   "would pass the ~{} a PyTorch step at this batch holds at least)",
                   gib(bytes), gib(peak), gib(e.floor(ckpt)));
      return;
    }
    if (bytes + rest + rest / 2 > available) {
      spdlog::info("train.transposed_weights auto: not keeping transposed weights ({} beside ~{} of training state "
                   "would exceed the {} available)", gib(bytes), gib(rest), gib(available));
      return;
    }
  }
  for (models::Linear* l : linears) l->weight_t = ops::contiguous(ops::transpose(l->weight));
  w.lm_head_t = ops::contiguous(ops::transpose(w.lm_head));
  spdlog::info("train.transposed_weights: the frozen weights of {} layers and lm_head also kept transposed (+{})",
               linears.size(), gib(bytes));
}

}  // namespace

void check_max_seq_len(const Recipe& r, const ModelConfig& c) {
  if (r.data.max_seq_len <= c.max_position_embeddings) return;
  const std::string what = "data.max_seq_len " + std::to_string(r.data.max_seq_len) + " is beyond the model's " +
                           "max_position_embeddings " + std::to_string(c.max_position_embeddings) + " (" + r.model +
                           "/config.json)";
  // A config that scales its rope was meant for other lengths than it was trained at; extending it further is a
  // deliberate choice. Otherwise positions past the trained ones only extrapolate.
  if (c.rope.type != RopeType::standard) {
    spdlog::warn("{}; the model scales its rope ({}), so training goes ahead", what, rope_type_name(c.rope.type));
    return;
  }
  throw ConfigError(what + ": lower data.max_seq_len, or add rope scaling to config.json to extend the context");
}

uint64_t estimated_training_bytes(const Recipe& r, const ModelConfig& c) {
  models::TrainingMemoryOptions mo;
  mo.batch = sequences_per_micro_batch(r);
  mo.seq = r.data.max_seq_len;
  mo.compute_dtype = compute_dtype(r);
  const bool full = r.finetune == Finetune::full;
  mo.rank = full ? 0 : r.lora.rank;
  mo.expert_lora =
      !full && std::find(r.lora.targets.begin(), r.lora.targets.end(), "experts") != r.lora.targets.end();
  mo.weight_dtype = full ? DType::f32 : mo.compute_dtype == DType::f32 ? stored_dtype(c) : mo.compute_dtype;
  mo.quantize = r.quantize;
  const uint64_t e = models::estimate_training_memory(c, mo).total(r.train.grad_checkpointing);
  return full ? e + 16 * uint64_t(models::parameter_count(c)) : e;  // grads and AdamW moments
}

void check_training_memory(const Recipe& r, uint64_t estimate, uint64_t available, const std::string& device) {
  if (available == 0 || estimate <= available) return;
  throw ConfigError("training needs an estimated " + gib(estimate) + " but " + device + " has " + gib(available) +
                    " available (train.batch_size " + std::to_string(r.train.batch_size) + " x data.max_seq_len " +
                    std::to_string(r.data.max_seq_len) + ", lora.rank " + std::to_string(r.lora.rank) +
                    ", train.grad_checkpointing " + (r.train.grad_checkpointing ? "true" : "false") +
                    "): lower train.batch_size (raise train.grad_accum to keep the step size) or data.max_seq_len, "
                    "or turn on train.grad_checkpointing");
}

void check_recipe_fits(const Recipe& r, const Tokenizer& tokenizer, Device device) {
  const ModelConfig c = load_model_config(r.model);
  infer::check_tokenizer_fits(tokenizer, c, r.model);
  check_max_seq_len(r, c);
  check_training_memory(r, estimated_training_bytes(r, c), backend(device).available_bytes(), device.str());
}

void check_model_files(const Recipe& r) {
  namespace fs = std::filesystem;
  const fs::path dir = r.model;
  if (find_gguf_model(dir)) return;  // a GGUF model is one file, validated when it is opened
  if (!fs::is_directory(dir)) throw FileError(r.model + ": model directory not found (recipe key 'model')");
  if (!fs::exists(dir / "config.json")) throw FileError(r.model + ": missing config.json");
  if (!fs::exists(dir / "model.safetensors") && !fs::exists(dir / "model.safetensors.index.json"))
    throw FileError(r.model + ": missing model.safetensors (or model.safetensors.index.json)");
  if (!fs::exists(dir / "tokenizer.json")) throw FileError(r.model + ": missing tokenizer.json");
}

TrainableModel build_trainable_model(const Recipe& r, Device device) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(r.model) && !find_gguf_model(r.model))
    throw FileError(r.model + ": model directory not found (recipe key 'model')");
  const DType compute = compute_dtype(r);
  TrainableModel tm;
  if (r.finetune == Finetune::full) {
    tm.weight_dtype = DType::f32;  // the trained weights are their own f32 master copies
  } else {
    // Frozen weights: the compute dtype, but never wider than the checkpoint stores them.
    DType stored = stored_dtype(load_model_config(r.model));
    tm.weight_dtype = compute == DType::f32 ? stored : compute;
  }
  tm.decoder = std::make_unique<models::Decoder>(
      models::load_decoder(r.model, tm.weight_dtype, compute, device, r.quantize));
  models::DecoderWeights& w = tm.decoder->weights();

  if (r.finetune == Finetune::full) {
    for (const models::ParamRef& p : models::parameter_map(tm.decoder->config(), w)) {
      if (!p.trainable) continue;
      if (p.slot->device() != device)
        throw ConfigError("full fine-tuning: '" + p.name + "' (" + std::to_string(p.slot->nbytes() >> 20) +
                          " MiB) is larger than this device's kernels address and stays in host memory; train "
                          "Gemma 4 with LoRA (finetune: lora)");
      p.slot->set_requires_grad(true);
      tm.params.push_back({p.name, *p.slot});
    }
    return tm;
  }

  if (!r.lora.init_from.empty()) {
    PeftAdapter peft = load_peft_adapter(r.lora.init_from);
    models::attach_peft(w, peft, "default", 1.0f, /*trainable=*/true);
    tm.lora_rank = peft.rank;
    tm.lora_alpha = peft.alpha;
    tm.lora_rslora = peft.rslora;
    if (peft.rank != r.lora.rank || peft.alpha != r.lora.alpha)
      spdlog::warn("lora.init_from {}: using its rank {} and alpha {} (the recipe says {} and {})", r.lora.init_from,
                   peft.rank, peft.alpha, r.lora.rank, r.lora.alpha);
  } else {
    tm.lora_rank = r.lora.rank;
    tm.lora_alpha = r.lora.alpha;
    tm.lora_rslora = r.lora.rslora;
    models::add_lora(w, r.lora.targets, r.lora.rank, float(lora_scale(r.lora.rank, r.lora.alpha, r.lora.rslora)),
                     r.train.seed);
  }
  uint64_t key = 0;
  for (const models::NamedLinear& nl : models::named_linears(w)) {
    ++key;
    for (models::LoraAdapter& a : nl.linear->adapters) {
      if (a.name != "default") continue;
      a.dropout = float(r.lora.dropout);
      a.dropout_key = key;
      tm.params.push_back({nl.module + ".lora_A", a.A});
      tm.params.push_back({nl.module + ".lora_B", a.B});
    }
  }
  for (const models::NamedExperts& ne : models::named_experts(w))
    for (const models::ExpertAdapter& a : *ne.adapters) {
      if (a.name != "default") continue;
      if (r.lora.dropout > 0)
        throw ConfigError("lora.dropout > 0 with LoRA on the experts: PEFT's LoRA on parameters has no dropout; "
                          "set lora.dropout: 0 or leave 'experts' out of lora.targets");
      tm.params.push_back({ne.module + "." + ne.param + ".lora_A", a.A});
      tm.params.push_back({ne.module + "." + ne.param + ".lora_B", a.B});
    }
  if (tm.params.empty()) throw ConfigError("lora: no module of the model matches lora.targets");
  tm.unchecked_layers = choose_unchecked_layers(r, tm, device);
  keep_transposed_weights(r, tm, device);
  return tm;
}

}  // namespace lmtune
