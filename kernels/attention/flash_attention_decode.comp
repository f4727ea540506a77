#version 450
// Attention forward for decoding: few query rows (T * G: one new token per sequence, the G query heads of a kv
// head) against a long key range. The row-block kernels would fill a block of 16-32 rows with 1-7 real ones and
// give each workgroup a whole row block's keys; here a workgroup takes up to MAXROWS rows of one (kv head, batch)
// and one contiguous range of keys (grid: row blocks, kv heads, batch x key splits; flash_attention_combine
// merges the splits' f32 partials, as for the row-block kernel). Keys go in tiles of 128. Every load is 16 bytes and a thread's
// loads of a tile are issued together (the kernel is bound by the latency of its few loads, not by bandwidth):
//   scores   one key per invocation: its whole K row (DMAX / 8 loads), then its score for every row;
//   softmax  the online softmax's row maxima and sums from 8 invocations per row (shared memory);
//   P V      invocation (key slice, 8 head dims): the slice's keys of the tile, 8 dims each, into registers
//            o[row][8]; the slices' sums meet once, after the last tile, in a tree.
// Needs D, the offsets and strides of q, k, v in multiples of 8 (the host checks). A row's sums live in registers
// (8 x MAXROWS per invocation), so more rows take more row blocks, not a wider kernel.
#define FLASH_WG 128
#define SPEC_DTYPES
#include "attention/flash_attention.glsl"
TENSOR4(1, K)
TENSOR4(2, V)

const uint MAXROWS = 8u, KT = 128u, PARTS = WG / MAXROWS;
const uint DG = DMAX / 8u;        // 16-byte groups of a row of K or V
const uint SLICES = WG / DG;      // key slices of the P V product
const uint KCHUNK = 8u;           // K loads in flight per invocation at a time
const uint PV_UNROLL = 4u;        // V loads in flight per invocation at a time

// q during the tiles (slot 0), then the slices' sums of O: a tree over the slices, half of those left at each
// level writing their sums for the other half to add (a serial merge cost a barrier per slice: 16 at DMAX 64).
const uint MERGE_SLOTS = SLICES > 1u ? SLICES / 2u : 1u;
shared float qo_s[MERGE_SLOTS][MAXROWS][DMAX];
shared float p_s[MAXROWS][KT];
shared float red_s[MAXROWS][PARTS];
shared float m_s[MAXROWS], l_s[MAXROWS], alpha_s[MAXROWS];

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
  const uint G = p.H / p.KV, r0 = gl_WorkGroupID.x * MAXROWS, rows = min(MAXROWS, p.T * G - r0);

  for (uint i = tid; i < rows * DMAX; i += WG) {  // zeros past D: the score loop reads whole 8-element groups
    const uint r = i / DMAX, d = i % DMAX, row = r0 + r;
    qo_s[0][r][d] = d < p.D ? Q_ld(dt(0), q_at(b, row / G, kv * G + row % G, d)) : 0.0;
  }
  if (tid < MAXROWS) {
    m_s[tid] = NEG_INF;
    l_s[tid] = 0.0;
  }
  // This split's share of the keys any row can see.
  const ivec2 range = key_range(r0 / G, (r0 + rows - 1u) / G);
  const uint span = uint(range.y - range.x), per = (span + p.splits - 1u) / p.splits;
  const uint j_begin = uint(range.x) + min(span, split * per), j_end = uint(range.x) + min(span, (split + 1u) * per);
  const uint dg = tid % DG, slice = tid / DG, d8 = dg * 8u;
  vec4 o_lo[MAXROWS], o_hi[MAXROWS];  // row r's sums of head dims d8 .. d8 + 3 and d8 + 4 .. d8 + 7
  [[unroll]] for (uint r = 0u; r < MAXROWS; ++r) o_lo[r] = o_hi[r] = vec4(0.0);
  barrier();

  for (uint j0 = j_begin; j0 < j_end; j0 += KT) {
    // Scores of key j0 + tid for every row.
    const uint j = j0 + tid;
    const bool key_ok = j < j_end && key_usable(b, j);
    float s[MAXROWS];
    [[unroll]] for (uint r = 0u; r < MAXROWS; ++r) s[r] = 0.0;
    if (key_ok) {
      const uint kb = k_at(b, j, kv, 0u);
      for (uint c0 = 0u; c0 < DG; c0 += KCHUNK) {
        vec4 lo[KCHUNK], hi[KCHUNK];
        [[unroll]] for (uint u = 0u; u < KCHUNK; ++u) {  // the chunk's loads first, all in flight together
          lo[u] = hi[u] = vec4(0.0);
          if (c0 + u < DG && 8u * (c0 + u) < p.D) K_ld8(dt(1), kb + 8u * (c0 + u), lo[u], hi[u]);
        }
        [[unroll]] for (uint u = 0u; u < KCHUNK; ++u) {
          if (c0 + u >= DG) break;
          const uint d = 8u * (c0 + u);  // past D: k is 0
          [[unroll]] for (uint r = 0u; r < MAXROWS; ++r) {
            if (r >= rows) break;
            s[r] += dot(lo[u], vec4(qo_s[0][r][d], qo_s[0][r][d + 1u], qo_s[0][r][d + 2u], qo_s[0][r][d + 3u])) +
                    dot(hi[u], vec4(qo_s[0][r][d + 4u], qo_s[0][r][d + 5u], qo_s[0][r][d + 6u], qo_s[0][r][d + 7u]));
          }
        }
      }
    }
    [[unroll]] for (uint r = 0u; r < MAXROWS; ++r) {
      if (r >= rows) break;
      const int qpos = int((r0 + r) / G) + p.q_offset;
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
    // O = alpha O + P V over this invocation's keys c = slice, slice + SLICES, ... and head dims d8 .. d8 + 7.
    [[unroll]] for (uint r = 0u; r < MAXROWS; ++r) {
      const float a = r < rows ? alpha_s[r] : 0.0;
      o_lo[r] *= a;
      o_hi[r] *= a;
    }
    const uint keys = min(KT, j_end - j0);
    for (uint c0 = slice; c0 < keys; c0 += SLICES * PV_UNROLL) {
      vec4 lo[PV_UNROLL], hi[PV_UNROLL];  // the loads of PV_UNROLL keys first, in flight together
      [[unroll]] for (uint u = 0u; u < PV_UNROLL; ++u) {
        const uint c = c0 + u * SLICES;
        lo[u] = hi[u] = vec4(0.0);
        // Masked keys have p = 0, but their V may be garbage (NaN): not read.
        if (c < keys && d8 < p.D && key_usable(b, j0 + c)) V_ld8(dt(2), v_at(b, j0 + c, kv, d8), lo[u], hi[u]);
      }
      [[unroll]] for (uint u = 0u; u < PV_UNROLL; ++u) {
        const uint c = min(c0 + u * SLICES, KT - 1u);  // past `keys`: v is 0
        [[unroll]] for (uint r = 0u; r < MAXROWS; ++r) {
          if (r >= rows) break;
          const float pr = p_s[r][c];
          o_lo[r] += pr * lo[u];
          o_hi[r] += pr * hi[u];
        }
      }
    }
    row_reduce(tid, rows, true);  // its first barrier also ends this tile's reads of p_s
  }

  // The slices' sums: at each level the upper half of the slices left writes, the lower half adds (q is no longer
  // read); slice 0 ends with the total and leaves it in slot 0.
  for (uint h = MERGE_SLOTS; h >= 1u && SLICES > 1u; h /= 2u) {
    if (slice >= h && slice < 2u * h) {
      [[unroll]] for (uint r = 0u; r < MAXROWS; ++r) {
        if (r >= rows) break;
        [[unroll]] for (uint e = 0u; e < 4u; ++e) {
          qo_s[slice - h][r][d8 + e] = o_lo[r][e];
          qo_s[slice - h][r][d8 + 4u + e] = o_hi[r][e];
        }
      }
    }
    barrier();
    if (slice < h) {
      [[unroll]] for (uint r = 0u; r < MAXROWS; ++r) {
        if (r >= rows) break;
        [[unroll]] for (uint e = 0u; e < 4u; ++e) {
          o_lo[r][e] += qo_s[slice][r][d8 + e];
          o_hi[r][e] += qo_s[slice][r][d8 + 4u + e];
        }
      }
    }
    barrier();
  }
  if (slice == 0u) {
    [[unroll]] for (uint r = 0u; r < MAXROWS; ++r) {
      if (r >= rows) break;
      [[unroll]] for (uint e = 0u; e < 4u; ++e) {
        qo_s[0][r][d8 + e] = o_lo[r][e];
        qo_s[0][r][d8 + 4u + e] = o_hi[r][e];
      }
    }
  }
  barrier();
  const uint y_base = p.y_off + split * batches * p.T * p.H * p.D;
  const uint lse_base = p.lse_off + split * batches * p.H * p.T;
  for (uint i = tid; i < rows * p.D; i += WG) {
    const uint r = i / p.D, d = i % p.D, row = r0 + r;
    const float l = l_s[r], inv = l > 0.0 ? 1.0 / l : 0.0;  // a row that saw no key outputs 0
    Y_st(dt(4), y_base + bth(b, row / G, kv * G + row % G, p.H, p.T) + d, qo_s[0][r][d] * inv);
  }
  if (tid < rows) {
    const float l = l_s[tid];
    const uint row = r0 + tid;
    ST_F32(LSE, lse_base + bht(b, kv * G + row % G, row / G), l > 0.0 ? m_s[tid] + log(l) : NEG_INF);
  }
}
