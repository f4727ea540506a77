// RMSNorm, LayerNorm, rotary embedding (both layouts, partial rotation), dropout, embedding and its scatter-add.
#include "core/autodiff.h"
#include "core/error.h"
#include "ops/op_test_util.h"

namespace lmtune::test {
namespace {

TEST_P(OpTest, RmsNormAndLayerNorm) {
  for (DType dt : float_dtypes())
    for (Layout l : {Layout::contiguous, Layout::transposed, Layout::strided})
      for (const Shape& s : {Shape{7, 33}, Shape{2, 3, 65}, Shape{1, 1}}) {
        LMTUNE_CASE(dtype_name(dt) << " " << layout_name(l) << " " << to_string(s));
        Tensor x = make_input(s, dt, dev(), 71, l, 0.1f, 3.0f);
        Tensor w = make_input({s.back()}, dt, dev(), 72, Layout::contiguous, 0.5f, 1.5f);
        Tensor b = make_input({s.back()}, dt, dev(), 73);
        ref::Array rx = ref::of(x), rw = ref::of(w), rb = ref::of(b);
        Tensor y = ops::rms_norm(x, w, 1e-5f);
        EXPECT_EQ(y.dtype(), dt);
        EXPECT_TRUE(close(y, ref::rms_norm(rx, rw, 1e-5), dt));
        EXPECT_TRUE(close(ops::layer_norm(x, w, b, 1e-5f), ref::layer_norm(rx, rw, &rb, 1e-5), dt));
        EXPECT_TRUE(close(ops::layer_norm(x, w, Tensor(), 1e-6f), ref::layer_norm(rx, rw, nullptr, 1e-6), dt));
      }
}

// RMSNorm's input gradient (the fused RmsNormGrad pass that backward runs) against a double-precision reference:
// vector and element-wise row lengths, every float dtype, strided inputs.
TEST_P(OpTest, RmsNormInputGradient) {
  for (DType dt : float_dtypes())
    for (const Shape& s : {Shape{7, 33}, Shape{2, 3, 64}, Shape{5, 260}}) {
      LMTUNE_CASE(dtype_name(dt) << " " << to_string(s));
      Tensor x = make_input(s, dt, dev(), 81, Layout::strided, 0.1f, 3.0f);
      Tensor w = make_input({s.back()}, dt, dev(), 82, Layout::contiguous, 0.5f, 1.5f);
      Tensor u = make_input(s, DType::f32, dev(), 83);  // loss = sum(y * u): the cotangent of y is u
      Tensor gx = value_and_grad([&](const std::vector<Tensor>& in) {
                    return std::vector<Tensor>{ops::sum_all(ops::mul(ops::cast(ops::rms_norm(in[0], w, 1e-5f), DType::f32), u))};
                  })({x}).second[0];
      ref::Array rx = ref::of(x), rw = ref::of(w), ru = ref::of(u), want(s);
      const int64_t C = s.back(), rows = rx.size() / C;
      for (int64_t r = 0; r < rows; ++r) {
        double ss = 0, dot = 0;
        for (int64_t c = 0; c < C; ++c) ss += rx[r * C + c] * rx[r * C + c];
        const double rstd = 1.0 / std::sqrt(ss / double(C) + 1e-5);
        for (int64_t c = 0; c < C; ++c) dot += ru[r * C + c] * rw[c] * rx[r * C + c] * rstd;
        for (int64_t c = 0; c < C; ++c)
          want[r * C + c] = rstd * (ru[r * C + c] * rw[c] - rx[r * C + c] * rstd * dot / double(C));
      }
      EXPECT_EQ(gx.dtype(), dt);
      EXPECT_TRUE(close(gx, want, dt));
    }
}

TEST_P(OpTest, LayerNormLargeMean) {
  // A row with a large common offset: one-pass variance formulas lose everything here.
  std::vector<float> v = random_values(65, 74);
  for (float& f : v) f += 1000.0f;
  Tensor x = Tensor::from_floats(v, {1, 65}, DType::f32, dev());
  Tensor w = Tensor::full({65}, 1.0f, DType::f32, dev());
  ref::Array rw = ref::of(w);
  EXPECT_TRUE(close(ops::layer_norm(x, w, Tensor(), 1e-5f), ref::layer_norm(ref::of(x), rw, nullptr, 1e-5), 1e-8));
}

// Dropout: the same mask on every backend (bit for bit against the CPU), the kept fraction near 1 - p, kept
// elements scaled by 1 / (1 - p), a new mask for a new key, and the gradient through the same mask.
TEST_P(OpTest, Dropout) {
  const float p = 0.3f;
  for (DType dt : float_dtypes())
    for (Layout l : {Layout::contiguous, Layout::transposed}) {
      LMTUNE_CASE(dtype_name(dt) << " " << layout_name(l));
      Tensor x = make_input({3, 7, 129}, dt, dev(), 40, l);
      Tensor y = ops::dropout(x, p, 0x123456789abcdefull);
      ASSERT_EQ(y.dtype(), dt);
      Tensor x_cpu = Tensor::from_floats(x.to_floats(), x.shape(), dt, Device::cpu());
      EXPECT_EQ(y.to_floats(), ops::dropout(x_cpu, p, 0x123456789abcdefull).to_floats());
      const std::vector<float> xv = x.to_floats(), yv = y.to_floats();
      const std::vector<float> other = ops::dropout(x, p, 0x123456789abcdeeull).to_floats();
      int64_t kept = 0, differ = 0;
      for (size_t i = 0; i < xv.size(); ++i) {
        if (yv[i] != 0) {
          ++kept;
          EXPECT_NEAR(yv[i], xv[i] / (1 - p), 1e-2 * std::abs(xv[i])) << "element " << i;
        }
        differ += (yv[i] == 0) != (other[i] == 0);
      }
      EXPECT_NEAR(double(kept) / double(xv.size()), 1 - p, 0.04);
      EXPECT_GT(differ, int64_t(xv.size() / 5));
      // d/dx Σ c ⊙ dropout(x) = dropout(c): zero where x was dropped, c / (1 - p) elsewhere.
      Tensor c = make_input(x.shape(), DType::f32, dev(), 41);
      auto loss = [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{ops::sum_all(ops::mul(ops::cast(ops::dropout(in[0], p, 0x123456789abcdefull), DType::f32), c))};
      };
      const std::vector<float> gv = value_and_grad(loss)({x}).second[0].to_floats(), cv = c.to_floats();
      for (size_t i = 0; i < gv.size(); ++i)
        EXPECT_NEAR(gv[i], yv[i] == 0 ? 0.0f : cv[i] / (1 - p), 1e-2 * std::abs(cv[i]) + 1e-6) << "element " << i;
    }
  Tensor x = make_input({5}, DType::f32, dev(), 42);
  EXPECT_EQ(ops::dropout(x, 0.0f, 1).to_floats(), x.to_floats());
  EXPECT_THROW(ops::dropout(x, 1.0f, 1), lmtune::ShapeError);
}

TEST_P(OpTest, Rope) {
  for (DType dt : float_dtypes())
    for (auto layout : {ops::RopeLayout::half_split, ops::RopeLayout::interleaved})
      for (int64_t R : {16, 6}) {  // full and partial rotation of D = 16
        const float scale = R == 6 ? 1.2071f : 1.0f;  // yarn / longrope attention factor on the rotated dims
        LMTUNE_CASE(dtype_name(dt) << " layout " << int(layout) << " R " << R << " scale " << scale);
        Tensor x = make_input({2, 7, 3, 16}, dt, dev(), 75, Layout::strided);
        std::vector<int32_t> pos;
        for (int b = 0; b < 2; ++b)
          for (int t = 0; t < 7; ++t) pos.push_back(b == 0 ? t : 4000 + 3 * t);  // large positions too
        Tensor positions = Tensor::from_ints(pos, {2, 7}, dev());
        std::vector<float> inv;
        for (int64_t i = 0; i < R / 2; ++i) inv.push_back(float(std::pow(10000.0, -2.0 * double(i) / double(R))));
        Tensor inv_freq = Tensor::from_floats(inv, {R / 2}, DType::f32, dev());
        Tensor y = ops::rope(x, positions, inv_freq, layout, scale);
        EXPECT_TRUE(close(y, ref::rope(ref::of(x), ref::ints_of(positions), ref::of(inv_freq), layout, false, scale),
                          dt));
      }
}

TEST_P(OpTest, EmbeddingAndBackward) {
  for (DType dt : float_dtypes()) {
    LMTUNE_CASE(dtype_name(dt));
    Tensor w = make_input({11, 33}, dt, dev(), 76);
    Tensor ids = Tensor::from_ints({3, 0, 10, 3, 3, 7}, {2, 3}, dev());  // repeats exercise the scatter-add
    auto rid = ref::ints_of(ids);
    EXPECT_TRUE(close(ops::embedding(w, ids), ref::embedding(ref::of(w), rid, {2, 3}), 0.0));
    Tensor g = make_input({2, 3, 33}, dt, dev(), 77, Layout::transposed);
    Tensor gw = ops::embedding_backward(g, ids, 11);
    EXPECT_EQ(gw.shape(), (Shape{11, 33}));
    EXPECT_TRUE(close(gw, ref::embedding_backward(ref::of(g), rid, 11), dt));
  }
}

// Ids the device made (top-k's): no read-back on a GPU, where an id outside the vocabulary gives a zero row; the CPU
// checks them as always.
TEST_P(OpTest, EmbeddingOfDeviceIds) {
  Tensor w = make_input({11, 33}, DType::f32, dev(), 78);
  Tensor ids = Tensor::from_ints({3, 0, 10, 3}, {4}, dev());
  EXPECT_TRUE(close(ops::embedding(w, ids, true), ref::embedding(ref::of(w), ref::ints_of(ids), {4}), 0.0));
  Tensor bad = Tensor::from_ints({3, 11}, {2}, dev());
  if (!dev().is_vulkan()) {
    EXPECT_THROW(ops::embedding(w, bad, true), ShapeError);
    return;
  }
  const std::vector<float> y = ops::embedding(w, bad, true).to_floats(), row3 = ops::embedding(w, ids).to_floats();
  for (int64_t c = 0; c < 33; ++c) {
    EXPECT_EQ(y[size_t(c)], row3[size_t(c)]) << c;
    EXPECT_EQ(y[size_t(33 + c)], 0.0f) << c;
  }
  EXPECT_THROW(ops::embedding(w, bad), ShapeError);  // read back and checked without device_ids
}

}  // namespace
}  // namespace lmtune::test
