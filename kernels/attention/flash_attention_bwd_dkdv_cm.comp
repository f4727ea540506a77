#version 450
// Fused attention backward, dK and dV, on tensor cores (the contract of flash_attention_bwd_dkdv.comp): one
// workgroup of 8 subgroups per (block of 128 keys, kv head, batch), a subgroup per 16 keys holding its K and V
// rows as f16 fragments (transposed, see flash_attention_cm.glsl). Per block of BR rows (all G query heads of the
// kv head) staged in shared memory, it works on the transposed problem, one product at a time through the
// subgroup's f32 area: S^T = K Q^T, P^T = exp(S^T - LSE) on the lanes (rounded to f16), dV += P^T dO; then
// dP^T = V dO^T, dS^T = scale P^T (dP^T - delta) on the lanes, dK += dS^T Q, into f32 accumulators. One writer
// per element: no atomics. Where few workgroups would run (GQA: T * G rows per kv head but only S / 128 key
// blocks), each one's row range is cut into p.splits parts, one workgroup each (grid z = batch * splits); each
// writes f32 partial dK, dV and flash_attention_bwd_sum.comp adds them up. 8 subgroups for the reason given in
// flash_attention_fwd_cm.comp. Layout conventions in flash_attention_cm.glsl.
#define FLASH_WG 256
#include "attention/flash_attention_cm.glsl"

const uint BR = 32u;                      // rows per block
const uint BC = NSG * 16u;                // keys per workgroup
const uint SST = BR + 4u;                 // f32 stride of a subgroup's S^T, then dP^T
const uint FST = 20u;                     // f32 stride of a subgroup's 16x16 dK / dV fragment (same area)
const uint PST = (BR + 8u) / 8u;          // uvec4 stride of P^T, then dS^T
const uint HC = BR / 2u;                  // row columns per lane
const uint NCH = BR * (DMAX / 8u) / WG;   // 8-element chunks per invocation of a Q or dO tile
const uint KPASS = BC / (2u * BR);        // K (then V) staged through the Q/dO tile in passes of 2 BR rows

shared uvec4 qo_s[2u * BR * DS];  // Q rows, then dO rows (K and V rows at the start)
shared float s_s[NSG * 16u * SST];
shared uvec4 pd_s[NSG * 16u * PST];
SHARED_ROW_DATA(BR)

// Writes a subgroup's accumulators ACC a fragment at a time through its shared area (lane: key lr, 8 dims) to
// tensor T (dtype field F, element offset OFF).
#define STORE_ROWS(ACC, T, F, OFF)                                                                   \
  [[unroll]] for (uint f = 0; f < FD; ++f) {                                                        \
    subgroup_sync();                                                                                \
    coopMatStoreNV(ACC[f], s_s, sbase, FST, false);                                                 \
    subgroup_sync();                                                                                \
    float g[8];                                                                                     \
    [[unroll]] for (uint i = 0; i < 8u; ++i) g[i] = s_s[sbase + lr * FST + half_ * 8u + i];          \
    if (j < p.S) T##_store8(dt(F), (OFF) + bth(b, j, kv, p.KV, p.S) + f * 16u + half_ * 8u, f * 16u + half_ * 8u, g); \
  }

void main() {
  const uint tid = gl_LocalInvocationIndex, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  KEY_BLOCK  // b, split, kv, j0, G
  const uint lr = lane % 16u, half_ = lane / 16u;

  // K, then V rows into fragments, 2 BR rows (the subgroups that own them) per pass through the Q/dO tile.
  F16M kt[FD], vt[FD];  // K^T and V^T, the B operands of S = Q K^T and dP = dO V^T
  uvec4 wq[NCH], wo[NCH];
  for (uint pass = 0; pass < 2u * KPASS; ++pass) {
    const uint k0 = j0 + (pass % KPASS) * 2u * BR;
    if (pass < KPASS) {
      LOAD_CHUNKS(NCH, wq, K, 1, k0 + r < p.S, k_at(b, min(k0 + r, p.S - 1u), kv, d0))
      LOAD_CHUNKS(NCH, wo, K, 1, k0 + BR + r < p.S, k_at(b, min(k0 + BR + r, p.S - 1u), kv, d0))
    } else {
      LOAD_CHUNKS(NCH, wq, V, 2, k0 + r < p.S, v_at(b, min(k0 + r, p.S - 1u), kv, d0))
      LOAD_CHUNKS(NCH, wo, V, 2, k0 + BR + r < p.S, v_at(b, min(k0 + BR + r, p.S - 1u), kv, d0))
    }
    if (pass > 0u) barrier();
    const uint f_dt = pass < KPASS ? 1u : 2u;
    STORE_CHUNKS(NCH, wq, f_dt, qo_s, 0u, k0 + r < p.S)
    STORE_CHUNKS(NCH, wo, f_dt, qo_s, BR * DS, k0 + BR + r < p.S)
    barrier();
    if (sg / (2u * BR / 16u) == pass % KPASS) {
      const uint at = (sg % (2u * BR / 16u)) * 16u * DS;
      [[unroll]] for (uint f = 0; f < FD; ++f) {
        if (pass < KPASS) coopMatLoadNV(kt[f], qo_s, at + f * 2u, DS, true);
        else coopMatLoadNV(vt[f], qo_s, at + f * 2u, DS, true);
      }
    }
  }

  const uint j = j0 + sg * 16u + lr;
  const bool key_ok = key_usable(b, j);
  const int key_doc = j < p.S ? doc_of(b, j) : 0;
  SPLIT_ROWS  // this workgroup's rows [row_begin, split_end) of [queries.x G, row_end); out_shift
  const uint sbase = sg * 16u * SST, pbase = sg * 16u * PST;
  F32M dk[FD], dv[FD];
  [[unroll]] for (uint f = 0; f < FD; ++f) dk[f] = dv[f] = F32M(0.0);

  for (uint r0 = row_begin; r0 < split_end; r0 += BR) {
#define ROW_T (min(r0 + r, row_end - 1u) / G)
#define ROW_H (kv * G + min(r0 + r, row_end - 1u) % G)
    LOAD_CHUNKS(NCH, wq, Q, 0, r0 + r < row_end, q_at(b, ROW_T, ROW_H, d0))
    LOAD_CHUNKS(NCH, wo, X, 3, r0 + r < row_end, x_at(b, ROW_T, ROW_H, d0))
    // Row data: a row per lane of subgroup 0 (BR == 32).
    const uint own = min(r0 + lane, row_end - 1u), own_t = own / G, own_h = kv * G + own % G;
    const float own_lse = LD_F32(LSE, p.lse_off + bht(b, own_h, own_t));
    const float own_delta = LD_F32(DELTA, p.delta_off + bht(b, own_h, own_t));
    const int own_doc = doc_of(b, own_t);
    barrier();
    STORE_CHUNKS(NCH, wq, 0, qo_s, 0u, r0 + r < row_end)
    STORE_CHUNKS(NCH, wo, 3, qo_s, BR * DS, r0 + r < row_end)
    if (sg == 0u) {
      row_ok[lane] = r0 + lane < row_end;
      row_qpos[lane] = int(own_t) + p.q_offset;
      row_doc[lane] = own_doc;
      row_lse[lane] = own_lse;
      row_delta[lane] = own_delta;
      vote(0u, r0 + lane < row_end, own_doc);
    }
    barrier();
    int rows_doc;
    const bool rows_plain = voted(1u, rows_doc);
    const bool whole = rows_plain && key_ok && key_doc == rows_doc &&
                       bounds_clear(int(j), int(j), int(r0 / G) + p.q_offset, int((r0 + BR - 1u) / G) + p.q_offset);

    // S = Q K^T stored transposed (S^T: this subgroup's keys by the block's rows); P^T on the lanes.
    TRANSPOSED_PRODUCT(BR, qa, qo_s, nb * 16u * DS + f * 2u, kt)
    subgroup_sync();
    float x[HC], pr[HC];
    uint vis = 0u;
    [[unroll]] for (uint i = 0; i < HC; ++i) {
      uint c = half_ * HC + i;
      x[i] = capped(s_s[sbase + lr * SST + c]);
      pr[i] = 0.0;
      if (whole || visible(row_ok[c], row_qpos[c], row_doc[c], key_ok, int(j), key_doc)) {
        pr[i] = exp(x[i] - row_lse[c]);
        vis |= 1u << i;
      }
    }
    [[unroll]] for (uint i = 0; i < HC; i += 8u)
      pd_s[pbase + lr * PST + (half_ * HC + i) / 8u] = f16x8_of(vec4(pr[i], pr[i + 1u], pr[i + 2u], pr[i + 3u]),
                                                                 vec4(pr[i + 4u], pr[i + 5u], pr[i + 6u], pr[i + 7u]));
    subgroup_sync();

    // dV += P^T dO.
    [[unroll]] for (uint kb = 0; kb < BR / 16u; ++kb) {
      F16M pa;
      coopMatLoadNV(pa, pd_s, pbase + kb * 2u, PST, false);
      [[unroll]] for (uint f = 0; f < FD; ++f) {
        F16M orow;
        coopMatLoadNV(orow, qo_s, (BR + kb * 16u) * DS + f * 2u, DS, false);
        dv[f] = coopMatMulAddNV(pa, orow, dv[f]);
      }
    }

    // dP = dO V^T stored transposed into the same area; dS^T on the lanes, over P^T.
    TRANSPOSED_PRODUCT(BR, oa, qo_s, (BR + nb * 16u) * DS + f * 2u, vt)
    subgroup_sync();
    [[unroll]] for (uint i = 0; i < HC; i += 8u) {
      float ds[8];
      [[unroll]] for (uint e = 0; e < 8u; ++e) {
        uint c = half_ * HC + i + e;
        ds[e] = 0.0;
        if ((vis & (1u << (i + e))) != 0u) {
          float g = pr[i + e] * (s_s[sbase + lr * SST + c] - row_delta[c]);
          if (p.softcap > 0.0) g *= 1.0 - (x[i + e] / p.softcap) * (x[i + e] / p.softcap);
          ds[e] = g * p.scale;
        }
      }
      pd_s[pbase + lr * PST + (half_ * HC + i) / 8u] = pack8(ds);
    }
    subgroup_sync();

    // dK += dS^T Q.
    [[unroll]] for (uint kb = 0; kb < BR / 16u; ++kb) {
      F16M da;
      coopMatLoadNV(da, pd_s, pbase + kb * 2u, PST, false);
      [[unroll]] for (uint f = 0; f < FD; ++f) {
        F16M qr;
        coopMatLoadNV(qr, qo_s, kb * 16u * DS + f * 2u, DS, false);
        dk[f] = coopMatMulAddNV(da, qr, dk[f]);
      }
    }
  }

  STORE_ROWS(dk, Y, 4, p.y_off + out_shift)
  STORE_ROWS(dv, Z, 5, p.z_off + out_shift)
}
