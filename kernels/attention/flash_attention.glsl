// Shared parts of the fused attention kernels (flash_attention_fwd.comp, flash_attention_bwd_dq.comp,
// flash_attention_bwd_dkdv.comp): the bindings and push constants they all use, index helpers and the mask.
// Rows of the problem are (query t, head g of the kv group) pairs, row = t * G + g: a workgroup's rows share the
// K/V tiles of one kv head. Tiles live in shared memory as f32 [rows][DMAX + 1] (an odd row stride, so reading a
// column across invocations hits distinct banks); accumulators live in registers. Every kernel runs 128
// invocations and is built per head-dim class DMAX (64, 128, 256; D <= DMAX, the rest of a tile row is 0), with
// block sizes chosen per kernel so that its shared memory stays under 32 KiB (lavapipe; NVIDIA has 48 KiB).
#ifndef LMTUNE_FLASH_ATTENTION_GLSL
#define LMTUNE_FLASH_ATTENTION_GLSL

#include "common/common.glsl"

#ifndef FLASH_WG
#define FLASH_WG 128  // invocations per workgroup (the tensor-core forward kernel runs 256)
#endif
layout(local_size_x = FLASH_WG) in;
const uint WG = FLASH_WG;
const uint QS = DMAX + 1u;

TENSOR(0, Q)
TENSOR(1, K)
TENSOR(2, V)
TENSOR(3, X)      // dO (backward)
TENSOR(4, LSE)    // f32 [B, H, T]
TENSOR(5, DELTA)  // f32 [B, H, T] (backward): rowsum(dO * O) - dLSE
TENSOR(6, DOCS)   // i32 [B, T]
TENSOR(7, KEYS)   // i32 [B, S]
TENSOR(8, Y)      // O (forward), dQ or dK (backward): dense
TENSOR(9, Z)      // dV: dense

// Mirrored by FlashPush in src/backend/vulkan/flash_attention.cpp.
layout(push_constant) uniform Push {
  uint T, S, H, KV, D;
  uint flags;  // 1 causal, 2 doc ids, 4 key mask; tensor-core kernels: 8 inputs read, 16 outputs written by 16 bytes
  int window, q_offset;
  float scale, softcap;
  uint q_off, q_sb, q_st, k_off, k_sb, k_st, v_off, v_sb, v_st, x_off, x_sb, x_st;  // element offset, batch and time strides
  uint lse_off, delta_off, docs_off, keys_off, y_off, z_off;
  uint dtypes;  // q | k << 4 | v << 8 | dO << 12 | Y << 16 | Z << 20
  uint splits;  // forward: key-range splits per row block (1 = none; else Y, LSE are f32 partials per split)
} p;

#define NEG_INF uintBitsToFloat(0xff800000u)

#ifdef SPEC_DTYPES
// The dtypes as specialization constant 0 (the host passes the push constants' value): a pipeline per dtype
// combination, whose code the driver compiles without the dtype switches (bench/RESULTS.md: small kernels are
// bound by their code's length, not by their work).
layout(constant_id = 0) const uint DTYPES = 0u;
uint dt(uint field) { return (DTYPES >> (4u * field)) & 15u; }
#else
uint dt(uint field) { return (p.dtypes >> (4u * field)) & 15u; }
#endif
bool causal() { return (p.flags & 1u) != 0u; }
bool has_docs() { return (p.flags & 2u) != 0u; }
bool has_key_mask() { return (p.flags & 4u) != 0u; }

// Element (b, t, head, d) of q / k / v / dO (heads and dims dense) and of the dense outputs.
uint q_at(uint b, uint t, uint h, uint d) { return p.q_off + b * p.q_sb + t * p.q_st + h * p.D + d; }
uint k_at(uint b, uint j, uint kv, uint d) { return p.k_off + b * p.k_sb + j * p.k_st + kv * p.D + d; }
uint v_at(uint b, uint j, uint kv, uint d) { return p.v_off + b * p.v_sb + j * p.v_st + kv * p.D + d; }
uint x_at(uint b, uint t, uint h, uint d) { return p.x_off + b * p.x_sb + t * p.x_st + h * p.D + d; }
uint bth(uint b, uint t, uint h, uint heads, uint len) { return ((b * len + t) * heads + h) * p.D; }
uint bht(uint b, uint h, uint t) { return (b * p.H + h) * p.T + t; }  // LSE / delta

// Whether a row (query position qpos, document row_doc) sees key j (document key_doc; key_ok: in range, not
// padding). The causal and window bounds, then packed documents.
bool visible(bool row_ok, int qpos, int row_doc, bool key_ok, int j, int key_doc) {
  if (!row_ok || !key_ok) return false;
  if (causal() && j > qpos) return false;
  if (p.window > 0 && qpos - j >= p.window) return false;
  return !has_docs() || row_doc == key_doc;
}

// Scaled, soft-capped score.
float capped(float dot) {
  float x = dot * p.scale;
  return p.softcap > 0.0 ? p.softcap * tanh(x / p.softcap) : x;
}

int doc_of(uint b, uint t) { return has_docs() ? LD_I32(DOCS, p.docs_off + b * p.T + t) : 0; }
bool key_usable(uint b, uint j) { return j < p.S && (!has_key_mask() || LD_I32(KEYS, p.keys_off + b * p.S + j) != 0); }

// Keys [j0, j1) that queries t_first..t_last may see by the causal and window bounds.
ivec2 key_range(uint t_first, uint t_last) {
  int j0 = 0, j1 = int(p.S);
  if (causal()) j1 = clamp(int(t_last) + p.q_offset + 1, 0, int(p.S));
  if (p.window > 0) j0 = clamp(int(t_first) + p.q_offset - p.window + 1, 0, int(p.S));
  return ivec2(j0, max(j0, j1));
}

// Queries [t0, t1) that may see one of the keys j_first..j_last.
ivec2 query_range(uint j_first, uint j_last) {
  int t0 = 0, t1 = int(p.T);
  if (causal()) t0 = clamp(int(j_first) - p.q_offset, 0, int(p.T));
  if (p.window > 0) t1 = clamp(int(j_last) + p.window - p.q_offset, 0, int(p.T));
  return ivec2(t0, max(t0, t1));
}

// The GPU starts workgroups in the order of their linear index (x fastest). Every kernel's grid is (blocks of rows
// or keys, kv heads, batch [x splits]), and under a causal mask the blocks' work differs up to T / block times.
// Read block-major, every (kv head, z) group's first block starts before any group's second: kernels number their
// blocks so that the first has the most work, and the long ones no longer start in the last wave
// (longest-processing-time-first; for the dK/dV pass of Llama-3.2-1B shapes the modelled makespan goes from 1.30x
// to 1.03x of the ideal). Returns (block rank, y, z).
uvec3 block_major_id() {
  const uvec3 n = gl_NumWorkGroups, w = gl_WorkGroupID;
  const uint groups = n.y * n.z, id = w.x + n.x * (w.y + n.y * w.z), g = id % groups;
  return uvec3(id / groups, g % n.y, g / n.y);
}

// The start of the row-block kernels' main() (dQ, the tensor-core forward and dQ kernels): declares id (block-major,
// above), b, kv and r0 (the batch, the kv head and the first of the workgroup's BR rows; row blocks count from the
// last, which sees the most keys under a causal mask), G (query heads per kv head) and rows (T G).
#define ROW_BLOCK                                                                                     \
  const uvec3 id = block_major_id();                                                                  \
  const uint b = id.z, kv = id.y, r0 = (gl_NumWorkGroups.x - 1u - id.x) * BR;                         \
  const uint G = p.H / p.KV, rows = p.T * G;

// The backward kernels' data of a block's N rows in shared memory: in range, query position, document, LSE, delta.
#define SHARED_ROW_DATA(N)                                                                            \
  shared bool row_ok[N];                                                                              \
  shared int row_qpos[N], row_doc[N];                                                                 \
  shared float row_lse[N], row_delta[N];

// The scalar kernels' TR x TC register tile of a product over the head dim: S[i][j] = sum over d < D of row
// sy + i SY of shared tile AT and row sx + j SX of shared tile BT (row stride QS). A and B name the registers that
// hold column d of each.
#define SCORE_TILE(S, A, AT, B, BT)                                                                   \
      [[unroll]] for (uint i = 0; i < TR; ++i) [[unroll]] for (uint j = 0; j < TC; ++j) S[i][j] = 0.0; \
      for (uint d = 0; d < p.D; ++d) {                                                                \
        float A[TR], B[TC];                                                                           \
        [[unroll]] for (uint i = 0; i < TR; ++i) A[i] = AT[(sy + i * SY) * QS + d];                   \
        [[unroll]] for (uint j = 0; j < TC; ++j) B[j] = BT[(sx + j * SX) * QS + d];                   \
        [[unroll]] for (uint i = 0; i < TR; ++i) [[unroll]] for (uint j = 0; j < TC; ++j) S[i][j] += A[i] * B[j]; \
      }

#endif
