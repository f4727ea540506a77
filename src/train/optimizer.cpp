// AdamW / SGD over named trainable tensors (see optimizer.h).
#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/optimizer.h"
#include "core/ops/view.h"
#include "io/hdf5_file.h"

namespace lmtune {

Optimizer::Optimizer(std::vector<NamedParam> params, const Recipe::Optimizer& config)
    : params_(std::move(params)), config_(config) {
  const bool adamw = config_.name == OptimizerName::adamw;
  for (const NamedParam& p : params_) {
    if (p.tensor.dtype() != DType::f32 || !p.tensor.requires_grad())
      throw ConfigError("optimizer: parameter " + p.name + " must be an f32 tensor that requires grad");
    const bool need_m = adamw || config_.momentum != 0;
    m_.push_back(need_m ? Tensor::zeros(p.tensor.shape(), DType::f32, p.tensor.device()) : Tensor());
    v_.push_back(adamw ? Tensor::zeros(p.tensor.shape(), DType::f32, p.tensor.device()) : Tensor());
  }
}

double Optimizer::grad_norm(double grad_divisor) const {
  NoGrad no_grad;
  // One sum of squares per device over all its gradients (a few dispatches, not three per tensor).
  std::vector<std::pair<Device, std::vector<Tensor>>> by_device;
  for (const NamedParam& p : params_) {
    Tensor g = p.tensor.grad();
    if (!g.defined()) continue;
    auto it = std::find_if(by_device.begin(), by_device.end(), [&](const auto& d) { return d.first == g.device(); });
    if (it == by_device.end()) it = by_device.insert(by_device.end(), {g.device(), {}});
    it->second.push_back(g);
  }
  double total = 0;
  for (const auto& [device, grads] : by_device) total += double(ops::sum_of_squares(grads).item());
  return std::sqrt(total) / grad_divisor;
}

void Optimizer::step(double lr, double grad_multiplier) {
  NoGrad no_grad;
  ++updates_;
  const bool adamw = config_.name == OptimizerName::adamw;
  const double b1 = adamw ? config_.beta1 : config_.momentum, b2 = config_.beta2;
  std::vector<float> h(kOptimHyperSize);
  h[kLr] = float(lr);
  h[kBeta1] = float(b1);
  h[kBeta2] = float(b2);
  h[kEps] = float(config_.eps);
  h[kWeightDecay] = float(config_.weight_decay);
  h[kBiasCorrection1] = float(1.0 - std::pow(b1, double(updates_)));
  h[kBiasCorrection2] = float(1.0 - std::pow(b2, double(updates_)));
  h[kGradScale] = float(grad_multiplier);
  Tensor hyper;  // one upload per device per step
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].tensor;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (!hyper.defined() || hyper.device() != p.device()) hyper = Tensor::from_floats(h, {kOptimHyperSize}, DType::f32, p.device());
    if (adamw)
      ops::adamw_update(p, m_[i], v_[i], g, hyper);
    else
      ops::sgd_update(p, m_[i], g, hyper);
  }
}

void Optimizer::zero_grad() {
  for (NamedParam& p : params_) p.tensor.zero_grad();
}

namespace {

void save_group(Hdf5File& f, const std::string& group, const std::vector<NamedParam>& params,
                const std::vector<Tensor>& tensors) {
  for (size_t i = 0; i < params.size(); ++i)
    if (tensors[i].defined()) f.write<float>(group + "/" + params[i].name, tensors[i].to_floats(), tensors[i].shape());
}

void load_into(const Hdf5File& f, const std::string& name, const Tensor& dst) {
  if (!f.exists(name)) throw FileError(f.path().string() + ": missing " + name);
  Shape shape;
  std::vector<float> data = f.read<float>(name, &shape);
  if (shape != dst.shape())
    throw FileError(f.path().string() + ": " + name + " has shape " + to_string(shape) + ", the run needs " +
                    to_string(dst.shape()));
  NoGrad no_grad;
  copy_into(dst, Tensor::from_floats(data, shape, DType::f32, dst.device()));
}

}  // namespace

void save_params(Hdf5File& f, const std::string& group, const std::vector<NamedParam>& params) {
  for (const NamedParam& p : params) f.write<float>(group + "/" + p.name, p.tensor.to_floats(), p.tensor.shape());
}

void load_params(const Hdf5File& f, const std::string& group, const std::vector<NamedParam>& params) {
  for (const NamedParam& p : params) load_into(f, group + "/" + p.name, p.tensor);
}

void Optimizer::save(Hdf5File& f, const std::string& group) const {
  f.create_group(group);
  f.set_attr(group, "name", to_string(config_.name));
  f.set_attr(group, "updates", int64_t(updates_));
  const bool adamw = config_.name == OptimizerName::adamw;
  save_group(f, group + (adamw ? "/m" : "/momentum"), params_, m_);
  if (adamw) save_group(f, group + "/v", params_, v_);
}

void Optimizer::load(const Hdf5File& f, const std::string& group) {
  if (f.attr_string(group, "name") != to_string(config_.name))
    throw ConfigError(f.path().string() + ": the checkpoint was written by optimizer '" + f.attr_string(group, "name") +
                      "', the recipe asks for '" + to_string(config_.name) + "'");
  updates_ = f.attr_int(group, "updates");
  const bool adamw = config_.name == OptimizerName::adamw;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (m_[i].defined()) load_into(f, group + (adamw ? "/m/" : "/momentum/") + params_[i].name, m_[i]);
    if (v_[i].defined()) load_into(f, group + "/v/" + params_[i].name, v_[i]);
  }
}

}  // namespace lmtune
