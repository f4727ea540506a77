// Tensor: a strided view (shape, strides in elements, offset) of a device Buffer, plus autodiff state.
// Tensors are cheap handles; copies share the same storage. Differentiable views (reshape, transpose, slice,
// expand) are ops in core/ops.h; the methods here only build tensors and move data.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/backend.h"
#include "core/dtype.h"
#include "core/shape.h"

namespace lmtune {

struct Node;

struct TensorImpl {
  std::shared_ptr<Buffer> buffer;
  Shape shape;
  Strides strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  Device device;
  // Autodiff. A leaf that requires grad has no node; an op output recorded for backward points at its node.
  bool requires_grad = false;
  std::shared_ptr<Node> node;
  int output_index = 0;
  std::shared_ptr<TensorImpl> grad;  // accumulated by backward() on leaves
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Construction. Data given on the host is converted to dtype and uploaded.
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = default_device());
  static Tensor from_floats(const std::vector<float>& data, const Shape& shape, DType dtype = DType::f32,
                            Device device = default_device());
  static Tensor from_ints(const std::vector<int32_t>& data, const Shape& shape, Device device = default_device());
  static Tensor full(const Shape& shape, float value, DType dtype = DType::f32, Device device = default_device());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = default_device());
  // Deterministic random values (host RNG, so CPU and Vulkan get identical tensors for the same seed).
  static Tensor randn(const Shape& shape, uint64_t seed, float stddev = 1.0f, DType dtype = DType::f32,
                      Device device = default_device());
  static Tensor uniform(const Shape& shape, uint64_t seed, float lo, float hi, DType dtype = DType::f32,
                        Device device = default_device());

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  const Strides& strides() const { return impl_->strides; }
  int64_t offset() const { return impl_->offset; }
  int ndim() const { return int(impl_->shape.size()); }
  int64_t dim(int axis) const;  // negative axes count from the end
  int64_t numel() const { return lmtune::numel(impl_->shape); }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->device; }
  const std::shared_ptr<Buffer>& buffer() const { return impl_->buffer; }
  bool is_contiguous() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype()); }

  // A view of the same buffer with another layout (no autodiff; ops build differentiable views with it).
  Tensor view_as(const Shape& shape, const Strides& strides, int64_t offset) const;

  // Copies to another device (no autodiff). Same device: returns *this.
  Tensor to(Device device) const;
  // Host copies of the elements in logical (row-major) order.
  std::vector<float> to_floats() const;     // any float dtype -> f32; i32 converted
  std::vector<double> to_doubles() const;
  std::vector<int32_t> to_ints() const;     // i32 only
  float item() const;                       // single-element tensors

  // Autodiff state.
  bool requires_grad() const { return impl_ && impl_->requires_grad; }
  Tensor& set_requires_grad(bool on = true);
  Tensor grad() const { return impl_ && impl_->grad ? Tensor(impl_->grad) : Tensor(); }
  void zero_grad() { if (impl_) impl_->grad.reset(); }
  // Same data, cut off from the graph.
  Tensor detach() const;

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

}  // namespace lmtune
