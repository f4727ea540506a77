// matmul and linear: odd sizes, broadcast batch dims, transposed / strided / expanded operands, all dtypes.
#include <array>
#include <functional>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops/matmul_add.h"
#include "ops/op_test_util.h"

namespace lmtune::test {
namespace {

// Matmul error grows with K: compare by NMSE, which is scale-free, with dtype thresholds.
TEST_P(OpTest, MatmulShapesAndLayouts) {
  const std::vector<std::pair<Shape, Shape>> shapes{
      {{1, 1}, {1, 1}},     {{3, 7}, {7, 5}},         {{33, 65}, {65, 17}},     {{2, 3, 7}, {2, 7, 5}},
      {{2, 1, 7, 5}, {3, 5, 4}}, {{4, 33, 7}, {7, 65}}, {{1, 3, 65}, {5, 65, 1}}, {{7, 0}, {0, 3}}};
  for (DType dt : float_dtypes())
    for (Layout la : {Layout::contiguous, Layout::transposed, Layout::strided, Layout::expanded})
      for (Layout lb : {Layout::contiguous, Layout::transposed, Layout::strided})
        for (const auto& [sa, sb] : shapes) {
          LMTUNE_CASE(dtype_name(dt) << " a " << layout_name(la) << " " << to_string(sa) << " b " << layout_name(lb)
                                     << " " << to_string(sb));
          Tensor a = make_input(sa, dt, dev(), 61, la);
          Tensor b = make_input(sb, dt, dev(), 62, lb);
          Tensor c = ops::matmul(a, b);
          EXPECT_EQ(c.dtype(), dt);
          EXPECT_TRUE(close(c, ref::matmul(ref::of(a), ref::of(b)), dt));
        }
}

TEST_P(OpTest, MatmulMixedDtypesAndLargeBatch) {
  Tensor a = make_input({16, 9, 33}, DType::bf16, dev(), 63);
  Tensor b = make_input({16, 33, 17}, DType::f32, dev(), 64, Layout::transposed);
  Tensor c = ops::matmul(a, b);
  EXPECT_EQ(c.dtype(), DType::bf16);
  EXPECT_TRUE(close(c, ref::matmul(ref::of(a), ref::of(b)), DType::bf16));
  // Big enough for OpenBLAS's own threading.
  Tensor x = make_input({130, 257}, DType::f32, dev(), 65);
  Tensor y = make_input({257, 129}, DType::f32, dev(), 66, Layout::transposed);
  EXPECT_TRUE(close(ops::matmul(x, y), ref::matmul(ref::of(x), ref::of(y)), DType::f32));
}

// f32 results of 16-bit operands (the logits of the fused loss): not rounded to the operands' dtype, and the
// gradients (a 16-bit cotangent, as under autocast) match f32 arithmetic on the same operand values.
TEST_P(OpTest, MatmulOutputDtype) {
  for (DType dt : {DType::bf16, DType::f16}) {
    LMTUNE_CASE(dtype_name(dt));
    Tensor a = make_input({37, 65}, dt, dev(), 71);
    Tensor b = make_input({65, 19}, dt, dev(), 72, Layout::transposed);
    Tensor c = ops::matmul(a, b, DType::f32);
    EXPECT_EQ(c.dtype(), DType::f32);
    EXPECT_TRUE(close(c, ref::matmul(ref::of(a), ref::of(b)), DType::f32));
    Tensor w = make_input({37, 19}, DType::f32, dev(), 73);
    auto loss = [&](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{ops::sum_all(ops::mul(ops::matmul(in[0], in[1], DType::f32), w))};
    };
    auto [value, grads] = value_and_grad(loss)({a, b});
    EXPECT_EQ(grads[0].dtype(), dt);
    // d/da = w bᵀ, d/db = aᵀ w (w rounded to dt first, as the 16-bit cotangent is).
    ref::Array w16 = ref::of(ops::cast(w, dt));
    EXPECT_TRUE(close(grads[0], ref::matmul(w16, ref::transpose(ref::of(b), 0, 1)), dt));
    EXPECT_TRUE(close(grads[1], ref::matmul(ref::transpose(ref::of(a), 0, 1), w16), dt));
  }
  EXPECT_THROW(ops::matmul(make_input({2, 3}, DType::f32, dev(), 74), make_input({3, 2}, DType::f32, dev(), 75),
                           DType::i32),
               lmtune::ShapeError);
}

// LoRA's rank side, C [M, N <= 32] = A B with 16-bit A (the skinny tensor-core kernel on devices that have it):
// every dtype of B and C, B in both layouts, rows past a multiple of 32, N past a multiple of 16.
TEST_P(OpTest, MatmulSkinny) {
  for (DType ta : {DType::bf16, DType::f16})
    for (DType tb : {DType::f16, DType::f32, DType::bf16})
      for (DType tc : {DType::f32, DType::f16, DType::bf16})
        for (Layout lb : {Layout::contiguous, Layout::transposed})
          for (auto [M, N, K] : {std::array<int64_t, 3>{45, 16, 320}, std::array<int64_t, 3>{64, 26, 96}}) {
            LMTUNE_CASE(dtype_name(ta) << " x " << dtype_name(tb) << " -> " << dtype_name(tc) << " b "
                                       << layout_name(lb) << " " << M << "x" << N << "x" << K);
            Tensor a = make_input({M, K}, ta, dev(), 76);
            Tensor b = make_input({K, N}, tb, dev(), 77, lb);
            Tensor c = ops::matmul(a, b, tc);
            EXPECT_EQ(c.dtype(), tc);
            EXPECT_TRUE(close(c, ref::matmul(ref::of(a), ref::of(b)), tc == DType::f32 ? ta : tc));
          }
  // LoRA's weight gradients, a short side over a long K: dA = gbᵀ x [16, N] and dB = gᵀ h [M, 32] with an f16 rank
  // side and g, x 16-bit and stored [K, rows].
  for (DType tx : {DType::bf16, DType::f16})
    for (DType tc : {DType::f32, DType::bf16}) {
      LMTUNE_CASE(dtype_name(tx) << " -> " << dtype_name(tc));
      Tensor gb = make_input({400, 16}, DType::f16, dev(), 78);
      Tensor x = make_input({400, 192}, tx, dev(), 79);
      Tensor da = ops::matmul(ops::transpose(gb), x, tc);
      EXPECT_TRUE(close(da, ref::matmul(ref::transpose(ref::of(gb), 0, 1), ref::of(x)), tc == DType::f32 ? tx : tc));
      Tensor h = make_input({400, 32}, DType::f16, dev(), 80);
      Tensor db = ops::matmul(ops::transpose(x), h, tc);
      EXPECT_TRUE(close(db, ref::matmul(ref::transpose(ref::of(x), 0, 1), ref::of(h)), tc == DType::f32 ? tx : tc));
    }
}

// alpha A B: on the skinny kernel's shapes (alpha in its sums) and elsewhere (a scaling pass), forward and both
// gradients (alpha times the plain product's).
TEST_P(OpTest, MatmulAlpha) {
  for (auto [M, N, K] : {std::array<int64_t, 3>{45, 16, 96}, std::array<int64_t, 3>{33, 40, 24}})
    for (DType dt : {DType::bf16, DType::f32}) {
      LMTUNE_CASE(M << "x" << N << "x" << K << " " << dtype_name(dt));
      Tensor a = make_input({M, K}, dt, dev(), 81);
      Tensor b = make_input({K, N}, dt, dev(), 82, Layout::transposed);
      Tensor w = make_input({M, N}, DType::f32, dev(), 83);
      auto loss = [&](float alpha) {
        return [&, alpha](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{ops::sum_all(ops::mul(ops::matmul(in[0], in[1], DType::f32, alpha), w))};
        };
      };
      Tensor c = ops::matmul(a, b, DType::f32, -2.5f);
      ref::Array want = ref::matmul(ref::of(a), ref::of(b));
      for (double& v : want.v) v *= -2.5;
      EXPECT_TRUE(close(c, want, dt));
      auto [v1, g1] = value_and_grad(loss(1.0f))({a, b});
      auto [v2, g2] = value_and_grad(loss(-2.5f))({a, b});
      for (int i = 0; i < 2; ++i) {
        ref::Array scaled = ref::of(g1[size_t(i)]);
        for (double& v : scaled.v) v *= -2.5;
        EXPECT_TRUE(close(g2[size_t(i)], scaled, dt)) << "gradient " << i;
      }
    }
}

// 16-bit activations times an f32 master weight: the product on the 16-bit path, the weight's gradient in f32
// (as accurate as f32 arithmetic on the same 16-bit operands, not rounded to bf16).
TEST_P(OpTest, AutocastLinear) {
  for (DType dt : {DType::bf16, DType::f16}) {
    LMTUNE_CASE(dtype_name(dt));
    Tensor x = make_input({3, 13, 33}, dt, dev(), 76);
    Tensor w = make_input({17, 33}, DType::f32, dev(), 77);
    Tensor c = ops::cast(make_input({3, 13, 17}, DType::f32, dev(), 78), dt);  // the cotangent, in x's dtype
    Tensor y = ops::autocast_linear(x, w);
    EXPECT_EQ(y.dtype(), dt);
    ref::Array w16 = ref::of(ops::cast(w, dt));
    EXPECT_TRUE(close(y, ref::linear(ref::of(x), w16, nullptr), dt));
    auto loss = [&](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{ops::sum_all(ops::cast(ops::mul(ops::autocast_linear(in[0], in[1]), c), DType::f32))};
    };
    auto [value, grads] = value_and_grad(loss)({x, w});
    ASSERT_EQ(grads[1].dtype(), DType::f32);
    ref::Array x2 = ref::reshape(ref::of(x), {39, 33}), c2 = ref::reshape(ref::of(c), {39, 17});
    EXPECT_TRUE(close(grads[1], ref::matmul(ref::transpose(c2, 0, 1), x2), DType::f32));
    EXPECT_TRUE(close(grads[0], ref::reshape(ref::matmul(c2, w16), {3, 13, 33}), dt));
    // Forward-mode agrees with the reverse-mode gradient: <J t, c> = <t, Jᵀ c>.
    Tensor tw = make_input({17, 33}, DType::f32, dev(), 79);
    auto f = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::autocast_linear(in[0], in[1])}; };
    Tensor jt = jvp(f, {x, w}, {Tensor::zeros(x.shape(), dt, dev()), tw}).second[0];
    double lhs = ops::sum_all(ops::mul(ops::cast(jt, DType::f32), ops::cast(c, DType::f32))).item();
    double rhs = ops::sum_all(ops::mul(grads[1], tw)).item();
    EXPECT_NEAR(lhs, rhs, 2e-2 * std::abs(rhs) + 1e-3);
  }
  EXPECT_THROW(ops::autocast_linear(make_input({2, 3}, DType::f32, dev(), 80), make_input({4, 3}, DType::f32, dev(), 81)),
               lmtune::ShapeError);
}

// A product with a low-rank addend, a b + α u v, against double arithmetic: odd sizes (scalar or general
// kernel, then the addend composed), tile-sized 16-bit addends (more K tiles of the fast coopmat kernel where
// the device has it, R below, at and above its K step; composed when U's or V's layout differs from A's or
// B's), and either layout of every operand.
TEST_P(OpTest, MatmulLowRank) {
  struct Case {
    int64_t M, K, N, R;
    DType dt, low;
  };
  const std::vector<Case> cases{
      {37, 65, 19, 5, DType::f32, DType::f32},       {37, 65, 19, 5, DType::bf16, DType::f16},
      {256, 64, 256, 16, DType::bf16, DType::f16},   {128, 96, 128, 32, DType::f16, DType::f16},
      {128, 64, 128, 16, DType::bf16, DType::bf16},  {128, 64, 256, 8, DType::bf16, DType::bf16},
      {256, 32, 128, 40, DType::f16, DType::bf16}};
  for (const Case& c : cases)
    for (Layout lb : {Layout::contiguous, Layout::transposed})
      for (Layout lu : {Layout::contiguous, Layout::transposed})
        for (Layout lv : {Layout::contiguous, Layout::transposed}) {
          LMTUNE_CASE(c.M << "x" << c.K << "x" << c.N << " R " << c.R << " " << dtype_name(c.dt) << " addend "
                          << dtype_name(c.low) << " b " << layout_name(lb) << " u " << layout_name(lu) << " v "
                          << layout_name(lv));
          Tensor a = make_input({c.M, c.K}, c.dt, dev(), 82);
          Tensor b = make_input({c.K, c.N}, c.dt, dev(), 83, lb);
          Tensor u = make_input({c.M, c.R}, c.low, dev(), 84, lu);
          Tensor v = make_input({c.R, c.N}, c.low, dev(), 85, lv);
          Tensor y = ops::matmul_low_rank(a, b, u, v, 1.75f, c.dt);
          ref::Array want = ref::binary(ref::matmul(ref::of(a), ref::of(b)), ref::matmul(ref::of(u), ref::of(v)),
                                        [](double p, double q) { return p + 1.75 * q; });
          EXPECT_EQ(y.dtype(), c.dt);
          EXPECT_TRUE(close(y, want, c.dt));
        }
  EXPECT_THROW(ops::matmul_low_rank(make_input({4, 3}, DType::f32, dev(), 86), make_input({3, 5}, DType::f32, dev(), 87),
                                    make_input({4, 2}, DType::f32, dev(), 88), make_input({3, 5}, DType::f32, dev(), 89),
                                    1.0f, DType::f32),
               lmtune::ShapeError);
}

// A product with an addend in its epilogue, a b + e (+ α u v), e [M, N] (a residual) or [N] (a bias), against
// double arithmetic: decode shapes (at most 4 rows, K a multiple of 8: the addend in matmul_gemv's epilogue on
// devices with subgroup arithmetic, f32 factors beside 16-bit operands as Linear::fused passes them), and shapes
// the composition takes (odd K, many rows).
TEST_P(OpTest, MatmulAdd) {
  struct Case {
    int64_t M, K, N, R;
    DType dt, low;
    bool row;  // e [N], else [M, N]
  };
  const std::vector<Case> cases{
      {1, 64, 37, 0, DType::bf16, DType::f32, true},   {3, 104, 45, 0, DType::f32, DType::f32, false},
      {4, 96, 33, 16, DType::bf16, DType::f32, false}, {2, 40, 129, 70, DType::f16, DType::f16, true},
      {2, 13, 9, 3, DType::f16, DType::f32, true},      {37, 65, 19, 5, DType::f32, DType::f32, false},
      {19, 64, 40, 0, DType::bf16, DType::f32, true}};
  for (const Case& c : cases) {
    LMTUNE_CASE(c.M << "x" << c.K << "x" << c.N << " R " << c.R << " " << dtype_name(c.dt) << " factors "
                    << dtype_name(c.low) << (c.row ? " bias row" : " residual"));
    Tensor a = make_input({c.M, c.K}, c.dt, dev(), 91);
    Tensor b = make_input({c.K, c.N}, c.dt, dev(), 92, Layout::transposed);
    Tensor e = c.row ? make_input({c.N}, c.dt, dev(), 93) : make_input({c.M, c.N}, c.dt, dev(), 93);
    ref::Array want = ref::binary(ref::matmul(ref::of(a), ref::of(b)), ref::of(e), std::plus<double>());
    Tensor y;
    if (c.R > 0) {
      Tensor u = make_input({c.M, c.R}, c.low, dev(), 94);
      Tensor v = make_input({c.R, c.N}, c.low, dev(), 95, Layout::transposed);
      y = ops::matmul_add(a, b, e, u, v, 0.6f, c.dt);
      want = ref::binary(want, ref::matmul(ref::of(u), ref::of(v)), [](double p, double q) { return p + 0.6 * q; });
    } else {
      y = ops::matmul_add(a, b, e, c.dt);
    }
    EXPECT_EQ(y.dtype(), c.dt);
    EXPECT_TRUE(close(y, want, c.dt));
  }
  Tensor a = make_input({4, 3}, DType::f32, dev(), 96), b = make_input({3, 5}, DType::f32, dev(), 97);
  EXPECT_THROW(ops::matmul_add(a, b, make_input({4}, DType::f32, dev(), 98), DType::f32), lmtune::ShapeError);
  Tensor bias = make_input({5}, DType::f32, dev(), 98), u = make_input({4, 2}, DType::f32, dev(), 99);
  EXPECT_THROW(ops::matmul_add(a, b, bias, u, make_input({3, 5}, DType::f32, dev(), 99), 1.0f, DType::f32),
               lmtune::ShapeError);
}

// c = c * scale[m] + a b in place (the fused loss's running sum), against double arithmetic: odd sizes (composed)
// and tile-sized 16-bit products (the fast coopmat kernel's epilogue where the device has it) into f32 and 16-bit
// c, with and without the row scale, b in either layout.
TEST_P(OpTest, MatmulAccumulate) {
  struct Case {
    int64_t M, K, N;
    DType ab, c;
  };
  const std::vector<Case> cases{{37, 65, 19, DType::f32, DType::f32},   {256, 64, 256, DType::bf16, DType::f32},
                                {128, 96, 256, DType::f16, DType::bf16}, {128, 32, 512, DType::bf16, DType::f16},
                                {33, 40, 24, DType::bf16, DType::f32}};
  for (const Case& c : cases)
    for (Layout lb : {Layout::contiguous, Layout::transposed})
      for (bool scaled : {false, true}) {
        LMTUNE_CASE(c.M << "x" << c.K << "x" << c.N << " " << dtype_name(c.ab) << " into " << dtype_name(c.c) << " b "
                        << layout_name(lb) << (scaled ? " scaled" : ""));
        Tensor a = make_input({c.M, c.K}, c.ab, dev(), 92);
        Tensor b = make_input({c.K, c.N}, c.ab, dev(), 93, lb);
        Tensor acc = make_input({c.M, c.N}, c.c, dev(), 94);
        Tensor scale = scaled ? make_input({c.M}, DType::f32, dev(), 95, Layout::contiguous, 0.1f, 1.0f) : Tensor();
        ref::Array old = ref::of(acc), product = ref::matmul(ref::of(a), ref::of(b));
        ref::Array want = product;
        const std::vector<float> s = scaled ? scale.to_floats() : std::vector<float>(size_t(c.M), 1.0f);
        for (int64_t m = 0; m < c.M; ++m)
          for (int64_t n = 0; n < c.N; ++n) want.v[size_t(m * c.N + n)] += old.v[size_t(m * c.N + n)] * s[size_t(m)];
        ops::matmul_accumulate(acc, a, b, scale);
        EXPECT_EQ(acc.dtype(), c.c);
        EXPECT_TRUE(close(acc, want, c.c == DType::f32 ? c.ab : c.c));
      }
  EXPECT_THROW(ops::matmul_accumulate(make_input({4, 5}, DType::f32, dev(), 96), make_input({4, 3}, DType::f32, dev(), 97),
                                      make_input({3, 6}, DType::f32, dev(), 98), Tensor()),
               lmtune::ShapeError);
}

// One LoRA adapter fused into its linear layer (ops::lora_linear), without and with LoRA dropout on the adapter's
// input, against double arithmetic on the same operand values (factors and the rank-R intermediate rounded to
// f16, as the op keeps them): output, all four gradients (the factors' in f32), forward mode against reverse mode.
TEST_P(OpTest, LoraLinear) {
  struct Case {
    Shape x;
    int64_t N, R;
    DType dt;
  };
  const std::vector<Case> cases{{{3, 13, 33}, 17, 5, DType::bf16}, {{2, 64, 64}, 128, 16, DType::bf16},
                                {{2, 64, 64}, 128, 16, DType::f16}};
  const float s = 2.5f;
  for (const Case& c : cases)
    for (bool drop : {false, true}) {
      LMTUNE_CASE(to_string(c.x) << " N " << c.N << " R " << c.R << " " << dtype_name(c.dt) << " dropout " << drop);
      const int64_t K = c.x.back(), M = numel(c.x) / K;
      Tensor x = make_input(c.x, c.dt, dev(), 90);
      Tensor w = make_input({c.N, K}, c.dt, dev(), 91);
      Tensor a = make_input({c.R, K}, DType::f32, dev(), 92);
      Tensor b = make_input({c.N, c.R}, DType::f32, dev(), 93);
      Shape yshape = c.x;
      yshape.back() = c.N;
      Tensor cot = ops::cast(make_input(yshape, DType::f32, dev(), 94), c.dt);
      auto f = [&](const std::vector<Tensor>& in) {
        Tensor x_in = drop ? ops::dropout(in[0], 0.25f, 77) : Tensor();
        return std::vector<Tensor>{ops::lora_linear(in[0], in[1], in[2], in[3], s, x_in)};
      };
      auto loss = [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{ops::sum_all(ops::cast(ops::mul(f(in)[0], cot), DType::f32))};
      };
      auto [value, grads] = value_and_grad(loss)({x, w, a, b});
      auto times = [](const ref::Array& t, double k) { return ref::unary(t, [k](double e) { return k * e; }); };
      auto plus = [](const ref::Array& p, const ref::Array& q) {
        return ref::binary(p, q, [](double l, double r) { return l + r; });
      };
      auto tr = [](const ref::Array& t) { return ref::transpose(t, 0, 1); };
      const ref::Array x2 = ref::reshape(ref::of(x), {M, K}), g = ref::reshape(ref::of(cot), {M, c.N});
      const ref::Array rw = ref::of(w), a16 = ref::of(ops::cast(a, DType::f16)), b16 = ref::of(ops::cast(b, DType::f16));
      // The adapter's input and d x_in / d x (0 or 1 / (1 - p) per element with dropout; x has no zeros).
      const ref::Array xin = drop ? ref::reshape(ref::of(ops::dropout(x, 0.25f, 77)), {M, K}) : x2;
      const ref::Array mask = ref::binary(xin, x2, [](double i, double o) { return i / o; });
      const ref::Array down = ref::matmul(xin, tr(a16));
      const ref::Array y = plus(ref::matmul(x2, tr(rw)), times(ref::matmul(down, tr(b16)), s));
      EXPECT_TRUE(close(f({x, w, a, b})[0], ref::reshape(y, yshape), c.dt));
      const ref::Array gb = times(ref::matmul(g, b16), s);
      const ref::Array dx_in = ref::binary(ref::matmul(gb, a16), mask, [](double v, double m) { return v * m; });
      ASSERT_EQ(grads[2].dtype(), DType::f32);
      ASSERT_EQ(grads[3].dtype(), DType::f32);
      EXPECT_TRUE(close(grads[0], ref::reshape(plus(ref::matmul(g, rw), dx_in), c.x), c.dt));
      EXPECT_TRUE(close(grads[1], ref::matmul(tr(g), x2), c.dt));
      EXPECT_TRUE(close(grads[2], ref::matmul(tr(gb), xin), DType::f16));
      EXPECT_TRUE(close(grads[3], times(ref::matmul(tr(g), down), s), DType::f16));
      // Forward mode: <J t, cot> = <t, Jᵀ cot> with tangents on all four inputs.
      std::vector<Tensor> t{ops::cast(make_input(c.x, DType::f32, dev(), 95), c.dt),
                            ops::cast(make_input({c.N, K}, DType::f32, dev(), 96), c.dt),
                            make_input({c.R, K}, DType::f32, dev(), 97), make_input({c.N, c.R}, DType::f32, dev(), 98)};
      Tensor jt = jvp(f, {x, w, a, b}, t).second[0];
      // (16-bit rounding is relative to each input's term, and the terms partly cancel.)
      double lhs = ops::sum_all(ops::mul(ops::cast(jt, DType::f32), ops::cast(cot, DType::f32))).item();
      double rhs = 0, size = 0;
      for (size_t i = 0; i < 4; ++i) {
        double term = ops::sum_all(ops::mul(ops::cast(grads[i], DType::f32), ops::cast(t[i], DType::f32))).item();
        rhs += term;
        size += std::abs(term);
      }
      EXPECT_NEAR(lhs, rhs, 2e-2 * size + 1e-2);
    }
  EXPECT_THROW(ops::lora_linear(make_input({2, 3}, DType::f32, dev(), 99), make_input({4, 3}, DType::f32, dev(), 100),
                                make_input({2, 3}, DType::f32, dev(), 101), make_input({4, 2}, DType::f32, dev(), 102), 1.0f),
               lmtune::ShapeError);
}

// A frozen weight's transposed copy (weight_t, read by the forward product as x · weight_t) gives what the weight
// alone gives: output and the gradients of x, A and B, with and without dropout, on shapes that take the tensor-core
// fast kernel on GPUs (its nn layout with the addend) and on odd ones; bad copies are refused.
TEST_P(OpTest, LoraLinearTransposedWeight) {
  struct Case {
    Shape x;
    int64_t N, R;
  };
  for (const Case& c : std::vector<Case>{{{3, 13, 33}, 17, 5}, {{2, 128, 256}, 256, 16}})
    for (bool drop : {false, true}) {
      LMTUNE_CASE(to_string(c.x) << " N " << c.N << " dropout " << drop);
      const int64_t K = c.x.back();
      Tensor x = make_input(c.x, DType::bf16, dev(), 190);
      Tensor w = make_input({c.N, K}, DType::bf16, dev(), 191);
      Tensor wt = ops::contiguous(ops::transpose(w));
      Tensor a = make_input({c.R, K}, DType::f32, dev(), 192);
      Tensor b = make_input({c.N, c.R}, DType::f32, dev(), 193);
      Shape yshape = c.x;
      yshape.back() = c.N;
      Tensor cot = make_input(yshape, DType::f32, dev(), 194);
      auto loss = [&](const Tensor& weight_t) {
        return [&, weight_t](const std::vector<Tensor>& in) {
          Tensor x_in = drop ? ops::dropout(in[0], 0.25f, 78) : Tensor();
          Tensor y = ops::lora_linear(in[0], w, in[1], in[2], 1.5f, x_in, weight_t);
          return std::vector<Tensor>{ops::sum_all(ops::mul(ops::cast(y, DType::f32), cot)), y};
        };
      };
      auto [v0, g0] = value_and_grad(loss(Tensor()))({x, a, b});
      auto [v1, g1] = value_and_grad(loss(wt))({x, a, b});
      EXPECT_TRUE(close(loss(wt)({x, a, b})[1], ref::of(loss(Tensor())({x, a, b})[1]), DType::bf16)) << "y";
      for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(close(g1[i], ref::of(g0[i]), DType::bf16)) << "grad " << i;
    }
  Tensor x = make_input({4, 8}, DType::bf16, dev(), 195), w = make_input({6, 8}, DType::bf16, dev(), 196);
  Tensor a = make_input({2, 8}, DType::f32, dev(), 197), b = make_input({6, 2}, DType::f32, dev(), 198);
  EXPECT_THROW(ops::lora_linear(x, w, a, b, 1.0f, Tensor(), w), lmtune::ShapeError);  // not transposed
  EXPECT_THROW(ops::lora_linear(x, w, a, b, 1.0f, Tensor(), ops::cast(ops::transpose(w), DType::f32)),
               lmtune::ShapeError);
  Tensor trained = make_input({6, 8}, DType::bf16, dev(), 196).set_requires_grad();
  EXPECT_THROW(ops::lora_linear(x, trained, a, b, 1.0f, Tensor(), ops::transpose(w)), lmtune::AutodiffError);
}

TEST_P(OpTest, Linear) {
  for (DType dt : float_dtypes())
    for (Layout lx : {Layout::contiguous, Layout::transposed, Layout::strided}) {
      LMTUNE_CASE(dtype_name(dt) << " " << layout_name(lx));
      Tensor x = make_input({2, 7, 33}, dt, dev(), 67, lx);
      Tensor w = make_input({5, 33}, dt, dev(), 68);
      Tensor b = make_input({5}, dt, dev(), 69);
      ref::Array rb = ref::of(b);
      EXPECT_TRUE(close(ops::linear(x, w), ref::linear(ref::of(x), ref::of(w), nullptr), dt));
      EXPECT_TRUE(close(ops::linear(x, w, b), ref::linear(ref::of(x), ref::of(w), &rb), dt));
      Tensor v = make_input({33}, dt, dev(), 70);
      EXPECT_TRUE(close(ops::linear(v, w, b),
                        ref::reshape(ref::linear(ref::reshape(ref::of(v), {1, 33}), ref::of(w), &rb), {5}), dt));
    }
}

}  // namespace
}  // namespace lmtune::test
