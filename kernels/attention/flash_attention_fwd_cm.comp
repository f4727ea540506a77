#version 450
// Fused attention forward on tensor cores (the same contract as flash_attention_fwd.comp, without key-range
// splits): one workgroup of 8 subgroups per (block of 128 rows, kv head, batch), a subgroup per 16 rows. Each
// subgroup keeps its Q rows as f16 fragments (transposed: S is computed as S^T = K Q^T, see
// flash_attention_cm.glsl) and, per block of BC keys staged in shared memory, computes S, the online softmax on
// its lanes (P rounded to f16) and O += P V straight into its output accumulators. A row's running maximum m moves
// only when a block's maximum passes it by more than TAU (P <= e^TAU then, well inside f16), so the accumulators
// are rescaled (O = alpha O, a fragment at a time through shared memory) only in the rare blocks where some row's
// m moved. NVIDIA runs one such workgroup per SM (its shared-memory carveout holds ~48 KiB for all resident
// workgroups), so the workgroup is 8 subgroups wide and its tiles are small (32 keys). Layout conventions in
// flash_attention_cm.glsl.
#define FLASH_WG 256
#include "attention/flash_attention_cm.glsl"
#include "attention/flash_attention_cm_rows.glsl"

const float TAU = 8.0;                        // lazy rescaling threshold (e^8 = 2981)
const uint NCH = BC * (DMAX / 8u) / WG;       // 8-element chunks per invocation of a K or V tile
const uint QPASS = BR / (2u * BC);            // Q staged through the K/V tile in passes of 2 BC rows

shared uvec4 kv_s[2u * BC * DS];  // K rows, then V rows (Q rows at the start)
shared float s_s[NSG * 16u * SST];
shared uvec4 p_s[NSG * 16u * PST];
shared bool key_ok[BC];
shared int key_doc[BC];

void main() {
  const uint tid = gl_LocalInvocationIndex, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  ROW_BLOCK  // b, kv, r0, G, rows
  const uint lr = lane % 16u, half_ = lane / 16u;  // this lane's row in the subgroup and its half of the columns

  // Q rows into fragments, 2 BC rows (the subgroups that own them) per pass through the K/V tile.
  F16M qt[FD];  // Q^T, the B operand of S^T = K Q^T
  uvec4 wk[NCH], wv[NCH];
  for (uint pass = 0; pass < QPASS; ++pass) {
    STAGE_Q_PASS(pass)
    if (sg / (2u * BC / 16u) == pass)
      [[unroll]] for (uint f = 0; f < FD; ++f)
        coopMatLoadNV(qt[f], kv_s, (sg % (2u * BC / 16u)) * 16u * DS + f * 2u, DS, true);
  }

  const uint row = r0 + sg * 16u + lr;
  const bool row_ok = row < rows;
  const uint t = min(row, rows - 1u) / G;
  const int qpos = int(t) + p.q_offset, doc = doc_of(b, t);
  const ivec2 keys = key_range(r0 / G, (min(r0 + BR, rows) - 1u) / G);
  float m = NEG_INF, l = 0.0;
  F32M oacc[FD];
  [[unroll]] for (uint f = 0; f < FD; ++f) oacc[f] = F32M(0.0);
  const uint sbase = sg * 16u * SST, pbase = sg * 16u * PST;

  for (int jb = keys.x; jb < keys.y; jb += int(BC)) {
    STAGE_KEY_BLOCK(jb)

    // S = Q K^T for this subgroup's 16 rows, as S^T = K Q^T stored transposed: K's fragments load row-major
    // (Q K^T needs a column-major load per multiply-add: 6% of the forward pass on the H100).
    TRANSPOSED_PRODUCT(BC, ka, kv_s, nb * 16u * DS + f * 2u, qt)
    subgroup_sync();

    // Online softmax of this lane's half row; element-wise masks only where the block is not wholly visible.
    float s[HC];
    float mx = NEG_INF;
    const bool whole = row_ok && keys_plain && doc == block_doc && bounds_clear(jb, jb + int(BC) - 1, qpos, qpos);
    [[unroll]] for (uint i = 0; i < HC; ++i) s[i] = s_s[sbase + lr * SST + half_ * HC + i];
    if (whole) {
      [[unroll]] for (uint i = 0; i < HC; ++i) s[i] = capped(s[i]);
    } else {
      [[unroll]] for (uint i = 0; i < HC; ++i) {
        uint c = half_ * HC + i;
        s[i] = visible(row_ok, qpos, doc, key_ok[c], jb + int(c), key_doc[c]) ? capped(s[i]) : NEG_INF;
      }
    }
    [[unroll]] for (uint i = 0; i < HC; ++i) mx = max(mx, s[i]);
    mx = pair_max(mx);
    const float m_new = mx > m + TAU || (m == NEG_INF && mx != NEG_INF) ? mx : m;
    // A row whose m was -inf has seen no key: its output is still 0 and needs no rescaling.
    const bool moved = m_new != m && m != NEG_INF;
    const float alpha = moved ? exp(m - m_new) : 1.0;
    float sum = 0.0;
    [[unroll]] for (uint i = 0; i < HC; i += 8u) {
      vec4 a, c;
      [[unroll]] for (uint e = 0; e < 4u; ++e) {
        a[e] = s[i + e] == NEG_INF ? 0.0 : exp(s[i + e] - m_new);
        c[e] = s[i + 4u + e] == NEG_INF ? 0.0 : exp(s[i + 4u + e] - m_new);
      }
      sum += a.x + a.y + a.z + a.w + c.x + c.y + c.z + c.w;
      p_s[pbase + lr * PST + (half_ * HC + i) / 8u] = f16x8_of(a, c);
    }
    l = l * alpha + pair_sum(sum);
    m = m_new;
    if (subgroupAny(moved)) {  // O = alpha O, a fragment at a time through this subgroup's score area
      [[unroll]] for (uint f = 0; f < FD; ++f) {
        subgroup_sync();
        coopMatStoreNV(oacc[f], s_s, sbase, FST, false);
        subgroup_sync();
        [[unroll]] for (uint i = 0; i < 8u; ++i) s_s[sbase + lr * FST + half_ * 8u + i] *= alpha;
        subgroup_sync();
        coopMatLoadNV(oacc[f], s_s, sbase, FST, false);
      }
    }
    subgroup_sync();

    // O += P V.
    [[unroll]] for (uint kb = 0; kb < BC / 16u; ++kb) {
      F16M pa;
      coopMatLoadNV(pa, p_s, pbase + kb * 2u, PST, false);
      [[unroll]] for (uint f = 0; f < FD; ++f) {
        F16M vb;
        coopMatLoadNV(vb, kv_s, (BC + kb * 16u) * DS + f * 2u, DS, false);
        oacc[f] = coopMatMulAddNV(pa, vb, oacc[f]);
      }
    }
  }

  // O / l, a fragment at a time: lane (row lr, dims f 16 + half 8 ..) writes 8 values.
  const float inv = l > 0.0 ? 1.0 / l : 0.0;  // a row that saw no key outputs 0
  const uint at = bth(b, t, kv * G + row % G, p.H, p.T);
  [[unroll]] for (uint f = 0; f < FD; ++f) {
    subgroup_sync();
    coopMatStoreNV(oacc[f], s_s, sbase, FST, false);
    subgroup_sync();
    float o[8];
    [[unroll]] for (uint i = 0; i < 8u; ++i) o[i] = s_s[sbase + lr * FST + half_ * 8u + i] * inv;
    if (row_ok) Y_store8(dt(4), p.y_off + at + f * 16u + half_ * 8u, f * 16u + half_ * 8u, o);
  }
  if (row_ok && half_ == 0u)
    ST_F32(LSE, p.lse_off + bht(b, kv * G + row % G, t), l > 0.0 ? m + log(l) : NEG_INF);
}
