// CPU kernels of the fused attention (core/ops/flash_attention.h). The forward pass is an online softmax over
// blocks of kRows rows x kKeys keys; the backward pass recomputes P from the saved LSE (FlashAttention-2) in two
// passes with one writer per output element, dQ over row blocks and dK/dV over key blocks, so results are
// deterministic and need no atomics. Rows are (query t, head g of a kv group) pairs, row = t * G + g, so the G
// query heads of a kv head share each K/V tile. All math is f32 (block products through OpenBLAS); the largest
// buffer is one [kRows, kKeys] block.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "backend/cpu/strided.h"
#include "core/ops/flash_attention.h"

namespace lmtune {
namespace {

constexpr int64_t kRows = 16, kKeys = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using Buf = std::vector<float>;
Buf buf(int64_t n) { return Buf(static_cast<size_t>(n), 0.0f); }

// A [B, T, heads, D] tensor with dense heads and dims: element (b, t, h, d) at b*sb + t*st + h*D + d.
struct Heads {
  const char* p;
  DType dt;
  int64_t sb, st, D;
  explicit Heads(const Tensor& x)
      : p(cpu::base_ptr(x)), dt(x.dtype()), sb(x.strides()[0]), st(x.strides()[1]), D(x.dim(3)) {}
  void load(int64_t b, int64_t t, int64_t h, float* dst) const {
    cpu::load_row(p + (b * sb + t * st + h * D) * int64_t(dtype_size(dt)), dt, 1, D, dst);
  }
};

// Stores row (b, t, h) of a contiguous [B, T, heads, D] output.
void store(Tensor& out, int64_t b, int64_t t, int64_t h, const float* src) {
  const int64_t T = out.dim(1), NH = out.dim(2), D = out.dim(3);
  cpu::store_row(cpu::base_ptr(out) + ((b * T + t) * NH + h) * D * int64_t(dtype_size(out.dtype())), out.dtype(), 1,
                 D, src);
}

struct Problem {
  FlashAttentionParams a;
  const int32_t* docs = nullptr;  // [B, T]
  const int32_t* keys = nullptr;  // [B, S]

  Problem(const FlashAttentionParams& p, const std::vector<Tensor>& in, size_t first_mask) : a(p) {
    if (p.docs) docs = cpu::data<int32_t>(in[first_mask++]);
    if (p.key_mask) keys = cpu::data<int32_t>(in[first_mask]);
  }
  bool visible(int64_t b, int64_t t, int64_t j) const {
    const int64_t qpos = t + a.q_offset;  // the query's position among the keys
    if (a.causal && j > qpos) return false;
    if (a.window > 0 && qpos - j >= a.window) return false;
    if (docs && docs[b * a.T + t] != docs[b * a.T + j]) return false;
    return !keys || keys[b * a.S + j] != 0;
  }
  // Keys [j0, j1) that queries t0..t1 may see by the causal and window bounds (the other masks are per element).
  std::pair<int64_t, int64_t> keys_for(int64_t t0, int64_t t1) const {
    int64_t j0 = 0, j1 = a.S;
    if (a.causal) j1 = std::clamp<int64_t>(t1 + a.q_offset + 1, 0, a.S);
    if (a.window > 0) j0 = std::clamp<int64_t>(t0 + a.q_offset - a.window + 1, 0, a.S);
    return {j0, std::max(j0, j1)};
  }
  // Queries [t0, t1) that may see one of the keys j0..j1.
  std::pair<int64_t, int64_t> queries_for(int64_t j0, int64_t j1) const {
    int64_t t0 = 0, t1 = a.T;
    if (a.causal) t0 = std::clamp<int64_t>(j0 - a.q_offset, 0, a.T);
    if (a.window > 0) t1 = std::clamp<int64_t>(j1 + a.window - a.q_offset, 0, a.T);
    return {t0, std::max(t0, t1)};
  }
};

// Rows [r0, r0 + n) of kv head `kv`: their query position and head.
struct RowBlock {
  int64_t n = 0, t[kRows], h[kRows];
  RowBlock(const Problem& P, int64_t kv, int64_t r0, int64_t r1) : n(std::min(kRows, r1 - r0)) {
    const int64_t G = P.a.G();
    for (int64_t r = 0; r < n; ++r) t[r] = (r0 + r) / G, h[r] = kv * G + (r0 + r) % G;
  }
};

// Keys [j0, j0 + nc) of (b, kv) as f32 rows [nc][D].
void load_keys(const Heads& x, int64_t b, int64_t kv, int64_t j0, int64_t nc, float* rows) {
  for (int64_t c = 0; c < nc; ++c) x.load(b, j0 + c, kv, rows + c * x.D);
}

// The block products, as small single-threaded GEMMs (OpenBLAS; deterministic for fixed sizes).
// out [n][kKeys] = a [n][D] · keys [nc][D]ᵀ.
void dots(const float* a, const float* keys, int64_t n, int64_t nc, int64_t D, float* out) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(nc), int(D), 1.0f, a, int(D), keys, int(D), 0.0f,
              out, int(kKeys));
}
// acc [n][D] += w [n][kKeys] · x [nc][D].
void weighted_rows(const float* w, const float* x, int64_t n, int64_t nc, int64_t D, float* acc) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(n), int(D), int(nc), 1.0f, w, int(kKeys), x, int(D),
              1.0f, acc, int(D));
}
// acc [nc][D] += w [n][kKeys]ᵀ · x [n][D] (key rows gather from query rows).
void weighted_cols(const float* w, const float* x, int64_t n, int64_t nc, int64_t D, float* acc) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(nc), int(D), int(n), 1.0f, w, int(kKeys), x, int(D),
              1.0f, acc, int(D));
}

// Scores of a block: s = scale q kᵀ (q [n][D], k [nc][D]), soft-capped, -inf where masked.
void block_scores(const Problem& P, int64_t b, const RowBlock& rb, const float* q, const float* k, int64_t j0,
                  int64_t nc, float* s) {
  dots(q, k, rb.n, nc, P.a.D, s);
  const float scale = P.a.scale, cap = P.a.softcap;
  for (int64_t r = 0; r < rb.n; ++r)
    for (int64_t c = 0; c < nc; ++c) {
      float x = s[r * kKeys + c] * scale;
      if (cap > 0) x = cap * std::tanh(x / cap);
      s[r * kKeys + c] = P.visible(b, rb.t[r], j0 + c) ? x : kNegInf;
    }
}

// From scores s and dP = dO vᵀ: s <- P = exp(s - lse), dp <- dS = scale P (dP - Δ) (1 - tanh²).
void block_grads(const Problem& P, const RowBlock& rb, const float* lse, const float* delta, int64_t nc, float* s,
                 float* dp) {
  const float scale = P.a.scale, cap = P.a.softcap;
  for (int64_t r = 0; r < rb.n; ++r)
    for (int64_t c = 0; c < nc; ++c) {
      float& x = s[r * kKeys + c];
      float& g = dp[r * kKeys + c];
      if (x == kNegInf) {
        x = g = 0.0f;
        continue;
      }
      float p = std::exp(x - lse[r]);
      float ds = p * (g - delta[r]);
      if (cap > 0) ds *= 1.0f - (x / cap) * (x / cap);
      x = p;
      g = scale * ds;
    }
}

// Row r of a [B, H, T] f32 tensor for the block's rows.
void gather_rows(const float* bht, const Problem& P, int64_t b, const RowBlock& rb, float* dst) {
  for (int64_t r = 0; r < rb.n; ++r) dst[r] = bht[(b * P.a.H + rb.h[r]) * P.a.T + rb.t[r]];
}

int64_t row_blocks(const FlashAttentionParams& p) { return (p.T * p.G() + kRows - 1) / kRows; }

}  // namespace

void FlashAttention::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Problem P(p, in, 3);
  const Heads q(in[0]), k(in[1]), v(in[2]);
  const int64_t D = p.D, rows = p.T * p.G(), nblocks = row_blocks(p);
  float* lse = cpu::data<float>(out[1]);
  cpu::parallel_for(p.B * p.KV * nblocks, 1, [&](int64_t w0, int64_t w1) {
    Buf qf = buf(kRows * D), kf = buf(kKeys * D), vf = buf(kKeys * D), s = buf(kRows * kKeys);
    Buf acc = buf(kRows * D), m = buf(kRows), l = buf(kRows);
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / (p.KV * nblocks), kv = w / nblocks % p.KV, r0 = w % nblocks * kRows;
      const RowBlock rb(P, kv, r0, rows);
      for (int64_t r = 0; r < rb.n; ++r) q.load(b, rb.t[r], rb.h[r], qf.data() + r * D);
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), 0.0f);
      auto [j0, j1] = P.keys_for(rb.t[0], rb.t[rb.n - 1]);
      for (int64_t jb = j0; jb < j1; jb += kKeys) {
        const int64_t nc = std::min(kKeys, j1 - jb);
        load_keys(k, b, kv, jb, nc, kf.data());
        load_keys(v, b, kv, jb, nc, vf.data());
        block_scores(P, b, rb, qf.data(), kf.data(), jb, nc, s.data());
        // Online softmax: rescale what the row has so far to the new running max, then add this block.
        for (int64_t r = 0; r < rb.n; ++r) {
          float* sr = s.data() + r * kKeys;
          const float mx = std::max(m[r], *std::max_element(sr, sr + nc));
          if (mx == kNegInf) {  // nothing visible yet: this block adds nothing
            std::fill(sr, sr + nc, 0.0f);
            continue;
          }
          const float alpha = std::exp(m[r] - mx);
          m[r] = mx;
          l[r] *= alpha;
          for (int64_t d = 0; d < D; ++d) acc[r * D + d] *= alpha;
          for (int64_t c = 0; c < nc; ++c) {
            sr[c] = std::exp(sr[c] - mx);  // 0 where masked
            l[r] += sr[c];
          }
        }
        weighted_rows(s.data(), vf.data(), rb.n, nc, D, acc.data());
      }
      for (int64_t r = 0; r < rb.n; ++r) {
        const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;  // a row that saw no key outputs 0
        for (int64_t d = 0; d < D; ++d) acc[r * D + d] *= inv;
        store(out[0], b, rb.t[r], rb.h[r], acc.data() + r * D);
        lse[(b * p.H + rb.h[r]) * p.T + rb.t[r]] = l[r] > 0 ? m[r] + std::log(l[r]) : kNegInf;
      }
    }
  });
}

void FlashAttentionBackward::eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Problem P(p, in, 7);
  const Heads q(in[0]), k(in[1]), v(in[2]), o(in[3]), d_o(in[4]);
  const float* lse = cpu::data<float>(in[5]);
  const float* d_lse = cpu::data<float>(in[6]);
  const int64_t D = p.D, rows = p.T * p.G(), nblocks = row_blocks(p);

  // Δ[b, h, t] = rowsum(dO ∘ O) - dLSE.
  Buf delta = buf(p.B * p.H * p.T);
  cpu::parallel_for(p.B * p.T, 16, [&](int64_t i0, int64_t i1) {
    Buf x = buf(D), y = buf(D);
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t h = 0; h < p.H; ++h) {
        const int64_t b = i / p.T, t = i % p.T, at = (b * p.H + h) * p.T + t;
        o.load(b, t, h, x.data());
        d_o.load(b, t, h, y.data());
        double sum = 0;
        for (int64_t d = 0; d < D; ++d) sum += double(x[size_t(d)]) * y[size_t(d)];
        delta[size_t(at)] = float(sum) - d_lse[at];
      }
  });

  // dQ: one task per row block, over the key blocks its rows see.
  cpu::parallel_for(p.B * p.KV * nblocks, 1, [&](int64_t w0, int64_t w1) {
    Buf qf = buf(kRows * D), dof = buf(kRows * D), kf = buf(kKeys * D), vf = buf(kKeys * D);
    Buf s = buf(kRows * kKeys), dp = buf(kRows * kKeys), dq = buf(kRows * D);
    float lse_r[kRows], delta_r[kRows];
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / (p.KV * nblocks), kv = w / nblocks % p.KV, r0 = w % nblocks * kRows;
      const RowBlock rb(P, kv, r0, rows);
      for (int64_t r = 0; r < rb.n; ++r) {
        q.load(b, rb.t[r], rb.h[r], qf.data() + r * D);
        d_o.load(b, rb.t[r], rb.h[r], dof.data() + r * D);
      }
      gather_rows(lse, P, b, rb, lse_r);
      gather_rows(delta.data(), P, b, rb, delta_r);
      std::fill(dq.begin(), dq.end(), 0.0f);
      auto [j0, j1] = P.keys_for(rb.t[0], rb.t[rb.n - 1]);
      for (int64_t jb = j0; jb < j1; jb += kKeys) {
        const int64_t nc = std::min(kKeys, j1 - jb);
        load_keys(k, b, kv, jb, nc, kf.data());
        load_keys(v, b, kv, jb, nc, vf.data());
        block_scores(P, b, rb, qf.data(), kf.data(), jb, nc, s.data());
        dots(dof.data(), vf.data(), rb.n, nc, D, dp.data());
        block_grads(P, rb, lse_r, delta_r, nc, s.data(), dp.data());
        weighted_rows(dp.data(), kf.data(), rb.n, nc, D, dq.data());
      }
      for (int64_t r = 0; r < rb.n; ++r) store(out[0], b, rb.t[r], rb.h[r], dq.data() + r * D);
    }
  });

  // dK, dV: one task per key block, over the row blocks (all G heads of the kv group) that see it.
  const int64_t kblocks = (p.S + kKeys - 1) / kKeys;
  cpu::parallel_for(p.B * p.KV * kblocks, 1, [&](int64_t w0, int64_t w1) {
    Buf qf = buf(kRows * D), dof = buf(kRows * D), kf = buf(kKeys * D), vf = buf(kKeys * D);
    Buf s = buf(kRows * kKeys), dp = buf(kRows * kKeys), dk = buf(kKeys * D), dv = buf(kKeys * D);
    float lse_r[kRows], delta_r[kRows];
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t b = w / (p.KV * kblocks), kv = w / kblocks % p.KV, jb = w % kblocks * kKeys;
      const int64_t nc = std::min(kKeys, p.S - jb);
      load_keys(k, b, kv, jb, nc, kf.data());
      load_keys(v, b, kv, jb, nc, vf.data());
      std::fill(dk.begin(), dk.end(), 0.0f);
      std::fill(dv.begin(), dv.end(), 0.0f);
      auto [t0, t1] = P.queries_for(jb, jb + nc - 1);
      for (int64_t r0 = t0 * p.G(); r0 < t1 * p.G(); r0 += kRows) {
        const RowBlock rb(P, kv, r0, t1 * p.G());
        for (int64_t r = 0; r < rb.n; ++r) {
          q.load(b, rb.t[r], rb.h[r], qf.data() + r * D);
          d_o.load(b, rb.t[r], rb.h[r], dof.data() + r * D);
        }
        gather_rows(lse, P, b, rb, lse_r);
        gather_rows(delta.data(), P, b, rb, delta_r);
        block_scores(P, b, rb, qf.data(), kf.data(), jb, nc, s.data());
        dots(dof.data(), vf.data(), rb.n, nc, D, dp.data());
        block_grads(P, rb, lse_r, delta_r, nc, s.data(), dp.data());
        weighted_cols(s.data(), dof.data(), rb.n, nc, D, dv.data());
        weighted_cols(dp.data(), qf.data(), rb.n, nc, D, dk.data());
      }
      for (int64_t c = 0; c < nc; ++c) {
        store(out[1], b, jb + c, kv, dk.data() + c * D);
        store(out[2], b, jb + c, kv, dv.data() + c * D);
      }
    }
  });
}

}  // namespace lmtune
