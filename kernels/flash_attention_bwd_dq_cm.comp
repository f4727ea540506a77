#version 450
// Fused attention backward, dQ, on tensor cores (the contract of flash_attention_bwd_dq.comp): one workgroup per
// (block of 64 rows, kv head, batch), a subgroup per 16 rows holding its Q and dO rows as f16 fragments
// (transposed, see flash_attention_cm.glsl). Per block of BC keys: S = Q K^T and dP = dO V^T on the tensor cores, dS = scale P (dP - delta) on the lanes (times
// 1 - tanh^2 where soft-capped; rounded to f16), dQ += dS K into f32 accumulators. Layout conventions in
// flash_attention_cm.glsl.
#include "flash_attention_cm.glsl"

const uint BC = 32u;                      // keys per block
const uint BR = NSG * 16u;                // rows per workgroup
const uint SST = BC + 4u;                 // f32 stride of a subgroup's S and dP
const uint SSZ = max(2u * 16u * SST, 16u * (DMAX + 4u));  // a subgroup's f32 area: S, dP; at the end dQ
const uint PST = (BC + 8u) / 8u;          // uvec4 stride of dS
const uint HC = BC / 2u;
const uint NCH = BC * (DMAX / 8u) / WG;   // 8-element chunks per invocation of a K or V tile (2 NCH: Q, dO)

shared uvec4 kv_s[2u * BC * DS];  // K rows, then V rows (Q and dO, 64 rows each, at the start)
shared float s_s[NSG * SSZ];
shared uvec4 ds_s[NSG * 16u * PST];
shared bool key_ok[BC];
shared int key_doc[BC];

void main() {
  const uint tid = gl_LocalInvocationIndex, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  // The last row blocks see the most keys under a causal mask: they start first.
  const uint b = gl_WorkGroupID.z, kv = gl_WorkGroupID.y, r0 = (gl_NumWorkGroups.x - 1u - gl_WorkGroupID.x) * BR;
  const uint G = p.H / p.KV, rows = p.T * G;
  const uint lr = lane % 16u, half_ = lane / 16u;

  // Q, then dO rows into fragments, through the K/V tile (2 BC == BR rows).
  F16M qt[FD], ot[FD];  // Q^T and dO^T, the B operands of S^T = K Q^T and dP^T = V dO^T
  uvec4 wk[2u * NCH], wv[2u * NCH];  // Q and dO chunks here, K and V chunks in the loop
#define ROW_T (min(r0 + r, rows - 1u) / G)
#define ROW_H (kv * G + min(r0 + r, rows - 1u) % G)
  LOAD_CHUNKS(2u * NCH, wk, Q, 0, r0 + r < rows, q_at(b, ROW_T, ROW_H, d0))
  LOAD_CHUNKS(2u * NCH, wv, X, 3, r0 + r < rows, x_at(b, ROW_T, ROW_H, d0))
  for (uint pass = 0; pass < 2u; ++pass) {
    if (pass == 0u) {
      STORE_CHUNKS(2u * NCH, wk, 0, kv_s, 0u, r0 + r < rows)
    } else {
      barrier();
      STORE_CHUNKS(2u * NCH, wv, 3, kv_s, 0u, r0 + r < rows)
    }
    barrier();
    [[unroll]] for (uint f = 0; f < FD; ++f) {
      if (pass == 0u) coopMatLoadNV(qt[f], kv_s, sg * 16u * DS + f * 2u, DS, true);
      else coopMatLoadNV(ot[f], kv_s, sg * 16u * DS + f * 2u, DS, true);
    }
  }

  const uint row = r0 + sg * 16u + lr;
  const bool row_ok = row < rows;
  const uint t = min(row, rows - 1u) / G, h = kv * G + min(row, rows - 1u) % G;
  const int qpos = int(t) + p.q_offset, doc = doc_of(b, t);
  const float lse = LD_F32(LSE, p.lse_off + bht(b, h, t)), delta = LD_F32(DELTA, p.delta_off + bht(b, h, t));
  const ivec2 keys = key_range(r0 / G, (min(r0 + BR, rows) - 1u) / G);
  const uint sbase = sg * SSZ, dbase = sbase + 16u * SST, pbase = sg * 16u * PST;
  F32M dq[FD];
  [[unroll]] for (uint f = 0; f < FD; ++f) dq[f] = F32M(0.0);

  for (int jb = keys.x; jb < keys.y; jb += int(BC)) {
    LOAD_CHUNKS(NCH, wk, K, 1, uint(jb) + r < p.S, k_at(b, min(uint(jb) + r, p.S - 1u), kv, d0))
    LOAD_CHUNKS(NCH, wv, V, 2, uint(jb) + r < p.S, v_at(b, min(uint(jb) + r, p.S - 1u), kv, d0))
    barrier();
    STORE_CHUNKS(NCH, wk, 1, kv_s, 0u, uint(jb) + r < p.S)
    STORE_CHUNKS(NCH, wv, 2, kv_s, BC * DS, uint(jb) + r < p.S)
    if (sg < BC / 32u) {
      uint c = sg * 32u + lane, j = uint(jb) + c;
      bool ok = int(j) < keys.y && key_usable(b, j);
      int d = j < p.S ? doc_of(b, j) : 0;
      key_ok[c] = ok;
      key_doc[c] = d;
      vote(sg, ok, d);
    }
    barrier();
    int block_doc;
    const bool keys_plain = voted(BC / 32u, block_doc);

    // S = Q K^T and dP = dO V^T, as S^T = K Q^T and dP^T = V dO^T stored transposed (row-major K, V loads).
    [[unroll]] for (uint nb = 0; nb < BC / 16u; ++nb) {
      F32M s = F32M(0.0), dp = F32M(0.0);
      [[unroll]] for (uint f = 0; f < FD; ++f) {
        F16M ka, va;
        coopMatLoadNV(ka, kv_s, nb * 16u * DS + f * 2u, DS, false);
        coopMatLoadNV(va, kv_s, (BC + nb * 16u) * DS + f * 2u, DS, false);
        s = coopMatMulAddNV(ka, qt[f], s);
        dp = coopMatMulAddNV(va, ot[f], dp);
      }
      coopMatStoreNV(s, s_s, sbase + nb * 16u, SST, true);
      coopMatStoreNV(dp, s_s, dbase + nb * 16u, SST, true);
    }
    subgroup_sync();

    const bool whole = row_ok && keys_plain && doc == block_doc && bounds_clear(jb, jb + int(BC) - 1, qpos, qpos);
    [[unroll]] for (uint i = 0; i < HC; i += 8u) {
      float ds[8];
      [[unroll]] for (uint e = 0; e < 8u; ++e) {
        uint c = half_ * HC + i + e;
        ds[e] = 0.0;
        if (whole || visible(row_ok, qpos, doc, key_ok[c], jb + int(c), key_doc[c])) {
          float x = capped(s_s[sbase + lr * SST + c]);
          float pr = exp(x - lse);
          float g = pr * (s_s[dbase + lr * SST + c] - delta);
          if (p.softcap > 0.0) g *= 1.0 - (x / p.softcap) * (x / p.softcap);
          ds[e] = g * p.scale;
        }
      }
      ds_s[pbase + lr * PST + (half_ * HC + i) / 8u] = pack8(ds);
    }
    subgroup_sync();

    // dQ += dS K.
    [[unroll]] for (uint kb = 0; kb < BC / 16u; ++kb) {
      F16M da;
      coopMatLoadNV(da, ds_s, pbase + kb * 2u, PST, false);
      [[unroll]] for (uint f = 0; f < FD; ++f) {
        F16M kr;
        coopMatLoadNV(kr, kv_s, kb * 16u * DS + f * 2u, DS, false);
        dq[f] = coopMatMulAddNV(da, kr, dq[f]);
      }
    }
  }

  subgroup_sync();
  [[unroll]] for (uint f = 0; f < FD; ++f) coopMatStoreNV(dq[f], s_s, sbase + f * 16u, DMAX + 4u, false);
  subgroup_sync();
  if (row_ok) {
    float g[HALF];
    [[unroll]] for (uint i = 0; i < HALF; ++i) g[i] = s_s[sbase + lr * (DMAX + 4u) + half_ * HALF + i];
    Y_store_half(dt(4), p.y_off + bth(b, t, h, p.H, p.T) + half_ * HALF, half_ * HALF, g);
  }
}
