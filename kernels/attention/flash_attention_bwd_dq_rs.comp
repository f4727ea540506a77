#version 450
// Fused attention backward, dQ, on tensor cores with the scores in registers (the contract of
// flash_attention_bwd_dq_cm.comp, the fragment layout of flash_attention_fwd_rs.comp): one workgroup of 8
// subgroups per (block of 8 / NSPLIT x 16 rows, kv head, batch), NSPLIT subgroups per 16 rows holding their part
// of its Q and dO rows as f16 A fragments (flash_attention_rs.glsl). Per block of BC keys: S = Q K^T and
// dP = dO V^T in accumulators (partial sums added up across the group), dS = scale P (dP - delta) on their
// elements (times 1 - tanh^2 where soft-capped), dQ += dS K with dS as an f16 fragment of the same layout.
#ifndef FLASH_WG
#define FLASH_WG 256
#endif
#ifndef BLOCK_KEYS
#define BLOCK_KEYS 32
#endif
#define XCH_SLOTS (2 * BLOCK_KEYS / 16 / XCH_ROUNDS)
#define OUT_TILE kv_s
#define OUT_TILE_BYTES (2 * BLOCK_KEYS * (DMAX + 8) * 2)
#include "attention/flash_attention_cm.glsl"
#include "attention/flash_attention_rs.glsl"

// K/V tile, output staging, exchange, key flags: past 48 KiB NVIDIA loses the device.
#if 2 * BLOCK_KEYS * (DMAX + 8) * 2 + OUT_BYTES + XCH_BYTES + BLOCK_KEYS * 8 > 49152
#error "flash_attention_bwd_dq_rs: shared memory over 48 KiB"
#endif
#if XCH_ROUNDS == 2 && BLOCK_KEYS != 16
#error "flash_attention_bwd_dq_rs: two exchange rounds take one 16-key fragment per block"
#endif

const uint BC = BLOCK_KEYS;               // keys per block
const uint BR = NGRP * 16u;               // rows per workgroup
const uint NCH = BC * (DMAX / 8u) / WG;   // 8-element chunks per invocation of a K or V tile
const uint QPASS = BR / (2u * BC);        // Q (then dO) staged through the K/V tile in passes of 2 BC rows

shared uvec4 kv_s[2u * BC * DS];  // K rows, then V rows (Q and dO rows at the start)
shared bool key_ok[BC];
shared int key_doc[BC];

void main() {
  const uint tid = gl_LocalInvocationIndex, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const uint grp = sg / NSPLIT, part = sg % NSPLIT;  // this subgroup's 16 rows, and its part of the head dims
  ROW_BLOCK  // b, kv, r0, G, rows

  // Q, then dO rows into A fragments, 2 BC rows per pass through the K/V tile.
  F16M qa[FP], oa[FP];
  uvec4 wk[NCH], wv[NCH];
  for (uint pass = 0; pass < 2u * QPASS; ++pass) {
    STAGE_Q_DO_PASS(pass)
    if (grp / (2u * BC / 16u) == pass % QPASS) {
      const uint at = (grp % (2u * BC / 16u)) * 16u * DS + part * FP * 2u;
      [[unroll]] for (uint f = 0; f < FP; ++f) {
        if (pass < QPASS) coopMatLoadNV(qa[f], kv_s, at + f * 2u, DS, false);
        else coopMatLoadNV(oa[f], kv_s, at + f * 2u, DS, false);
      }
    }
  }

  // This lane's two rows (fragment rows l/4 and l/4 + 8).
  bool row_ok[2];
  int qpos[2], doc[2];
  float lse[2], delta[2];
  [[unroll]] for (uint h = 0; h < 2u; ++h) {
    const uint row = r0 + grp * 16u + frag_row(lane, h * 4u);
    row_ok[h] = row < rows;
    const uint t = min(row, rows - 1u) / G, hd = kv * G + min(row, rows - 1u) % G;
    qpos[h] = int(t) + p.q_offset;
    doc[h] = doc_of(b, t);
    lse[h] = LD_F32(LSE, p.lse_off + bht(b, hd, t));
    delta[h] = LD_F32(DELTA, p.delta_off + bht(b, hd, t));
  }
  const ivec2 keys = key_range(r0 / G, (min(r0 + BR, rows) - 1u) / G);
  F32M dq[FP];
  [[unroll]] for (uint f = 0; f < FP; ++f) dq[f] = F32M(0.0);

  for (int jb = keys.x; jb < keys.y; jb += int(BC)) {
    STAGE_KEY_BLOCK(jb)
    bool whole[2];
    [[unroll]] for (uint h = 0; h < 2u; ++h)
      whole[h] = row_ok[h] && keys_plain && doc[h] == block_doc && bounds_clear(jb, jb + int(BC) - 1, qpos[h], qpos[h]);

    const bool all_whole = whole[0] && whole[1];  // else masks in a loop of their own (flash_attention_cm.glsl)
    // S = Q K^T and dP = dO V^T per 16 keys (K^T and V^T loaded column-major from the rows), then dS.
    F16M da[BC / 16u];
    [[unroll]] for (uint nb = 0; nb < BC / 16u; ++nb) {
      F32M s = F32M(0.0), dp = F32M(0.0);
      [[unroll]] for (uint f = 0; f < FP; ++f) {
        F16M kb, vb;
        coopMatLoadNV(kb, kv_s, nb * 16u * DS + (part * FP + f) * 2u, DS, true);
        coopMatLoadNV(vb, kv_s, (BC + nb * 16u) * DS + (part * FP + f) * 2u, DS, true);
        s = coopMatMulAddNV(qa[f], kb, s);
        dp = coopMatMulAddNV(oa[f], vb, dp);
      }
#if NSPLIT > 1 && XCH_ROUNDS == 1
      // The group's partial sums added up (slots per key fragment: the next block's puts come after its staging
      // barriers).
      XCH_PUT(2u * nb, s)
      XCH_PUT(2u * nb + 1u, dp)
      barrier();
      XCH_SUM(2u * nb, s)
      XCH_SUM(2u * nb + 1u, dp)
#elif NSPLIT > 1
      XCH_PUT(0u, s)
      barrier();
      XCH_SUM(0u, s)
      barrier();
      XCH_PUT(0u, dp)
      barrier();
      XCH_SUM(0u, dp)
#endif
      float dsv[8];
      [[unroll]] for (uint e = 0; e < 8u; ++e) {
        const uint h = e / 4u;
        const float x = capped(s[e]);
        float g = exp(x - lse[h]) * (dp[e] - delta[h]);
        if (p.softcap > 0.0) g *= 1.0 - (x / p.softcap) * (x / p.softcap);
        dsv[e] = g * p.scale;
      }
      if (!all_whole) {
        [[unroll]] for (uint e = 0; e < 8u; ++e) {
          const uint h = e / 4u, c = nb * 16u + frag_col(lane, e);
          if (!(whole[h] || visible(row_ok[h], qpos[h], doc[h], key_ok[c], jb + int(c), key_doc[c]))) dsv[e] = 0.0;
        }
      }
      [[unroll]] for (uint e = 0; e < 8u; ++e) da[nb][e] = float16_t(dsv[e]);
    }

    // dQ += dS K.
    [[unroll]] for (uint kb = 0; kb < BC / 16u; ++kb)
      [[unroll]] for (uint f = 0; f < FP; ++f) {
        F16M kr;
        coopMatLoadNV(kr, kv_s, kb * 16u * DS + (part * FP + f) * 2u, DS, false);
        dq[f] = coopMatMulAddNV(da[kb], kr, dq[f]);
      }
  }

  // dQ a fragment at a time through shared memory: lane (row lr, dims f 16 + half 8 ..) writes 8 values.
  const uint lr = lane % 16u, half_ = lane / 16u, row = r0 + grp * 16u + lr;
  const uint at = bth(b, min(row, rows - 1u) / G, kv * G + min(row, rows - 1u) % G, p.H, p.T);
  const uint obase = sg * 16u * FST / 4u;
#ifdef OUT_IN_TILE
  barrier();  // every subgroup is done with the last K block
#endif
  [[unroll]] for (uint fp = 0; fp < FP; ++fp) {
    const uint f = part * FP + fp;
    subgroup_sync();
    coopMatStoreNV(dq[fp], out_s, obase, FST / 4u, false);
    subgroup_sync();
    const uint fa = obase + (lr * FST + half_ * 8u) / 4u;
    const vec4 lo = uintBitsToFloat(out_s[fa]), hi = uintBitsToFloat(out_s[fa + 1u]);
    float g[8] = float[8](lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
    if (row < rows) Y_store8(dt(4), p.y_off + at + f * 16u + half_ * 8u, f * 16u + half_ * 8u, g);
  }
}
