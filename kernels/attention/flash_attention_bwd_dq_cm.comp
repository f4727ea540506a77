#version 450
// Fused attention backward, dQ, on tensor cores (the contract of flash_attention_bwd_dq.comp): one workgroup of 8
// subgroups per (block of 128 rows, kv head, batch), a subgroup per 16 rows holding its Q and dO rows as f16
// fragments (transposed, see flash_attention_cm.glsl). Per block of BC keys: S = Q K^T, then dP = dO V^T on the
// tensor cores (one after the other through the subgroup's f32 area), dS = scale P (dP - delta) on the lanes
// (times 1 - tanh^2 where soft-capped; rounded to f16), dQ += dS K into f32 accumulators. 8 subgroups and
// 32-key tiles for the reason given in flash_attention_fwd_cm.comp. Layout conventions in flash_attention_cm.glsl.
#define FLASH_WG 256
#include "attention/flash_attention_cm.glsl"
#include "attention/flash_attention_cm_rows.glsl"

const uint NCH = BC * (DMAX / 8u) / WG;   // 8-element chunks per invocation of a K or V tile
const uint QPASS = BR / (2u * BC);        // Q (then dO) staged through the K/V tile in passes of 2 BC rows

shared uvec4 kv_s[2u * BC * DS];  // K rows, then V rows (Q and dO rows at the start)
shared float s_s[NSG * 16u * SST];
shared uvec4 ds_s[NSG * 16u * PST];
shared bool key_ok[BC];
shared int key_doc[BC];

void main() {
  const uint tid = gl_LocalInvocationIndex, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  ROW_BLOCK  // b, kv, r0, G, rows
  const uint lr = lane % 16u, half_ = lane / 16u;

  // Q, then dO rows into fragments, 2 BC rows (the subgroups that own them) per pass through the K/V tile.
  F16M qt[FD], ot[FD];  // Q^T and dO^T, the B operands of S^T = K Q^T and dP^T = V dO^T
  uvec4 wk[NCH], wv[NCH];
  for (uint pass = 0; pass < 2u * QPASS; ++pass) {
    STAGE_Q_DO_PASS(pass)
    if (sg / (2u * BC / 16u) == pass % QPASS) {
      const uint at = (sg % (2u * BC / 16u)) * 16u * DS;
      [[unroll]] for (uint f = 0; f < FD; ++f) {
        if (pass < QPASS) coopMatLoadNV(qt[f], kv_s, at + f * 2u, DS, true);
        else coopMatLoadNV(ot[f], kv_s, at + f * 2u, DS, true);
      }
    }
  }

  const uint row = r0 + sg * 16u + lr;
  const bool row_ok = row < rows;
  const uint t = min(row, rows - 1u) / G, h = kv * G + min(row, rows - 1u) % G;
  const int qpos = int(t) + p.q_offset, doc = doc_of(b, t);
  const float lse = LD_F32(LSE, p.lse_off + bht(b, h, t)), delta = LD_F32(DELTA, p.delta_off + bht(b, h, t));
  const ivec2 keys = key_range(r0 / G, (min(r0 + BR, rows) - 1u) / G);
  const uint sbase = sg * 16u * SST, pbase = sg * 16u * PST;
  F32M dq[FD];
  [[unroll]] for (uint f = 0; f < FD; ++f) dq[f] = F32M(0.0);

  for (int jb = keys.x; jb < keys.y; jb += int(BC)) {
    STAGE_KEY_BLOCK(jb)
    const bool whole = row_ok && keys_plain && doc == block_doc && bounds_clear(jb, jb + int(BC) - 1, qpos, qpos);

    // S = Q K^T as S^T = K Q^T stored transposed (row-major K loads); this lane's half row into registers.
    TRANSPOSED_PRODUCT(BC, ka, kv_s, nb * 16u * DS + f * 2u, qt)
    subgroup_sync();
    float x[HC];
    [[unroll]] for (uint i = 0; i < HC; ++i) x[i] = capped(s_s[sbase + lr * SST + half_ * HC + i]);
    subgroup_sync();

    // dP = dO V^T as dP^T = V dO^T, into the same area.
    TRANSPOSED_PRODUCT(BC, va, kv_s, (BC + nb * 16u) * DS + f * 2u, ot)
    subgroup_sync();

    [[unroll]] for (uint i = 0; i < HC; i += 8u) {
      float ds[8];
      [[unroll]] for (uint e = 0; e < 8u; ++e) {
        uint c = half_ * HC + i + e;
        ds[e] = 0.0;
        if (whole || visible(row_ok, qpos, doc, key_ok[c], jb + int(c), key_doc[c])) {
          float pr = exp(x[i + e] - lse);
          float g = pr * (s_s[sbase + lr * SST + c] - delta);
          if (p.softcap > 0.0) g *= 1.0 - (x[i + e] / p.softcap) * (x[i + e] / p.softcap);
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

  // dQ a fragment at a time: lane (row lr, dims f 16 + half 8 ..) writes 8 values.
  const uint at = bth(b, t, h, p.H, p.T);
  [[unroll]] for (uint f = 0; f < FD; ++f) {
    subgroup_sync();
    coopMatStoreNV(dq[f], s_s, sbase, FST, false);
    subgroup_sync();
    float g[8];
    [[unroll]] for (uint i = 0; i < 8u; ++i) g[i] = s_s[sbase + lr * FST + half_ * 8u + i];
    if (row_ok) Y_store8(dt(4), p.y_off + at + f * 16u + half_ * 8u, f * 16u + half_ * 8u, g);
  }
}
