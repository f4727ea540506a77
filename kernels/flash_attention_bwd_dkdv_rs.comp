#version 450
// Fused attention backward, dK and dV, on tensor cores with the scores in registers (the contract of
// flash_attention_bwd_dkdv_cm.comp, the fragment layout of flash_attention_fwd_rs.comp): one workgroup of 8
// subgroups per (block of 128 keys, kv head, batch), a subgroup per 16 keys holding its K and V rows as f16 A
// fragments. Per block of BR rows: S^T = K Q^T in accumulators, P^T = exp(S^T - LSE) on their elements,
// dV += P^T dO; dP^T = V dO^T, dS^T = scale P^T (dP^T - delta), dK += dS^T Q, with P^T and dS^T as f16 fragments
// of the accumulators' layout. Rows are staged RSUB blocks at a time (two barriers per RSUB blocks). Row-range
// splits as in flash_attention_bwd_dkdv_cm.comp.
#ifndef FLASH_WG
#define FLASH_WG 256
#endif
#include "flash_attention_cm.glsl"

#ifndef RSUB
#define RSUB 2  // H100, Qwen2.5-0.5B heads: dK/dV 10% faster than 1 (the two blocks unrolled: +1.5% Qwen training)
#endif
#if RSUB > 2
#error "flash_attention_bwd_dkdv_rs: the block votes have two slots (RSUB <= 2)"
#endif
#if FLASH_WG < 128 * RSUB
#error "flash_attention_bwd_dkdv_rs: K and V pass through the Q/dO tile, which needs BC >= 2 BR RSUB"
#endif
const uint BR = 32u;                      // rows per block
const uint BT = BR * RSUB;                // rows per staged tile: RSUB blocks between two barriers
const uint BC = NSG * 16u;                // keys per workgroup
const uint FST = 20u;                     // f32 stride of a subgroup's 16x16 dK / dV fragment
const float LOG2E = 1.4426950408889634;
const uint NCH = BT * (DMAX / 8u) / WG;   // 8-element chunks per invocation of a Q or dO tile
const uint KPASS = BC / (2u * BT);        // K (then V) staged through the Q/dO tile in passes of 2 BT rows

shared uvec4 qo_s[2u * BT * DS];  // Q rows, then dO rows (K and V rows at the start)
shared uvec4 out_s[NSG * 16u * FST / 4u];
shared bool row_ok[BT];
shared int row_qpos[BT], row_doc[BT];
shared float row_lse[BT], row_delta[BT];

// Writes a subgroup's accumulators ACC a fragment at a time through shared memory (lane: key lr, 8 dims) to
// tensor T (dtype field F, element offset OFF).
#define STORE_ROWS(ACC, T, F, OFF)                                                                   \
  [[unroll]] for (uint f = 0; f < FD; ++f) {                                                        \
    subgroup_sync();                                                                                \
    coopMatStoreNV(ACC[f], out_s, obase, FST / 4u, false);                                          \
    subgroup_sync();                                                                                \
    const uint fa = obase + (lr * FST + half_ * 8u) / 4u;                                           \
    const vec4 lo = uintBitsToFloat(out_s[fa]), hi = uintBitsToFloat(out_s[fa + 1u]);               \
    float g[8] = float[8](lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);                          \
    if (j < p.S) T##_store8(dt(F), (OFF) + bth(b, j, kv, p.KV, p.S) + f * 16u + half_ * 8u, f * 16u + half_ * 8u, g); \
  }

void main() {
  const uint tid = gl_LocalInvocationIndex, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  // Key blocks from the first (the most rows under a causal mask) on, block-major.
  const uvec3 id = block_major_id();
  const uint b = id.z / p.splits, split = id.z % p.splits, kv = id.y, j0 = id.x * BC;
  const uint G = p.H / p.KV;

  // K, then V rows into A fragments, 2 BT rows per pass through the Q/dO tile.
  F16M ka[FD], va[FD];
  uvec4 wq[NCH], wo[NCH];
  for (uint pass = 0; pass < 2u * KPASS; ++pass) {
    const uint k0 = j0 + (pass % KPASS) * 2u * BT;
    if (pass < KPASS) {
      LOAD_CHUNKS(NCH, wq, K, 1, k0 + r < p.S, k_at(b, min(k0 + r, p.S - 1u), kv, d0))
      LOAD_CHUNKS(NCH, wo, K, 1, k0 + BT + r < p.S, k_at(b, min(k0 + BT + r, p.S - 1u), kv, d0))
    } else {
      LOAD_CHUNKS(NCH, wq, V, 2, k0 + r < p.S, v_at(b, min(k0 + r, p.S - 1u), kv, d0))
      LOAD_CHUNKS(NCH, wo, V, 2, k0 + BT + r < p.S, v_at(b, min(k0 + BT + r, p.S - 1u), kv, d0))
    }
    if (pass > 0u) barrier();
    const uint f_dt = pass < KPASS ? 1u : 2u;
    STORE_CHUNKS(NCH, wq, f_dt, qo_s, 0u, k0 + r < p.S)
    STORE_CHUNKS(NCH, wo, f_dt, qo_s, BT * DS, k0 + BT + r < p.S)
    barrier();
    if (sg / (2u * BT / 16u) == pass % KPASS) {
      const uint at = (sg % (2u * BT / 16u)) * 16u * DS;
      [[unroll]] for (uint f = 0; f < FD; ++f) {
        if (pass < KPASS) coopMatLoadNV(ka[f], qo_s, at + f * 2u, DS, false);
        else coopMatLoadNV(va[f], qo_s, at + f * 2u, DS, false);
      }
    }
  }

  // This lane's two keys (fragment rows l/4 and l/4 + 8).
  uint jk[2];
  bool key_ok[2];
  int key_doc[2];
  [[unroll]] for (uint h = 0; h < 2u; ++h) {
    jk[h] = j0 + sg * 16u + frag_row(lane, h * 4u);
    key_ok[h] = key_usable(b, jk[h]);
    key_doc[h] = jk[h] < p.S ? doc_of(b, jk[h]) : 0;
  }
  const ivec2 queries = query_range(j0, min(j0 + BC, p.S) - 1u);
  const uint row_end = uint(queries.y) * G;
  // This workgroup's part of the rows, in whole row blocks, and where its outputs go.
  const uint chunk = (row_end - uint(queries.x) * G + p.splits * BT - 1u) / (p.splits * BT) * BT;
  const uint row_begin = min(uint(queries.x) * G + split * chunk, row_end);
  const uint split_end = min(row_end, row_begin + chunk);
  const uint out_shift = split * (gl_NumWorkGroups.z / p.splits) * p.S * p.KV * p.D;
  F32M dk[FD], dv[FD];
  [[unroll]] for (uint f = 0; f < FD; ++f) dk[f] = dv[f] = F32M(0.0);

  for (uint t0 = row_begin; t0 < split_end; t0 += BT) {
#define ROW_T (min(t0 + r, row_end - 1u) / G)
#define ROW_H (kv * G + min(t0 + r, row_end - 1u) % G)
    LOAD_CHUNKS(NCH, wq, Q, 0, t0 + r < row_end, q_at(b, ROW_T, ROW_H, d0))
    LOAD_CHUNKS(NCH, wo, X, 3, t0 + r < row_end, x_at(b, ROW_T, ROW_H, d0))
    // Row data: a row per lane of subgroups 0 .. RSUB - 1 (BR == 32), each voting for its block.
    const uint own_r = t0 + min(sg, RSUB - 1u) * BR + lane;
    const uint own = min(own_r, row_end - 1u), own_t = own / G, own_h = kv * G + own % G;
    const float own_lse = LD_F32(LSE, p.lse_off + bht(b, own_h, own_t));
    const float own_delta = LD_F32(DELTA, p.delta_off + bht(b, own_h, own_t));
    const int own_doc = doc_of(b, own_t);
    barrier();
    STORE_CHUNKS(NCH, wq, 0, qo_s, 0u, t0 + r < row_end)
    STORE_CHUNKS(NCH, wo, 3, qo_s, BT * DS, t0 + r < row_end)
    if (sg < RSUB) {
      const uint i = sg * BR + lane;
      row_ok[i] = own_r < row_end;
      row_qpos[i] = int(own_t) + p.q_offset;
      row_doc[i] = own_doc;
      row_lse[i] = own_lse;
      row_delta[i] = own_delta;
      vote(sg, own_r < row_end, own_doc);
    }
    barrier();
    [[unroll]] for (uint sb = 0; sb < RSUB; ++sb) {
      const uint r0 = t0 + sb * BR, qrow = sb * BR, orow = BT + sb * BR;
      const int rows_doc = vote_doc_s[sb];
      const bool rows_plain = vote_s[sb];
      bool whole[2];
      [[unroll]] for (uint h = 0; h < 2u; ++h)
        whole[h] = rows_plain && key_ok[h] && key_doc[h] == rows_doc &&
                   bounds_clear(int(jk[h]), int(jk[h]), int(r0 / G) + p.q_offset, int((r0 + BR - 1u) / G) + p.q_offset);

      const bool all_whole = whole[0] && whole[1];  // else masks in a loop of their own (flash_attention_cm.glsl)
      // The LSE (times log2 e) and delta of this lane's columns (rows of the block): 4 per 16 rows, read once.
      float lse2[BR / 16u][4], dl[BR / 16u][4];
      [[unroll]] for (uint nb = 0; nb < BR / 16u; ++nb)
        [[unroll]] for (uint q = 0; q < 4u; ++q) {
          const uint c = nb * 16u + frag_col(lane, q);
          lse2[nb][q] = row_lse[qrow + c] * LOG2E;
          dl[nb][q] = row_delta[qrow + c];
        }

      // S^T = K Q^T per 16 rows (Q^T loaded column-major), P^T on the elements; dV += P^T dO.
      F16M pa[BR / 16u];
      float pr[BR / 16u][8], xs[BR / 16u][8];
      [[unroll]] for (uint nb = 0; nb < BR / 16u; ++nb) {
        F32M st = F32M(0.0);
        [[unroll]] for (uint f = 0; f < FD; ++f) {
          F16M qb;
          coopMatLoadNV(qb, qo_s, (qrow + nb * 16u) * DS + f * 2u, DS, true);
          st = coopMatMulAddNV(ka[f], qb, st);
        }
        [[unroll]] for (uint e = 0; e < 8u; ++e) {
          xs[nb][e] = capped(st[e]);
          pr[nb][e] = exp2(xs[nb][e] * LOG2E - lse2[nb][e % 4u]);
        }
        if (!all_whole) {
          [[unroll]] for (uint e = 0; e < 8u; ++e) {
            const uint h = e / 4u, i = qrow + nb * 16u + frag_col(lane, e);
            if (!(whole[h] || visible(row_ok[i], row_qpos[i], row_doc[i], key_ok[h], int(jk[h]), key_doc[h])))
              pr[nb][e] = 0.0;
          }
        }
        [[unroll]] for (uint e = 0; e < 8u; ++e) pa[nb][e] = float16_t(pr[nb][e]);
      }
      [[unroll]] for (uint kb = 0; kb < BR / 16u; ++kb)
        [[unroll]] for (uint f = 0; f < FD; ++f) {
          F16M ob;
          coopMatLoadNV(ob, qo_s, (orow + kb * 16u) * DS + f * 2u, DS, false);
          dv[f] = coopMatMulAddNV(pa[kb], ob, dv[f]);
        }

      // dP^T = V dO^T per 16 rows (dO^T loaded column-major), dS^T on the elements; dK += dS^T Q.
      [[unroll]] for (uint nb = 0; nb < BR / 16u; ++nb) {
        F32M dpt = F32M(0.0);
        [[unroll]] for (uint f = 0; f < FD; ++f) {
          F16M ob;
          coopMatLoadNV(ob, qo_s, (orow + nb * 16u) * DS + f * 2u, DS, true);
          dpt = coopMatMulAddNV(va[f], ob, dpt);
        }
        [[unroll]] for (uint e = 0; e < 8u; ++e) {
          float g = pr[nb][e] * (dpt[e] - dl[nb][e % 4u]);
          if (p.softcap > 0.0) g *= 1.0 - (xs[nb][e] / p.softcap) * (xs[nb][e] / p.softcap);
          pa[nb][e] = float16_t(g * p.scale);
        }
      }
      [[unroll]] for (uint kb = 0; kb < BR / 16u; ++kb)
        [[unroll]] for (uint f = 0; f < FD; ++f) {
          F16M qr;
          coopMatLoadNV(qr, qo_s, (qrow + kb * 16u) * DS + f * 2u, DS, false);
          dk[f] = coopMatMulAddNV(pa[kb], qr, dk[f]);
        }
    }
  }

  const uint lr = lane % 16u, half_ = lane / 16u, j = j0 + sg * 16u + lr;
  const uint obase = sg * 16u * FST / 4u;
  STORE_ROWS(dk, Y, 4, p.y_off + out_shift)
  STORE_ROWS(dv, Z, 5, p.z_off + out_shift)
}
