#version 450
// Fused attention backward, dK and dV (FlashAttention-2): one workgroup per (block of BC keys, kv head, batch)
// keeps its K and V tiles in shared memory and walks the blocks of BR rows (all G query heads of the kv head)
// that can see them, recomputing P = exp(S - LSE), dP = dO V^T and dS = scale P (dP - delta) (times 1 - tanh^2
// where soft-capped); dV += P^T dO and dK += dS^T Q accumulate in registers. One writer per element: no atomics.
#extension GL_EXT_control_flow_attributes : enable
#include "attention/flash_attention.glsl"

// Block and tile sizes per head-dim class, tuned for this kernel (the same numbers elsewhere are not shared code).
// check_kernel_duplicates: off
#if DMAX == 64
#define BC 32
#define BR 16
#define TR 1
#define TC 4
#define AR 4
#define AD 4
#elif DMAX == 128
#define BC 16
#define BR 8
#define TR 1
#define TC 1
#define AR 2
#define AD 8
#else
#define BC 8
#define BR 4
#define TR 1
#define TC 1
#define AR 1
#define AD 16
#endif
// check_kernel_duplicates: on
const uint SX = BC / TC, SY = BR / TR;
const uint AX = DMAX / AD, AY = BC / AR;  // accumulator tiles: AR keys x AD dims
const uint PS = BC + 1u;

shared float k_s[BC * QS];
shared float v_s[BC * QS];
shared float q_s[BR * QS];
shared float do_s[BR * QS];
shared float p_s[BR * PS];
shared float ds_s[BR * PS];
SHARED_ROW_DATA(BR)
shared bool key_ok[BC];
shared int key_doc[BC];

void main() {
  const uint tid = gl_LocalInvocationIndex;
  // Key blocks from the first (the most rows under a causal mask) on, block-major.
  const uvec3 id = block_major_id();
  const uint b = id.z, kv = id.y, j0 = id.x * BC;
  const uint G = p.H / p.KV;
  const uint sx = tid % SX, sy = tid / SX, ax = tid % AX, ay = tid / AX;
  const bool s_active = sy < SY;

  for (uint i = tid; i < BC * DMAX; i += WG) {
    uint c = i / DMAX, d = i % DMAX, j = j0 + c;
    bool in_range = j < p.S && d < p.D;
    k_s[c * QS + d] = in_range ? K_ld(dt(1), k_at(b, j, kv, d)) : 0.0;
    v_s[c * QS + d] = in_range ? V_ld(dt(2), v_at(b, j, kv, d)) : 0.0;
  }
  if (tid < BC) {
    uint j = j0 + tid;
    key_ok[tid] = key_usable(b, j);
    key_doc[tid] = j < p.S ? doc_of(b, j) : 0;
  }
  const ivec2 queries = query_range(j0, min(j0 + BC, p.S) - 1u);
  const uint row_end = uint(queries.y) * G;

  float dk[AR][AD], dv[AR][AD];
  [[unroll]] for (uint i = 0; i < AR; ++i) [[unroll]] for (uint j = 0; j < AD; ++j) dk[i][j] = dv[i][j] = 0.0;

  for (uint r0 = uint(queries.x) * G; r0 < row_end; r0 += BR) {
    barrier();
    for (uint i = tid; i < BR * DMAX; i += WG) {
      uint r = i / DMAX, d = i % DMAX, row = r0 + r;
      bool in_range = row < row_end && d < p.D;
      uint t = row / G, h = kv * G + row % G;
      q_s[r * QS + d] = in_range ? Q_ld(dt(0), q_at(b, t, h, d)) : 0.0;
      do_s[r * QS + d] = in_range ? X_ld(dt(3), x_at(b, t, h, d)) : 0.0;
    }
    if (tid < BR) {
      uint row = min(r0 + tid, row_end - 1u), t = row / G, h = kv * G + row % G;
      row_ok[tid] = r0 + tid < row_end;
      row_qpos[tid] = int(t) + p.q_offset;
      row_doc[tid] = doc_of(b, t);
      row_lse[tid] = LD_F32(LSE, p.lse_off + bht(b, h, t));
      row_delta[tid] = LD_F32(DELTA, p.delta_off + bht(b, h, t));
    }
    barrier();

    if (s_active) {
      float s[TR][TC], dp[TR][TC];
      [[unroll]] for (uint i = 0; i < TR; ++i) [[unroll]] for (uint j = 0; j < TC; ++j) s[i][j] = dp[i][j] = 0.0;
      for (uint d = 0; d < p.D; ++d) {
        float a[TR], o[TR], k[TC], v[TC];
        [[unroll]] for (uint i = 0; i < TR; ++i) {
          a[i] = q_s[(sy + i * SY) * QS + d];
          o[i] = do_s[(sy + i * SY) * QS + d];
        }
        [[unroll]] for (uint j = 0; j < TC; ++j) {
          k[j] = k_s[(sx + j * SX) * QS + d];
          v[j] = v_s[(sx + j * SX) * QS + d];
        }
        [[unroll]] for (uint i = 0; i < TR; ++i) [[unroll]] for (uint j = 0; j < TC; ++j) {
          s[i][j] += a[i] * k[j];
          dp[i][j] += o[i] * v[j];
        }
      }
      [[unroll]] for (uint i = 0; i < TR; ++i) [[unroll]] for (uint j = 0; j < TC; ++j) {
        uint r = sy + i * SY, c = sx + j * SX;
        float pr = 0.0, ds = 0.0;
        if (visible(row_ok[r], row_qpos[r], row_doc[r], key_ok[c], int(j0 + c), key_doc[c])) {
          float x = capped(s[i][j]);
          pr = exp(x - row_lse[r]);
          ds = pr * (dp[i][j] - row_delta[r]);
          if (p.softcap > 0.0) ds *= 1.0 - (x / p.softcap) * (x / p.softcap);
        }
        p_s[r * PS + c] = pr;
        ds_s[r * PS + c] = ds * p.scale;
      }
    }
    barrier();

    for (uint r = 0; r < BR; ++r) {
      float pr[AR], ds[AR], o[AD], a[AD];
      [[unroll]] for (uint i = 0; i < AR; ++i) {
        pr[i] = p_s[r * PS + ay + i * AY];
        ds[i] = ds_s[r * PS + ay + i * AY];
      }
      [[unroll]] for (uint j = 0; j < AD; ++j) {
        o[j] = do_s[r * QS + ax + j * AX];
        a[j] = q_s[r * QS + ax + j * AX];
      }
      [[unroll]] for (uint i = 0; i < AR; ++i) [[unroll]] for (uint j = 0; j < AD; ++j) {
        dv[i][j] += pr[i] * o[j];
        dk[i][j] += ds[i] * a[j];
      }
    }
  }

  [[unroll]] for (uint i = 0; i < AR; ++i) {
    uint j = j0 + ay + i * AY;
    if (j >= p.S) continue;
    uint at = bth(b, j, kv, p.KV, p.S);
    [[unroll]] for (uint jj = 0; jj < AD; ++jj) {
      uint d = ax + jj * AX;
      if (d < p.D) {
        Y_st(dt(4), p.y_off + at + d, dk[i][jj]);
        Z_st(dt(5), p.z_off + at + d, dv[i][jj]);
      }
    }
  }
}
