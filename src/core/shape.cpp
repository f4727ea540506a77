// Shape helpers.
#include "core/shape.h"

#include "core/error.h"

namespace lmtune {

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Strides contiguous_strides(const Shape& s) {
  Strides st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

std::string to_string(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      throw ShapeError(std::string(op) + ": shapes " + to_string(a) + " and " + to_string(b) +
                       " cannot be broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int normalize_axis(int axis, int ndim, const char* op) {
  int a = axis < 0 ? axis + ndim : axis;
  if (a < 0 || a >= ndim)
    throw ShapeError(std::string(op) + ": axis " + std::to_string(axis) + " out of range for " +
                     std::to_string(ndim) + " dims");
  return a;
}

void collapse_dims(Shape& shape, std::vector<Strides>& strides) {
  Shape s;
  std::vector<Strides> st(strides.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !s.empty();
    for (size_t t = 0; t < strides.size() && merge; ++t) merge = st[t].back() == strides[t][d] * shape[d];
    if (merge) {
      s.back() *= shape[d];
      for (size_t t = 0; t < strides.size(); ++t) st[t].back() = strides[t][d];
    } else {
      s.push_back(shape[d]);
      for (size_t t = 0; t < strides.size(); ++t) st[t].push_back(strides[t][d]);
    }
  }
  shape = std::move(s);
  strides = std::move(st);
}

}  // namespace lmtune
