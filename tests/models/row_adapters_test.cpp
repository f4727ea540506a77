// A batch whose rows use different adapters (serving): Linear::by_row_ids takes every row's delta from stacks of
// the adapters' factors by id. Each row equals the layer with only its own adapter (or none) applied to it alone;
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

// Row b of x through `l` with only adapter `name` (empty: none).
Tensor alone(const Linear& l, const Tensor& x, int64_t b, const std::string& name) {
  Linear one = l;
  one.adapters.clear();
  for (const LoraAdapter& a : l.adapters)
    if (a.name == name) one.adapters.push_back(a);
  return one(ops::slice(x, 0, b, b + 1));
}

TEST(RowAdapters, EachRowGetsItsOwnAdapter) {
  for (const std::string& dev_name : test::test_devices())
    for (DType dt : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(dev_name + " " + std::string(dtype_name(dt)));
      const Device dev = parse_device(dev_name);
      NoGrad no_grad;
      const Linear l = layer_with_adapters(dev);
      const Tensor x = ops::cast(Tensor::randn({6, 3, 24}, 5, 1.0f, DType::f32, dev), dt);
      RowAdapters rows;  // row 0 none, 1-2 "b", 3 "a", 4 "zzz" (not on this layer), 5 "c"
      rows.groups = {{"b", 1, 3}, {"a", 3, 4}, {"zzz", 4, 5}, {"c", 5, 6}};
      const Tensor y = l(x, &rows);
      ASSERT_EQ(y.shape(), (Shape{6, 3, 40}));
      const char* want[] = {"", "b", "b", "a", "", "c"};
      for (int64_t b = 0; b < 6; ++b)
        EXPECT_LT(rel_err(ops::slice(y, 0, b, b + 1).to_floats(), alone(l, x, b, want[b]).to_floats()),
                  dt == DType::f32 ? 1e-5 : 1e-2)
            << "row " << b;
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
  (void)l(x, &rows);  // the factors are stacked once, on first use
  // The base product of 4 rows is matmul_gemv's 4-row variant; the deltas are one-row-per-workgroup products.
  const lmtune::test::DispatchCount c =
      lmtune::test::count_dispatches(ctx, "matmul_gemv_r1", [&] { (void)l(x, &rows); });
  EXPECT_EQ(c.matching, 2u) << c.report;
  EXPECT_LE(c.all, 5u) << c.report;  // and the base product, its bias, the add
}

}  // namespace
}  // namespace lmtune::models
