// Vulkan softmax, cross-entropy, normalization, rotary and embedding kernels against straightforward
// double-precision references computed here (the launchers of backend/vulkan/nn_kernels.h are called directly).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "backend/vulkan/nn_kernels.h"
#include "core/ops.h"
#include "vk_test_util.h"

namespace lmtune {
namespace {

using test::gpu;
const DType kFloats[] = {DType::f32, DType::f16, DType::bf16};

// A random GPU tensor and its values (after rounding to dtype) on the host.
struct Input {
  Tensor dev;
  std::vector<double> v;
};
Input randn(const Shape& s, uint64_t seed, DType dt, float stddev = 1.0f) {
  Input in{Tensor::randn(s, seed, stddev, dt, gpu()), {}};
  in.v = Tensor::randn(s, seed, stddev, dt, Device::cpu()).to_doubles();
  return in;
}
std::vector<float> to_f(const std::vector<double>& d) { return std::vector<float>(d.begin(), d.end()); }

TEST(VulkanNN, SoftmaxAndLogSoftmax) {
  REQUIRE_VULKAN();
  for (DType dt : kFloats)
    for (Shape s : {Shape{1, 1}, Shape{7, 33}, Shape{3, 5, 1031}, Shape{2, 5000}})
      for (bool log : {false, true}) {
        SCOPED_TRACE(to_string(s) + (log ? " log" : "") + " " + std::string(dtype_name(dt)));
        Input x = randn(s, 1, dt, 3.0f);
        int64_t n = s.back(), rows = numel(s) / n;
        std::vector<double> ref(x.v.size());
        for (int64_t r = 0; r < rows; ++r) {
          double m = -INFINITY, sum = 0;
          for (int64_t k = 0; k < n; ++k) m = std::max(m, x.v[r * n + k]);
          for (int64_t k = 0; k < n; ++k) sum += std::exp(x.v[r * n + k] - m);
          for (int64_t k = 0; k < n; ++k)
            ref[r * n + k] = log ? x.v[r * n + k] - m - std::log(sum) : std::exp(x.v[r * n + k] - m) / sum;
        }
        Tensor y = Tensor::empty(s, dt, gpu());
        vk::softmax_rows(x.dev, y, log);
        EXPECT_CLOSE(y.to_floats(), to_f(ref), dt);
      }
  // Strided input (transposed) and an all -inf row.
  Input x = randn({33, 7}, 2, DType::f32);
  Tensor y = Tensor::empty({7, 33}, DType::f32, gpu());
  vk::softmax_rows(ops::transpose(x.dev, 0, 1), y, false);
  auto got = y.to_floats();
  for (int r = 0; r < 7; ++r) {
    double sum = 0;
    for (int k = 0; k < 33; ++k) sum += got[r * 33 + k];
    EXPECT_NEAR(sum, 1.0, 1e-5);
  }
  Tensor ninf = Tensor::full({2, 9}, -INFINITY, DType::f32, gpu());
  Tensor p = Tensor::empty({2, 9}, DType::f32, gpu()), lp = Tensor::empty({2, 9}, DType::f32, gpu());
  vk::softmax_rows(ninf, p, false);
  vk::softmax_rows(ninf, lp, true);
  for (float f : p.to_floats()) EXPECT_EQ(f, 0.0f);
  for (float f : lp.to_floats()) EXPECT_EQ(f, -INFINITY);
}

TEST(VulkanNN, CrossEntropyAndItsGradient) {
  REQUIRE_VULKAN();
  const int ignore = -100;
  for (DType dt : kFloats)
    for (auto [n, v] : {std::pair<int64_t, int64_t>{1, 7}, {7, 1031}, {33, 257}}) {
      SCOPED_TRACE(std::to_string(n) + "x" + std::to_string(v) + " " + std::string(dtype_name(dt)));
      Input l = randn({n, v}, 3, dt, 2.0f);
      std::vector<int32_t> t(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) t[i] = i % 4 == 3 ? ignore : int32_t((i * 7919 + 13) % v);
      Tensor targets = Tensor::from_ints(t, {n}, gpu());
      Tensor loss = Tensor::empty({n}, DType::f32, gpu()), lse = Tensor::empty({n}, DType::f32, gpu());
      vk::cross_entropy_rows(l.dev, targets, loss, lse, ignore);
      std::vector<double> ref_loss(n), ref_lse(n);
      for (int64_t i = 0; i < n; ++i) {
        double m = -INFINITY, s = 0;
        for (int64_t k = 0; k < v; ++k) m = std::max(m, l.v[i * v + k]);
        for (int64_t k = 0; k < v; ++k) s += std::exp(l.v[i * v + k] - m);
        ref_lse[i] = m + std::log(s);
        ref_loss[i] = t[i] == ignore ? 0 : ref_lse[i] - l.v[i * v + t[i]];
      }
      EXPECT_CLOSE(lse.to_floats(), to_f(ref_lse), DType::f32);
      EXPECT_CLOSE(loss.to_floats(), to_f(ref_loss), DType::f32);
      auto got_loss = loss.to_floats();
      for (int64_t i = 0; i < n; ++i) {
        if (t[i] == ignore) {
          EXPECT_EQ(got_loss[i], 0.0f);
        }
      }

      Input g = randn({n}, 4, DType::f32);
      Tensor d = Tensor::empty({n, v}, dt, gpu());
      vk::cross_entropy_grad_rows(l.dev, targets, lse, g.dev, d, ignore);
      std::vector<double> ref_d(n * v, 0.0);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < v && t[i] != ignore; ++k)
          ref_d[i * v + k] = (std::exp(l.v[i * v + k] - ref_lse[i]) - (k == t[i] ? 1 : 0)) * g.v[i];
      EXPECT_CLOSE(d.to_floats(), to_f(ref_d), dt);
    }
}

TEST(VulkanNN, RmsNormAndLayerNorm) {
  REQUIRE_VULKAN();
  const float eps = 1e-5f;
  for (DType dt : kFloats)
    // c a multiple of 8 (16-bit rows: 16-byte loads) and of 4, rows past what an invocation keeps in registers.
    for (Shape s : {Shape{1, 1}, Shape{3, 7, 257}, Shape{5, 4099}, Shape{4, 64}, Shape{3, 520}, Shape{2, 8200},
                    Shape{3, 8196}}) {
      SCOPED_TRACE(to_string(s) + " " + std::string(dtype_name(dt)));
      int64_t c = s.back(), rows = numel(s) / c;
      Input x = randn(s, 5, dt, 2.0f), w = randn({c}, 6, dt), b = randn({c}, 7, dt);
      std::vector<double> ry(x.v.size()), rr(rows), rm(rows), ly(x.v.size()), lyb(x.v.size()), lr(rows);
      for (int64_t r = 0; r < rows; ++r) {
        double ss = 0, mean = 0, var = 0;
        for (int64_t k = 0; k < c; ++k) ss += x.v[r * c + k] * x.v[r * c + k], mean += x.v[r * c + k];
        rr[r] = 1 / std::sqrt(ss / c + eps);
        mean /= c;
        for (int64_t k = 0; k < c; ++k) var += (x.v[r * c + k] - mean) * (x.v[r * c + k] - mean);
        rm[r] = mean;
        lr[r] = 1 / std::sqrt(var / c + eps);
        for (int64_t k = 0; k < c; ++k) {
          ry[r * c + k] = x.v[r * c + k] * rr[r] * w.v[k];
          ly[r * c + k] = (x.v[r * c + k] - mean) * lr[r] * w.v[k];
          lyb[r * c + k] = ly[r * c + k] + b.v[k];
        }
      }
      Shape rs(s.begin(), s.end() - 1);
      Tensor y = Tensor::empty(s, dt, gpu()), rstd = Tensor::empty(rs, DType::f32, gpu());
      vk::rms_norm_rows(x.dev, w.dev, y, rstd, eps);
      EXPECT_CLOSE(y.to_floats(), to_f(ry), dt);
      EXPECT_CLOSE(rstd.to_floats(), to_f(rr), DType::f32);
      Tensor mean = Tensor::empty(rs, DType::f32, gpu());
      vk::layer_norm_rows(x.dev, w.dev, b.dev, y, mean, rstd, eps);
      EXPECT_CLOSE(y.to_floats(), to_f(lyb), dt);
      EXPECT_CLOSE(mean.to_floats(), to_f(rm), DType::f32);
      EXPECT_CLOSE(rstd.to_floats(), to_f(lr), DType::f32);
      vk::layer_norm_rows(x.dev, w.dev, Tensor(), y, mean, rstd, eps);
      EXPECT_CLOSE(y.to_floats(), to_f(ly), dt);
    }
  // A transposed input is made dense first.
  Input x = randn({33, 5}, 8, DType::f32), w = randn({5}, 9, DType::f32);
  Tensor y = Tensor::empty({5, 33}, DType::f32, gpu()), w33 = Tensor::full({33}, 1.0f, DType::f32, gpu());
  Tensor rstd = Tensor::empty({5}, DType::f32, gpu());
  vk::rms_norm_rows(ops::transpose(x.dev, 0, 1), w33, y, rstd, eps);
  auto got = y.to_floats();
  for (int r = 0; r < 5; ++r) {
    double ss = 0;
    for (int k = 0; k < 33; ++k) ss += x.v[k * 5 + r] * x.v[k * 5 + r];
    double rs = 1 / std::sqrt(ss / 33 + eps);
    for (int k = 0; k < 33; ++k) EXPECT_NEAR(got[r * 33 + k], x.v[k * 5 + r] * rs, 1e-5);
  }
}

TEST(VulkanNN, RopeBothLayoutsAndInverse) {
  REQUIRE_VULKAN();
  const int64_t B = 2, T = 5, H = 3;
  for (DType dt : kFloats)
    for (auto [D, R] : {std::pair<int64_t, int64_t>{16, 16}, {18, 8}, {24, 16}})  // vec; scalar; vec + pass-through
      for (bool inter : {false, true})
        for (bool inverse : {false, true}) {
          SCOPED_TRACE("D " + std::to_string(D) + " R " + std::to_string(R) + (inter ? " interleaved" : " half") +
                       (inverse ? " inverse" : "") + " " + std::string(dtype_name(dt)));
          Input x = randn({B, T, H, D}, 10, dt);
          std::vector<int32_t> pos(B * T);
          for (int64_t i = 0; i < B * T; ++i) pos[i] = int32_t((i * 977) % 5000);  // large angles too
          std::vector<float> freq(R / 2);
          for (int64_t i = 0; i < R / 2; ++i) freq[i] = float(1.0 / std::pow(10000.0, double(2 * i) / double(R)));
          Tensor y = Tensor::empty({B, T, H, D}, dt, gpu());
          const double scale = R == 8 ? 1.15 : 1.0;  // yarn / longrope attention factor
          vk::rope_apply(x.dev, Tensor::from_ints(pos, {B, T}, gpu()),
                         Tensor::from_floats(freq, {R / 2}, DType::f32, gpu()), y, inter, inverse, float(scale));
          std::vector<double> ref(x.v);
          for (int64_t tok = 0; tok < B * T; ++tok)
            for (int64_t h = 0; h < H; ++h) {
              const double* xv = &x.v[(tok * H + h) * D];
              double* out = &ref[(tok * H + h) * D];
              for (int64_t i = 0; i < R / 2; ++i) {
                double a = double(float(pos[tok]) * freq[i]);  // the angle is an f32 product, as in HF
                double c = scale * std::cos(a), s = scale * (inverse ? -1 : 1) * std::sin(a);
                int64_t i0 = inter ? 2 * i : i, i1 = inter ? 2 * i + 1 : i + R / 2;
                out[i0] = xv[i0] * c - xv[i1] * s;
                out[i1] = xv[i1] * c + xv[i0] * s;
              }
            }
          EXPECT_CLOSE(y.to_floats(), to_f(ref), dt);
        }
}

TEST(VulkanNN, EmbeddingGatherAndScatterAdd) {
  REQUIRE_VULKAN();
  const int64_t V = 37, C = 33;
  for (DType dt : kFloats) {
    SCOPED_TRACE(dtype_name(dt));
    Input w = randn({V, C}, 11, dt);
    std::vector<int32_t> ids(2 * 7);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 5) % 9);  // duplicates
    Tensor idt = Tensor::from_ints(ids, {2, 7}, gpu());
    Tensor y = Tensor::empty({2, 7, C}, dt, gpu());
    vk::embedding_gather(w.dev, idt, y);
    std::vector<double> ref(ids.size() * C);
    for (size_t r = 0; r < ids.size(); ++r)
      for (int64_t c = 0; c < C; ++c) ref[r * C + c] = w.v[ids[r] * C + c];
    EXPECT_EQ(y.to_floats(), to_f(ref));

    Input g = randn({2, 7, C}, 12, dt);
    std::vector<double> acc(V * C, 0.0);
    for (size_t r = 0; r < ids.size(); ++r)
      for (int64_t c = 0; c < C; ++c) acc[ids[r] * C + c] += g.v[r * C + c];
    for (DType out_dt : {DType::f32, dt}) {
      Tensor out = Tensor::full({V, C}, 123.0f, out_dt, gpu());  // overwritten, not accumulated into
      vk::embedding_scatter_add(g.dev, idt, out);
      EXPECT_CLOSE(out.to_floats(), to_f(acc), out_dt);
    }
  }
}

}  // namespace
}  // namespace lmtune
