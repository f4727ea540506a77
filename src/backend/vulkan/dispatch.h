// How op files run kernels on a Vulkan device. The whole API:
//
//   vk::Context& ctx = vk::context_for(out.device());
//   struct Push { uint32_t n, x_off, y_off; float alpha; };           // <= 128 bytes, matches the GLSL block
//   Push p{uint32_t(n), uint32_t(x.offset()), uint32_t(y.offset()), 2.0f};
//   ctx.dispatch("my_kernel", {vk::in(x), vk::out(y)}, p, vk::groups_1d(n, 256), {256 /* spec constant 0 */});
//
// - kernel: a name from kernels/variants.txt (its SPIR-V is embedded). The pipeline is created on first use and
//   cached (in memory, and by the driver on disk).
// - bindings: storage buffers 0..N-1 of descriptor set 0, in order. Each is the tensor's WHOLE device allocation
//   (bound at the allocation's start), so the shader indexes it with the tensor's element offset (t.offset())
//   and strides, passed in push constants. in() = read-only, out() = written (or read and written). The
//   recorder uses this to place barriers: mark every buffer the kernel writes with out().
// - push: one trivially copyable struct, at most 128 bytes (static_assert), declared in GLSL as
//   `layout(push_constant) uniform Push { ... }` with the same layout (std430 rules: keep to 4-byte scalars).
// - groups: workgroup counts {x, y, z} (each <= the device limit; groups_1d() caps x and kernels loop).
// - spec: specialization constants 0..k-1 (uint32; use uintBitsToFloat in GLSL for floats). By convention
//   constant 0 is the workgroup size when the kernel declares `layout(local_size_x_id = 0) in;`.
//
// Dispatches are recorded, not run: they execute in order on the device's queue, with barriers between
// dependent ones. Backend::read (Tensor::to_floats, ...) waits for what it needs; ctx.synchronize() waits for all.
// Temporaries: Tensor::empty(shape, dtype, device) (freed memory is reused only after the kernels finished).
// Device facts for choosing kernels: ctx.features() (subgroup_size, storage_16bit, cooperative_matrix, ...),
// ctx.properties().limits.
#pragma once
#include <algorithm>
#include <string>

#include "backend/vulkan/context.h"
#include "core/tensor.h"

namespace lmtune::vk {

inline Binding in(const Tensor& t) { return {t.buffer(), false}; }
inline Binding out(const Tensor& t) { return {t.buffer(), true}; }

inline uint32_t ceil_div(uint64_t n, uint64_t d) { return uint32_t((n + d - 1) / d); }

// Workgroups for n items at `per_group` items each, capped at 65535 (kernels use grid-stride loops).
inline Groups groups_1d(uint64_t n, uint32_t per_group, uint32_t cap = 65535) {
  return {std::max<uint32_t>(1, std::min<uint32_t>(ceil_div(n, per_group), cap)), 1, 1};
}

// The variant of a kernel that this device can run: "<base>_packed16" (f16/bf16 through uint32 words) when the
// device lacks 16-bit storage. Kernels that touch f16/bf16 data are built in both forms (kernels/variants.txt).
inline std::string variant(const Context& ctx, const std::string& base) {
  return ctx.features().storage_16bit ? base : base + "_packed16";
}

}  // namespace lmtune::vk
