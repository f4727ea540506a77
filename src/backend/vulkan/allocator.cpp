// Block sub-allocator for tensor memory (see allocator.h).
#include "backend/vulkan/allocator.h"

#include <algorithm>
#include <cstdio>

#include <spdlog/spdlog.h>

#include "backend/vulkan/context.h"
#include "backend/vulkan/recorder.h"
#include "core/error.h"

namespace lmtune::vk {
namespace {

constexpr VkDeviceSize kAlign = 256;
VkDeviceSize round_up(VkDeviceSize v, VkDeviceSize a) { return (v + a - 1) / a * a; }

}  // namespace

std::string format_bytes(uint64_t b) {
  char buf[64];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", double(b) / double(1ull << 30));
  else if (b >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / double(1ull << 20));
  else if (b >= (1ull << 10)) std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024.0);
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

DeviceBuffer::DeviceBuffer(std::shared_ptr<Context> ctx, Allocation a, size_t bytes)
    : ctx_(std::move(ctx)), alloc_(a), bytes_(bytes) {}

DeviceBuffer::~DeviceBuffer() {
  std::lock_guard lock(ctx_->mutex());
  // Any submission that used this buffer has a serial <= the one being recorded (or the last submitted).
  ctx_->allocator().release(alloc_, bytes_, ctx_->recorder().release_serial());
}

Device DeviceBuffer::device() const { return Device::vulkan(ctx_->index()); }

Allocator::Allocator(Context& ctx) : ctx_(ctx) {
  const auto& mp = ctx.memory_properties();
  // Vulkan lists memory types in order of preference: the first device-local one is the right one for tensors
  // (plain VRAM on discrete GPUs; host-visible too on lavapipe and unified-memory devices, which we then map).
  bool found = false;
  for (uint32_t i = 0; i < mp.memoryTypeCount && !found; ++i)
    if (mp.memoryTypes[i].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) {
      memory_type_ = i;
      found = true;
    }
  if (!found) memory_type_ = 0;
  heap_ = mp.memoryTypes[memory_type_].heapIndex;
  VkDeviceSize heap = mp.memoryHeaps[heap_].size;
  // Small heaps (lavapipe's 2 GiB, integrated GPUs) get smaller blocks so that one block is not a big share.
  block_size_ = heap <= (8ull << 30) ? (64ull << 20) : (256ull << 20);
  max_allocation_ = ctx.properties().limits.maxStorageBufferRange;
}

Allocator::~Allocator() {
  for (auto& b : blocks_) destroy_block(b.get());
}

VkDeviceSize Allocator::available() const {
  const auto& mp = ctx_.memory_properties();
  if (ctx_.features().memory_budget) {
    VkPhysicalDeviceMemoryBudgetPropertiesEXT budget{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT};
    VkPhysicalDeviceMemoryProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2};
    p2.pNext = &budget;
    vkGetPhysicalDeviceMemoryProperties2(ctx_.physical_device(), &p2);
    VkDeviceSize b = budget.heapBudget[heap_], u = budget.heapUsage[heap_];
    return b > u ? b - u : 0;
  }
  VkDeviceSize heap = mp.memoryHeaps[heap_].size;
  return heap > reserved_ ? heap - reserved_ : 0;
}

std::string Allocator::describe_usage() const {
  return format_bytes(in_use_) + " in use by tensors, " + format_bytes(reserved_) + " reserved in " +
         std::to_string(blocks_.size()) + " block(s), " + format_bytes(available()) + " more available on the device" +
         (ctx_.features().memory_budget ? " (VK_EXT_memory_budget)" : " (heap size; no memory-budget extension)");
}

Block* Allocator::new_block(VkDeviceSize size, bool dedicated, std::string& why) {
  if (size > available()) {
    why = "the device has " + format_bytes(available()) + " left";
    return nullptr;
  }
  auto b = std::make_unique<Block>();
  b->size = size;
  b->dedicated = dedicated;
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = size;
  bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  bi.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  VkResult r = vkCreateBuffer(ctx_.device(), &bi, nullptr, &b->buffer);
  if (r != VK_SUCCESS) {
    why = std::string("vkCreateBuffer failed (") + result_name(r) + ")";
    return nullptr;
  }
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(ctx_.device(), b->buffer, &req);
  uint32_t type = memory_type_;
  if (!(req.memoryTypeBits & (1u << type))) {
    const auto& mp = ctx_.memory_properties();
    for (uint32_t i = 0; i < mp.memoryTypeCount; ++i)
      if ((req.memoryTypeBits & (1u << i)) && (mp.memoryTypes[i].propertyFlags & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT)) {
        type = i;
        break;
      }
  }
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.allocationSize = req.size;
  ai.memoryTypeIndex = type;
  r = vkAllocateMemory(ctx_.device(), &ai, nullptr, &b->memory);
  if (r != VK_SUCCESS) {
    vkDestroyBuffer(ctx_.device(), b->buffer, nullptr);
    why = std::string("vkAllocateMemory of ") + format_bytes(req.size) + " failed (" + result_name(r) + ")";
    return nullptr;
  }
  check(vkBindBufferMemory(ctx_.device(), b->buffer, b->memory, 0), "vkBindBufferMemory");
  VkMemoryPropertyFlags flags = ctx_.memory_properties().memoryTypes[type].propertyFlags;
  if ((flags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) && (flags & VK_MEMORY_PROPERTY_HOST_COHERENT_BIT) &&
      ctx_.features().host_mapping) {
    void* p = nullptr;
    if (vkMapMemory(ctx_.device(), b->memory, 0, VK_WHOLE_SIZE, 0, &p) == VK_SUCCESS) b->mapped = static_cast<char*>(p);
  }
  b->free.emplace(0, size);
  reserved_ += size;
  spdlog::debug("{}: new {}memory block of {}", ctx_.name(), dedicated ? "dedicated " : "", format_bytes(size));
  blocks_.push_back(std::move(b));
  return blocks_.back().get();
}

void Allocator::destroy_block(Block* b) {
  if (b->mapped) vkUnmapMemory(ctx_.device(), b->memory);
  vkDestroyBuffer(ctx_.device(), b->buffer, nullptr);
  vkFreeMemory(ctx_.device(), b->memory, nullptr);
  reserved_ -= b->size;
}

bool Allocator::try_allocate(size_t bytes, Allocation& out, std::string& why) {
  VkDeviceSize need = round_up(std::max<VkDeviceSize>(bytes, 1), kAlign);
  Block* best = nullptr;
  VkDeviceSize best_off = 0, best_size = ~VkDeviceSize(0);
  if (need <= block_size_) {
    for (auto& b : blocks_) {
      if (b->dedicated) continue;
      for (auto [off, sz] : b->free)
        if (sz >= need && sz < best_size) {
          best = b.get();
          best_off = off;
          best_size = sz;
        }
    }
    if (!best) {
      // Near the end of the budget a full block may not fit while the request itself would.
      auto fresh = [&] {
        Block* b = new_block(block_size_, false, why);
        return b ? b : new_block(need, true, why);
      };
      best = fresh();
      if (!best && release_empty_blocks()) best = fresh();
      if (!best) return false;
      best_off = 0;
      best_size = best->size;
    }
  } else {
    // An empty dedicated block kept from an earlier tensor of about this size (collect() keeps a few): a new
    // VkDeviceMemory per large tensor costs a driver allocation and slows the first kernels that touch it.
    for (auto& b : blocks_)
      if (b->dedicated && b->used == 0 && b->size >= need && b->size - need <= need / 4 &&
          (!best || b->size < best->size))
        best = b.get();
    if (!best) best = new_block(need, true, why);
    if (!best && release_empty_blocks()) best = new_block(need, true, why);
    if (!best) return false;
    if (need > max_allocation_)
      spdlog::warn("{}: a {} tensor exceeds maxStorageBufferRange ({}); kernels cannot address all of it",
                   ctx_.name(), format_bytes(need), format_bytes(max_allocation_));
    best_off = 0;
    best_size = best->size;
  }
  best->free.erase(best_off);
  if (best_size > need) best->free.emplace(best_off + need, best_size - need);
  best->used += need;
  out.block = best;
  out.buffer = best->buffer;
  out.offset = best_off;
  out.size = need;
  in_use_ += bytes;
  peak_ = std::max(peak_, in_use_);
  max_peak_ = std::max(max_peak_, in_use_);
  return true;
}

void Allocator::release(const Allocation& a, size_t bytes, uint64_t after_serial) {
  in_use_ -= bytes;
  // Memory that only the GPU touches is reusable at once: later work is recorded on the same queue, and the
  // recorder orders it after earlier readers and writers of the range (a barrier within a batch, the barrier
  // that opens every batch across batches). Mapped memory waits for the work that uses it to finish, because the
  // host may write a new tensor there directly (Recorder::write).
  if (!a.block->mapped) {
    free_range(a.block, a.offset, a.size);
    a.block->busy_until = std::max(a.block->busy_until, after_serial);  // not given back before then
    return;
  }
  pending_.push_back({a, after_serial});
}

void Allocator::free_range(Block* b, VkDeviceSize offset, VkDeviceSize size) {
  b->used -= size;
  auto next = b->free.lower_bound(offset);
  if (next != b->free.end() && offset + size == next->first) {  // merge with the following free range
    size += next->second;
    next = b->free.erase(next);
  }
  if (next != b->free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {  // merge with the preceding one
      prev->second += size;
      return;
    }
  }
  b->free.emplace(offset, size);
}

void Allocator::collect(uint64_t completed_serial) {
  for (size_t i = 0; i < pending_.size();) {
    if (pending_[i].serial <= completed_serial) {
      free_range(pending_[i].a.block, pending_[i].a.offset, pending_[i].a.size);
      pending_[i] = pending_.back();
      pending_.pop_back();
    } else {
      ++i;
    }
  }
  trim(completed_serial);
}

void Allocator::trim(uint64_t completed_serial) {
  // Keep kKeepEmpty empty regular blocks as spares and up to kKeepEmpty empty dedicated blocks (reused by requests
  // of about their size), and beyond those the empty regular blocks that keep what is reserved within 1.25 times
  // the most ever held: a training step frees and allocates the same activations again and again, and giving
  // their blocks back made every step call the driver for new memory (H100, Qwen2.5-0.5B without checkpointing:
  // 255 instead of 38 new 256 MiB blocks over 8 steps, 13766 instead of 18422 tokens/s). Everything empty is given
  // back when an allocation would otherwise fail.
  constexpr int kKeepEmpty = 2;
  const VkDeviceSize cached = VkDeviceSize(double(max_peak_) * cache_factor_);
  int spare = 0, kept = 0;
  for (size_t i = 0; i < blocks_.size();) {
    Block* b = blocks_[i].get();
    bool beyond_cache = b->dedicated || reserved_ >= cached + b->size;  // still cached without it
    if (b->used == 0 && b->busy_until <= completed_serial && (b->dedicated ? kept : spare) >= kKeepEmpty &&
        beyond_cache) {
      destroy_block(b);
      blocks_.erase(blocks_.begin() + long(i));
      continue;
    }
    if (b->used == 0) ++(b->dedicated ? kept : spare);
    ++i;
  }
}

bool Allocator::release_empty_blocks() {
  bool any = false;
  for (size_t i = 0; i < blocks_.size();) {
    Block* b = blocks_[i].get();
    if (b->used == 0 && b->busy_until <= ctx_.recorder().completed_serial()) {
      destroy_block(b);
      blocks_.erase(blocks_.begin() + long(i));
      any = true;
      continue;
    }
    ++i;
  }
  return any;
}

}  // namespace lmtune::vk
