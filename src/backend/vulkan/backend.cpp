// The Vulkan Backend (core/backend.h): tensor buffers from the allocator, host transfers through the recorder.
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include "backend/vulkan/allocator.h"
#include "backend/vulkan/context.h"
#include "backend/vulkan/flash_attention.h"
#include "backend/vulkan/matmul.h"
#include "backend/vulkan/pipelines.h"
#include "backend/vulkan/recorder.h"
#include "core/error.h"

namespace lmtune::vk {
namespace {

// Contexts are never destroyed: tensors in static storage may outlive any owner we could pick, and the driver
// tears itself down at exit. Instead, an exit hook (registered after the driver loaded, so it runs before the
// driver's own) saves each context's pipeline cache.
void keep_until_exit(const std::shared_ptr<Context>& ctx) {
  static auto* contexts = new std::vector<std::shared_ptr<Context>>();
  static std::mutex mu;
  std::lock_guard lock(mu);
  contexts->push_back(ctx);
  static const bool hooked = [] {
    std::atexit([] {
      for (auto& c : *contexts) {
        try {
          std::lock_guard ctx_lock(c->mutex());
          c->pipelines().save_cache();
        } catch (const std::exception& e) {
          spdlog::warn("{}: could not save the pipeline cache: {}", c->name(), e.what());
        }
      }
    });
    return true;
  }();
  (void)hooked;
}

class VulkanBackend final : public Backend {
 public:
  explicit VulkanBackend(int index) : ctx_(std::make_shared<Context>(index)) { keep_until_exit(ctx_); }
  Device device() const override { return Device::vulkan(ctx_->index()); }
  Context& context() { return *ctx_; }

  std::shared_ptr<Buffer> allocate(size_t bytes) override {
    std::lock_guard lock(ctx_->mutex());
    Allocation a;
    std::string why;
    Allocator& al = ctx_->allocator();
    Recorder& rec = ctx_->recorder();
    if (!al.try_allocate(bytes, a, why)) {
      // Memory freed by tensors whose last kernels are still queued comes back once they finish (mapped memory;
      // empty blocks are given back to the driver only once idle).
      rec.poll();
      if (!al.try_allocate(bytes, a, why)) {
        rec.wait_all();
        if (!al.try_allocate(bytes, a, why)) a.block = nullptr;
      }
    }
    if (!a.block)
      throw OutOfMemoryError(ctx_->name() + ": out of device memory allocating " + format_bytes(bytes) + " (" +
                             std::to_string(bytes) + " bytes): " + why + "; " + al.describe_usage());
    return std::make_shared<DeviceBuffer>(ctx_, a, bytes);
  }

  void write(Buffer& dst, size_t offset, const void* src, size_t bytes) override {
    std::lock_guard lock(ctx_->mutex());
    ctx_->recorder().write(device_buffer(dst), offset, src, bytes);
  }
  void read(Buffer& src, size_t offset, void* dst, size_t bytes) override {
    std::lock_guard lock(ctx_->mutex());
    ctx_->recorder().read(device_buffer(src), offset, dst, bytes);
  }
  void fill(Buffer& dst, uint32_t word) override {
    // A non-owning pointer: the fill is recorded before this returns and keeps no reference.
    ctx_->fill_buffer({std::shared_ptr<Buffer>(std::shared_ptr<Buffer>(), &dst), true}, word);
  }
  void copy(Buffer& src, Buffer& dst, const std::vector<CopyRegion>& regions) override {
    std::lock_guard lock(ctx_->mutex());
    ctx_->recorder().copy(device_buffer(src), device_buffer(dst), regions);
  }
  void synchronize() override { ctx_->synchronize(); }
  uint64_t read_later(Buffer& src, size_t offset, size_t bytes) override {
    std::lock_guard lock(ctx_->mutex());
    return ctx_->recorder().read_later(device_buffer(src), offset, bytes);
  }
  void take_read(uint64_t ticket, void* dst, size_t bytes) override {
    std::lock_guard lock(ctx_->mutex());
    ctx_->recorder().take_read(ticket, dst, bytes);
  }
  size_t bytes_in_use() const override {
    std::lock_guard lock(ctx_->mutex());
    return ctx_->allocator().bytes_in_use();
  }
  size_t peak_bytes() const override {
    std::lock_guard lock(ctx_->mutex());
    return ctx_->allocator().peak_bytes();
  }
  void reset_peak() override {
    std::lock_guard lock(ctx_->mutex());
    ctx_->allocator().reset_peak();
  }
  bool rounds_bf16_products_to_f16() const override {
    return ctx_->kernel_choice().matmul != MatmulKernel::scalar && coopmat_available(ctx_->index());
  }
  bool prefers_transposed_weights() const override { return rounds_bf16_products_to_f16(); }
  bool runs_fused_attention(const FlashAttentionParams& p, DType q_dtype, bool backward) const override {
    return flash_attention_runs(*ctx_, p, q_dtype, backward);
  }
  size_t max_tensor_bytes() const override { return ctx_->properties().limits.maxStorageBufferRange; }
  size_t available_bytes() const override {
    std::lock_guard lock(ctx_->mutex());
    return size_t(ctx_->allocator().available());
  }

 private:
  DeviceBuffer& device_buffer(Buffer& b) {
    auto* d = dynamic_cast<DeviceBuffer*>(&b);
    if (!d || &d->context() != ctx_.get())
      throw DeviceError(ctx_->name() + ": buffer belongs to another device (" + b.device().str() + ")");
    return *d;
  }

  std::shared_ptr<Context> ctx_;
};

}  // namespace

std::unique_ptr<Backend> make_backend(int index) { return std::make_unique<VulkanBackend>(index); }

Context& context_for(Device d) {
  if (!d.is_vulkan()) throw DeviceError("vulkan: context_for(" + d.str() + "): not a Vulkan device");
  return static_cast<VulkanBackend&>(backend(d)).context();
}

}  // namespace lmtune::vk
