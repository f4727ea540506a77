// vjp and jvp of every differentiable op against finite differences of the double references.
#include "autodiff/gradcheck.h"

#include <functional>

#include "core/ops/gather_rows.h"
#include "core/ops/grouped_matmul.h"
#include "core/ops/matmul_add.h"
#include "core/ops/matmul_gated.h"

namespace lmtune::test {
namespace {

using A = ref::Array;
using V = std::vector<Tensor>;
using RA = std::vector<A>;

TEST(OpGrads, Unary) {
  struct Case {
    const char* name;
    Tensor (*op)(const Tensor&);
    double (*ref)(double);
    bool positive;
  };
  const std::vector<Case> cases{
      {"neg", ops::neg, [](double x) { return -x; }, false},
      {"exp", ops::exp, [](double x) { return std::exp(x); }, false},
      {"log", ops::log, [](double x) { return std::log(x); }, true},
      {"sqrt", ops::sqrt, [](double x) { return std::sqrt(x); }, true},
      {"rsqrt", ops::rsqrt, [](double x) { return 1 / std::sqrt(x); }, true},
      {"square", ops::square, [](double x) { return x * x; }, false},
      {"tanh", ops::tanh, [](double x) { return std::tanh(x); }, false},
      {"sigmoid", ops::sigmoid, [](double x) { return 1 / (1 + std::exp(-x)); }, false},
      {"silu", ops::silu, [](double x) { return x / (1 + std::exp(-x)); }, false},
      {"gelu_tanh", ops::gelu_tanh,
       [](double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }, false},
      {"gelu_erf", ops::gelu_erf, [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }, false},
      {"erf", ops::erf, [](double x) { return std::erf(x); }, false},
      {"scale", [](const Tensor& x) { return ops::scale(x, -1.75f); }, [](double x) { return -1.75 * x; }, false},
      {"add_scalar", [](const Tensor& x) { return ops::add_scalar(x, 0.5f); }, [](double x) { return x + 0.5; }, false},
  };
  for (const auto& c : cases) {
    LMTUNE_CASE(c.name);
    Tensor x = f32_input({3, 7}, 5, Layout::transposed, c.positive ? 0.5f : 0.1f, 2.0f, c.positive);
    check_gradients1(c.op, [&](const A& a) { return ref::unary(a, c.ref); }, x);
  }
}

TEST(OpGrads, GatedActivation) {
  struct Case {
    const char* name;
    ops::GateActivation act;
    double (*ref)(double);
  };
  const std::vector<Case> cases{
      {"silu", ops::GateActivation::silu, [](double x) { return x / (1 + std::exp(-x)); }},
      {"gelu_tanh", ops::GateActivation::gelu_tanh,
       [](double x) { return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))); }},
      {"gelu_erf", ops::GateActivation::gelu_erf, [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }},
  };
  for (const auto& c : cases) {
    LMTUNE_CASE(c.name);
    check_gradients([&](const V& in) { return V{ops::gated_activation(in[0], in[1], c.act)}; },
                    [&](const RA& in) {
                      return RA{ref::binary(ref::unary(in[0], c.ref), in[1], [](double a, double b) { return a * b; })};
                    },
                    {f32_input({3, 7}, 15, Layout::transposed, 0.1f, 3.0f), f32_input({3, 7}, 16, Layout::strided)});
  }
}

TEST(OpGrads, BinaryWithBroadcast) {
  struct Case {
    const char* name;
    Tensor (*op)(const Tensor&, const Tensor&);
    double (*ref)(double, double);
  };
  const std::vector<Case> cases{
      {"add", ops::add, [](double a, double b) { return a + b; }},
      {"sub", ops::sub, [](double a, double b) { return a - b; }},
      {"mul", ops::mul, [](double a, double b) { return a * b; }},
      {"div", ops::div, [](double a, double b) { return a / b; }},
      {"maximum", ops::maximum, [](double a, double b) { return a >= b ? a : b; }},
  };
  for (const auto& c : cases) {
    LMTUNE_CASE(c.name);
    check_gradients([&](const V& in) { return V{c.op(in[0], in[1])}; },
                    [&](const RA& in) { return RA{ref::binary(in[0], in[1], c.ref)}; },
                    {f32_input({3, 1, 5}, 6, Layout::strided), f32_input({4, 5}, 7)});
  }
}

TEST(OpGrads, WhereAndMaskedFill) {
  Tensor cond = Tensor::from_ints({1, 0, 1, 1, 0, 0, 1}, {7, 1}, Device::cpu());
  A rc = ref::of(cond);
  check_gradients([&](const V& in) { return V{ops::where(cond, in[0], in[1])}; },
                  [&](const RA& in) { return RA{ref::where(rc, in[0], in[1])}; },
                  {f32_input({7, 5}, 8), f32_input({5}, 9)});
  check_gradients1([&](const Tensor& x) { return ops::masked_fill(x, cond, -2.0f); },
                   [&](const A& x) { return ref::where(rc, A(Shape{}, {-2.0}), x); }, f32_input({7, 3}, 10));
}

TEST(OpGrads, Views) {
  Tensor x = f32_input({3, 4, 5}, 11, Layout::transposed);
  check_gradients1([](const Tensor& t) { return ops::reshape(t, {5, -1}); }, [](const A& a) { return ref::reshape(a, {5, 12}); }, x);
  check_gradients1([](const Tensor& t) { return ops::transpose(t, 0, 2); }, [](const A& a) { return ref::transpose(a, 0, 2); }, x);
  check_gradients1([](const Tensor& t) { return ops::permute(t, {2, 0, 1}); }, [](const A& a) { return ref::permute(a, {2, 0, 1}); }, x);
  check_gradients1([](const Tensor& t) { return ops::slice(t, 2, 1, 5, 2); }, [](const A& a) { return ref::slice(a, 2, 1, 5, 2); }, x);
  check_gradients1([](const Tensor& t) { return ops::contiguous(t); }, [](const A& a) { return a; }, x);
  check_gradients1([](const Tensor& t) { return ops::expand(ops::slice(t, 0, 0, 1), {2, 4, 5}); },
                   [](const A& a) { return ref::expand(ref::slice(a, 0, 0, 1, 1), {2, 4, 5}); }, x);
  check_gradients1([](const Tensor& t) { return ops::sum_to_shape(t, {4, 1}); },
                   [](const A& a) { return ref::reshape(ref::sum(a, {0, 2}, true), {4, 1}); }, x);
  check_gradients([](const V& in) { return V{ops::concat({in[0], in[1]}, 1)}; },
                  [](const RA& in) { return RA{ref::concat({in[0], in[1]}, 1)}; },
                  {f32_input({2, 3, 5}, 12), f32_input({2, 1, 5}, 13, Layout::strided)});
}

TEST(OpGrads, Reductions) {
  Tensor x = f32_input({3, 4, 5}, 14, Layout::strided, 0.1f, 3.0f);
  check_gradients1([](const Tensor& t) { return ops::sum(t, {0, 2}); }, [](const A& a) { return ref::sum(a, {0, 2}, false); }, x);
  check_gradients1([](const Tensor& t) { return ops::mean(t, {1}, true); },
                   [](const A& a) { return ref::unary(ref::sum(a, {1}, true), [](double v) { return v / 4; }); }, x);
  check_gradients1([](const Tensor& t) { return ops::max(t, 1); },
                   [](const A& a) { return ref::drop_axes(ref::reduce(a, 1, ref::fold_max), {1}); }, x);
  check_gradients1([](const Tensor& t) { return ops::logsumexp(t, -1, true); },
                   [](const A& a) { return ref::reduce(a, 2, ref::fold_logsumexp); }, x);
  check_gradients1([](const Tensor& t) { return ops::topk(t, 2).first; },
                   [](const A& a) {
                     A r(Shape{3, 4, 2});
                     for (int64_t row = 0; row < 12; ++row) {
                       std::vector<double> v(a.v.begin() + row * 5, a.v.begin() + row * 5 + 5);
                       std::sort(v.rbegin(), v.rend());
                       r[row * 2] = v[0];
                       r[row * 2 + 1] = v[1];
                     }
                     return r;
                   },
                   x);
}

TEST(OpGrads, SoftmaxAndCrossEntropy) {
  Tensor x = f32_input({3, 4, 7}, 15, Layout::transposed, 0.1f, 3.0f);
  for (int axis : {-1, 1})
    for (bool log : {false, true}) {
      LMTUNE_CASE("axis " << axis << " log " << log);
      check_gradients1([&](const Tensor& t) { return log ? ops::log_softmax(t, axis) : ops::softmax(t, axis); },
                       [&](const A& a) { return ref::softmax(a, axis < 0 ? 2 : axis, log); }, x);
    }
  Tensor targets = Tensor::from_ints({3, -100, 6, 0, 2}, {5}, Device::cpu());
  auto rt = ref::ints_of(targets);
  check_gradients1([&](const Tensor& t) { return ops::cross_entropy(t, targets); },
                   [&](const A& a) { return ref::cross_entropy(a, rt, -100); },
                   f32_input({5, 7}, 16, Layout::transposed, 0.1f, 3.0f));
}

// Fused linear + cross-entropy: V = 10 in chunks of 4 (4 + 4 + 2), an ignored row, soft-cap off and on.
TEST(OpGrads, LinearCrossEntropy) {
  Tensor targets = Tensor::from_ints({3, -100, 9, 0, 4}, {5}, Device::cpu());
  auto rt = ref::ints_of(targets);
  for (float softcap : {0.0f, 1.5f}) {
    LMTUNE_CASE("softcap " << softcap);
    check_gradients(
        [&](const V& in) { return V{ops::linear_cross_entropy(in[0], in[1], targets, -100, softcap, 4)}; },
        [&](const RA& in) {
          A z = ref::linear(in[0], in[1], nullptr);
          if (softcap > 0) z = ref::unary(z, [&](double x) { return softcap * std::tanh(x / softcap); });
          return RA{ref::cross_entropy(z, rt, -100)};
        },
        {f32_input({5, 3}, 24, Layout::transposed, 0.1f, 2.0f), f32_input({10, 3}, 25, Layout::contiguous, 0.1f, 2.0f)});
    // A frozen weight: d hidden comes from the forward pass (the running-lse path), checked the same way.
    Tensor w = f32_input({10, 3}, 25, Layout::contiguous, 0.1f, 2.0f);
    A rw = ref::of(w);
    check_gradients1([&](const Tensor& h) { return ops::linear_cross_entropy(h, w, targets, -100, softcap, 4); },
                     [&](const A& h) {
                       A z = ref::linear(h, rw, nullptr);
                       if (softcap > 0) z = ref::unary(z, [&](double x) { return softcap * std::tanh(x / softcap); });
                       return ref::cross_entropy(z, rt, -100);
                     },
                     f32_input({5, 3}, 24, Layout::transposed, 0.1f, 2.0f));
  }
}

TEST(OpGrads, MatmulAndLinear) {
  check_gradients([](const V& in) { return V{ops::matmul(in[0], in[1])}; },
                  [](const RA& in) { return RA{ref::matmul(in[0], in[1])}; },
                  {f32_input({2, 1, 3, 5}, 17, Layout::transposed), f32_input({3, 5, 4}, 18, Layout::strided)});
  check_gradients([](const V& in) { return V{ops::matmul(in[0], in[1])}; },
                  [](const RA& in) { return RA{ref::matmul(in[0], in[1])}; },
                  {f32_input({2, 3, 5}, 19), f32_input({5, 4}, 20, Layout::transposed)});
  check_gradients([](const V& in) { return V{ops::linear(in[0], in[1], in[2])}; },
                  [](const RA& in) { return RA{ref::linear(in[0], in[1], &in[2])}; },
                  {f32_input({2, 3, 5}, 21), f32_input({4, 5}, 22), f32_input({4}, 23)});
}

TEST(OpGrads, MatmulLowRank) {
  auto ref_fn = [](double alpha) {
    return [alpha](const RA& in) {
      return RA{ref::binary(ref::matmul(in[0], in[1]), ref::matmul(in[2], in[3]),
                            [alpha](double p, double q) { return p + alpha * q; })};
    };
  };
  check_gradients([](const V& in) { return V{ops::matmul_low_rank(in[0], in[1], in[2], in[3], 1.5f, DType::f32)}; },
                  ref_fn(1.5),
                  {f32_input({5, 7}, 26), f32_input({7, 4}, 27, Layout::transposed), f32_input({5, 3}, 28),
                   f32_input({3, 4}, 29, Layout::transposed)});
  check_gradients([](const V& in) { return V{ops::matmul_low_rank(in[0], in[1], in[2], in[3], 1.0f, DType::f32)}; },
                  ref_fn(1.0),
                  {f32_input({3, 2}, 30, Layout::transposed), f32_input({2, 6}, 31), f32_input({3, 1}, 32),
                   f32_input({1, 6}, 33)});
}

// a b + e + α u v: the addend a row (bias) or a full [M, N] (residual).
TEST(OpGrads, MatmulAdd) {
  auto ref_fn = [](const RA& in) {
    A y = ref::binary(ref::matmul(in[0], in[1]), in[2], std::plus<double>());
    if (in.size() < 4) return RA{y};
    return RA{ref::binary(y, ref::matmul(in[3], in[4]), [](double p, double q) { return p + 1.5 * q; })};
  };
  check_gradients([](const V& in) { return V{ops::matmul_add(in[0], in[1], in[2], DType::f32)}; }, ref_fn,
                  {f32_input({3, 7}, 40), f32_input({7, 4}, 41, Layout::transposed), f32_input({4}, 42)});
  check_gradients(
      [](const V& in) { return V{ops::matmul_add(in[0], in[1], in[2], in[3], in[4], 1.5f, DType::f32)}; }, ref_fn,
      {f32_input({2, 5}, 43), f32_input({5, 6}, 44), f32_input({2, 6}, 45), f32_input({2, 3}, 46),
       f32_input({3, 6}, 47, Layout::transposed)});
}

// act(y[:, :F]) * y[:, F:] of y = a b + bias + α u v (silu), and of the bare product (gelu_tanh).
TEST(OpGrads, MatmulGated) {
  const int64_t F = 3;
  auto ref_fn = [](double (*act)(double), double alpha) {
    return [act, alpha](const RA& in) {
      A y = ref::matmul(in[0], in[1]);
      if (in.size() > 2) y = ref::binary(y, in[2], std::plus<double>());
      if (in.size() > 3)
        y = ref::binary(y, ref::matmul(in[3], in[4]), [alpha](double p, double q) { return p + alpha * q; });
      const int64_t M = y.shape[0];
      A out({M, F}, std::vector<double>(size_t(M * F)));
      for (int64_t m = 0; m < M; ++m)
        for (int64_t f = 0; f < F; ++f)
          out.v[size_t(m * F + f)] = act(y.v[size_t(m * 2 * F + f)]) * y.v[size_t(m * 2 * F + F + f)];
      return RA{out};
    };
  };
  double (*silu)(double) = [](double x) { return x / (1 + std::exp(-x)); };
  double (*gelu)(double) = [](double x) {
    return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  };
  check_gradients(
      [](const V& in) {
        return V{ops::matmul_gated(in[0], in[1], in[2], in[3], in[4], 1.5f, ops::GateActivation::silu, DType::f32)};
      },
      ref_fn(silu, 1.5),
      {f32_input({2, 5}, 70), f32_input({5, 2 * F}, 71, Layout::transposed), f32_input({2 * F}, 72),
       f32_input({2, 3}, 73), f32_input({3, 2 * F}, 74, Layout::transposed)});
  check_gradients(
      [](const V& in) {
        return V{ops::matmul_gated(in[0], in[1], Tensor(), Tensor(), Tensor(), 1.0f, ops::GateActivation::gelu_tanh,
                                   DType::f32)};
      },
      ref_fn(gelu, 1.0), {f32_input({3, 4}, 75, Layout::transposed), f32_input({4, 2 * F}, 76)});
}

// Dropout against x times its mask (read off the op applied to ones), which is what it must be linear in.
TEST(OpGrads, Dropout) {
  Tensor x = f32_input({4, 9}, 34, Layout::transposed);
  const ref::Array mask = ref::of(ops::dropout(Tensor::full({4, 9}, 1.0f, DType::f32, Device::cpu()), 0.4f, 99));
  check_gradients([](const V& in) { return V{ops::dropout(in[0], 0.4f, 99)}; },
                  [mask](const RA& in) { return RA{ref::binary(in[0], mask, [](double v, double m) { return v * m; })}; },
                  {x});
}

TEST(OpGrads, Norms) {
  check_gradients([](const V& in) { return V{ops::rms_norm(in[0], in[1], 1e-5f)}; },
                  [](const RA& in) { return RA{ref::rms_norm(in[0], in[1], 1e-5)}; },
                  {f32_input({3, 7}, 24, Layout::transposed, 0.1f, 2.0f), f32_input({7}, 25, Layout::contiguous, 0.5f, 1.5f)});
  check_gradients([](const V& in) { return V{ops::layer_norm(in[0], in[1], in[2], 1e-5f)}; },
                  [](const RA& in) { return RA{ref::layer_norm(in[0], in[1], &in[2], 1e-5)}; },
                  {f32_input({3, 7}, 26, Layout::strided, 0.1f, 2.0f), f32_input({7}, 27, Layout::contiguous, 0.5f, 1.5f),
                   f32_input({7}, 28)});
}

TEST(OpGrads, Rope) {
  Tensor positions = Tensor::from_ints({0, 1, 2, 7, 9, 300}, {2, 3}, Device::cpu());
  Tensor inv_freq = Tensor::from_floats({1.0f, 0.1f}, {2}, DType::f32, Device::cpu());  // R = 4 of D = 6
  auto rp = ref::ints_of(positions);
  A rf = ref::of(inv_freq);
  for (auto layout : {ops::RopeLayout::half_split, ops::RopeLayout::interleaved}) {
    LMTUNE_CASE("layout " << int(layout));
    check_gradients1([&](const Tensor& x) { return ops::rope(x, positions, inv_freq, layout); },
                     [&](const A& x) { return ref::rope(x, rp, rf, layout); },
                     f32_input({2, 3, 2, 6}, 29, Layout::strided));
    // The cotangent reaching rope is a transposed view here (it must be made contiguous for the kernel).
    check_gradients1([&](const Tensor& x) { return ops::transpose(ops::rope(x, positions, inv_freq, layout), 1, 2); },
                     [&](const A& x) { return ref::transpose(ref::rope(x, rp, rf, layout), 1, 2); },
                     f32_input({2, 3, 2, 6}, 35));
  }
  // Scaled (yarn / longrope attention factor): the vjp is the inverse rotation with the same scale.
  const auto split = ops::RopeLayout::half_split;
  check_gradients1([&](const Tensor& x) { return ops::rope(x, positions, inv_freq, split, 1.3f); },
                   [&](const A& x) { return ref::rope(x, rp, rf, split, false, 1.3f); },
                   f32_input({2, 3, 2, 6}, 36, Layout::strided));
}

TEST(OpGrads, EmbeddingAndBackward) {
  Tensor ids = Tensor::from_ints({3, 0, 4, 3, 3, 1}, {2, 3}, Device::cpu());
  auto rid = ref::ints_of(ids);
  check_gradients1([&](const Tensor& w) { return ops::embedding(w, ids); },
                   [&](const A& w) { return ref::embedding(w, rid, {2, 3}); }, f32_input({5, 4}, 30));
  check_gradients1([&](const Tensor& g) { return ops::embedding_backward(g, ids, 5); },
                   [&](const A& g) { return ref::embedding_backward(g, rid, 5); }, f32_input({2, 3, 4}, 31));
}

// Products by groups of rows (one group empty) and a row gather that takes every row twice (mixtures of experts).
TEST(OpGrads, GroupedMatmulAndGatherRows) {
  const std::vector<int64_t> off{0, 2, 2, 5};
  for (bool t : {true, false}) {
    LMTUNE_CASE((t ? "transposed" : "as stored"));
    auto ref_fn = [&](const RA& in) {
      const int64_t P = in[1].shape[1], Q = in[1].shape[2], K = in[0].shape[1], cols = t ? P : Q;
      A y(Shape{in[0].shape[0], cols});
      for (size_t g = 0; g + 1 < off.size(); ++g)
        for (int64_t r = off[g]; r < off[g + 1]; ++r)
          for (int64_t c = 0; c < cols; ++c)
            for (int64_t k = 0; k < K; ++k)
              y[r * cols + c] += in[0][r * K + k] * in[1][int64_t(g) * P * Q + (t ? c * Q + k : k * Q + c)];
      return RA{y};
    };
    check_gradients([&](const V& in) { return V{ops::grouped_matmul(in[0], in[1], off, t)}; }, ref_fn,
                    {f32_input({5, t ? 4 : 3}, 50, Layout::strided), f32_input({3, 3, 4}, 51)});
  }
  const std::vector<int32_t> index{2, 0, 1, 2, 0, 1};
  const std::vector<int64_t> ids(index.begin(), index.end());
  check_gradients1([&](const Tensor& x) { return ops::gather_rows(x, index, 2); },
                   [&](const A& x) { return ref::embedding(x, ids, {6}); }, f32_input({3, 4}, 52, Layout::transposed));
}

TEST(OpGrads, Attention) {
  struct Case {
    const char* name;
    int64_t T, S, H, KV;
    bool causal;
    int64_t window;
    float softcap;
    bool docs;
    int64_t q_offset;
  };
  const std::vector<Case> cases{{"gqa_causal_softcap", 5, 5, 4, 2, true, 0, 3.0f, false, 0},
                                {"window_docs", 6, 6, 2, 1, true, 3, 0, true, 0},
                                {"kv_cache", 2, 5, 2, 2, true, 0, 0, false, 3},
                                {"masked_rows", 4, 4, 2, 1, true, 0, 0, false, -1}};
  for (const auto& c : cases) {
    LMTUNE_CASE(c.name);
    ops::AttentionOptions opt;
    opt.causal = c.causal;
    opt.window = c.window;
    opt.softcap = c.softcap;
    opt.q_offset = c.q_offset;
    ref::AttentionRef ro{0, c.causal, c.window, c.softcap, {}, c.q_offset};
    if (c.docs) {
      opt.doc_ids = Tensor::from_ints({0, 0, 1, 1, 1, 2, 4, 4, 4, 4, 5, 5}, {2, 6}, Device::cpu());
      ro.doc_ids = ref::ints_of(opt.doc_ids);
    }
    check_gradients([&](const V& in) { return V{ops::attention(in[0], in[1], in[2], opt)}; },
                    [&](const RA& in) { return RA{ref::attention(in[0], in[1], in[2], ro)}; },
                    {f32_input({2, c.T, c.H, 3}, 32, Layout::strided, 0.1f, 1.5f), f32_input({2, c.S, c.KV, 3}, 33, Layout::contiguous, 0.1f, 1.5f),
                     f32_input({2, c.S, c.KV, 3}, 34)});
  }
}

}  // namespace
}  // namespace lmtune::test
