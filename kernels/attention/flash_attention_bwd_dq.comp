#version 450
// Fused attention backward, dQ (FlashAttention-2): one workgroup per (block of BR rows, kv head, batch) walks the
// key blocks its rows see, recomputes P = exp(S - LSE) from the saved LSE, dP = dO V^T and
// dS = scale P (dP - delta) (times 1 - tanh^2 where soft-capped), and accumulates dQ = dS K in registers.
// V and K take turns in one shared tile: V for dP, then K for S and for dS K. dK/dV: flash_attention_bwd_dkdv.comp.
#extension GL_EXT_control_flow_attributes : enable
#include "attention/flash_attention.glsl"

// Block and tile sizes per head-dim class, tuned for this kernel (the same numbers elsewhere are not shared code).
// check_kernel_duplicates: off
#if DMAX == 64
#define BR 32
#define BC 32
#define TR 2
#define TC 4
#define AR 4
#define AD 4
#elif DMAX == 128
#define BR 16
#define BC 16
#define TR 1
#define TC 2
#define AR 2
#define AD 8
#else
#define BR 8
#define BC 8
#define TR 1
#define TC 1
#define AR 1
#define AD 16
#endif
// check_kernel_duplicates: on
const uint SX = BC / TC, SY = BR / TR;
const uint AX = DMAX / AD, AY = BR / AR;
const uint PS = BC + 1u;

shared float q_s[BR * QS];
shared float do_s[BR * QS];
shared float kv_s[BC * QS];
shared float ds_s[BR * PS];
SHARED_ROW_DATA(BR)
shared bool key_ok[BC];
shared int key_doc[BC];

void main() {
  const uint tid = gl_LocalInvocationIndex;
  ROW_BLOCK  // b, kv, r0, G, rows
  const uint sx = tid % SX, sy = tid / SX, ax = tid % AX, ay = tid / AX;
  const bool s_active = sy < SY;

  for (uint i = tid; i < BR * DMAX; i += WG) {
    uint r = i / DMAX, d = i % DMAX, row = r0 + r;
    bool in_range = row < rows && d < p.D;
    uint t = row / G, h = kv * G + row % G;
    q_s[r * QS + d] = in_range ? Q_ld(dt(0), q_at(b, t, h, d)) : 0.0;
    do_s[r * QS + d] = in_range ? X_ld(dt(3), x_at(b, t, h, d)) : 0.0;
  }
  if (tid < BR) {
    uint row = min(r0 + tid, rows - 1u), t = row / G, h = kv * G + row % G;
    row_ok[tid] = r0 + tid < rows;
    row_qpos[tid] = int(t) + p.q_offset;
    row_doc[tid] = doc_of(b, t);
    row_lse[tid] = LD_F32(LSE, p.lse_off + bht(b, h, t));
    row_delta[tid] = LD_F32(DELTA, p.delta_off + bht(b, h, t));
  }
  const ivec2 keys = key_range(r0 / G, (min(r0 + BR, rows) - 1u) / G);

  float acc[AR][AD];
  [[unroll]] for (uint i = 0; i < AR; ++i) [[unroll]] for (uint j = 0; j < AD; ++j) acc[i][j] = 0.0;

  for (int jb = keys.x; jb < keys.y; jb += int(BC)) {
    barrier();
    for (uint i = tid; i < BC * DMAX; i += WG) {
      uint c = i / DMAX, d = i % DMAX, j = uint(jb) + c;
      kv_s[c * QS + d] = j < p.S && d < p.D ? V_ld(dt(2), v_at(b, j, kv, d)) : 0.0;
    }
    if (tid < BC) {
      uint j = uint(jb) + tid;
      key_ok[tid] = int(j) < keys.y && key_usable(b, j);
      key_doc[tid] = j < p.S ? doc_of(b, j) : 0;
    }
    barrier();

    float dp[TR][TC];
    if (s_active) {
      SCORE_TILE(dp, a, do_s, v, kv_s)
    }
    barrier();
    for (uint i = tid; i < BC * DMAX; i += WG) {
      uint c = i / DMAX, d = i % DMAX, j = uint(jb) + c;
      kv_s[c * QS + d] = j < p.S && d < p.D ? K_ld(dt(1), k_at(b, j, kv, d)) : 0.0;
    }
    barrier();

    if (s_active) {
      float s[TR][TC];
      SCORE_TILE(s, a, q_s, k, kv_s)
      [[unroll]] for (uint i = 0; i < TR; ++i) [[unroll]] for (uint j = 0; j < TC; ++j) {
        uint r = sy + i * SY, c = sx + j * SX;
        float ds = 0.0;
        if (visible(row_ok[r], row_qpos[r], row_doc[r], key_ok[c], jb + int(c), key_doc[c])) {
          float x = capped(s[i][j]);
          ds = exp(x - row_lse[r]) * (dp[i][j] - row_delta[r]);
          if (p.softcap > 0.0) ds *= 1.0 - (x / p.softcap) * (x / p.softcap);
        }
        ds_s[r * PS + c] = ds * p.scale;
      }
    }
    barrier();

    for (uint c = 0; c < BC; ++c) {
      float w[AR], k[AD];
      [[unroll]] for (uint i = 0; i < AR; ++i) w[i] = ds_s[(ay + i * AY) * PS + c];
      [[unroll]] for (uint j = 0; j < AD; ++j) k[j] = kv_s[c * QS + ax + j * AX];
      [[unroll]] for (uint i = 0; i < AR; ++i) [[unroll]] for (uint j = 0; j < AD; ++j) acc[i][j] += w[i] * k[j];
    }
  }

  [[unroll]] for (uint i = 0; i < AR; ++i) {
    uint row = r0 + ay + i * AY;
    if (row >= rows) continue;
    uint at = bth(b, row / G, kv * G + row % G, p.H, p.T);
    [[unroll]] for (uint j = 0; j < AD; ++j) {
      uint d = ax + j * AX;
      if (d < p.D) Y_st(dt(4), p.y_off + at + d, acc[i][j]);
    }
  }
}
