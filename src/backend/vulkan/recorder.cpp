// Command batches, barriers, host transfers and GPU timestamps (see recorder.h).
#include "backend/vulkan/recorder.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include <spdlog/spdlog.h>

#include "backend/vulkan/allocator.h"
#include "backend/vulkan/environment.h"
#include "core/error.h"

namespace lmtune::vk {
namespace {

constexpr uint64_t kFenceTimeoutNs = 60ull * 1000 * 1000 * 1000;
constexpr VkDeviceSize kStagingChunk = 64ull << 20;     // largest single staging copy
constexpr VkDeviceSize kStagingPerBatch = 256ull << 20;  // flush a batch that has staged this much

std::atomic<bool> g_profiling{vulkan_environment().profile};

// LMTUNE_PROFILE=grid: times per kernel name and grid size (which shapes a kernel's time goes to).
const bool g_profile_grid = vulkan_environment().profile_grid;

constexpr VkPipelineStageFlags kStages = VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;

}  // namespace

void set_profiling(bool on) { g_profiling = on; }
bool profiling() { return g_profiling; }

std::mutex g_profile_mu;
std::map<std::string, KernelStats> g_profile;
BatchStats g_batches;

void reset_profile() {
  std::lock_guard lock(g_profile_mu);
  g_profile.clear();
  g_batches = BatchStats{};
}

BatchStats batch_stats() {
  std::lock_guard lock(g_profile_mu);
  return g_batches;
}

std::map<std::string, KernelStats> profile_stats() {
  std::lock_guard lock(g_profile_mu);
  return g_profile;
}

Recorder::Recorder(Context& ctx) : ctx_(ctx) {
  VkDevice d = ctx.device();
  for (Slot& s : slots_) {
    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pi.flags = VK_COMMAND_POOL_CREATE_TRANSIENT_BIT;
    pi.queueFamilyIndex = ctx.queue_family();
    check(vkCreateCommandPool(d, &pi, nullptr, &s.pool), "vkCreateCommandPool");
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = s.pool;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    check(vkAllocateCommandBuffers(d, &ai, &s.cb), "vkAllocateCommandBuffers");
    VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    check(vkCreateFence(d, &fi, nullptr, &s.fence), "vkCreateFence");
  }
  timestamp_ns_ = ctx.properties().limits.timestampPeriod;
  uint32_t bits = ctx.features().timestamp_bits;
  timestamp_mask_ = bits >= 64 ? ~0ull : (1ull << bits) - 1;
}

Recorder::~Recorder() {
  try {
    wait_all();
  } catch (const std::exception& e) {
    spdlog::warn("{}: while shutting down: {}", ctx_.name(), e.what());
  }
  VkDevice d = ctx_.device();
  for (Slot& s : slots_) {
    for (auto& h : s.staging) destroy_host_buffer(h);
    for (auto p : s.descriptor_pools) vkDestroyDescriptorPool(d, p, nullptr);
    if (s.queries) vkDestroyQueryPool(d, s.queries, nullptr);
    vkDestroyFence(d, s.fence, nullptr);
    vkDestroyCommandPool(d, s.pool, nullptr);
  }
  destroy_host_buffer(readback_);
  for (auto& r : later_) destroy_host_buffer(r.host);
  for (auto& h : spare_later_) destroy_host_buffer(h);
}

HostBuffer Recorder::make_host_buffer(VkDeviceSize size, bool readback) {
  HostBuffer h;
  h.size = size;
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = size;
  bi.usage = VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  check(vkCreateBuffer(ctx_.device(), &bi, nullptr, &h.buffer), "vkCreateBuffer(staging)");
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(ctx_.device(), h.buffer, &req);
  const auto& mp = ctx_.memory_properties();
  VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  // Downloads prefer cached host memory (fast CPU reads); uploads take the first host-visible type.
  uint32_t type = UINT32_MAX;
  for (int pass = readback ? 0 : 1; pass < 2 && type == UINT32_MAX; ++pass)
    for (uint32_t i = 0; i < mp.memoryTypeCount; ++i) {
      VkMemoryPropertyFlags f = mp.memoryTypes[i].propertyFlags;
      VkMemoryPropertyFlags need = pass == 0 ? want | VK_MEMORY_PROPERTY_HOST_CACHED_BIT : want;
      if ((req.memoryTypeBits & (1u << i)) && (f & need) == need) {
        type = i;
        break;
      }
    }
  if (type == UINT32_MAX) throw DeviceError(ctx_.name() + ": no host-visible coherent memory type for staging");
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = type;
  VkResult r = vkAllocateMemory(ctx_.device(), &ai, nullptr, &h.memory);
  if (r != VK_SUCCESS) {
    vkDestroyBuffer(ctx_.device(), h.buffer, nullptr);
    throw OutOfMemoryError(ctx_.name() + ": cannot allocate " + format_bytes(size) + " of staging memory (" +
                           result_name(r) + ")");
  }
  check(vkBindBufferMemory(ctx_.device(), h.buffer, h.memory, 0), "vkBindBufferMemory(staging)");
  void* p = nullptr;
  check(vkMapMemory(ctx_.device(), h.memory, 0, VK_WHOLE_SIZE, 0, &p), "vkMapMemory(staging)");
  h.mapped = static_cast<char*>(p);
  return h;
}

void Recorder::destroy_host_buffer(HostBuffer& h) {
  if (!h.buffer) return;
  vkUnmapMemory(ctx_.device(), h.memory);
  vkDestroyBuffer(ctx_.device(), h.buffer, nullptr);
  vkFreeMemory(ctx_.device(), h.memory, nullptr);
  h = HostBuffer{};
}

void Recorder::barrier(VkCommandBuffer cb) {
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_READ_BIT |
                     VK_ACCESS_TRANSFER_WRITE_BIT;
  vkCmdPipelineBarrier(cb, kStages, kStages, 0, 1, &mb, 0, nullptr, 0, nullptr);
  accesses_.clear();
  ++barriers_;
}

Recorder::Slot& Recorder::begin() {
  Slot& s = slots_[current_];
  if (open_) return s;
  if (s.submitted) retire(s, true);
  check(vkResetCommandPool(ctx_.device(), s.pool, 0), "vkResetCommandPool");
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  check(vkBeginCommandBuffer(s.cb, &bi), "vkBeginCommandBuffer");
  s.serial = ++serial_;
  open_ = true;
  batch_dispatches_ = 0;
  s.profiling = profiling() && ctx_.features().timestamps;
  if (s.profiling) {
    if (!s.queries) {
      VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
      qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
      qi.queryCount = 2 * kMaxDispatches + 2;  // each dispatch's two, then the batch's first and last command
      check(vkCreateQueryPool(ctx_.device(), &qi, nullptr, &s.queries), "vkCreateQueryPool");
    }
    vkCmdResetQueryPool(s.cb, s.queries, 0, 2 * kMaxDispatches + 2);
    vkCmdWriteTimestamp(s.cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, s.queries, 2 * kMaxDispatches);
  }
  barrier(s.cb);  // orders this batch after everything submitted before it
  return s;
}

void Recorder::track(const std::vector<Access>& accesses) {
  bool hazard = false;
  for (const Access& a : accesses) {
    for (const Access& b : accesses_) {
      if (a.buffer != b.buffer || !(a.write || b.write)) continue;
      if (a.offset < b.offset + b.size && b.offset < a.offset + a.size) {
        hazard = true;
        break;
      }
    }
    if (hazard) break;
  }
  if (hazard) barrier(slots_[current_].cb);
  accesses_.insert(accesses_.end(), accesses.begin(), accesses.end());
}

VkDescriptorSet Recorder::descriptor_set(Slot& s, VkDescriptorSetLayout layout) {
  for (;;) {
    if (s.descriptor_pool == s.descriptor_pools.size()) {
      VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 8 * kMaxDispatches};
      VkDescriptorPoolCreateInfo pi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
      pi.maxSets = kMaxDispatches;
      pi.poolSizeCount = 1;
      pi.pPoolSizes = &size;
      VkDescriptorPool pool;
      check(vkCreateDescriptorPool(ctx_.device(), &pi, nullptr, &pool), "vkCreateDescriptorPool");
      s.descriptor_pools.push_back(pool);
    }
    VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    ai.descriptorPool = s.descriptor_pools[s.descriptor_pool];
    ai.descriptorSetCount = 1;
    ai.pSetLayouts = &layout;
    VkDescriptorSet set;
    VkResult r = vkAllocateDescriptorSets(ctx_.device(), &ai, &set);
    if (r == VK_SUCCESS) return set;
    if (r != VK_ERROR_OUT_OF_POOL_MEMORY && r != VK_ERROR_FRAGMENTED_POOL) check(r, "vkAllocateDescriptorSets");
    ++s.descriptor_pool;  // this pool is full: move on to the next (created above if needed)
  }
}

void Recorder::dispatch(const Pipeline& p, const std::vector<Binding>& bindings, const void* push,
                        size_t push_bytes, Groups groups, const std::string& kernel) {
  Slot& s = begin();
  std::vector<Access> acc;
  std::vector<VkDescriptorBufferInfo> infos(bindings.size());
  for (size_t i = 0; i < bindings.size(); ++i) {
    auto* db = dynamic_cast<DeviceBuffer*>(bindings[i].buffer.get());
    if (!db || &db->context() != &ctx_)
      throw DeviceError(ctx_.name() + ": kernel '" + kernel + "' binding " + std::to_string(i) +
                        " is not a buffer of this device");
    const Allocation& a = db->allocation();
    infos[i] = {a.buffer, a.offset, a.size};
    acc.push_back({a.buffer, a.offset, a.size, bindings[i].write});
    db->last_use = s.serial;
    if (bindings[i].write) db->last_write = s.serial;
  }
  track(acc);
  std::vector<VkWriteDescriptorSet> writes(bindings.size());
  for (size_t i = 0; i < bindings.size(); ++i) {
    writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    writes[i].dstBinding = uint32_t(i);
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[i];
  }
  vkCmdBindPipeline(s.cb, VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline);
  if (ctx_.features().push_descriptor) {
    vkCmdPushDescriptorSetKHR(s.cb, VK_PIPELINE_BIND_POINT_COMPUTE, p.layout, 0, uint32_t(writes.size()),
                              writes.data());
  } else {
    VkDescriptorSet set = descriptor_set(s, p.set_layout);
    for (auto& w : writes) w.dstSet = set;
    vkUpdateDescriptorSets(ctx_.device(), uint32_t(writes.size()), writes.data(), 0, nullptr);
    vkCmdBindDescriptorSets(s.cb, VK_PIPELINE_BIND_POINT_COMPUTE, p.layout, 0, 1, &set, 0, nullptr);
  }
  if (push_bytes) vkCmdPushConstants(s.cb, p.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, uint32_t(push_bytes), push);
  if (s.profiling) {
    uint32_t q = uint32_t(s.profiled.size()) * 2;
    vkCmdWriteTimestamp(s.cb, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, s.queries, q);
    vkCmdDispatch(s.cb, groups[0], groups[1], groups[2]);
    vkCmdWriteTimestamp(s.cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, s.queries, q + 1);
    s.profiled.push_back(!g_profile_grid ? kernel
                                         : kernel + " " + std::to_string(groups[0]) + "x" + std::to_string(groups[1]) +
                                               "x" + std::to_string(groups[2]));
  } else {
    vkCmdDispatch(s.cb, groups[0], groups[1], groups[2]);
  }
  ++dispatches_;
  if (++batch_dispatches_ >= batch_limit_) {
    flush();
    batch_limit_ = std::min(2 * batch_limit_, kMaxDispatches);
  }
}

void Recorder::fill(const Binding& b, uint32_t value) {
  auto* db = dynamic_cast<DeviceBuffer*>(b.buffer.get());
  if (!db) throw DeviceError(ctx_.name() + ": fill of a buffer that is not on this device");
  Slot& s = begin();
  const Allocation& a = db->allocation();
  track({{a.buffer, a.offset, a.size, true}});
  vkCmdFillBuffer(s.cb, a.buffer, a.offset, a.size, value);
  db->last_use = db->last_write = s.serial;
}

void Recorder::copy(DeviceBuffer& src, DeviceBuffer& dst, const std::vector<CopyRegion>& regions) {
  std::vector<VkBufferCopy> copies;
  const Allocation &sa = src.allocation(), &da = dst.allocation();
  for (const CopyRegion& r : regions) {
    if (r.bytes == 0) continue;
    if (r.src_offset + r.bytes > src.bytes() || r.dst_offset + r.bytes > dst.bytes())
      throw DeviceError(ctx_.name() + ": copy region past the end of a buffer");
    copies.push_back({sa.offset + r.src_offset, da.offset + r.dst_offset, r.bytes});
  }
  if (copies.empty()) return;
  Slot& s = begin();
  track({{sa.buffer, sa.offset, src.bytes(), false}, {da.buffer, da.offset, dst.bytes(), true}});
  vkCmdCopyBuffer(s.cb, sa.buffer, da.buffer, uint32_t(copies.size()), copies.data());
  src.last_use = s.serial;
  dst.last_use = dst.last_write = s.serial;
}

char* Recorder::staging(Slot& s, VkDeviceSize bytes, VkBuffer& buffer, VkDeviceSize& offset) {
  bytes = (bytes + 15) / 16 * 16;
  while (s.staging_index < s.staging.size() &&
         s.staging_offset + bytes > s.staging[s.staging_index].size) {
    ++s.staging_index;
    s.staging_offset = 0;
  }
  if (s.staging_index == s.staging.size()) {
    VkDeviceSize last = s.staging.empty() ? 0 : s.staging.back().size;
    VkDeviceSize size = std::max({bytes, VkDeviceSize(4) << 20, std::min(2 * last, kStagingChunk)});
    s.staging.push_back(make_host_buffer(size, false));
    s.staging_offset = 0;
  }
  HostBuffer& h = s.staging[s.staging_index];
  buffer = h.buffer;
  offset = s.staging_offset;
  s.staging_offset += bytes;
  s.staging_bytes += bytes;
  return h.mapped + offset;
}

void Recorder::write(DeviceBuffer& dst, size_t offset, const void* src, size_t bytes) {
  if (bytes == 0) return;
  const Allocation& a = dst.allocation();
  if (dst.last_use > completed_ && dst.last_use <= submitted_) poll();
  if (a.mapped() && dst.last_use <= completed_) {
    // No queued work touches this memory: write it directly (host writes are visible to later submissions).
    std::memcpy(a.mapped() + offset, src, bytes);
    return;
  }
  const char* p = static_cast<const char*>(src);
  while (bytes) {
    VkDeviceSize chunk = std::min<VkDeviceSize>(bytes, kStagingChunk);
    if (open_ && slots_[current_].staging_bytes + chunk > kStagingPerBatch) flush();
    Slot& s = begin();
    VkBuffer sb;
    VkDeviceSize so;
    std::memcpy(staging(s, chunk, sb, so), p, chunk);
    track({{a.buffer, a.offset, a.size, true}});
    VkBufferCopy region{so, a.offset + offset, chunk};
    vkCmdCopyBuffer(s.cb, sb, a.buffer, 1, &region);
    dst.last_use = dst.last_write = s.serial;
    p += chunk;
    offset += chunk;
    bytes -= chunk;
  }
}

void Recorder::read(DeviceBuffer& src, size_t offset, void* dst, size_t bytes) {
  if (bytes == 0) return;
  const Allocation& a = src.allocation();
  if (a.mapped()) {
    wait(src.last_write);  // only the submission that last wrote it
    std::memcpy(dst, a.mapped() + offset, bytes);
    return;
  }
  char* p = static_cast<char*>(dst);
  while (bytes) {
    VkDeviceSize chunk = std::min<VkDeviceSize>(bytes, kStagingChunk);
    if (readback_.size < chunk) {
      destroy_host_buffer(readback_);
      readback_ = make_host_buffer(std::max<VkDeviceSize>(chunk, 4 << 20), true);
    }
    Slot& s = begin();
    track({{a.buffer, a.offset, a.size, false}});
    VkBufferCopy region{a.offset + offset, 0, chunk};
    vkCmdCopyBuffer(s.cb, a.buffer, readback_.buffer, 1, &region);
    src.last_use = s.serial;
    uint64_t serial = s.serial;
    wait(serial);
    std::memcpy(p, readback_.mapped, chunk);
    p += chunk;
    offset += chunk;
    bytes -= chunk;
  }
}

uint64_t Recorder::read_later(DeviceBuffer& src, size_t offset, size_t bytes) {
  HostBuffer h;
  for (auto it = spare_later_.begin(); it != spare_later_.end(); ++it)
    if (it->size >= bytes) {
      h = *it;
      spare_later_.erase(it);
      break;
    }
  if (!h.buffer) h = make_host_buffer(std::max<VkDeviceSize>(bytes, 256), true);
  const Allocation& a = src.allocation();
  Slot& s = begin();
  track({{a.buffer, a.offset, a.size, false}});
  if (bytes) {
    VkBufferCopy region{a.offset + offset, 0, bytes};
    vkCmdCopyBuffer(s.cb, a.buffer, h.buffer, 1, &region);
  }
  src.last_use = s.serial;
  later_.push_back({++later_tickets_, s.serial, h, bytes});
  flush();
  return later_tickets_;
}

void Recorder::take_read(uint64_t ticket, void* dst, size_t bytes) {
  auto it = std::find_if(later_.begin(), later_.end(), [&](const LaterRead& r) { return r.ticket == ticket; });
  if (it == later_.end()) throw DeviceError(ctx_.name() + ": no pending read " + std::to_string(ticket));
  wait(it->serial);
  std::memcpy(dst, it->host.mapped, std::min(bytes, it->bytes));
  spare_later_.push_back(it->host);
  later_.erase(it);
}

void Recorder::flush() {
  if (!open_) return;
  Slot& s = slots_[current_];
  // Make this batch's writes visible to host reads (mapped device memory and the readback buffer).
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(s.cb, kStages, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, nullptr, 0, nullptr);
  if (s.profiling) vkCmdWriteTimestamp(s.cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, s.queries, 2 * kMaxDispatches + 1);
  check(vkEndCommandBuffer(s.cb), "vkEndCommandBuffer");
  check(vkResetFences(ctx_.device(), 1, &s.fence), "vkResetFences");
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &s.cb;
  check(vkQueueSubmit(ctx_.queue(), 1, &si, s.fence), "vkQueueSubmit");
  s.submitted = true;
  submitted_ = s.serial;
  open_ = false;
  accesses_.clear();
  ++submissions_;
  current_ = (current_ + 1) % kSlots;
  poll();
}

void Recorder::retire(Slot& s, bool block) {
  if (!s.submitted) return;
  if (block) {
    const auto t0 = std::chrono::steady_clock::now();
    VkResult r = vkWaitForFences(ctx_.device(), 1, &s.fence, VK_TRUE, kFenceTimeoutNs);
    if (r == VK_TIMEOUT)
      throw DeviceError(ctx_.name() + ": GPU did not finish within 60 s (a kernel hung or the device is overloaded)");
    check(r, "vkWaitForFences");
    if (s.profiling) {
      std::lock_guard lock(g_profile_mu);
      ++g_batches.waits;
      g_batches.wait_ns += double(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                      std::chrono::steady_clock::now() - t0).count());
    }
  } else {
    VkResult r = vkGetFenceStatus(ctx_.device(), s.fence);
    if (r == VK_NOT_READY) return;
    check(r, "vkGetFenceStatus");
  }
  if (s.profiling) {
    uint64_t span[2] = {0, 0};
    if (vkGetQueryPoolResults(ctx_.device(), s.queries, 2 * kMaxDispatches, 2, sizeof span, span, 8,
                              VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT) == VK_SUCCESS) {
      std::lock_guard lock(g_profile_mu);
      ++g_batches.batches;
      g_batches.span_ns += double((span[1] - span[0]) & timestamp_mask_) * timestamp_ns_;
    }
  }
  if (s.profiling && !s.profiled.empty()) {
    std::vector<uint64_t> ts(2 * s.profiled.size());
    VkResult r = vkGetQueryPoolResults(ctx_.device(), s.queries, 0, uint32_t(ts.size()), ts.size() * 8, ts.data(), 8,
                                       VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
    if (r == VK_SUCCESS) {
      std::lock_guard lock(g_profile_mu);
      for (size_t i = 0; i < s.profiled.size(); ++i) {
        uint64_t t = ((ts[2 * i + 1] - ts[2 * i]) & timestamp_mask_);
        auto& k = g_profile[s.profiled[i]];
        ++k.calls;
        k.ns += double(t) * timestamp_ns_;
      }
    }
  }
  s.profiled.clear();
  s.submitted = false;
  if (s.descriptor_pool || !s.descriptor_pools.empty())
    for (auto p : s.descriptor_pools) vkResetDescriptorPool(ctx_.device(), p, 0);
  s.descriptor_pool = 0;
  // Keep only the largest staging buffer for the next batch in this slot.
  if (s.staging.size() > 1) {
    std::sort(s.staging.begin(), s.staging.end(), [](auto& x, auto& y) { return x.size > y.size; });
    for (size_t i = 1; i < s.staging.size(); ++i) destroy_host_buffer(s.staging[i]);
    s.staging.resize(1);
  }
  s.staging_index = 0;
  s.staging_offset = s.staging_bytes = 0;
  completed_ = std::max(completed_, s.serial);
  ctx_.allocator().collect(completed_);
}

void Recorder::poll() {
  // Slots retire in submission order, oldest first: current_ (unless open), then the ones after it.
  for (int i = 0; i < kSlots; ++i) {
    Slot& s = slots_[(current_ + i) % kSlots];
    if (!s.submitted) continue;
    retire(s, false);
    if (s.submitted) break;
  }
}

void Recorder::wait(uint64_t serial) {
  if (serial > completed_) {
    if (open_ && serial >= serial_) flush();
    for (int i = 0; i < kSlots; ++i) {
      Slot& s = slots_[(current_ + i) % kSlots];
      if (s.submitted && s.serial <= serial) retire(s, true);
    }
  }
  if (completed_ >= submitted_) batch_limit_ = kFirstBatch;  // the GPU is idle: start it soon (see recorder.h)
}

void Recorder::wait_all() {
  flush();
  wait(submitted_);
  ctx_.allocator().collect(completed_);
}


}  // namespace lmtune::vk
