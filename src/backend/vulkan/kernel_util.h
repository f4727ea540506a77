// Helpers shared by the op files of the Vulkan backend: checked narrowing to the uint32 fields of push constants,
// dense temporaries, and the strided elementwise launcher (up to 4 tensors, dims collapsed to at most 4).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/vulkan/dispatch.h"
#include "core/tensor.h"

namespace lmtune::vk {

// v as uint32, or a ShapeError naming `what` (kernels index with 32-bit integers).
uint32_t u32(int64_t v, const char* what);


// Outer dims (rows) of up to 3 collapsed dims for row kernels: shape padded in front with 1s, strides with 0s.
struct Rows {
  uint32_t count = 0;
  uint32_t shape[3] = {1, 1, 1};
  uint32_t strides[2][3] = {{0, 0, 0}, {0, 0, 0}};
};
// Rows over `shape` for up to two stride vectors; false if they need more than 3 dims.
bool make_rows(Shape shape, std::vector<Strides> strides, Rows& rows);

// Push constants of kernels/elementwise/elementwise.comp.
struct ElementwisePush {
  uint32_t n;
  uint32_t shape[4];
  uint32_t strides[16];
  uint32_t offsets[4];
  uint32_t dtypes;
  uint32_t op;
  float param;
  uint32_t contiguous;
};
static_assert(sizeof(ElementwisePush) <= 128);

// Runs `kernel` (unary/binary/where/copy) over tensors[i], all viewed with the shape of the last one (the output);
// broadcast inputs have stride 0.
void run_elementwise(const std::string& kernel, const std::vector<Tensor>& tensors, uint32_t op, float param);

// Strided copy with dtype conversion (the Copy primitive's kernel).
void copy_tensor(const Tensor& src, const Tensor& dst);
// x itself if dense (contiguous, any offset), else a dense copy on the same device.
Tensor dense(const Tensor& x);
// Elements of t's first row-major element and one past its last, relative to the buffer start.
inline uint32_t elem_offset(const Tensor& t) { return u32(t.offset(), "tensor offset"); }

}  // namespace lmtune::vk
