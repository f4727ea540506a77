// Shapes and strides (in elements), broadcasting, and printing them in error messages.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace lmtune {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

int64_t numel(const Shape& s);
Strides contiguous_strides(const Shape& s);
std::string to_string(const Shape& s);
// Numpy broadcasting of two shapes; throws ShapeError naming both shapes and the op.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Normalises a possibly negative axis into [0, ndim); throws ShapeError.
int normalize_axis(int axis, int ndim, const char* op);
// Drops size-1 dims of `shape` and merges dim i into dim i+1 where every tensor's strides step over dim i by exactly
// one full dim i+1 (strides: one vector per tensor viewed with `shape`). Every dim 1: shape and strides empty.
void collapse_dims(Shape& shape, std::vector<Strides>& strides);

}  // namespace lmtune
