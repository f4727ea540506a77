// CPU kernels for the in-place optimizer updates.
#include <cmath>
#include <vector>

#include "backend/cpu/strided.h"
#include "core/ops/optimizer.h"

namespace lmtune {

void SumOfSquares::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  double total = 0;
  std::vector<float> row;
  for (const Tensor& x : in) {  // contiguous (ops::sum_of_squares makes them so)
    row.resize(size_t(x.numel()));
    cpu::load_row(cpu::base_ptr(x), x.dtype(), 1, x.numel(), row.data());
    float s = 0;
    for (float v : row) s += v * v;
    total += s;
  }
  cpu::data<float>(out[0])[0] = float(total);
}

void AdamWUpdate::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>&) {
  float* p = cpu::data<float>(in[0]);
  float* m = cpu::data<float>(in[1]);
  float* v = cpu::data<float>(in[2]);
  const Tensor& g = in[3];
  const char* gp = cpu::base_ptr(g);
  std::vector<float> h = in[4].to_floats();
  const float lr = h[kLr], b1 = h[kBeta1], b2 = h[kBeta2], eps = h[kEps], wd = h[kWeightDecay];
  const float bc1 = h[kBiasCorrection1], bc2 = h[kBiasCorrection2], gs = h[kGradScale];
  const float step_size = lr / bc1, sqrt_bc2 = std::sqrt(bc2);
  size_t ge = dtype_size(g.dtype());
  cpu::parallel_for(in[0].numel(), 4096, [&](int64_t b, int64_t e) {
    std::vector<float> gr(static_cast<size_t>(e - b));
    cpu::load_row(gp + b * int64_t(ge), g.dtype(), 1, e - b, gr.data());
    for (int64_t i = b; i < e; ++i) {
      float gi = gr[i - b] * gs;
      p[i] -= lr * wd * p[i];  // decoupled weight decay, applied before the Adam step as torch does
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      p[i] -= step_size * m[i] / (std::sqrt(v[i]) / sqrt_bc2 + eps);
    }
  });
}

void SgdUpdate::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>&) {
  float* p = cpu::data<float>(in[0]);
  float* buf = in[1].defined() ? cpu::data<float>(in[1]) : nullptr;
  const Tensor& g = in[2];
  const char* gp = cpu::base_ptr(g);
  std::vector<float> h = in[3].to_floats();
  const float lr = h[kLr], mu = h[kBeta1], wd = h[kWeightDecay], gs = h[kGradScale];
  size_t ge = dtype_size(g.dtype());
  cpu::parallel_for(in[0].numel(), 4096, [&](int64_t b, int64_t e) {
    std::vector<float> gr(static_cast<size_t>(e - b));
    cpu::load_row(gp + b * int64_t(ge), g.dtype(), 1, e - b, gr.data());
    for (int64_t i = b; i < e; ++i) {
      float gi = gr[i - b] * gs;
      p[i] -= lr * wd * p[i];
      if (buf) {
        buf[i] = mu * buf[i] + gi;
        gi = buf[i];
      }
      p[i] -= lr * gi;
    }
  });
}

}  // namespace lmtune
