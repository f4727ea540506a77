// CPU kernel for the strided copy / cast.
#include <cstring>
#include <vector>

#include "backend/cpu/strided.h"
#include "core/ops/view.h"

namespace lmtune {

void Copy::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor& x = in[0];
  const Tensor& y = out[0];
  char *xp = cpu::base_ptr(x), *yp = cpu::base_ptr(y);
  size_t xs = dtype_size(x.dtype()), ys = dtype_size(y.dtype());
  bool same_int = x.dtype() == DType::i32 && y.dtype() == DType::i32;
  cpu::for_each_span(x.shape(), {x.strides(), y.strides()}, [&](const int64_t* o, const int64_t* s, int64_t n) {
    if (x.dtype() == y.dtype() && s[0] == 1 && s[1] == 1) {
      std::memcpy(yp + o[1] * ys, xp + o[0] * xs, size_t(n) * xs);
      return;
    }
    if (same_int) {  // i32 must not round-trip through f32 (values above 2^24)
      auto* src = reinterpret_cast<const int32_t*>(xp) + o[0];
      auto* dst = reinterpret_cast<int32_t*>(yp) + o[1];
      for (int64_t i = 0; i < n; ++i) dst[i * s[1]] = src[i * s[0]];
      return;
    }
    float* buf = cpu::scratch(0, n);
    cpu::load_row(xp + o[0] * xs, x.dtype(), s[0], n, buf);
    cpu::store_row(yp + o[1] * ys, y.dtype(), s[1], n, buf);
  });
}

}  // namespace lmtune
