#version 450
// Fused attention backward, dK and dV, on tensor cores with the scores in registers (the contract of
// flash_attention_bwd_dkdv_cm.comp, the fragment layout of flash_attention_fwd_rs.comp): one workgroup of 8
// subgroups per (block of 8 / NSPLIT x 16 keys, kv head, batch), NSPLIT subgroups per 16 keys holding their part
// of its K and V rows as f16 A fragments and of dK, dV as accumulators (flash_attention_rs.glsl). Per block of BR
// rows: S^T = K Q^T and dP^T = V dO^T in accumulators (partial sums added up across the group), P^T =
// exp(S^T - LSE) on their elements, dV += P^T dO, dS^T = scale P^T (dP^T - delta), dK += dS^T Q, with P^T and dS^T
// as f16 fragments of the accumulators' layout. Row-range splits as in flash_attention_bwd_dkdv_cm.comp.
//
// The Q/dO tile has TILE_BUFS buffers. With two, block i is staged into buffer i % 2 while the others may still
// read block i - 1 from the other one, so a block costs one barrier (plus one for the exchange); with one (where
// two do not fit in 48 KiB) a second barrier guards the tile. Each block's Q and dO rows are read into registers
// before the previous block's products, so their latency hides behind them.
#ifndef FLASH_WG
#define FLASH_WG 256
#endif
#ifndef BLOCK_ROWS
#define BLOCK_ROWS 32
#endif
#ifndef TILE_BUFS
#define TILE_BUFS 2
#endif
#define XCH_SLOTS (2 * BLOCK_ROWS / 16 / XCH_ROUNDS)
#define OUT_TILE qo_s
#define OUT_TILE_BYTES (TILE_BUFS * 2 * BLOCK_ROWS * (DMAX + 8) * 2)
#include "attention/flash_attention_cm.glsl"
#include "attention/flash_attention_rs.glsl"

// Q/dO tile, output staging, exchange, row data: past 48 KiB NVIDIA loses the device.
#if TILE_BUFS * 2 * BLOCK_ROWS * (DMAX + 8) * 2 + OUT_BYTES + XCH_BYTES + TILE_BUFS * BLOCK_ROWS * 20 > 49152
#error "flash_attention_bwd_dkdv_rs: shared memory over 48 KiB"
#endif
#if XCH_ROUNDS == 2 && BLOCK_ROWS != 16
#error "flash_attention_bwd_dkdv_rs: two exchange rounds take one 16-row fragment per block"
#endif
#if TILE_BUFS > 2 || BLOCK_ROWS > 32
#error "flash_attention_bwd_dkdv_rs: the row votes have two slots and one lane per row"
#endif
#if TILE_BUFS * 2 * BLOCK_ROWS < FLASH_WG / 32 / NSPLIT * 16 || BLOCK_ROWS * DMAX / 8 % FLASH_WG != 0
#error "flash_attention_bwd_dkdv_rs: K and V are staged through the tile (it must hold the keys), in whole chunks"
#endif

const uint BR = BLOCK_ROWS;               // rows per block
const uint BC = NGRP * 16u;               // keys per workgroup
const uint TILE = 2u * BR * DS;           // uvec4 of one buffer: Q rows, then dO rows
const float LOG2E = 1.4426950408889634;
const uint NCH = BR * (DMAX / 8u) / WG;   // 8-element chunks per invocation of a Q or dO block
const uint KCAP = TILE_BUFS * 2u * BR;    // K (then V) rows the tile holds at the start
const uint NKCH = KCAP * (DMAX / 8u) / WG;

shared uvec4 qo_s[TILE_BUFS * TILE];
SHARED_ROW_DATA(TILE_BUFS * BR)

// Writes a subgroup's accumulators ACC (its part of the head dims) a fragment at a time through shared memory
// (lane: key lr, 8 dims) to tensor T (dtype field F, element offset OFF).
#define STORE_ROWS(ACC, T, F, OFF)                                                                   \
  [[unroll]] for (uint fp = 0; fp < FP; ++fp) {                                                     \
    const uint f = part * FP + fp;                                                                  \
    subgroup_sync();                                                                                \
    coopMatStoreNV(ACC[fp], out_s, obase, FST / 4u, false);                                         \
    subgroup_sync();                                                                                \
    const uint fa = obase + (lr * FST + half_ * 8u) / 4u;                                           \
    const vec4 lo = uintBitsToFloat(out_s[fa]), hi = uintBitsToFloat(out_s[fa + 1u]);               \
    float g[8] = float[8](lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);                          \
    if (j < p.S) T##_store8(dt(F), (OFF) + bth(b, j, kv, p.KV, p.S) + f * 16u + half_ * 8u, f * 16u + half_ * 8u, g); \
  }

void main() {
  const uint tid = gl_LocalInvocationIndex, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const uint grp = sg / NSPLIT, part = sg % NSPLIT;  // this subgroup's 16 keys, and its part of the head dims
  KEY_BLOCK  // b, split, kv, j0, G

  // K, then V rows through the whole tile (KCAP >= BC rows) into A fragments.
  F16M ka[FP], va[FP];
  {
    uvec4 wkv[NKCH];
    LOAD_CHUNKS(NKCH, wkv, K, 1, j0 + r < p.S, k_at(b, min(j0 + r, p.S - 1u), kv, d0))
    STORE_CHUNKS(NKCH, wkv, 1, qo_s, 0u, j0 + r < p.S)
    barrier();
    [[unroll]] for (uint f = 0; f < FP; ++f)
      coopMatLoadNV(ka[f], qo_s, grp * 16u * DS + (part * FP + f) * 2u, DS, false);
    LOAD_CHUNKS(NKCH, wkv, V, 2, j0 + r < p.S, v_at(b, min(j0 + r, p.S - 1u), kv, d0))
    barrier();
    STORE_CHUNKS(NKCH, wkv, 2, qo_s, 0u, j0 + r < p.S)
    barrier();
    [[unroll]] for (uint f = 0; f < FP; ++f)
      coopMatLoadNV(va[f], qo_s, grp * 16u * DS + (part * FP + f) * 2u, DS, false);
    barrier();
  }

  // This lane's two keys (fragment rows l/4 and l/4 + 8).
  uint jk[2];
  bool key_ok[2];
  int key_doc[2];
  [[unroll]] for (uint h = 0; h < 2u; ++h) {
    jk[h] = j0 + grp * 16u + frag_row(lane, h * 4u);
    key_ok[h] = key_usable(b, jk[h]);
    key_doc[h] = jk[h] < p.S ? doc_of(b, jk[h]) : 0;
  }
  SPLIT_ROWS  // this workgroup's rows [row_begin, split_end) of [queries.x G, row_end); out_shift
  F32M dk[FP], dv[FP];
  [[unroll]] for (uint f = 0; f < FP; ++f) dk[f] = dv[f] = F32M(0.0);

  // Block t0's Q and dO rows into wq / wo, and its row data (a row per lane of subgroup 0; lanes past BR repeat
  // the last row, which leaves the vote as it is) into the own_* registers.
  uvec4 wq[NCH], wo[NCH];
  float own_lse, own_delta;
  int own_doc;
  uint own_r, own_t;
#define ROW_T (min(t0 + r, row_end - 1u) / G)
#define ROW_H (kv * G + min(t0 + r, row_end - 1u) % G)
#define LOAD_BLOCK(T0)                                                                              \
  {                                                                                                 \
    const uint t0 = (T0);                                                                           \
    LOAD_CHUNKS(NCH, wq, Q, 0, t0 + r < row_end, q_at(b, ROW_T, ROW_H, d0))                         \
    LOAD_CHUNKS(NCH, wo, X, 3, t0 + r < row_end, x_at(b, ROW_T, ROW_H, d0))                         \
    own_r = t0 + min(lane, BR - 1u);                                                                \
    const uint own = min(own_r, row_end - 1u), own_h = kv * G + own % G;                            \
    own_t = own / G;                                                                                \
    own_lse = LD_F32(LSE, p.lse_off + bht(b, own_h, own_t));                                        \
    own_delta = LD_F32(DELTA, p.delta_off + bht(b, own_h, own_t));                                  \
    own_doc = doc_of(b, own_t);                                                                     \
  }
  if (row_begin < split_end) LOAD_BLOCK(row_begin)

  uint buf = 0u;
  for (uint t0 = row_begin; t0 < split_end; t0 += BR, buf = (buf + 1u) % TILE_BUFS) {
    if (TILE_BUFS == 1u) barrier();  // the one buffer is free once every subgroup is done with the last block
    const uint qrow = buf * TILE, orow = qrow + BR * DS, rd = buf * BR;  // Q rows, dO rows, row data
    STORE_CHUNKS(NCH, wq, 0, qo_s, qrow, t0 + r < row_end)
    STORE_CHUNKS(NCH, wo, 3, qo_s, orow, t0 + r < row_end)
    if (sg == 0u) {
      if (lane < BR) {
        const uint i = rd + lane;
        row_ok[i] = own_r < row_end;
        row_qpos[i] = int(own_t) + p.q_offset;
        row_doc[i] = own_doc;
        row_lse[i] = own_lse;
        row_delta[i] = own_delta;
      }
      vote(buf, own_r < row_end, own_doc);
    }
    barrier();
    if (t0 + BR < split_end) LOAD_BLOCK(t0 + BR)  // the next block's loads in flight during this one's products

    const int rows_doc = vote_doc_s[buf];
    const bool rows_plain = vote_s[buf];
    bool whole[2];
    [[unroll]] for (uint h = 0; h < 2u; ++h)
      whole[h] = rows_plain && key_ok[h] && key_doc[h] == rows_doc &&
                 bounds_clear(int(jk[h]), int(jk[h]), int(t0 / G) + p.q_offset, int((t0 + BR - 1u) / G) + p.q_offset);
    const bool all_whole = whole[0] && whole[1];  // else masks in a loop of their own (flash_attention_cm.glsl)
    // The LSE (times log2 e) and delta of this lane's columns (rows of the block): 4 per 16 rows, read once.
    float lse2[BR / 16u][4], dl[BR / 16u][4];
    [[unroll]] for (uint nb = 0; nb < BR / 16u; ++nb)
      [[unroll]] for (uint q = 0; q < 4u; ++q) {
        const uint c = rd + nb * 16u + frag_col(lane, q);
        lse2[nb][q] = row_lse[c] * LOG2E;
        dl[nb][q] = row_delta[c];
      }

    // S^T = K Q^T per 16 rows (Q^T loaded column-major); where the head dims are split, dP^T = V dO^T too, so
    // that one exchange adds up both.
    F32M st[BR / 16u], dpt[BR / 16u];
    [[unroll]] for (uint nb = 0; nb < BR / 16u; ++nb) {
      st[nb] = F32M(0.0);
      [[unroll]] for (uint f = 0; f < FP; ++f) {
        F16M qb;
        coopMatLoadNV(qb, qo_s, qrow + nb * 16u * DS + (part * FP + f) * 2u, DS, true);
        st[nb] = coopMatMulAddNV(ka[f], qb, st[nb]);
      }
    }
#if NSPLIT > 1
    [[unroll]] for (uint nb = 0; nb < BR / 16u; ++nb) {
      dpt[nb] = F32M(0.0);
      [[unroll]] for (uint f = 0; f < FP; ++f) {
        F16M ob;
        coopMatLoadNV(ob, qo_s, orow + nb * 16u * DS + (part * FP + f) * 2u, DS, true);
        dpt[nb] = coopMatMulAddNV(va[f], ob, dpt[nb]);
      }
#if XCH_ROUNDS == 1
      XCH_PUT(2u * nb, st[nb])
      XCH_PUT(2u * nb + 1u, dpt[nb])
#endif
    }
#if XCH_ROUNDS == 1
    barrier();  // the next block's puts come after its staging barrier
    [[unroll]] for (uint nb = 0; nb < BR / 16u; ++nb) {
      XCH_SUM(2u * nb, st[nb])
      XCH_SUM(2u * nb + 1u, dpt[nb])
    }
#else
    XCH_PUT(0u, st[0])
    barrier();
    XCH_SUM(0u, st[0])
    barrier();
    XCH_PUT(0u, dpt[0])
    barrier();
    XCH_SUM(0u, dpt[0])
#endif
#endif

    // P^T on the elements; dV += P^T dO.
    F16M pa[BR / 16u];
    float pr[BR / 16u][8], xs[BR / 16u][8];
    [[unroll]] for (uint nb = 0; nb < BR / 16u; ++nb) {
      [[unroll]] for (uint e = 0; e < 8u; ++e) {
        xs[nb][e] = capped(st[nb][e]);
        pr[nb][e] = exp2(xs[nb][e] * LOG2E - lse2[nb][e % 4u]);
      }
      if (!all_whole) {
        [[unroll]] for (uint e = 0; e < 8u; ++e) {
          const uint h = e / 4u, i = rd + nb * 16u + frag_col(lane, e);
          if (!(whole[h] || visible(row_ok[i], row_qpos[i], row_doc[i], key_ok[h], int(jk[h]), key_doc[h])))
            pr[nb][e] = 0.0;
        }
      }
      [[unroll]] for (uint e = 0; e < 8u; ++e) pa[nb][e] = float16_t(pr[nb][e]);
    }
    [[unroll]] for (uint kb = 0; kb < BR / 16u; ++kb)
      [[unroll]] for (uint f = 0; f < FP; ++f) {
        F16M ob;
        coopMatLoadNV(ob, qo_s, orow + kb * 16u * DS + (part * FP + f) * 2u, DS, false);
        dv[f] = coopMatMulAddNV(pa[kb], ob, dv[f]);
      }

    // dS^T on the elements (dP^T computed here when the head dims are whole: fewer registers live at once);
    // dK += dS^T Q.
    [[unroll]] for (uint nb = 0; nb < BR / 16u; ++nb) {
#if NSPLIT == 1
      dpt[nb] = F32M(0.0);
      [[unroll]] for (uint f = 0; f < FP; ++f) {
        F16M ob;
        coopMatLoadNV(ob, qo_s, orow + nb * 16u * DS + f * 2u, DS, true);
        dpt[nb] = coopMatMulAddNV(va[f], ob, dpt[nb]);
      }
#endif
      [[unroll]] for (uint e = 0; e < 8u; ++e) {
        float g = pr[nb][e] * (dpt[nb][e] - dl[nb][e % 4u]);
        if (p.softcap > 0.0) g *= 1.0 - (xs[nb][e] / p.softcap) * (xs[nb][e] / p.softcap);
        pa[nb][e] = float16_t(g * p.scale);
      }
    }
    [[unroll]] for (uint kb = 0; kb < BR / 16u; ++kb)
      [[unroll]] for (uint f = 0; f < FP; ++f) {
        F16M qr;
        coopMatLoadNV(qr, qo_s, qrow + kb * 16u * DS + (part * FP + f) * 2u, DS, false);
        dk[f] = coopMatMulAddNV(pa[kb], qr, dk[f]);
      }
  }

  const uint lr = lane % 16u, half_ = lane / 16u, j = j0 + grp * 16u + lr;
  const uint obase = sg * 16u * FST / 4u;
#ifdef OUT_IN_TILE
  barrier();  // every subgroup is done with the last Q/dO block
#endif
  STORE_ROWS(dk, Y, 4, p.y_off + out_shift)
  STORE_ROWS(dv, Z, 5, p.z_off + out_shift)
}
