// What the core needs from a backend: device memory and transfers. Backends live in src/backend/ and
// implement this; ops reach their kernels through Primitive::eval_cpu / eval_vulkan, not through here.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"

namespace lmtune {

struct FlashAttentionParams;  // core/ops/flash_attention.h

// A block of device memory holding one tensor's elements (possibly shared by views).
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual size_t bytes() const = 0;
  virtual Device device() const = 0;
  // Host pointer for CPU buffers; nullptr for device buffers.
  virtual void* host_data() { return nullptr; }
};

// A byte range of one buffer copied to another (Backend::copy).
struct CopyRegion {
  size_t src_offset = 0, dst_offset = 0, bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  // Throws OutOfMemoryError naming the requested size and what is available.
  virtual std::shared_ptr<Buffer> allocate(size_t bytes) = 0;
  // Host -> device copy. May be queued; ordering with kernels is preserved.
  virtual void write(Buffer& dst, size_t offset, const void* src, size_t bytes) = 0;
  // Device -> host copy; waits for all work that writes the buffer.
  virtual void read(Buffer& src, size_t offset, void* dst, size_t bytes) = 0;
  // Every 4 bytes of the buffer set to `word` (little-endian; a buffer whose size is not a multiple of 4 ends with
  // the word's first bytes). Queued like a kernel, without a host copy of the contents (Tensor::full, zeros).
  virtual void fill(Buffer& dst, uint32_t word) = 0;
  // Byte ranges of src copied into dst (src and dst distinct buffers, the destination ranges disjoint), queued
  // like a kernel as one command: a cache's rows moved in one step, not one kernel per row (KvCache::regroup).
  virtual void copy(Buffer& src, Buffer& dst, const std::vector<CopyRegion>& regions) = 0;
  // Waits until all queued work has finished.
  virtual void synchronize() = 0;
  // A device -> host copy of `bytes` of src started after the work queued so far, which is submitted; take_read()
  // of the ticket later waits for that point only, however much is queued after it (a decode step reads its
  // sampled ids while the next step runs). Each ticket is taken once. Here (host backends): read at once.
  virtual uint64_t read_later(Buffer& src, size_t offset, size_t bytes) {
    std::vector<char> copy(bytes);
    read(src, offset, copy.data(), bytes);
    stash_.emplace_back(++tickets_, std::move(copy));
    return tickets_;
  }
  virtual void take_read(uint64_t ticket, void* dst, size_t bytes) {
    auto it = std::find_if(stash_.begin(), stash_.end(), [&](const auto& s) { return s.first == ticket; });
    if (it == stash_.end()) throw DeviceError("no pending read " + std::to_string(ticket));
    std::memcpy(dst, it->second.data(), std::min(bytes, it->second.size()));
    stash_.erase(it);
  }
  // Bytes held by live tensors now, and the most held since the last reset_peak().
  virtual size_t bytes_in_use() const = 0;
  virtual size_t peak_bytes() const = 0;
  virtual void reset_peak() = 0;
  // Whether bf16 matmuls run on f16 tensor cores (Vulkan cooperative matrices take f16 operands only): bf16
  // values are rounded to f16 there, so gradients below f16's normal range (6e-5) lose precision or flush to
  // zero unless training scales its loss (train/loss_scaler.h).
  virtual bool rounds_bf16_products_to_f16() const { return false; }
  // Whether x · W runs measurably faster than x · Wᵀ for a weight W (the tensor-core GEMM reads the untransposed
  // layout 5-8% faster: bench/RESULTS.md), so that a transposed copy of a frozen weight pays for its memory.
  virtual bool prefers_transposed_weights() const { return false; }
  // The largest tensor a kernel can address whole (Vulkan: maxStorageBufferRange, 4 GiB on NVIDIA).
  virtual size_t max_tensor_bytes() const { return SIZE_MAX; }
  // Bytes that allocations can still get (device memory budget); 0 when the backend cannot tell.
  virtual size_t available_bytes() const { return 0; }
  // Whether the fused attention (FlashAttention) runs here for these parameters and query dtype, and its backward
  // too when `backward`; ops::attention composes it otherwise.
  virtual bool runs_fused_attention(const FlashAttentionParams& /*p*/, DType /*q_dtype*/, bool /*backward*/) const {
    return true;
  }

 private:
  std::vector<std::pair<uint64_t, std::vector<char>>> stash_;  // read_later's copies (host backends)
  uint64_t tickets_ = 0;
};

// The backend for a device (created on first use). Defined in src/backend/registry.cpp.
Backend& backend(Device d);

}  // namespace lmtune
