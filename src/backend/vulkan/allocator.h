// Device memory for tensors: large blocks (one VkDeviceMemory + one VkBuffer each) carved into 256-byte aligned
// ranges with a best-fit free list that coalesces neighbours; requests larger than a block get a dedicated block.
// A freed range goes back to the free list only after the submission that last used it has finished (the
// recorder's serials), so kernels still in flight never see their memory reused. Empty blocks stay reserved up
// to 1.25x the most ever held (a caching allocator: steps reuse them) until an allocation needs the room.
// Budget-aware: an allocation that does not fit raises OutOfMemoryError naming the request, what tensors hold and
// what the device has left.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/vulkan/vk_api.h"
#include "core/backend.h"

namespace lmtune::vk {

class Context;

struct Block {
  VkDeviceMemory memory = VK_NULL_HANDLE;
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceSize size = 0;
  char* mapped = nullptr;  // persistent host mapping when the memory is host-visible and coherent, else null
  bool dedicated = false;
  std::map<VkDeviceSize, VkDeviceSize> free;  // offset -> size, non-adjacent (coalesced)
  VkDeviceSize used = 0;
  uint64_t busy_until = 0;  // serial of the last submission that may use memory freed in it (see release)
};

// A range of a block. `offset` is a multiple of 256 (>= minStorageBufferOffsetAlignment on every device).
struct Allocation {
  Block* block = nullptr;
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceSize offset = 0;
  VkDeviceSize size = 0;  // rounded up to 256 bytes
  char* mapped() const { return block && block->mapped ? block->mapped + offset : nullptr; }
};

// The Buffer behind a Vulkan tensor. Serials say which submission last touched it (see Recorder).
class DeviceBuffer final : public Buffer {
 public:
  DeviceBuffer(std::shared_ptr<Context> ctx, Allocation a, size_t bytes);
  ~DeviceBuffer() override;
  size_t bytes() const override { return bytes_; }
  Device device() const override;
  const Allocation& allocation() const { return alloc_; }
  Context& context() const { return *ctx_; }

  uint64_t last_write = 0;  // serial of the last submission that writes it (0: none)
  uint64_t last_use = 0;    // serial of the last submission that reads or writes it

 private:
  std::shared_ptr<Context> ctx_;
  Allocation alloc_;
  size_t bytes_;
};

class Allocator {
 public:
  explicit Allocator(Context& ctx);
  ~Allocator();

  // Finds or makes room for `bytes`. Returns false (with the reason in `why`) when the budget is exhausted.
  bool try_allocate(size_t bytes, Allocation& out, std::string& why);
  // Returns a range; it is reused once submission `after_serial` has completed (collect()).
  void release(const Allocation& a, size_t bytes, uint64_t after_serial);
  // Recycles ranges whose submissions have completed.
  void collect(uint64_t completed_serial);
  bool has_pending() const { return !pending_.empty(); }

  size_t bytes_in_use() const { return in_use_; }
  size_t peak_bytes() const { return peak_; }
  void reset_peak() { peak_ = in_use_; }
  size_t reserved_bytes() const { return reserved_; }
  size_t block_count() const { return blocks_.size(); }
  VkDeviceSize block_size() const { return block_size_; }
  // Bytes the device can still give us (memory budget when available, else heap size minus what we hold).
  VkDeviceSize available() const;
  std::string describe_usage() const;

 private:
  Block* new_block(VkDeviceSize size, bool dedicated, std::string& why);
  // Gives back every empty block (kept for reuse) whose work has finished; true if there were any.
  bool release_empty_blocks();
  void trim(uint64_t completed_serial);  // gives back idle empty blocks beyond a few spares
  void destroy_block(Block* b);
  void free_range(Block* b, VkDeviceSize offset, VkDeviceSize size);

  Context& ctx_;
  uint32_t memory_type_ = 0, heap_ = 0;
  VkDeviceSize block_size_ = 0, max_allocation_ = 0;
  std::vector<std::unique_ptr<Block>> blocks_;
  struct Pending {
    Allocation a;
    uint64_t serial;
  };
  std::vector<Pending> pending_;
  size_t in_use_ = 0, peak_ = 0, reserved_ = 0;
  size_t max_peak_ = 0;        // the most ever held (peak_ is reset per step): how much trim() keeps reserved
  double cache_factor_ = 1.25;  // ... times this
};

// "1.5 GiB"
std::string format_bytes(uint64_t bytes);

}  // namespace lmtune::vk
