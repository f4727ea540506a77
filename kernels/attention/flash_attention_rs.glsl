// Shared parts of the register-softmax attention kernels (flash_attention_{fwd,bwd_dq,bwd_dkdv}_rs.comp): how a
// head dim too wide for one subgroup's registers is split. NSPLIT subgroups (1, 2, 4 or 8) share a group of 16 rows
// (16 keys in dK/dV), each owning DP = DMAX / NSPLIT of the head dims: its part of the fixed operands (Q and dO, or
// K and V) as f16 A fragments and its part of the f32 accumulators. A 16x16 accumulator holds 8 f32 per lane, so
// at DMAX 128 one subgroup's Q, dO and dQ take 128 registers and its K, V, dK and dV 192: past what a subgroup can
// hold next to its scores, so the wide classes split (see variants.txt for each kernel's NSPLIT).
//
// Products that reduce over the head dim (S = Q K^T, dP = dO V^T and their transposes) then leave each subgroup a
// partial sum over its dims. The group adds them through shared memory: XCH_PUT stores a fragment's 8 elements per
// lane (element-major, so a subgroup's stores are 32 consecutive floats), a barrier, and XCH_SUM adds the group's
// partials in part order, reading its own back too, so every subgroup of a group holds the same bits and takes the
// same softmax decisions. The kernel defines XCH_SLOTS (fragments exchanged per subgroup between two barriers)
// before including this file. Where the backward kernels' two sums (S and dP) would not fit beside a 512-wide tile,
// XCH_ROUNDS 2 exchanges them one after the other through one slot (two barriers more per block).
//
// out_s: where the epilogue stages a subgroup's 16x16 f32 output fragments (row stride FST). With OUT_IN_TILE, the
// kernel's operand tile OUT_TILE (of OUT_TILE_BYTES), after a barrier, instead of an area of its own: the 512
// class's tiles leave no room for one. OUT_BYTES is that area's size.
#ifndef LMTUNE_FLASH_ATTENTION_RS_GLSL
#define LMTUNE_FLASH_ATTENTION_RS_GLSL

#ifndef NSPLIT
#define NSPLIT 1
#endif
#if NSPLIT != 1 && NSPLIT != 2 && NSPLIT != 4 && NSPLIT != 8
#error "flash attention: NSPLIT is 1, 2, 4 or 8"
#endif
#ifndef XCH_ROUNDS
#define XCH_ROUNDS 1
#endif
const uint FST = 20u;
#ifdef OUT_IN_TILE
#define OUT_BYTES 0
#if OUT_TILE_BYTES < FLASH_WG / 32 * 16 * 20 * 4
#error "flash attention: the operand tile cannot stage the outputs"
#endif
#define out_s OUT_TILE
#else
#define OUT_BYTES (FLASH_WG / 32 * 16 * 20 * 4)
shared uvec4 out_s[NSG * 16u * FST / 4u];
#endif

const uint NGRP = NSG / NSPLIT;  // groups of 16 rows (keys) per workgroup
const uint FP = DMAX / NSPLIT / 16u;  // 16-wide fragments across a subgroup's part of the head dim

// Shared memory of the exchange, in bytes (for the kernels' 48 KiB checks).
#define XCH_BYTES ((NSPLIT > 1) * (FLASH_WG / 32) * XCH_SLOTS * 1024)

#if NSPLIT > 1
shared float xch[NSG * XCH_SLOTS * 256u];
#define XCH_AT(SG, SLOT, E) ((((SG) * XCH_SLOTS + (SLOT)) * 8u + (E)) * 32u + gl_SubgroupInvocationID)
#define XCH_PUT(SLOT, M) \
  [[unroll]] for (uint e_ = 0; e_ < 8u; ++e_) xch[XCH_AT(gl_SubgroupID, SLOT, e_)] = M[e_];
#define XCH_SUM(SLOT, M)                                                                          \
  [[unroll]] for (uint e_ = 0; e_ < 8u; ++e_) {                                                   \
    const uint first_ = gl_SubgroupID / NSPLIT * NSPLIT;                                          \
    float sum_ = xch[XCH_AT(first_, SLOT, e_)];                                                   \
    [[unroll]] for (uint q_ = 1; q_ < NSPLIT; ++q_) sum_ += xch[XCH_AT(first_ + q_, SLOT, e_)];    \
    M[e_] = sum_;                                                                                 \
  }
#endif

#endif
