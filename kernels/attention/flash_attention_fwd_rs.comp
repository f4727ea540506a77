#version 450
// Fused attention forward on tensor cores with the softmax in registers (the contract of
// flash_attention_fwd_cm.comp): where the device lays a 16x16 fragment out as NVIDIA's mma.sync does (checked at
// run time, see flash_attention_cm.glsl: lane l holds rows l/4 and l/4 + 8, columns 2(l%4) + {0, 1} and + 8, in
// the same order for f32 accumulators and f16 operands), S = Q K^T stays in its accumulators: masks, row maxima
// (over the 4 lanes of a row), exponentials and the rescaling of O run on the fragments' elements, and P goes
// into the P V product as an f16 fragment of the same layout. No score leaves the registers; per block of BC keys
// the workgroup shares only the K and V tiles. One workgroup of 8 subgroups per (block of 8 / NSPLIT x 16 rows,
// kv head, batch), NSPLIT subgroups per 16 rows (flash_attention_rs.glsl: at NSPLIT 2 each owns half the head
// dims of Q and O, and the pair adds its partial scores through shared memory); lazy rescaling as in
// flash_attention_fwd_cm.comp.
#ifndef FLASH_WG
#define FLASH_WG 256
#endif
#ifndef BLOCK_KEYS
#define BLOCK_KEYS 32
#endif
#define XCH_SLOTS (BLOCK_KEYS / 16)
#define OUT_TILE kv_s
#define OUT_TILE_BYTES (2 * BLOCK_KEYS * (DMAX + 8) * 2)
#include "attention/flash_attention_cm.glsl"
#include "attention/flash_attention_rs.glsl"

// K/V tile, output staging, 1 / l per row, exchange, key flags: past 48 KiB NVIDIA loses the device.
#if 2 * BLOCK_KEYS * (DMAX + 8) * 2 + OUT_BYTES + FLASH_WG / 32 * 16 * 4 + XCH_BYTES + BLOCK_KEYS * 8 > 49152
#error "flash_attention_fwd_rs: shared memory over 48 KiB"
#endif

const uint BC = BLOCK_KEYS;                   // keys per block
const uint BR = NGRP * 16u;                   // rows per workgroup
const float TAU = 8.0;                        // lazy rescaling threshold (e^8 = 2981)
const uint NCH = BC * (DMAX / 8u) / WG;       // 8-element chunks per invocation of a K or V tile
const uint QPASS = BR / (2u * BC);            // Q staged through the K/V tile in passes of 2 BC rows

shared uvec4 kv_s[2u * BC * DS];  // K rows, then V rows (Q rows at the start)
shared float inv_s[NSG * 16u];
shared bool key_ok[BC];
shared int key_doc[BC];

void main() {
  const uint tid = gl_LocalInvocationIndex, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const uint grp = sg / NSPLIT, part = sg % NSPLIT;  // this subgroup's 16 rows, and its part of the head dims
  ROW_BLOCK  // b, kv, r0, G, rows

  // Q rows into fragments (the A operand of S = Q K^T), 2 BC rows per pass through the K/V tile.
  F16M qa[FP];
  uvec4 wk[NCH], wv[NCH];
  for (uint pass = 0; pass < QPASS; ++pass) {
    STAGE_Q_PASS(pass)
    if (grp / (2u * BC / 16u) == pass)
      [[unroll]] for (uint f = 0; f < FP; ++f)
        coopMatLoadNV(qa[f], kv_s, (grp % (2u * BC / 16u)) * 16u * DS + (part * FP + f) * 2u, DS, false);
  }

  // This lane's two rows (fragment rows l/4 and l/4 + 8): index 0 and 1 of the arrays below.
  bool row_ok[2];
  int qpos[2], doc[2];
  float m[2] = float[2](NEG_INF, NEG_INF), l[2] = float[2](0.0, 0.0);  // l: this lane's part of the row sum
  [[unroll]] for (uint h = 0; h < 2u; ++h) {
    const uint row = r0 + grp * 16u + frag_row(lane, h * 4u);
    row_ok[h] = row < rows;
    const uint t = min(row, rows - 1u) / G;
    qpos[h] = int(t) + p.q_offset;
    doc[h] = doc_of(b, t);
  }
  const ivec2 keys = key_range(r0 / G, (min(r0 + BR, rows) - 1u) / G);
  F32M oacc[FP];
  [[unroll]] for (uint f = 0; f < FP; ++f) oacc[f] = F32M(0.0);

  for (int jb = keys.x; jb < keys.y; jb += int(BC)) {
    STAGE_KEY_BLOCK(jb)

    // S = Q K^T, a 16x16 accumulator per 16 keys (K^T loaded column-major from the K rows).
    F32M s[BC / 16u];
    [[unroll]] for (uint nb = 0; nb < BC / 16u; ++nb) {
      s[nb] = F32M(0.0);
      [[unroll]] for (uint f = 0; f < FP; ++f) {
        F16M kb;
        coopMatLoadNV(kb, kv_s, nb * 16u * DS + (part * FP + f) * 2u, DS, true);
        s[nb] = coopMatMulAddNV(qa[f], kb, s[nb]);
      }
    }
#if NSPLIT > 1
    // The group's partial scores added up (the next block's puts come after its staging barriers).
    [[unroll]] for (uint nb = 0; nb < BC / 16u; ++nb) XCH_PUT(nb, s[nb])
    barrier();
    [[unroll]] for (uint nb = 0; nb < BC / 16u; ++nb) XCH_SUM(nb, s[nb])
#endif

    // Masks and the online softmax on the elements; a row's maximum over its 4 lanes.
    bool whole[2];
    float mx[2] = float[2](NEG_INF, NEG_INF);
    [[unroll]] for (uint h = 0; h < 2u; ++h)
      whole[h] = row_ok[h] && keys_plain && doc[h] == block_doc && bounds_clear(jb, jb + int(BC) - 1, qpos[h], qpos[h]);
    [[unroll]] for (uint nb = 0; nb < BC / 16u; ++nb)
      [[unroll]] for (uint e = 0; e < 8u; ++e) s[nb][e] = capped(s[nb][e]);
    // The masks only where a lane's rows are not both whole, as one branch around the loop (with the condition
    // per element the compiler evaluated the masks everywhere: see flash_attention_cm.glsl).
    if (!(whole[0] && whole[1]))
      [[unroll]] for (uint nb = 0; nb < BC / 16u; ++nb)
        [[unroll]] for (uint e = 0; e < 8u; ++e) {
          const uint h = e / 4u, c = nb * 16u + frag_col(lane, e);
          if (!whole[h] && !visible(row_ok[h], qpos[h], doc[h], key_ok[c], jb + int(c), key_doc[c])) s[nb][e] = NEG_INF;
        }
    [[unroll]] for (uint nb = 0; nb < BC / 16u; ++nb)
      [[unroll]] for (uint e = 0; e < 8u; ++e) mx[e / 4u] = max(mx[e / 4u], s[nb][e]);
    float alpha[2];
    bool moved = false;
    [[unroll]] for (uint h = 0; h < 2u; ++h) {
      mx[h] = quad_max(mx[h]);
      const float m_new = mx[h] > m[h] + TAU || (m[h] == NEG_INF && mx[h] != NEG_INF) ? mx[h] : m[h];
      // A row whose m was -inf has seen no key: its output is still 0 and needs no rescaling.
      const bool mv = m_new != m[h] && m[h] != NEG_INF;
      alpha[h] = mv ? exp(m[h] - m_new) : 1.0;
      moved = moved || mv;
      m[h] = m_new;
      l[h] *= alpha[h];
    }
    if (subgroupAny(moved))
      [[unroll]] for (uint f = 0; f < FP; ++f)
        [[unroll]] for (uint e = 0; e < 8u; ++e) oacc[f][e] *= alpha[e / 4u];
    F16M pa[BC / 16u];
    [[unroll]] for (uint nb = 0; nb < BC / 16u; ++nb)
      [[unroll]] for (uint e = 0; e < 8u; ++e) {
        const float x = s[nb][e], pe = x == NEG_INF ? 0.0 : exp(x - m[e / 4u]);
        l[e / 4u] += pe;
        pa[nb][e] = float16_t(pe);
      }

    // O += P V.
    [[unroll]] for (uint kb = 0; kb < BC / 16u; ++kb)
      [[unroll]] for (uint f = 0; f < FP; ++f) {
        F16M vb;
        coopMatLoadNV(vb, kv_s, (BC + kb * 16u) * DS + (part * FP + f) * 2u, DS, false);
        oacc[f] = coopMatMulAddNV(pa[kb], vb, oacc[f]);
      }
  }

  // Row sums over the row's 4 lanes; 1 / l and the LSE per row.
  [[unroll]] for (uint h = 0; h < 2u; ++h) {
    const float lsum = quad_sum(l[h]);
    const uint lrow = frag_row(lane, h * 4u);
    if (lane % 4u == 0u) {
      inv_s[sg * 16u + lrow] = lsum > 0.0 ? 1.0 / lsum : 0.0;  // a row that saw no key outputs 0
      const uint row = r0 + grp * 16u + lrow;
      if (row_ok[h] && part == 0u)
        ST_F32(LSE, p.lse_off + bht(b, kv * G + row % G, row / G), lsum > 0.0 ? m[h] + log(lsum) : NEG_INF);
    }
  }

  // O / l, a fragment at a time through shared memory: lane (row lr, dims f 16 + half 8 ..) writes 8 values.
  const uint lr = lane % 16u, half_ = lane / 16u, row = r0 + grp * 16u + lr;
  const uint at = bth(b, min(row, rows - 1u) / G, kv * G + row % G, p.H, p.T);
  const uint obase = sg * 16u * FST / 4u;
#ifdef OUT_IN_TILE
  barrier();  // every subgroup is done with the last V block
#endif
  [[unroll]] for (uint fp = 0; fp < FP; ++fp) {
    const uint f = part * FP + fp;
    subgroup_sync();
    coopMatStoreNV(oacc[fp], out_s, obase, FST / 4u, false);
    subgroup_sync();
    const float inv = inv_s[sg * 16u + lr];
    const uint fa = obase + (lr * FST + half_ * 8u) / 4u;
    const vec4 lo = uintBitsToFloat(out_s[fa]) * inv, hi = uintBitsToFloat(out_s[fa + 1u]) * inv;
    float o[8] = float[8](lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
    if (row < rows) Y_store8(dt(4), p.y_off + at + f * 16u + half_ * 8u, f * 16u + half_ * 8u, o);
  }
}
