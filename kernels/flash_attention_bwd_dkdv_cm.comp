#version 450
// Fused attention backward, dK and dV, on tensor cores (the contract of flash_attention_bwd_dkdv.comp): one
// workgroup per (block of 64 keys, kv head, batch), a subgroup per 16 keys holding its K and V rows as f16
// fragments (transposed, see flash_attention_cm.glsl). Per block of BR rows (all G query heads of the kv head) staged in shared memory, it works on the
// transposed problem: S^T = K Q^T and dP^T = V dO^T on the tensor cores, P^T = exp(S^T - LSE) and
// dS^T = scale P^T (dP^T - delta) on the lanes (rounded to f16), then dV += P^T dO and dK += dS^T Q into f32
// accumulators. One writer per element: no atomics. Where few workgroups would run (GQA: T * G rows per kv head
// but only S / 64 key blocks), each one's row range is cut into p.splits parts, one workgroup each (grid z =
// batch * splits); each writes f32 partial dK, dV and flash_attention_bwd_sum.comp adds them up. Layout
// conventions in flash_attention_cm.glsl.
#include "flash_attention_cm.glsl"

const uint BR = 32u;                      // rows per block
const uint BC = NSG * 16u;                // keys per workgroup
const uint SST = BR + 4u;                 // f32 stride of a subgroup's S^T and dP^T
const uint SSZ = max(2u * 16u * SST, 16u * (DMAX + 4u));  // a subgroup's f32 area: S^T, dP^T; at the end dK, dV
const uint PST = (BR + 8u) / 8u;          // uvec4 stride of P^T and dS^T
const uint HC = BR / 2u;
const uint NCH = BR * (DMAX / 8u) / WG;   // 8-element chunks per invocation of a Q or dO tile (2 NCH: K, V)

shared uvec4 qo_s[2u * BR * DS];  // Q rows, then dO rows (K and V, 64 rows each, at the start)
shared float s_s[NSG * SSZ];
shared uvec4 pd_s[NSG * 2u * 16u * PST];  // per subgroup: P^T, then dS^T
shared bool row_ok[BR];
shared int row_qpos[BR], row_doc[BR];
shared float row_lse[BR], row_delta[BR];

// Writes a subgroup's accumulators ACC as f32 rows through its shared area (lane: key lr, dims of its half) to
// tensor T (dtype field F, element offset OFF).
#define STORE_ROWS(ACC, T, F, OFF)                                                                   \
  subgroup_sync();                                                                                  \
  [[unroll]] for (uint f = 0; f < FD; ++f) coopMatStoreNV(ACC[f], s_s, sbase + f * 16u, DMAX + 4u, false); \
  subgroup_sync();                                                                                  \
  if (j < p.S) {                                                                                    \
    float g[HALF];                                                                                  \
    [[unroll]] for (uint i = 0; i < HALF; ++i) g[i] = s_s[sbase + lr * (DMAX + 4u) + half_ * HALF + i]; \
    T##_store_half(dt(F), OFF + bth(b, j, kv, p.KV, p.S) + half_ * HALF, half_ * HALF, g);          \
  }

void main() {
  const uint tid = gl_LocalInvocationIndex, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const uint b = gl_WorkGroupID.z / p.splits, split = gl_WorkGroupID.z % p.splits;
  const uint kv = gl_WorkGroupID.y, j0 = gl_WorkGroupID.x * BC;
  const uint G = p.H / p.KV;
  const uint lr = lane % 16u, half_ = lane / 16u;

  // K, then V rows into fragments, through the Q/dO tile (2 BR == BC rows).
  F16M kt[FD], vt[FD];  // K^T and V^T, the B operands of S = Q K^T and dP = dO V^T
  uvec4 wq[2u * NCH], wo[2u * NCH];  // K and V chunks here, Q and dO chunks in the loop
  LOAD_CHUNKS(2u * NCH, wq, K, 1, j0 + r < p.S, k_at(b, min(j0 + r, p.S - 1u), kv, d0))
  LOAD_CHUNKS(2u * NCH, wo, V, 2, j0 + r < p.S, v_at(b, min(j0 + r, p.S - 1u), kv, d0))
  for (uint pass = 0; pass < 2u; ++pass) {
    if (pass == 0u) {
      STORE_CHUNKS(2u * NCH, wq, 1, qo_s, 0u, j0 + r < p.S)
    } else {
      barrier();
      STORE_CHUNKS(2u * NCH, wo, 2, qo_s, 0u, j0 + r < p.S)
    }
    barrier();
    [[unroll]] for (uint f = 0; f < FD; ++f) {
      if (pass == 0u) coopMatLoadNV(kt[f], qo_s, sg * 16u * DS + f * 2u, DS, true);
      else coopMatLoadNV(vt[f], qo_s, sg * 16u * DS + f * 2u, DS, true);
    }
  }

  const uint j = j0 + sg * 16u + lr;
  const bool key_ok = key_usable(b, j);
  const int key_doc = j < p.S ? doc_of(b, j) : 0;
  const ivec2 queries = query_range(j0, min(j0 + BC, p.S) - 1u);
  const uint row_end = uint(queries.y) * G;
  // This workgroup's part of the rows, in whole row blocks, and where its outputs go.
  const uint chunk = (row_end - uint(queries.x) * G + p.splits * BR - 1u) / (p.splits * BR) * BR;
  const uint row_begin = min(uint(queries.x) * G + split * chunk, row_end);
  const uint split_end = min(row_end, row_begin + chunk);
  const uint out_shift = split * (gl_NumWorkGroups.z / p.splits) * p.S * p.KV * p.D;
  const uint sbase = sg * SSZ, dbase = sbase + 16u * SST, pbase = sg * 32u * PST, dsbase = pbase + 16u * PST;
  F32M dk[FD], dv[FD];
  [[unroll]] for (uint f = 0; f < FD; ++f) dk[f] = dv[f] = F32M(0.0);

  for (uint r0 = row_begin; r0 < split_end; r0 += BR) {
#define ROW_T (min(r0 + r, row_end - 1u) / G)
#define ROW_H (kv * G + min(r0 + r, row_end - 1u) % G)
    LOAD_CHUNKS(NCH, wq, Q, 0, r0 + r < row_end, q_at(b, ROW_T, ROW_H, d0))
    LOAD_CHUNKS(NCH, wo, X, 3, r0 + r < row_end, x_at(b, ROW_T, ROW_H, d0))
    const uint own = min(r0 + tid % BR, row_end - 1u), own_t = own / G, own_h = kv * G + own % G;
    const float lse = LD_F32(LSE, p.lse_off + bht(b, own_h, own_t));
    const float delta = LD_F32(DELTA, p.delta_off + bht(b, own_h, own_t));
    const int own_doc = doc_of(b, own_t);
    barrier();
    STORE_CHUNKS(NCH, wq, 0, qo_s, 0u, r0 + r < row_end)
    STORE_CHUNKS(NCH, wo, 3, qo_s, BR * DS, r0 + r < row_end)
    if (tid < BR) {
      row_ok[tid] = r0 + tid < row_end;
      row_qpos[tid] = int(own_t) + p.q_offset;
      row_doc[tid] = own_doc;
      row_lse[tid] = lse;
      row_delta[tid] = delta;
    }
    if (sg == 0u) {  // BR == 32: one subgroup votes on the block's rows
      uint row = r0 + lane;
      vote(0u, row < row_end, doc_of(b, min(row, row_end - 1u) / G));
    }
    barrier();
    int rows_doc;
    const bool rows_plain = voted(1u, rows_doc);

    // S^T = K Q^T and dP^T = V dO^T for this subgroup's 16 keys, as S = Q K^T and dP = dO V^T stored transposed
    // (row-major Q, dO loads).
    [[unroll]] for (uint nb = 0; nb < BR / 16u; ++nb) {
      F32M s = F32M(0.0), dp = F32M(0.0);
      [[unroll]] for (uint f = 0; f < FD; ++f) {
        F16M qa, oa;
        coopMatLoadNV(qa, qo_s, nb * 16u * DS + f * 2u, DS, false);
        coopMatLoadNV(oa, qo_s, (BR + nb * 16u) * DS + f * 2u, DS, false);
        s = coopMatMulAddNV(qa, kt[f], s);
        dp = coopMatMulAddNV(oa, vt[f], dp);
      }
      coopMatStoreNV(s, s_s, sbase + nb * 16u, SST, true);
      coopMatStoreNV(dp, s_s, dbase + nb * 16u, SST, true);
    }
    subgroup_sync();

    const bool whole = rows_plain && key_ok && key_doc == rows_doc &&
                       bounds_clear(int(j), int(j), int(r0 / G) + p.q_offset, int((r0 + BR - 1u) / G) + p.q_offset);
    [[unroll]] for (uint i = 0; i < HC; i += 8u) {
      float pr[8], ds[8];
      [[unroll]] for (uint e = 0; e < 8u; ++e) {
        uint c = half_ * HC + i + e;
        pr[e] = ds[e] = 0.0;
        if (whole || visible(row_ok[c], row_qpos[c], row_doc[c], key_ok, int(j), key_doc)) {
          float x = capped(s_s[sbase + lr * SST + c]);
          pr[e] = exp(x - row_lse[c]);
          float g = pr[e] * (s_s[dbase + lr * SST + c] - row_delta[c]);
          if (p.softcap > 0.0) g *= 1.0 - (x / p.softcap) * (x / p.softcap);
          ds[e] = g * p.scale;
        }
      }
      pd_s[pbase + lr * PST + (half_ * HC + i) / 8u] = pack8(pr);
      pd_s[dsbase + lr * PST + (half_ * HC + i) / 8u] = pack8(ds);
    }
    subgroup_sync();

    // dV += P^T dO, dK += dS^T Q.
    [[unroll]] for (uint kb = 0; kb < BR / 16u; ++kb) {
      F16M pa, da;
      coopMatLoadNV(pa, pd_s, pbase + kb * 2u, PST, false);
      coopMatLoadNV(da, pd_s, dsbase + kb * 2u, PST, false);
      [[unroll]] for (uint f = 0; f < FD; ++f) {
        F16M qr, orow;
        coopMatLoadNV(orow, qo_s, (BR + kb * 16u) * DS + f * 2u, DS, false);
        coopMatLoadNV(qr, qo_s, kb * 16u * DS + f * 2u, DS, false);
        dv[f] = coopMatMulAddNV(pa, orow, dv[f]);
        dk[f] = coopMatMulAddNV(da, qr, dk[f]);
      }
    }
  }

  STORE_ROWS(dk, Y, 4, p.y_off + out_shift)
  STORE_ROWS(dv, Z, 5, p.z_off + out_shift)
}
