#version 450
// Attention forward for decoding: few query rows (T * G <= 16: one new token per sequence, the G query heads of a
// kv head) against a long key range. The row-block kernels would fill a block of 16-32 rows with 1-7 real ones
// and give each workgroup a whole row block's keys; here a workgroup takes all rows of one (kv head, batch) and
// one contiguous range of keys (grid: key splits, kv heads, batch; flash_attention_combine merges the splits'
// f32 partials, as for the row-block kernel). Keys go in tiles of 128, one per invocation: its scores for every
// row (K read once, 16 bytes at a time), the online softmax's row maxima and sums from 8 invocations per row,
// then O += P V with invocations over head dims (and, below DMAX 128, over alternate keys). Needs D, the offsets
// and strides of q, k, v in multiples of 8 (the host checks).
#define FLASH_WG 128
#include "attention/flash_attention.glsl"
TENSOR4(1, K)
TENSOR4(2, V)

const uint MAXROWS = 16u, KT = 128u, PARTS = WG / MAXROWS, PV_UNROLL = 8u;
const uint DT = DMAX < 128u ? DMAX : 128u;  // invocations per key subset in the P V product
const uint KS = WG / DT, DPT = DMAX / DT;    // key subsets, head dims per invocation

shared float q_s[MAXROWS][DMAX];
shared float p_s[MAXROWS][KT];
shared float red_s[MAXROWS][PARTS];
shared float m_s[MAXROWS], l_s[MAXROWS], alpha_s[MAXROWS];
shared float o_s[KS > 1u ? KS - 1u : 1u][MAXROWS][KS > 1u ? DMAX : 1u];  // only below DMAX 128

// The row maxima (then m_s, alpha_s) or, with `sum`, the row sums (then l_s) of p_s over the tile: PARTS
// invocations per row into red_s, then one per row.
void row_reduce(uint tid, uint rows, bool sum) {
  const uint r = tid / PARTS, part = tid % PARTS;
  if (r < rows) {
    float acc = sum ? 0.0 : NEG_INF;
    for (uint c = part; c < KT; c += PARTS) acc = sum ? acc + p_s[r][c] : max(acc, p_s[r][c]);
    red_s[r][part] = acc;
  }
  barrier();
  if (tid < rows) {
    float acc = sum ? 0.0 : NEG_INF;
    [[unroll]] for (uint i = 0u; i < PARTS; ++i) acc = sum ? acc + red_s[tid][i] : max(acc, red_s[tid][i]);
    if (sum) {
      l_s[tid] = l_s[tid] * alpha_s[tid] + acc;
    } else {
      const float m_new = max(m_s[tid], acc);
      alpha_s[tid] = m_s[tid] == NEG_INF ? 0.0 : exp(m_s[tid] - m_new);
      m_s[tid] = m_new;
    }
  }
  barrier();
}

void main() {
  const uint tid = gl_LocalInvocationIndex;
  const uint batches = gl_NumWorkGroups.z / p.splits;
  const uint b = gl_WorkGroupID.z / p.splits, split = gl_WorkGroupID.z % p.splits, kv = gl_WorkGroupID.y;
  const uint G = p.H / p.KV, rows = p.T * G;

  for (uint i = tid; i < rows * DMAX; i += WG) {  // zeros past D: the score loop reads whole 8-element groups
    const uint r = i / DMAX, d = i % DMAX;
    q_s[r][d] = d < p.D ? Q_ld(dt(0), q_at(b, r / G, kv * G + r % G, d)) : 0.0;
  }
  if (tid < MAXROWS) {
    m_s[tid] = NEG_INF;
    l_s[tid] = 0.0;
  }
  // This split's share of the keys any row can see.
  const ivec2 range = key_range(0u, p.T - 1u);
  const uint span = uint(range.y - range.x), per = (span + p.splits - 1u) / p.splits;
  const uint j_begin = uint(range.x) + min(span, split * per), j_end = uint(range.x) + min(span, (split + 1u) * per);
  float o[MAXROWS][DPT];
  [[unroll]] for (uint r = 0u; r < MAXROWS; ++r) [[unroll]] for (uint e = 0u; e < DPT; ++e) o[r][e] = 0.0;
  const uint od = tid % DT, oks = tid / DT;
  barrier();

  for (uint j0 = j_begin; j0 < j_end; j0 += KT) {
    // Scores of key j0 + tid for every row.
    const uint j = j0 + tid;
    const bool key_ok = j < j_end && key_usable(b, j);
    float s[MAXROWS];
    [[unroll]] for (uint r = 0u; r < MAXROWS; ++r) s[r] = 0.0;
    if (key_ok) {
      const uint kb = k_at(b, j, kv, 0u);
      for (uint d0 = 0u; d0 < p.D; d0 += 32u) {
        vec4 lo[4], hi[4];
        [[unroll]] for (uint u = 0u; u < 4u; ++u) {  // four loads in flight
          lo[u] = hi[u] = vec4(0.0);
          if (d0 + 8u * u < p.D) K_ld8(dt(1), kb + d0 + 8u * u, lo[u], hi[u]);
        }
        [[unroll]] for (uint u = 0u; u < 4u; ++u) {
          const uint d = min(d0 + 8u * u, DMAX - 8u);  // past D: k is 0
          [[unroll]] for (uint r = 0u; r < MAXROWS; ++r) {
            if (r >= rows) break;
            s[r] += dot(lo[u], vec4(q_s[r][d], q_s[r][d + 1u], q_s[r][d + 2u], q_s[r][d + 3u])) +
                    dot(hi[u], vec4(q_s[r][d + 4u], q_s[r][d + 5u], q_s[r][d + 6u], q_s[r][d + 7u]));
          }
        }
      }
    }
    [[unroll]] for (uint r = 0u; r < MAXROWS; ++r) {
      if (r >= rows) break;
      const int qpos = int(r / G) + p.q_offset;
      s[r] = visible(true, qpos, 0, key_ok, int(j), 0) ? capped(s[r]) : NEG_INF;
      p_s[r][tid] = s[r];
    }
    barrier();
    row_reduce(tid, rows, false);
    [[unroll]] for (uint r = 0u; r < MAXROWS; ++r) {
      if (r >= rows) break;
      p_s[r][tid] = s[r] == NEG_INF ? 0.0 : exp(s[r] - m_s[r]);
    }
    barrier();
    // O = alpha O + P V: invocation (key subset oks, head dim od [+ DT ...]) over keys j0 + oks, + KS, ...
    [[unroll]] for (uint r = 0u; r < MAXROWS; ++r) [[unroll]] for (uint e = 0u; e < DPT; ++e) o[r][e] *= alpha_s[r];
    const uint keys = min(KT, j_end - j0);
    for (uint c0 = oks; c0 < keys; c0 += KS * PV_UNROLL) {
      float v[PV_UNROLL][DPT];  // the loads of PV_UNROLL keys first, so that they are in flight together
      [[unroll]] for (uint u = 0u; u < PV_UNROLL; ++u) {
        const uint c = c0 + u * KS;
        // Masked keys have p = 0, but their V may be garbage (NaN): not read.
        const bool ok = c < keys && key_usable(b, j0 + c);
        [[unroll]] for (uint e = 0u; e < DPT; ++e) {
          const uint d = od + e * DT;
          v[u][e] = ok && d < p.D ? V_ld(dt(2), v_at(b, j0 + c, kv, d)) : 0.0;
        }
      }
      [[unroll]] for (uint u = 0u; u < PV_UNROLL; ++u) {
        const uint c = min(c0 + u * KS, KT - 1u);  // past `keys`: v is 0
        [[unroll]] for (uint r = 0u; r < MAXROWS; ++r) {
          if (r >= rows) break;
          [[unroll]] for (uint e = 0u; e < DPT; ++e) o[r][e] += p_s[r][c] * v[u][e];
        }
      }
    }
    row_reduce(tid, rows, true);  // its first barrier also ends this tile's reads of p_s
  }

  // Key subsets 1.. hand their sums to subset 0.
  if (KS > 1u && oks > 0u)
    [[unroll]] for (uint r = 0u; r < MAXROWS; ++r) [[unroll]] for (uint e = 0u; e < DPT; ++e)
      o_s[oks - 1u][r][od + e * DT] = o[r][e];
  barrier();
  const uint y_base = p.y_off + split * batches * p.T * p.H * p.D;
  const uint lse_base = p.lse_off + split * batches * p.H * p.T;
  if (oks == 0u) {
    [[unroll]] for (uint r = 0u; r < MAXROWS; ++r) {
      if (r >= rows) break;
      const float l = l_s[r], inv = l > 0.0 ? 1.0 / l : 0.0;  // a row that saw no key outputs 0
      const uint at = bth(b, r / G, kv * G + r % G, p.H, p.T);
      [[unroll]] for (uint e = 0u; e < DPT; ++e) {
        const uint d = od + e * DT;
        float sum = o[r][e];
        for (uint k = 1u; k < KS; ++k) sum += o_s[k - 1u][r][d];
        if (d < p.D) Y_st(dt(4), y_base + at + d, sum * inv);
      }
    }
  }
  if (tid < rows) {
    const float l = l_s[tid];
    ST_F32(LSE, lse_base + bht(b, kv * G + tid % G, tid / G), l > 0.0 ? m_s[tid] + log(l) : NEG_INF);
  }
}
