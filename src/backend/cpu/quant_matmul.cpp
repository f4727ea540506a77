// CPU products with a block-quantized weight (QuantizedMatmul): W is dequantized a panel of rows at a time into
// f32 scratch of at most ~8 MiB (rows in parallel on our pool) and each panel goes through one OpenBLAS GEMM,
// which threads itself: never more than a panel of W exists as floats. An addend is loaded into the result first.
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/strided.h"
#include "core/ops/quant_matmul.h"

namespace lmtune {
namespace {

constexpr int64_t kPanelFloats = int64_t(2) << 20;  // 8 MiB of f32 per panel

// x [M, K] as f32 rows with a unit column stride: in place for f32, else converted (rows in parallel).
const float* f32_rows(const Tensor& x, std::vector<float>& scratch, int64_t& ld) {
  const int64_t M = x.dim(0), K = x.dim(1);
  if (x.dtype() == DType::f32 && (x.strides()[1] == 1 || K == 1)) {
    ld = std::max<int64_t>({M > 1 ? x.strides()[0] : K, K, 1});
    return cpu::data<float>(x);
  }
  scratch.resize(size_t(M * K));
  ld = std::max<int64_t>(K, 1);
  const char* src = cpu::base_ptr(x);
  const int64_t es = int64_t(dtype_size(x.dtype()));
  cpu::parallel_for(M, std::max<int64_t>(1, 16384 / std::max<int64_t>(K, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      cpu::load_row(src + r * x.strides()[0] * es, x.dtype(), x.strides()[1], K, scratch.data() + r * K);
  });
  return scratch.data();
}

}  // namespace

void QuantizedMatmul::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  Tensor& y = out[0];
  const Tensor& x = in[0];
  const int64_t M = x.dim(0), N = y.dim(1), rows = weight.rows(), cols = weight.cols();
  if (y.numel() == 0) return;
  std::vector<float> xscratch, yscratch;
  int64_t ldx = 0;
  const float* xb = f32_rows(x, xscratch, ldx);
  float* yb = y.dtype() == DType::f32 ? cpu::data<float>(y) : (yscratch.resize(size_t(y.numel())), yscratch.data());
  // An addend starts the sums: y = d, then every panel's GEMM adds to it (beta 1).
  const bool add = in.size() > 1;
  if (add) {
    const Tensor& d = in[1];
    const char* src = cpu::base_ptr(d);
    const int64_t es = int64_t(dtype_size(d.dtype()));
    cpu::parallel_for(M, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        cpu::load_row(src + r * d.strides()[0] * es, d.dtype(), d.strides()[1], N, yb + r * N);
    });
  }
  const auto* wb = reinterpret_cast<const std::byte*>(cpu::base_ptr(weight.words));
  const size_t rb = quant::row_bytes(weight.format, cols);
  const int64_t panel_rows = std::clamp<int64_t>(kPanelFloats / cols, 1, rows);
  std::vector<float> panel(size_t(panel_rows * cols));
  for (int64_t r0 = 0; r0 < rows; r0 += panel_rows) {
    const int64_t p = std::min(panel_rows, rows - r0);
    cpu::parallel_for(p, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        quant::dequantize_row(weight.format, wb + size_t(r0 + i) * rb, cols, panel.data() + i * cols);
    });
    if (transposed)  // y[:, r0 : r0 + p] = x panelᵀ
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(M), int(p), int(cols), 1.0f, xb, int(ldx),
                  panel.data(), int(cols), add ? 1.0f : 0.0f, yb + r0, int(N));
    else  // y += x[:, r0 : r0 + p] panel
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(M), int(cols), int(p), 1.0f, xb + r0, int(ldx),
                  panel.data(), int(cols), r0 == 0 && !add ? 0.0f : 1.0f, yb, int(N));
  }
  if (y.dtype() != DType::f32) {
    char* dst = cpu::base_ptr(y);
    const int64_t es = int64_t(dtype_size(y.dtype()));
    cpu::parallel_for(M, 1, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) cpu::store_row(dst + r * N * es, y.dtype(), 1, N, yb + r * N);
    });
  }
}

}  // namespace lmtune
