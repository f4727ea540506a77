// Command recording and submission. Ops record into the current command buffer (a "batch"); a batch is submitted
// after kMaxDispatches dispatches, or when the host needs a result, and up to kSlots batches are in flight. After
// the host has waited for the GPU (which is then idle), batches start small and double (kFirstBatch, 2x, ..., up to
// kMaxDispatches), so the GPU starts on the first kernels while the host records the rest.
// Every batch has a serial; a batch's fence signalling means all work up to that serial has finished.
//
// Barriers: the recorder remembers which buffer ranges were read and written since the last barrier and inserts a
// compute/transfer memory barrier only before a command that reads or writes a range written earlier (or writes a
// range read earlier). Each batch starts with one barrier (covering earlier submissions) and ends with one making
// writes visible to the host.
//
// Host transfers: write() copies through per-batch staging memory (or straight into host-visible device memory
// that no queued work uses); read() waits only for the submission that last wrote the buffer.
// Fence waits are bounded (60 s) and VK_ERROR_DEVICE_LOST becomes a DeviceError.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/vulkan/context.h"
#include "backend/vulkan/pipelines.h"

namespace lmtune::vk {

class DeviceBuffer;

// Host-visible, coherent memory used to stage uploads and downloads.
struct HostBuffer {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  char* mapped = nullptr;
  VkDeviceSize size = 0;
};

class Recorder {
 public:
  static constexpr int kSlots = 3;
  static constexpr uint32_t kMaxDispatches = 256;
  static constexpr uint32_t kFirstBatch = 16;

  explicit Recorder(Context& ctx);
  ~Recorder();

  void dispatch(const Pipeline& p, const std::vector<Binding>& bindings, const void* push, size_t push_bytes,
                Groups groups, const std::string& kernel);
  void fill(const Binding& b, uint32_t value);
  void copy(DeviceBuffer& src, DeviceBuffer& dst, const std::vector<CopyRegion>& regions);  // Backend::copy
  void write(DeviceBuffer& dst, size_t offset, const void* src, size_t bytes);
  void read(DeviceBuffer& src, size_t offset, void* dst, size_t bytes);
  // Backend::read_later / take_read: the copy into a host buffer of its own is recorded now and its batch
  // submitted; take_read waits for that batch only.
  uint64_t read_later(DeviceBuffer& src, size_t offset, size_t bytes);
  void take_read(uint64_t ticket, void* dst, size_t bytes);

  // Submits the open batch, if any.
  void flush();
  // Waits until submission `serial` has finished (submitting it first if it is the open batch).
  void wait(uint64_t serial);
  void wait_all();
  // Retires finished submissions without blocking.
  void poll();

  uint64_t completed_serial() const { return completed_; }
  uint64_t open_serial() const { return open_ ? serial_ : 0; }
  // The serial after which memory freed now may be reused: the open batch, else the last submitted one.
  uint64_t release_serial() const { return open_ ? serial_ : submitted_; }
  // Counters for tests and `lmtune bench`.
  uint64_t submissions() const { return submissions_; }
  uint64_t barriers() const { return barriers_; }
  uint64_t dispatches() const { return dispatches_; }

 private:
  struct Access {
    VkBuffer buffer;
    VkDeviceSize offset, size;
    bool write;
  };
  struct Slot {
    VkCommandPool pool = VK_NULL_HANDLE;
    VkCommandBuffer cb = VK_NULL_HANDLE;
    VkFence fence = VK_NULL_HANDLE;
    std::vector<VkDescriptorPool> descriptor_pools;
    size_t descriptor_pool = 0;  // index of the pool sets come from now
    VkQueryPool queries = VK_NULL_HANDLE;
    bool profiling = false;
    std::vector<std::string> profiled;  // kernel of timestamp pair i
    std::vector<HostBuffer> staging;
    size_t staging_index = 0;
    VkDeviceSize staging_offset = 0, staging_bytes = 0;
    uint64_t serial = 0;
    bool submitted = false;
  };

  Slot& begin();  // the open batch's slot (opening one if needed)
  void track(const std::vector<Access>& accesses);
  void barrier(VkCommandBuffer cb);
  void retire(Slot& s, bool block);
  char* staging(Slot& s, VkDeviceSize bytes, VkBuffer& buffer, VkDeviceSize& offset);
  VkDescriptorSet descriptor_set(Slot& s, VkDescriptorSetLayout layout);
  HostBuffer make_host_buffer(VkDeviceSize size, bool readback);
  void destroy_host_buffer(HostBuffer& b);

  Context& ctx_;
  Slot slots_[kSlots];
  int current_ = 0;
  bool open_ = false;
  uint64_t serial_ = 0, submitted_ = 0, completed_ = 0;
  uint32_t batch_dispatches_ = 0;
  uint32_t batch_limit_ = kFirstBatch;  // dispatches that submit the open batch
  std::vector<Access> accesses_;  // since the last barrier in the open batch
  HostBuffer readback_;
  struct LaterRead {
    uint64_t ticket, serial;
    HostBuffer host;
    size_t bytes;
  };
  std::vector<LaterRead> later_;      // read_later's copies not yet taken
  std::vector<HostBuffer> spare_later_;  // their host buffers, for reuse
  uint64_t later_tickets_ = 0;
  uint64_t submissions_ = 0, barriers_ = 0, dispatches_ = 0;
  double timestamp_ns_ = 1;
  uint64_t timestamp_mask_ = ~0ull;
};

// Profiling (LMTUNE_PROFILE=1 or set_profiling(true)): GPU time per kernel name, for all devices.
void set_profiling(bool on);
bool profiling();
// Waits for queued work, then returns a table: kernel, calls, total ms, mean us (slowest first).
std::string profile_report();
void reset_profile();
struct KernelStats {
  uint64_t calls = 0;
  double ns = 0;
};
std::map<std::string, KernelStats> profile_stats();  // without waiting
// Where a profiled run's time goes besides the kernels: the GPU's span per batch (first to last command, so
// the gaps between kernels count: barriers, copies, idle), and the host blocked on the GPU's fences.
struct BatchStats {
  uint64_t batches = 0, waits = 0;
  double span_ns = 0, wait_ns = 0;
};
BatchStats batch_stats();

}  // namespace lmtune::vk
