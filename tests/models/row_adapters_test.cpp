// A batch whose rows use different adapters (serving): Linear::by_row_ids takes every row's delta from stacks of
// the adapters' factors by id. Each row equals x Wᵀ + b + s (x Aᵀ) Bᵀ of its own adapter (or none), in f32;
// ranks that are not multiples of 8, rows without an adapter, groups naming an adapter the layer does not have and
// several tokens per row included. On Vulkan the deltas are two matmul_gemv dispatches however many adapters.
#include <gtest/gtest.h>

#include "common/dispatch_count.h"
#include "core/autodiff.h"
#include "core/ops.h"
#include "models/linear.h"
#include "models_test_util.h"

namespace lmtune::models {
namespace {

using test::rel_err;

Linear layer_with_adapters(Device dev) {
  Linear l(Tensor::randn({40, 24}, 1, 0.3f, DType::f32, dev), Tensor::randn({40}, 2, 0.1f, DType::f32, dev));
  const char* names[] = {"a", "b", "c"};
  const int64_t ranks[] = {4, 16, 8};
  for (int i = 0; i < 3; ++i) {
    LoraAdapter& a = l.add_adapter(ranks[i], 0.5f + 0.25f * float(i), 10 + uint64_t(i), names[i]);
    a.B = Tensor::randn(a.B.shape(), 20 + uint64_t(i), 0.3f, DType::f32, dev);
  }
  return l;
}

// Row b of x through `l` with only adapter `name` (empty: none), composed in f32 from the layer's tensors: x Wᵀ
// + bias + scale (x Aᵀ) Bᵀ (none of the paths Linear chooses between).
Tensor alone(const Linear& l, const Tensor& x, int64_t b, const std::string& name) {
  const Tensor xb = ops::cast(ops::reshape(ops::slice(x, 0, b, b + 1), {-1, x.dim(-1)}), DType::f32);
  Tensor y = ops::matmul(xb, ops::transpose(ops::cast(l.weight, DType::f32)));
  if (l.bias.defined()) y = ops::add(y, ops::cast(l.bias, DType::f32));
  for (const LoraAdapter& a : l.adapters)
    if (a.name == name)
      y = ops::add(y, ops::scale(ops::matmul(ops::matmul(xb, ops::transpose(a.A)), ops::transpose(a.B)), a.scale));
  Shape out = x.shape();
  out[0] = 1;
  out.back() = l.out_features();
  return ops::reshape(y, out);
}

// Six rows mixing the adapters of layer_with_adapters: row 0 none, 1-2 "b", 3 "a", 4 "zzz" (not on the layer),
// 5 "c"; kSixRowsUse[b] is the adapter row b gets.
RowAdapters six_mixed_rows() {
  RowAdapters rows;
  rows.groups = {{"b", 1, 3}, {"a", 3, 4}, {"zzz", 4, 5}, {"c", 5, 6}};
  return rows;
}
const char* const kSixRowsUse[] = {"", "b", "b", "a", "", "c"};

// Runs `check(device, dtype, tolerance)` on every test device in f32 and bf16, without autodiff.
template <typename Check>
void on_devices_and_dtypes(const Check& check) {
  for (const std::string& dev_name : test::test_devices())
    for (DType dt : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(dev_name + " " + std::string(dtype_name(dt)));
      NoGrad no_grad;
      check(parse_device(dev_name), dt, dt == DType::f32 ? 1e-5 : 1e-2);
    }
}

// 3 tokens per row: the deltas by id; 20 (a prompt of 120 rows in all): each group's own delta products.
TEST(RowAdapters, EachRowGetsItsOwnAdapter) {
  on_devices_and_dtypes([](Device dev, DType dt, double tol) {
    for (int64_t tokens : {3, 20}) {
      SCOPED_TRACE("tokens " + std::to_string(tokens));
      const Linear l = layer_with_adapters(dev);
      const Tensor x = ops::cast(Tensor::randn({6, tokens, 24}, 5, 1.0f, DType::f32, dev), dt);
      const RowAdapters rows = six_mixed_rows();
      const Tensor y = l(x, &rows);
      ASSERT_EQ(y.shape(), (Shape{6, tokens, 40}));
      for (int64_t b = 0; b < 6; ++b)
        EXPECT_LT(rel_err(ops::slice(y, 0, b, b + 1).to_floats(), alone(l, x, b, kSixRowsUse[b]).to_floats()), tol)
            << "row " << b;
    }
  });
}

// The residual stream plus a layer's output (o_proj, down_proj) in a mixed batch: the residual in the base
// product's epilogue, each row's delta by id after it; rows equal the residual plus their layer alone.
TEST(RowAdapters, ResidualTakesEachRowsOwnAdapter) {
  on_devices_and_dtypes([](Device dev, DType dt, double tol) {
    const Linear l = layer_with_adapters(dev);
    const Tensor x = ops::cast(Tensor::randn({6, 1, 24}, 21, 1.0f, DType::f32, dev), dt);
    const Tensor r = ops::cast(Tensor::randn({6, 1, 40}, 22, 1.0f, DType::f32, dev), dt);
    const RowAdapters rows = six_mixed_rows();
    RowAdapters others;  // no group names an adapter of this layer: the base product alone
    others.groups = {{"zzz", 0, 6}};
    const Tensor y = l.add_to(r, x, &rows), base = l.add_to(r, x, &others);
    for (int64_t b = 0; b < 6; ++b) {
      const Tensor rb = ops::cast(ops::slice(r, 0, b, b + 1), DType::f32);
      EXPECT_LT(rel_err(ops::slice(y, 0, b, b + 1).to_floats(),
                        ops::add(rb, alone(l, x, b, kSixRowsUse[b])).to_floats()),
                tol)
          << "row " << b;
      EXPECT_LT(rel_err(ops::slice(base, 0, b, b + 1).to_floats(), ops::add(rb, alone(l, x, b, "")).to_floats()), tol)
          << "row " << b;
    }
  });
}

// Serving's batches through a projection group (q, k, v as one product): the base products as one, plus every
// row's deltas of all parts by id from the parts' adapters stacked per name (q has "a", "b", "c" and v "b", with
// other factors); every row equals its part alone with only its adapter.
TEST(RowAdapters, ProjectionGroupsTakeEachRowsOwnAdapter) {
  on_devices_and_dtypes([](Device dev, DType dt, double tol) {
    Linear q = layer_with_adapters(dev), k(Tensor::randn({16, 24}, 3, 0.3f, DType::f32, dev),
                                           Tensor::randn({16}, 4, 0.1f, DType::f32, dev));
    Linear v(Tensor::randn({16, 24}, 7, 0.3f, DType::f32, dev), Tensor::randn({16}, 8, 0.1f, DType::f32, dev));
    v.adapters.push_back(q.adapters[1]);  // "b" only
    v.adapters[0].A = Tensor::randn(v.adapters[0].A.shape(), 30, 0.3f, DType::f32, dev);
    v.adapters[0].B = Tensor::randn({16, v.adapters[0].A.dim(0)}, 31, 0.3f, DType::f32, dev);
    const LinearGroup group({&q, &k, &v});
    ASSERT_TRUE(group.defined());
    const int64_t B = 20;  // more rows than decoding's fused group takes
    const Tensor x = ops::cast(Tensor::randn({B, 1, 24}, 9, 1.0f, DType::f32, dev), dt);
    RowAdapters rows;  // 0-5 none, 5-11 "b", 11-14 "a", 14-16 "zzz", 16-20 "c"
    rows.groups = {{"b", 5, 11}, {"a", 11, 14}, {"zzz", 14, 16}, {"c", 16, 20}};
    Tensor whole;
    const std::vector<Tensor> out = group({&q, &k, &v}, x, &rows, &whole);
    ASSERT_EQ(out.size(), 3u);
    ASSERT_TRUE(whole.defined());  // the one product with every part's deltas: the parts are its columns
    EXPECT_EQ(rel_err(ops::slice(whole, -1, 56, 72).to_floats(), out[2].to_floats()), 0.0);
    auto want = [&](int64_t b) {
      return b < 5 || (b >= 14 && b < 16) ? "" : b < 11 ? "b" : b < 14 ? "a" : "c";
    };
    const Linear* parts[] = {&q, &k, &v};
    for (int i = 0; i < 3; ++i)
      for (int64_t b = 0; b < B; ++b)
        EXPECT_LT(rel_err(ops::slice(out[size_t(i)], 0, b, b + 1).to_floats(),
                          alone(*parts[i], x, b, want(b)).to_floats()),
                  tol)
            << "part " << i << " row " << b;
    // No group names k's adapters (it has none), so the three base products without deltas are one product.
    RowAdapters none;
    const std::vector<Tensor> plain = group({&q, &k, &v}, x, &none, &whole);
    ASSERT_TRUE(whole.defined());
    EXPECT_LT(rel_err(plain[1].to_floats(), k(x).to_floats()), tol);
  });
}

// gate and up as one product with the activation in it, for serving's batches where no group names their
// adapters; where one does, the caller takes the parts' products (the deltas come before the activation).
TEST(RowAdapters, GatedGroupTakesServingBatchesWithoutDeltas) {
  for (const std::string& dev_name : test::test_devices()) {
    SCOPED_TRACE(dev_name);
    const Device dev = parse_device(dev_name);
    NoGrad no_grad;
    Linear gate(Tensor::randn({32, 24}, 11, 0.3f, DType::f32, dev));
    Linear up(Tensor::randn({32, 24}, 12, 0.3f, DType::f32, dev));
    const LinearGroup group({&gate, &up});
    const Tensor x = Tensor::randn({20, 1, 24}, 13, 1.0f, DType::f32, dev);
    RowAdapters rows;
    rows.groups = {{"a", 0, 7}};
    const Tensor y = group.gated(gate, up, x, ops::GateActivation::silu, &rows);
    ASSERT_TRUE(y.defined());
    EXPECT_LT(rel_err(y.to_floats(), ops::gated_activation_reference(gate(x), up(x), ops::GateActivation::silu)
                                         .to_floats()),
              1e-5);
    gate.add_adapter(4, 1.0f, 14, "a");
    EXPECT_FALSE(group.gated(gate, up, x, ops::GateActivation::silu, &rows).defined());
  }
}

TEST(RowAdapters, DeltasAreTwoDispatchesOnVulkan) {
  const std::vector<std::string> devices = test::test_devices();
  if (devices.size() < 2) GTEST_SKIP() << "no Vulkan device";
  const Device dev = parse_device(devices[1]);
  vk::Context& ctx = vk::context_for(dev);
  if (!ctx.features().subgroup_arithmetic) GTEST_SKIP() << "no subgroup arithmetic";
  if (!ctx.features().timestamps) GTEST_SKIP() << "no timestamps to count dispatches by";
  NoGrad no_grad;
  const Linear l = layer_with_adapters(dev);
  const Tensor x = Tensor::randn({4, 1, 24}, 6, 1.0f, DType::f32, dev);
  RowAdapters rows;
  rows.groups = {{"a", 0, 1}, {"b", 1, 2}, {"c", 2, 3}};
  (void)l(x, &rows);  // the factors are stacked and the rows' slots uploaded once, on first use
  EXPECT_EQ(rows.slot_ids.size(), 1u);
  // The base product of 4 rows is matmul_gemv's 4-row variant; the deltas are one-row-per-workgroup products.
  const lmtune::test::DispatchCount c =
      lmtune::test::count_dispatches(ctx, "matmul_gemv_r1", [&] { (void)l(x, &rows); });
  EXPECT_EQ(c.matching, 2u) << c.report;
  EXPECT_LE(c.all, 5u) << c.report;  // and the base product, its bias, the add
  EXPECT_EQ(rows.slot_ids.size(), 1u);  // the same slots again
  (void)l(ops::slice(x, 0, 0, 3), &rows);
  EXPECT_EQ(rows.slot_ids.size(), 2u);  // another batch size, other slots
}

}  // namespace
}  // namespace lmtune::models
