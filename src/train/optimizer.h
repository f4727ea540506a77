// The trainer's optimizer: AdamW or SGD over named f32 trainable tensors through the fused in-place kernels
// (core/ops/optimizer.h), the global gradient norm (computed in f32 on the device, one host read) and the
// optimizer state that checkpoints save and restore.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "train/recipe.h"

namespace lmtune {

class Hdf5File;

// A trainable tensor with a stable name (HF module path + ".lora_A" / ".lora_B", or the HF weight name).
struct NamedParam {
  std::string name;
  Tensor tensor;  // f32 leaf that requires grad
};

class Optimizer {
 public:
  Optimizer(std::vector<NamedParam> params, const Recipe::Optimizer& config);

  const std::vector<NamedParam>& params() const { return params_; }
  int64_t updates() const { return updates_; }  // optimizer steps applied (bias-correction t)

  // sqrt(Σ ‖grad‖²) / grad_divisor over the accumulated gradients, in f32 (NaN/Inf when a gradient is).
  double grad_norm(double grad_divisor = 1.0) const;
  // One update at learning rate `lr`; every gradient is multiplied by `grad_multiplier` first (1/loss_scale ·
  // clip factor). Parameters without a gradient are left alone (as torch does).
  void step(double lr, double grad_multiplier);
  void zero_grad();

  // State under `group` of an open checkpoint: <group>/m/<name>, <group>/v/<name> (AdamW) or <group>/momentum/<name>
  // (SGD with momentum), and the attribute updates.
  void save(Hdf5File& file, const std::string& group) const;
  void load(const Hdf5File& file, const std::string& group);

 private:
  std::vector<NamedParam> params_;
  Recipe::Optimizer config_;
  std::vector<Tensor> m_, v_;  // AdamW moments, or SGD momentum in m_ (undefined without momentum)
  int64_t updates_ = 0;
};

// Writes every tensor of `params` (f32) under `group`, and reads them back into the same tensors in place.
void save_params(Hdf5File& file, const std::string& group, const std::vector<NamedParam>& params);
void load_params(const Hdf5File& file, const std::string& group, const std::vector<NamedParam>& params);

}  // namespace lmtune
