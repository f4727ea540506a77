// Decoding's rope and KV-cache append in one op (ops::rope_append) against ops::rope followed by copies on the same
// device (bit-equal) and against the double reference, on every device: the queries returned, the keys and the
// values in their cache slots, every other slot untouched.
#include <cmath>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops/rope_append.h"
#include "core/ops/view.h"
#include "ops/op_test_util.h"

namespace lmtune::test {
namespace {

struct RopeAppendCase {
  int64_t B, T, H, KV, D, R;
  DType dt;
  float scale;
};

TEST_P(OpTest, RopeAppend) {
  const std::vector<RopeAppendCase> cases{{1, 1, 4, 2, 16, 16, DType::bf16, 1.0f},
                                          {2, 3, 3, 1, 16, 6, DType::f32, 1.2071f},
                                          {1, 5, 7, 1, 64, 64, DType::f16, 1.0f},
                                          {2, 1, 2, 2, 8, 4, DType::bf16, 1.0f}};
  for (const RopeAppendCase& c : cases) {
    LMTUNE_CASE(c.B << "x" << c.T << " H " << c.H << " KV " << c.KV << " D " << c.D << " R " << c.R << " "
                    << dtype_name(c.dt));
    const int64_t heads = c.H + 2 * c.KV, capacity = c.T + 4, used = 2;
    // The fused q, k, v product [B, T, (H + 2 KV) D]; q and k as one strided view of it, v another.
    const Tensor whole = make_input({c.B, c.T, heads * c.D}, c.dt, dev(), 91);
    const Tensor qk = ops::reshape(ops::slice(whole, 2, 0, (c.H + c.KV) * c.D), {c.B, c.T, c.H + c.KV, c.D});
    const Tensor v = ops::reshape(ops::slice(whole, 2, (c.H + c.KV) * c.D, heads * c.D), {c.B, c.T, c.KV, c.D});
    std::vector<int32_t> pos;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t t = 0; t < c.T; ++t) pos.push_back(int32_t(b == 0 ? used + t : 4000 + 3 * t));
    const Tensor positions = Tensor::from_ints(pos, {c.B, c.T}, dev());
    std::vector<float> inv;
    for (int64_t i = 0; i < c.R / 2; ++i) inv.push_back(float(std::pow(10000.0, -2.0 * double(i) / double(c.R))));
    const Tensor inv_freq = Tensor::from_floats(inv, {c.R / 2}, DType::f32, dev());
    // Caches [B, capacity, KV, D] holding earlier tokens; the new ones go to [used, used + T).
    const Tensor k_cache = make_input({c.B, capacity, c.KV, c.D}, c.dt, dev(), 92);
    const Tensor v_cache = make_input({c.B, capacity, c.KV, c.D}, c.dt, dev(), 93);
    const std::vector<double> k_before = k_cache.to_doubles(), v_before = v_cache.to_doubles();
    const Tensor k_slots = ops::slice(k_cache, 1, used, used + c.T);
    const Tensor v_slots = ops::slice(v_cache, 1, used, used + c.T);
    const Tensor q = ops::rope_append(qk, v, positions, inv_freq, c.scale, k_slots, v_slots);
    ASSERT_EQ(q.shape(), (Shape{c.B, c.T, c.H, c.D}));
    // The composition on this device: the same values.
    const Tensor r = ops::rope(qk, positions, inv_freq, ops::RopeLayout::half_split, c.scale);
    EXPECT_EQ(q.to_doubles(), ops::slice(r, 2, 0, c.H).to_doubles());
    EXPECT_EQ(k_slots.to_doubles(), ops::slice(r, 2, c.H, c.H + c.KV).to_doubles());
    EXPECT_EQ(v_slots.to_doubles(), v.to_doubles());
    const ref::Array want = ref::rope(ref::of(qk), ref::ints_of(positions), ref::of(inv_freq),
                                      ops::RopeLayout::half_split, false, c.scale);
    EXPECT_TRUE(close(q, ref::slice(want, 2, 0, c.H, 1), c.dt));
    // Slots outside [used, used + T) keep what they held.
    const std::vector<double> k_after = k_cache.to_doubles(), v_after = v_cache.to_doubles();
    const int64_t row = c.KV * c.D;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t j = 0; j < capacity; ++j) {
        if (j >= used && j < used + c.T) continue;
        for (int64_t e = 0; e < row; ++e) {
          const size_t i = size_t((b * capacity + j) * row + e);
          ASSERT_EQ(k_after[i], k_before[i]) << "key slot " << j;
          ASSERT_EQ(v_after[i], v_before[i]) << "value slot " << j;
        }
      }
  }
}

TEST_P(OpTest, RopeAppendBadInputs) {
  const Tensor qk = make_input({1, 1, 3, 8}, DType::f32, dev(), 94);
  const Tensor v = make_input({1, 1, 1, 8}, DType::f32, dev(), 95);
  const Tensor pos = Tensor::from_ints({0}, {1, 1}, dev());
  const Tensor freq = Tensor::from_floats({1.0f, 0.5f}, {2}, DType::f32, dev());
  const Tensor slots = Tensor::empty({1, 1, 1, 8}, DType::f32, dev());
  EXPECT_THROW(ops::rope_append(qk, make_input({1, 1, 2, 8}, DType::f32, dev(), 96), pos, freq, 1.0f, slots, slots),
               lmtune::ShapeError);
  EXPECT_THROW(ops::rope_append(qk, v, Tensor::from_ints({0, 1}, {1, 2}, dev()), freq, 1.0f, slots, slots),
               lmtune::ShapeError);
  EXPECT_THROW(ops::rope_append(qk, v, pos, Tensor::from_floats({1, 1, 1, 1, 1}, {5}, DType::f32, dev()), 1.0f,
                                slots, slots),
               lmtune::ShapeError);
  Tensor tracked = make_input({1, 1, 3, 8}, DType::f32, dev(), 97);
  tracked.set_requires_grad(true);
  EXPECT_THROW(ops::rope_append(tracked, v, pos, freq, 1.0f, slots, slots), lmtune::AutodiffError);
}

}  // namespace
}  // namespace lmtune::test
