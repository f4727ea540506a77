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

}  // namespace lmtune
