// CPU matmul through OpenBLAS cblas_sgemm. f32 operands in a GEMM layout are used in place; f16/bf16 operands
// (and any other layout) are first converted to contiguous f32 scratch. Batches whose matrices are small run in
// parallel on our pool (one single-threaded GEMM each); large GEMMs run one after another and OpenBLAS threads them.
#include <cblas.h>

#include <cstring>
#include <vector>

#include "backend/cpu/strided.h"
#include "core/ops/elementwise.h"
#include "core/ops/matmul.h"

namespace lmtune {
namespace {

// An operand as sgemm sees it: f32 data (the tensor's own memory or scratch) with its strides.
struct Operand {
  std::vector<float> scratch;
  const float* base = nullptr;
  Strides strides;
};

bool usable_in_place(const Tensor& t) {
  if (t.dtype() != DType::f32) return false;
  int n = t.ndim();
  int64_t rows = t.shape()[n - 2], cols = t.shape()[n - 1];
  int64_t rs = t.strides()[n - 2], cs = t.strides()[n - 1];
  return ((cs == 1 || cols == 1) && (rows == 1 || rs >= cols)) || ((rs == 1 || rows == 1) && (cols == 1 || cs >= rows));
}

Operand prepare(const Tensor& t) {
  Operand op;
  if (usable_in_place(t)) {
    op.base = cpu::data<float>(t);
    op.strides = t.strides();
    return op;
  }
  op.scratch.resize(size_t(t.numel()));
  op.strides = contiguous_strides(t.shape());
  const char* src = cpu::base_ptr(t);
  size_t es = dtype_size(t.dtype());
  float* dst = op.scratch.data();
  cpu::for_each_row(t.shape(), {t.strides(), op.strides}, [&](const int64_t* o, const int64_t* s, int64_t n) {
    cpu::load_row(src + o[0] * int64_t(es), t.dtype(), s[0], n, dst + o[1]);
  });
  op.base = op.scratch.data();
  return op;
}

// The sgemm transpose flag and leading dimension of a [rows, cols] matrix with strides (rs, cs).
void gemm_args(int64_t rows, int64_t cols, int64_t rs, int64_t cs, CBLAS_TRANSPOSE& trans, int& ld) {
  if ((cs == 1 || cols == 1) && (rows == 1 || rs >= cols)) {
    trans = CblasNoTrans;
    ld = int(std::max<int64_t>({rows == 1 ? cols : rs, cols, 1}));
  } else {
    trans = CblasTrans;
    ld = int(std::max<int64_t>({cols == 1 ? rows : cs, rows, 1}));
  }
}

// A result computed in f32 scratch, stored in y's 16-bit dtype (nothing to do for f32 y, computed in place).
void store_result(Tensor& y, const float* ybase) {
  if (y.dtype() == DType::f32) return;
  char* dst = cpu::base_ptr(y);
  size_t es = dtype_size(y.dtype());
  cpu::for_each_row(y.shape(), {y.strides()}, [&](const int64_t* o, const int64_t* s, int64_t n) {
    cpu::store_row(dst + o[0] * int64_t(es), y.dtype(), s[0], n, ybase + o[0]);
  });
}

}  // namespace

void Matmul::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  Tensor& y = out[0];
  const int nd = y.ndim();
  const int64_t M = y.shape()[nd - 2], N = y.shape()[nd - 1], K = in[0].shape()[in[0].ndim() - 1];
  if (y.numel() == 0) return;
  Shape batch(y.shape().begin(), y.shape().end() - 2);
  const int64_t nbatch = numel(batch);

  Operand a = prepare(in[0]), b = prepare(in[1]);
  // Broadcast the operands' batch strides to the output's batch shape (stride 0 where broadcast).
  auto batch_strides = [&](const Tensor& t, const Strides& st) {
    Shape full = batch;
    full.push_back(t.shape()[t.ndim() - 2]);
    full.push_back(t.shape()[t.ndim() - 1]);
    return broadcast_view(t.view_as(t.shape(), st, 0), full).strides();
  };
  Strides as = batch_strides(in[0], a.strides), bs = batch_strides(in[1], b.strides);
  CBLAS_TRANSPOSE ta, tb;
  int lda, ldb;
  gemm_args(M, K, as[nd - 2], as[nd - 1], ta, lda);
  gemm_args(K, N, bs[nd - 2], bs[nd - 1], tb, ldb);

  std::vector<float> yscratch;
  float* ybase = y.dtype() == DType::f32 ? cpu::data<float>(y) : (yscratch.resize(size_t(y.numel())), yscratch.data());

  auto run = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      int64_t ao = 0, bo = 0, r = i;
      for (int d = nd - 3; d >= 0; --d) {
        int64_t idx = r % batch[d];
        r /= batch[d];
        ao += idx * as[d];
        bo += idx * bs[d];
      }
      float* c = ybase + i * M * N;
      if (K == 0) {
        std::memset(c, 0, size_t(M * N) * sizeof(float));
        continue;
      }
      cblas_sgemm(CblasRowMajor, ta, tb, int(M), int(N), int(K), alpha, a.base + ao, lda, b.base + bo, ldb, 0.0f, c,
                  int(N));
    }
  };
  const int64_t work = M * N * std::max<int64_t>(K, 1);
  const int64_t small = int64_t(1) << 18;  // below this a GEMM is not worth OpenBLAS's threads
  if (nbatch > 1 && work < small)
    cpu::parallel_for(nbatch, std::max<int64_t>(1, small / work), run);
  else
    run(0, nbatch);

  store_result(y, ybase);
}

void MatmulLowRank::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  Tensor& y = out[0];
  if (y.numel() == 0) return;
  const int64_t M = y.dim(0), N = y.dim(1), K = in[0].dim(1), R = in[2].dim(1);
  std::vector<float> yscratch;
  float* ybase = y.dtype() == DType::f32 ? cpu::data<float>(y) : (yscratch.resize(size_t(y.numel())), yscratch.data());
  // C = A B, then C += alpha U V (sgemm's beta).
  auto gemm = [&](const Tensor& at, const Tensor& bt, int64_t inner, float alpha, float beta) {
    Operand a = prepare(at), b = prepare(bt);
    CBLAS_TRANSPOSE ta, tb;
    int lda, ldb;
    gemm_args(M, inner, a.strides[0], a.strides[1], ta, lda);
    gemm_args(inner, N, b.strides[0], b.strides[1], tb, ldb);
    cblas_sgemm(CblasRowMajor, ta, tb, int(M), int(N), int(inner), alpha, a.base, lda, b.base, ldb, beta, ybase,
                int(N));
  };
  if (K > 0) gemm(in[0], in[1], K, 1.0f, 0.0f);
  else std::memset(ybase, 0, size_t(M * N) * sizeof(float));
  if (R > 0) gemm(in[2], in[3], R, alpha, 1.0f);
  store_result(y, ybase);
}

}  // namespace lmtune
