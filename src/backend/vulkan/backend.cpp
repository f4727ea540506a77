// The Vulkan Backend (core/backend.h): tensor buffers from the allocator, host transfers through the recorder.
#include <spdlog/spdlog.h>

#include "backend/vulkan/allocator.h"
#include "backend/vulkan/context.h"
#include "backend/vulkan/recorder.h"
#include "core/error.h"

namespace lmtune::vk {
namespace {

class VulkanBackend final : public Backend {
 public:
  explicit VulkanBackend(int index) : ctx_(std::make_shared<Context>(index)) {}
  Device device() const override { return Device::vulkan(ctx_->index()); }
  Context& context() { return *ctx_; }

  std::shared_ptr<Buffer> allocate(size_t bytes) override {
    std::lock_guard lock(ctx_->mutex());
    Allocation a;
    std::string why;
    Allocator& al = ctx_->allocator();
    Recorder& rec = ctx_->recorder();
    if (!al.try_allocate(bytes, a, why)) {
      // Memory freed by tensors whose last kernels are still queued comes back once they finish.
      rec.poll();
      if (!al.try_allocate(bytes, a, why) && al.has_pending()) {
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
  void synchronize() override { ctx_->synchronize(); }
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
