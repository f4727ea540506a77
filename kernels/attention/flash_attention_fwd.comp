#version 450
// Fused attention forward: O and LSE from q, k, v with an online softmax, never storing a [T, S] matrix. One
// workgroup per (block of BR rows, kv head, batch); it walks the key blocks its rows can see (causal / window
// bounds skip the rest) in tiles of BC keys: S = Q K^T (a TR x TC register tile per invocation), the row maxima,
// P = exp(S - m), then O = alpha O + P V (an AR x AD register tile per invocation). Built per DMAX (variants.txt).
// When few workgroups would run (decoding: T = 1), the key range is cut into p.splits parts, one workgroup each
// (grid z = batch * splits); each writes its normalized partial O and LSE in f32 and
// flash_attention_combine.comp merges them.
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
#define BR 32
#define BC 16
#define TR 2
#define TC 2
#define AR 4
#define AD 8
#else
#define BR 16
#define BC 8
#define TR 1
#define TC 1
#define AR 2
#define AD 16
#endif
// check_kernel_duplicates: on
const uint SX = BC / TC, SY = BR / TR;    // the score tile grid (invocations past SX * SY idle there)
const uint AX = DMAX / AD, AY = BR / AR;  // the output tile grid (AX * AY == 128)
const uint PS = BC + 1u;

shared float q_s[BR * QS];
shared float kv_s[BC * QS];  // K, then V of the current key block
shared float p_s[BR * PS];   // scores, then probabilities
shared float m_s[BR], l_s[BR], alpha_s[BR];
shared bool row_ok[BR];
shared int row_qpos[BR], row_doc[BR];
shared bool key_ok[BC];
shared int key_doc[BC];

void main() {
  const uint tid = gl_LocalInvocationIndex;
  // Row blocks from the last (the most keys under a causal mask) on, block-major.
  const uvec3 id = block_major_id();
  const uint b = id.z / p.splits, split = id.z % p.splits, kv = id.y, r0 = (gl_NumWorkGroups.x - 1u - id.x) * BR;
  const uint G = p.H / p.KV, rows = p.T * G;
  const uint sx = tid % SX, sy = tid / SX, ax = tid % AX, ay = tid / AX;
  const bool s_active = sy < SY;

  for (uint i = tid; i < BR * DMAX; i += WG) {
    uint r = i / DMAX, d = i % DMAX, row = r0 + r;
    q_s[r * QS + d] = row < rows && d < p.D ? Q_ld(dt(0), q_at(b, row / G, kv * G + row % G, d)) : 0.0;
  }
  if (tid < BR) {
    uint row = r0 + tid, t = min(row, rows - 1u) / G;
    row_ok[tid] = row < rows;
    row_qpos[tid] = int(t) + p.q_offset;
    row_doc[tid] = doc_of(b, t);
    m_s[tid] = NEG_INF;
    l_s[tid] = 0.0;
  }
  ivec2 keys = key_range(r0 / G, (min(r0 + BR, rows) - 1u) / G);
  if (p.splits > 1u) {  // this workgroup's part of the key range, in whole key blocks
    int chunk = int((uint(keys.y - keys.x) + p.splits - 1u) / p.splits + BC - 1u) / int(BC) * int(BC);
    int lo = min(keys.x + int(split) * chunk, keys.y);
    keys = ivec2(lo, min(keys.y, lo + chunk));
  }
  // Where this workgroup's outputs go: O and LSE, or its split's f32 partials.
  const uint batches = gl_NumWorkGroups.z / p.splits;
  const uint y_base = p.y_off + split * batches * p.T * p.H * p.D;
  const uint lse_base = p.lse_off + split * batches * p.H * p.T;

  float o[AR][AD];
  [[unroll]] for (uint i = 0; i < AR; ++i) [[unroll]] for (uint j = 0; j < AD; ++j) o[i][j] = 0.0;

  for (int jb = keys.x; jb < keys.y; jb += int(BC)) {
    barrier();
    for (uint i = tid; i < BC * DMAX; i += WG) {
      uint c = i / DMAX, d = i % DMAX, j = uint(jb) + c;
      kv_s[c * QS + d] = j < p.S && d < p.D ? K_ld(dt(1), k_at(b, j, kv, d)) : 0.0;
    }
    if (tid < BC) {
      uint j = uint(jb) + tid;
      key_ok[tid] = int(j) < keys.y && key_usable(b, j);
      key_doc[tid] = j < p.S ? doc_of(b, j) : 0;
    }
    barrier();

    float s[TR][TC];
    if (s_active) {
      SCORE_TILE(s, a, q_s, k, kv_s)
      [[unroll]] for (uint i = 0; i < TR; ++i) [[unroll]] for (uint j = 0; j < TC; ++j) {
        uint r = sy + i * SY, c = sx + j * SX;
        bool vis = visible(row_ok[r], row_qpos[r], row_doc[r], key_ok[c], jb + int(c), key_doc[c]);
        s[i][j] = vis ? capped(s[i][j]) : NEG_INF;
        p_s[r * PS + c] = s[i][j];
      }
    }
    barrier();

    // The rows' new maxima (and the rescale of what they hold), while everyone loads V over K.
    if (tid < BR) {
      float m_old = m_s[tid], mx = m_old;
      for (uint c = 0; c < BC; ++c) mx = max(mx, p_s[tid * PS + c]);
      alpha_s[tid] = mx == NEG_INF ? 1.0 : (m_old == NEG_INF ? 0.0 : exp(m_old - mx));
      m_s[tid] = mx;
    }
    for (uint i = tid; i < BC * DMAX; i += WG) {
      uint c = i / DMAX, d = i % DMAX, j = uint(jb) + c;
      kv_s[c * QS + d] = j < p.S && d < p.D ? V_ld(dt(2), v_at(b, j, kv, d)) : 0.0;
    }
    barrier();

    if (s_active) {
      [[unroll]] for (uint i = 0; i < TR; ++i) [[unroll]] for (uint j = 0; j < TC; ++j) {
        uint r = sy + i * SY, c = sx + j * SX;
        p_s[r * PS + c] = s[i][j] == NEG_INF ? 0.0 : exp(s[i][j] - m_s[r]);
      }
    }
    barrier();

    if (tid < BR) {
      float sum = 0.0;
      for (uint c = 0; c < BC; ++c) sum += p_s[tid * PS + c];
      l_s[tid] = l_s[tid] * alpha_s[tid] + sum;
    }
    [[unroll]] for (uint i = 0; i < AR; ++i) {
      float a = alpha_s[ay + i * AY];
      [[unroll]] for (uint j = 0; j < AD; ++j) o[i][j] *= a;
    }
    for (uint c = 0; c < BC; ++c) {
      float pr[AR], vv[AD];
      [[unroll]] for (uint i = 0; i < AR; ++i) pr[i] = p_s[(ay + i * AY) * PS + c];
      [[unroll]] for (uint j = 0; j < AD; ++j) vv[j] = kv_s[c * QS + ax + j * AX];
      [[unroll]] for (uint i = 0; i < AR; ++i) [[unroll]] for (uint j = 0; j < AD; ++j) o[i][j] += pr[i] * vv[j];
    }
  }
  barrier();

  [[unroll]] for (uint i = 0; i < AR; ++i) {
    uint r = ay + i * AY, row = r0 + r;
    if (row >= rows) continue;
    float l = l_s[r], inv = l > 0.0 ? 1.0 / l : 0.0;  // a row that saw no key outputs 0
    uint at = bth(b, row / G, kv * G + row % G, p.H, p.T);
    [[unroll]] for (uint j = 0; j < AD; ++j) {
      uint d = ax + j * AX;
      if (d < p.D) Y_st(dt(4), y_base + at + d, o[i][j] * inv);
    }
  }
  if (tid < BR && r0 + tid < rows) {
    uint row = r0 + tid;
    float l = l_s[tid];
    ST_F32(LSE, lse_base + bht(b, kv * G + row % G, row / G), l > 0.0 ? m_s[tid] + log(l) : NEG_INF);
  }
}
