// The Vulkan runtime: device listing, the block allocator, batching and barriers in the recorder, profiling.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/vulkan/allocator.h"
#include "backend/vulkan/context.h"
#include "backend/vulkan/recorder.h"
#include "backend/vulkan/vulkan_backend.h"
#include "core/error.h"
#include "core/ops.h"
#include "vk_test_util.h"

namespace lmtune {
namespace {

using test::gpu;

TEST(VulkanRuntime, ListsDevices) {
  REQUIRE_VULKAN();
  auto devs = vk::list_devices();
  ASSERT_FALSE(devs.empty());
  for (const auto& d : devs) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_FALSE(d.type.empty());
    EXPECT_GT(d.memory_bytes, 0u);
    EXPECT_GT(d.subgroup_size, 0u);
    EXPECT_FALSE(d.driver.empty());
  }
  vk::Context& ctx = vk::context_for(gpu());
  EXPECT_NE(ctx.device(), VK_NULL_HANDLE);
  EXPECT_EQ(ctx.features().subgroup_size, devs[0].subgroup_size);
}

TEST(VulkanRuntime, AllocatorSubAllocatesAndReuses) {
  REQUIRE_VULKAN();
  vk::Context& ctx = vk::context_for(gpu());
  Backend& be = backend(gpu());
  be.synchronize();
  size_t blocks0 = ctx.allocator().block_count();
  size_t used0 = be.bytes_in_use();
  std::vector<std::shared_ptr<Buffer>> bufs;
  for (int i = 0; i < 64; ++i) bufs.push_back(be.allocate(1000 + size_t(i)));
  // 64 small tensors share blocks: at most one new block.
  EXPECT_LE(ctx.allocator().block_count(), blocks0 + 1);
  EXPECT_EQ(be.bytes_in_use(), used0 + 64 * 1000 + 63 * 64 / 2);
  std::set<std::pair<VkBuffer, VkDeviceSize>> ranges;
  for (auto& b : bufs) {
    auto& a = static_cast<vk::DeviceBuffer&>(*b).allocation();
    EXPECT_EQ(a.offset % 256, 0u);
    EXPECT_TRUE(ranges.insert({a.buffer, a.offset}).second);
  }
  auto first = static_cast<vk::DeviceBuffer&>(*bufs[0]).allocation();
  bufs.clear();
  be.synchronize();
  EXPECT_EQ(be.bytes_in_use(), used0);
  auto again = be.allocate(1000);
  auto& a = static_cast<vk::DeviceBuffer&>(*again).allocation();
  EXPECT_EQ(a.buffer, first.buffer);  // the freed range (coalesced) is reused
  EXPECT_GE(be.peak_bytes(), used0 + 64 * 1000);
  be.reset_peak();
  EXPECT_EQ(be.peak_bytes(), be.bytes_in_use());
}

// Freed blocks stay reserved (up to 1.25x the most ever held) for the next step's tensors instead of going back
// to the driver and being allocated again.
TEST(VulkanRuntime, AllocatorKeepsFreedBlocksForReuse) {
  REQUIRE_VULKAN();
  vk::Context& ctx = vk::context_for(gpu());
  Backend& be = backend(gpu());
  be.synchronize();
  const size_t big = size_t(ctx.allocator().block_size()) * 5 / 8;  // one per block
  auto step = [&] {
    std::vector<std::shared_ptr<Buffer>> bufs;
    for (int i = 0; i < 4; ++i) bufs.push_back(be.allocate(big));
    size_t n = ctx.allocator().block_count();
    bufs.clear();
    be.synchronize();
    return n;
  };
  size_t during = step();
  EXPECT_EQ(ctx.allocator().block_count(), during) << "freed blocks were given back";
  size_t reserved = ctx.allocator().reserved_bytes();
  EXPECT_EQ(step(), during) << "the second step needed new blocks";
  EXPECT_EQ(ctx.allocator().reserved_bytes(), reserved);
}

TEST(VulkanRuntime, OutOfMemoryNamesSizes) {
  REQUIRE_VULKAN();
  Backend& be = backend(gpu());
  try {
    be.allocate(size_t(1) << 40);
    FAIL() << "1 TiB allocation succeeded";
  } catch (const OutOfMemoryError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("1024.00 GiB"), std::string::npos) << m;
    EXPECT_NE(m.find("in use"), std::string::npos) << m;
    EXPECT_NE(m.find("available"), std::string::npos) << m;
  }
  // The device still works afterwards.
  auto t = Tensor::from_floats({1, 2, 3}, {3}, DType::f32, gpu());
  EXPECT_EQ(t.to_floats(), (std::vector<float>{1, 2, 3}));
}

TEST(VulkanRuntime, WriteReadRoundTrip) {
  REQUIRE_VULKAN();
  for (int64_t n : {1, 7, 33, 257, 1031, 300000}) {
    auto h = Tensor::randn({n}, 11, 1.0f, DType::f32, Device::cpu()).to_floats();
    auto t = Tensor::from_floats(h, {n}, DType::f32, gpu());
    EXPECT_EQ(t.to_floats(), h);
  }
}

TEST(VulkanRuntime, BatchesManyDispatchesAndOrdersThem) {
  REQUIRE_VULKAN();
  vk::Context& ctx = vk::context_for(gpu());
  ctx.synchronize();
  uint64_t subs0 = ctx.recorder().submissions();
  auto x = Tensor::full({1031}, 0.0f, DType::f32, gpu());
  // A chain of 600 dependent dispatches (each reads the previous result), then one read.
  for (int i = 0; i < 600; ++i) x = ops::add_scalar(x, 1.0f);
  uint64_t subs_mid = ctx.recorder().submissions();
  auto v = x.to_floats();
  for (float f : v) ASSERT_EQ(f, 600.0f);
  uint64_t subs = ctx.recorder().submissions() - subs0;
  // Bounded work per submit: after the synchronize, batches of 16, 32, 64, 128, then 256 dispatches.
  EXPECT_GE(subs, 5u);
  EXPECT_LE(subs, 7u);  // but batched, not one submit per dispatch
  EXPECT_EQ(subs_mid - subs0, 5u);
}

TEST(VulkanRuntime, WriteAfterKernelsIsOrdered) {
  REQUIRE_VULKAN();
  auto x = Tensor::full({257}, 1.0f, DType::f32, gpu());
  auto y = ops::scale(x, 3.0f);  // queued: reads x
  std::vector<float> ones(257, 5.0f);
  backend(gpu()).write(*x.buffer(), 0, ones.data(), ones.size() * 4);  // must not affect y
  auto z = ops::scale(x, 2.0f);
  for (float f : y.to_floats()) ASSERT_EQ(f, 3.0f);
  for (float f : z.to_floats()) ASSERT_EQ(f, 10.0f);
}

TEST(VulkanRuntime, ReadLaterSeesItsPointInTheQueueAndWaitsForItOnly) {
  REQUIRE_VULKAN();
  vk::Context& ctx = vk::context_for(gpu());
  Backend& be = backend(gpu());
  auto x = Tensor::full({33}, 0.0f, DType::f32, gpu());
  for (int i = 0; i < 20; ++i) x = ops::add_scalar(x, 1.0f);
  const uint64_t subs = ctx.recorder().submissions();
  const uint64_t ticket = be.read_later(*x.buffer(), size_t(x.offset()) * 4, 33 * 4);
  EXPECT_EQ(ctx.recorder().submissions(), subs + 1);  // the copy's batch went out at once
  // Work queued after the read, writing the same buffer in place: not seen by it, and not waited for.
  for (int i = 0; i < 40; ++i) x = ops::add_scalar(x, 1.0f);
  backend(gpu()).write(*x.buffer(), 0, std::vector<float>(33, 7.0f).data(), 33 * 4);
  const uint64_t open = ctx.recorder().open_serial();
  std::vector<float> got(33);
  be.take_read(ticket, got.data(), got.size() * 4);
  for (float f : got) ASSERT_EQ(f, 20.0f);
  if (open) {
    EXPECT_LT(ctx.recorder().completed_serial(), open);
  }
  EXPECT_THROW(be.take_read(ticket, got.data(), 4), DeviceError);  // taken once
  for (float f : x.to_floats()) ASSERT_EQ(f, 7.0f);
}

// Backend::copy's byte ranges (2-byte offsets and sizes too: bf16 rows) equal the CPU backend's, in order with the
// kernels that write the source before and read the destination after; a range past the end is refused.
TEST(VulkanRuntime, CopyRegionsEqualTheCpusInOrderWithKernels) {
  REQUIRE_VULKAN();
  const std::vector<CopyRegion> regions = {{12, 40, 68}, {400, 800, 132}, {2, 2002, 14}, {0, 2800, 308}};
  std::vector<float> x(1031);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i) * 0.37f - 100.0f;
  auto run = [&](Device d) {
    const Tensor src = ops::scale(Tensor::from_floats(x, {1031}, DType::f32, d), 2.0f);  // queued before the copy
    const Tensor dst = Tensor::full({777}, -1.0f, DType::f32, d);
    backend(d).copy(*src.buffer(), *dst.buffer(), regions);
    EXPECT_THROW(backend(d).copy(*src.buffer(), *dst.buffer(), {{0, 3000, 200}}), DeviceError);
    std::vector<float> out = ops::scale(dst, 1.0f).to_floats();  // queued after it
    std::vector<uint32_t> bits(out.size());
    std::memcpy(bits.data(), out.data(), out.size() * 4);
    return bits;
  };
  const std::vector<uint32_t> cpu = run(Device::cpu()), vulkan = run(gpu());
  EXPECT_EQ(vulkan, cpu);
  float first;
  std::memcpy(&first, &cpu[10], 4);
  EXPECT_EQ(first, 2.0f * x[3]);  // region 0: element 3 of the source at element 10
}

TEST(VulkanRuntime, ProfilingCountsKernels) {
  REQUIRE_VULKAN();
  vk::Context& ctx = vk::context_for(gpu());
  if (!ctx.features().timestamps) GTEST_SKIP() << "no timestamps";
  ctx.synchronize();
  vk::reset_profile();
  vk::set_profiling(true);
  auto x = Tensor::randn({4096}, 1, 1.0f, DType::f32, gpu());
  for (int i = 0; i < 5; ++i) x = ops::exp(ops::scale(x, 0.1f));
  std::string report = vk::profile_report();
  vk::set_profiling(false);
  auto stats = vk::profile_stats();
  uint64_t calls = 0;
  for (auto& [name, s] : stats)
    if (name.rfind("unary", 0) == 0) calls += s.calls;  // "unary" or its _packed16 fallback
  EXPECT_EQ(calls, 10u) << report;
  EXPECT_NE(report.find("unary"), std::string::npos);
  EXPECT_NE(report.find("mean us"), std::string::npos);
}

}  // namespace
}  // namespace lmtune
