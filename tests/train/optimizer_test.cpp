// The fused optimizer kernels (core/ops/optimizer.h) against torch.optim.AdamW / SGD written out in double
// precision, on the CPU and on Vulkan; and the trainer's Optimizer (gradient norm, state save/load).
#include <gtest/gtest.h>

#include <cmath>

#include "backend/vulkan/vulkan_backend.h"
#include "core/autodiff.h"
#include "core/ops.h"
#include "core/ops/optimizer.h"
#include "core/random.h"
#include "io/hdf5_file.h"
#include "train/optimizer.h"
#include "train_test_util.h"

using namespace lmtune;

namespace {

std::vector<std::string> devices() {
  std::vector<std::string> d = {"cpu"};
  if (!vk::list_devices().empty()) d.push_back("vulkan:0");
  return d;
}

std::vector<float> random_vec(size_t n, uint64_t seed, double scale) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = float(rng.normal() * scale);
  return v;
}

Tensor hyper(double lr, double b1, double b2, double eps, double wd, int t, double gs, Device d) {
  std::vector<float> h(kOptimHyperSize);
  h[kLr] = float(lr);
  h[kBeta1] = float(b1);
  h[kBeta2] = float(b2);
  h[kEps] = float(eps);
  h[kWeightDecay] = float(wd);
  h[kBiasCorrection1] = float(1 - std::pow(b1, t));
  h[kBiasCorrection2] = float(1 - std::pow(b2, t));
  h[kGradScale] = float(gs);
  return Tensor::from_floats(h, {kOptimHyperSize}, DType::f32, d);
}

double max_rel(const std::vector<float>& a, const std::vector<double>& b) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) e = std::max(e, std::fabs(a[i] - b[i]) / (std::fabs(b[i]) + 1e-3));
  return e;
}

}  // namespace

// torch.optim.AdamW.step (non-amsgrad, non-maximize), one parameter element at a time:
//   p *= 1 - lr·wd;  m = β1 m + (1-β1) g;  v = β2 v + (1-β2) g²
//   p -= lr / (1-β1^t) · m / (sqrt(v) / sqrt(1-β2^t) + eps)
TEST(OptimizerKernels, AdamWMatchesTorchFormula) {
  const size_t n = 3000;  // not a multiple of the work-group size
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = 0.5;
  for (const std::string& dev : devices()) {
    Device d = parse_device(dev);
    std::vector<float> p0 = random_vec(n, 1, 1.0);
    Tensor p = Tensor::from_floats(p0, {int64_t(n)}, DType::f32, d);
    Tensor m = Tensor::zeros({int64_t(n)}, DType::f32, d), v = Tensor::zeros({int64_t(n)}, DType::f32, d);
    std::vector<double> P(p0.begin(), p0.end()), M(n, 0), V(n, 0);
    for (int t = 1; t <= 3; ++t) {
      std::vector<float> g = random_vec(n, 10 + t, 0.1);
      // The gradient arrives in bf16 in step 2 (the kernel accepts any float dtype), as f32 otherwise.
      DType gd = t == 2 ? DType::bf16 : DType::f32;
      Tensor gt = Tensor::from_floats(g, {int64_t(n)}, gd, d);
      std::vector<float> gr = gt.to_floats();
      ops::adamw_update(p, m, v, gt, hyper(lr, b1, b2, eps, wd, t, gs, d));
      for (size_t i = 0; i < n; ++i) {
        double gi = double(gr[i]) * gs;
        P[i] *= 1 - lr * wd;
        M[i] = b1 * M[i] + (1 - b1) * gi;
        V[i] = b2 * V[i] + (1 - b2) * gi * gi;
        P[i] -= lr / (1 - std::pow(b1, t)) * M[i] / (std::sqrt(V[i]) / std::sqrt(1 - std::pow(b2, t)) + eps);
      }
    }
    EXPECT_LT(max_rel(p.to_floats(), P), 1e-5) << dev;
    EXPECT_LT(max_rel(m.to_floats(), M), 1e-5) << dev;
    EXPECT_LT(max_rel(v.to_floats(), V), 1e-4) << dev;
  }
}

// torch.optim.SGD with momentum μ (dampening 0, nesterov off) and lmtune's decoupled weight decay:
//   p *= 1 - lr·wd;  buf = μ buf + g (buf = g at t = 1);  p -= lr·buf
TEST(OptimizerKernels, SgdMatchesTorchFormula) {
  const size_t n = 1000;
  const double lr = 0.1, mu = 0.9, wd = 0.01, gs = 2.0;
  for (const std::string& dev : devices()) {
    for (bool momentum : {false, true}) {
      Device d = parse_device(dev);
      std::vector<float> p0 = random_vec(n, 2, 1.0);
      Tensor p = Tensor::from_floats(p0, {int64_t(n)}, DType::f32, d);
      Tensor buf = momentum ? Tensor::zeros({int64_t(n)}, DType::f32, d) : Tensor();
      std::vector<double> P(p0.begin(), p0.end()), Buf(n, 0);
      for (int t = 1; t <= 3; ++t) {
        std::vector<float> g = random_vec(n, 20 + t, 0.1);
        ops::sgd_update(p, buf, Tensor::from_floats(g, {int64_t(n)}, DType::f32, d),
                        hyper(lr, momentum ? mu : 0, 0, 0, wd, t, gs, d));
        for (size_t i = 0; i < n; ++i) {
          double gi = double(g[i]) * gs;
          P[i] *= 1 - lr * wd;
          if (momentum) gi = Buf[i] = mu * Buf[i] + gi;
          P[i] -= lr * gi;
        }
      }
      EXPECT_LT(max_rel(p.to_floats(), P), 1e-5) << dev << " momentum " << momentum;
    }
  }
}

TEST(OptimizerKernels, VulkanMatchesCpu) {
  if (vk::list_devices().empty()) GTEST_SKIP() << "no Vulkan device";
  const size_t n = 5000;
  std::vector<float> p0 = random_vec(n, 3, 1.0), g = random_vec(n, 4, 0.3);
  std::vector<std::vector<float>> results;
  for (Device d : {Device::cpu(), Device::vulkan(0)}) {
    Tensor p = Tensor::from_floats(p0, {int64_t(n)}, DType::f32, d);
    Tensor m = Tensor::zeros({int64_t(n)}, DType::f32, d), v = Tensor::zeros({int64_t(n)}, DType::f32, d);
    for (int t = 1; t <= 2; ++t)
      ops::adamw_update(p, m, v, Tensor::from_floats(g, {int64_t(n)}, DType::f32, d),
                        hyper(3e-3, 0.9, 0.999, 1e-8, 0.01, t, 1.0, d));
    results.push_back(p.to_floats());
  }
  double e = 0;
  for (size_t i = 0; i < n; ++i) e = std::max(e, double(std::fabs(results[0][i] - results[1][i])));
  EXPECT_LT(e, 1e-6);
}

TEST(Optimizer, GradNormAndStateRoundTrip) {
  Tensor a = Tensor::from_floats({3, 4}, {2}), b = Tensor::from_floats({12}, {1});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  Recipe::Optimizer cfg;
  Optimizer opt({{"a", a}, {"b", b}}, cfg);
  backward(ops::add(ops::sum_all(ops::mul(a, a)), ops::sum_all(b)));  // grads 2a = (6, 8) and 1
  EXPECT_NEAR(opt.grad_norm(), std::sqrt(36.0 + 64.0 + 1.0), 1e-5);
  EXPECT_NEAR(opt.grad_norm(2.0), std::sqrt(101.0) / 2, 1e-5);
  opt.step(0.1, 1.0);
  opt.zero_grad();
  EXPECT_FALSE(a.grad().defined());
  train_test::TempDir dir("opt");
  save_hdf5_atomic(dir.path / "s.h5", [&](Hdf5File& f) {
    save_params(f, "params", opt.params());
    opt.save(f, "optimizer");
  });
  Tensor a2 = Tensor::zeros({2}), b2 = Tensor::zeros({1});
  a2.set_requires_grad(true);
  b2.set_requires_grad(true);
  Optimizer opt2({{"a", a2}, {"b", b2}}, cfg);
  Hdf5File f = Hdf5File::open(dir.path / "s.h5");
  load_params(f, "params", opt2.params());
  opt2.load(f, "optimizer");
  EXPECT_EQ(a2.to_floats(), a.to_floats());
  EXPECT_EQ(opt2.updates(), 1);
}
