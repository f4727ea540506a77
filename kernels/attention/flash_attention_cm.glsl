// Shared parts of the tensor-core fused attention kernels: the bindings, push constants and mask of
// flash_attention.glsl, plus f16 tiles in shared memory and the lane layouts. There are two families:
// - flash_attention_{fwd,bwd_dq,bwd_dkdv}_rs.comp keep the scores in registers, in NVIDIA's mma.sync fragment
//   layout (frag_row / frag_col below);
// - flash_attention_{fwd,bwd_dq,bwd_dkdv}_cm.comp take any layout: the scores leave the accumulators through
//   shared memory.
//
// Products run on VK_NV_cooperative_matrix 16x16x16 f16 fragments with f32 accumulation; softmax, masks and the
// rescaling of the online softmax run in f32. A workgroup is NSG = FLASH_WG / 32 subgroups of 32 (8 in all six
// kernels: see flash_attention_fwd_cm.comp). Each subgroup owns 16 rows of the problem (queries in the forward
// and dQ kernels, keys in dK/dV) and works on them alone between the workgroup's tile loads (subgroup barriers
// only).
//
// In the _cm kernels, products whose second operand would be transposed (S = Q K^T) run transposed (S^T = K Q^T:
// the fixed Q^T fragments are loaded once and the result is stored column-major), so that no fragment in an inner
// loop is loaded column-major (one such load per multiply-add cost the forward pass 6% there). Scores sit in
// shared memory as f32 [16][cols + 4]; lane l then handles row l % 16, columns [(l / 16) * cols / 2, +cols / 2)
// (the row's other half is lane l ^ 16).
//
// Operand tiles are f16 [rows][DMAX + 8] (uvec4 = 8 halves per element of the shared arrays). Inputs are read 8
// elements at a time where flags bit 8 says every row start is a multiple of 8 elements, else element by element;
// bf16 and f32 inputs become f16 in the tiles.
//
// The block geometry of the _cm forward and dQ kernels is in flash_attention_cm_rows.glsl.
#ifndef LMTUNE_FLASH_ATTENTION_CM_GLSL
#define LMTUNE_FLASH_ATTENTION_CM_GLSL

#extension GL_KHR_memory_scope_semantics : enable
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_shuffle : enable
#extension GL_KHR_shader_subgroup_vote : enable

#include "attention/flash_attention.glsl"
#include "matmul/mma_layout.glsl"

#define F16M fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define F32M fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>

const uint NSG = WG / 32u;        // subgroups per workgroup
const uint FD = DMAX / 16u;       // 16-wide fragments across the head dim
const uint DS = (DMAX + 8u) / 8u;  // row stride of an f16 operand tile, in uvec4

#define VEC8_VIEW(B, T) \
  layout(std430, set = 0, binding = B) readonly buffer T##_bufv { uvec4 T##_v[]; };
VEC8_VIEW(0, Q)
VEC8_VIEW(1, K)
VEC8_VIEW(2, V)
VEC8_VIEW(3, X)

bool vec8() { return (p.flags & 8u) != 0u; }

uvec4 pack8(float x[8]) {
  return uvec4(packHalf2x16(vec2(x[0], x[1])), packHalf2x16(vec2(x[2], x[3])), packHalf2x16(vec2(x[4], x[5])),
               packHalf2x16(vec2(x[6], x[7])));
}
uint bf16x2_to_f16x2(uint w) { return packHalf2x16(vec2(uintBitsToFloat(w << 16), uintBitsToFloat(w & 0xffff0000u))); }

// 8 elements of a tensor from element e on (the first n < 8 only, the rest 0), as 8 f16.
#define F16X8_FN(T)                                                                                    \
  uvec4 T##_f16x8(uint dt, uint e, uint n) {                                                           \
    if (vec8() && n == 8u) {                                                                           \
      if (dt == DT_F32) {                                                                              \
        uvec4 w0 = T##_v[e >> 2], w1 = T##_v[(e >> 2) + 1u];                                           \
        return uvec4(packHalf2x16(uintBitsToFloat(w0.xy)), packHalf2x16(uintBitsToFloat(w0.zw)),       \
                     packHalf2x16(uintBitsToFloat(w1.xy)), packHalf2x16(uintBitsToFloat(w1.zw)));      \
      }                                                                                                \
      uvec4 w = T##_v[e >> 3];                                                                         \
      if (dt == DT_F16) return w;                                                                      \
      return uvec4(bf16x2_to_f16x2(w.x), bf16x2_to_f16x2(w.y), bf16x2_to_f16x2(w.z), bf16x2_to_f16x2(w.w)); \
    }                                                                                                  \
    float x[8];                                                                                        \
    [[unroll]] for (uint i = 0; i < 8u; ++i) x[i] = i < n ? T##_ld(dt, e + i) : 0.0;                   \
    return pack8(x);                                                                                   \
  }
F16X8_FN(Q)
F16X8_FN(K)
F16X8_FN(V)
F16X8_FN(X)

// Tiles are staged in two steps so that all of an invocation's loads of a tile are in flight at once (a loop
// that loads, converts and stores chunk by chunk waits for each load in turn: the forward kernel took 1.5-1.7x
// as long). LOAD_CHUNKS reads the N chunks c = tid + i WG of a [rows][DMAX] tile of tensor T (dtype field F)
// into W[N]: where 8-element reads apply and T is 16-bit, as raw words with no branch around the loads (row and
// dims clamped into the tensor; ROW_OK and n say what is real), else as f16 (element-wise, zeros outside).
// STORE_CHUNKS converts them (bf16 -> f16, zeros outside) into shared array DST from uvec4 offset BASE on.
// ROW_OK and AT are expressions of the chunk's row r and first dim d0 (AT: T's element offset, valid for any r).
bool raw_chunks(uint dt) { return vec8() && dt != DT_F32; }
#define LOAD_CHUNKS(N, W, T, F, ROW_OK, AT)                                                             \
  if (raw_chunks(dt(F))) {                                                                             \
    [[unroll]] for (uint i = 0; i < N; ++i) {                                                          \
      uint r, d0, n;                                                                                   \
      tile_chunk(tid + i * WG, r, d0, n);                                                              \
      d0 = n > 0u ? d0 : 0u;                                                                           \
      W[i] = T##_v[(AT) >> 3];                                                                         \
    }                                                                                                  \
  } else {                                                                                             \
    [[unroll]] for (uint i = 0; i < N; ++i) {                                                          \
      uint r, d0, n;                                                                                   \
      tile_chunk(tid + i * WG, r, d0, n);                                                              \
      W[i] = (ROW_OK) && n > 0u ? T##_f16x8(dt(F), AT, n) : uvec4(0);                                   \
    }                                                                                                  \
  }
#define STORE_CHUNKS(N, W, F, DST, BASE, ROW_OK)                                                        \
  [[unroll]] for (uint i = 0; i < N; ++i) {                                                            \
    uint r, d0, n;                                                                                     \
    tile_chunk(tid + i * WG, r, d0, n);                                                                \
    uvec4 w = W[i];                                                                                    \
    if (raw_chunks(dt(F)) && dt(F) == DT_BF16)                                                         \
      w = uvec4(bf16x2_to_f16x2(w.x), bf16x2_to_f16x2(w.y), bf16x2_to_f16x2(w.z), bf16x2_to_f16x2(w.w)); \
    DST[(BASE) + tile_at(tid + i * WG)] = (ROW_OK) && n > 0u ? w : uvec4(0);                            \
  }

// Outputs leave a fragment at a time: a lane writes 8 consecutive dims of one row (its half of a 16-wide
// fragment row). Where flags bit 16 says the output offsets and D are multiples of 8 elements, they go in one
// 16-byte store (16-bit types) or two (f32), else element by element (one element per store made a lane's stores
// touch a sector each). v: the values of dims d_first.. (those past D are not written), to tensor T from element
// e (of dim d_first) on.
bool vec_out() { return (p.flags & 16u) != 0u; }
uint encode2(uint dt, float a, float b) { return encode(dt, a) | (encode(dt, b) << 16); }
#define STORE8_FN(B, T)                                                                                \
  layout(std430, set = 0, binding = B) writeonly buffer T##_bufo { uvec4 T##_o[]; };                   \
  void T##_store8(uint dt, uint e, uint d_first, float v[8]) {                                         \
    if (d_first >= p.D) return;                                                                        \
    if (vec_out() && is16(dt)) {                                                                       \
      T##_o[e >> 3] = uvec4(encode2(dt, v[0], v[1]), encode2(dt, v[2], v[3]), encode2(dt, v[4], v[5]), \
                            encode2(dt, v[6], v[7]));                                                  \
    } else if (vec_out() && dt == DT_F32) {                                                            \
      T##_o[e >> 2] = floatBitsToUint(vec4(v[0], v[1], v[2], v[3]));                                   \
      T##_o[(e >> 2) + 1u] = floatBitsToUint(vec4(v[4], v[5], v[6], v[7]));                           \
    } else {                                                                                           \
      [[unroll]] for (uint i = 0; i < 8u; ++i)                                                         \
        if (d_first + i < p.D) T##_st(dt, e + i, v[i]);                                                \
    }                                                                                                  \
  }
STORE8_FN(8, Y)
STORE8_FN(9, Z)

// Chunk c of a [rows][DMAX] tile: its row and first dim, and how many of its 8 dims exist (D <= DMAX).
void tile_chunk(uint c, out uint r, out uint d0, out uint n) {
  r = c / (DMAX / 8u);
  d0 = (c % (DMAX / 8u)) * 8u;
  n = d0 < p.D ? min(8u, p.D - d0) : 0u;
}

// Where chunk c of a [rows][DMAX] tile goes in an operand tile (uvec4 units).
uint tile_at(uint c) { return (c / (DMAX / 8u)) * DS + c % (DMAX / 8u); }

// Stores 8 f32 as f16 into an operand-style tile row (uvec4 units).
uvec4 f16x8_of(vec4 a, vec4 b) {
  return uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw), packHalf2x16(b.xy), packHalf2x16(b.zw));
}

// The fragment layout the register-softmax kernels (*_rs.comp) take: mma_layout.glsl (frag_row / frag_col).
float quad_max(float x) {
  x = max(x, subgroupShuffleXor(x, 1u));
  return max(x, subgroupShuffleXor(x, 2u));
}
float quad_sum(float x) {
  x += subgroupShuffleXor(x, 1u);
  return x + subgroupShuffleXor(x, 2u);
}

// Row maximum / sum over the two lanes that share a row.
float pair_max(float x) { return max(x, subgroupShuffleXor(x, 16u)); }
float pair_sum(float x) { return x + subgroupShuffleXor(x, 16u); }

// The *_rs kernels apply the element-wise masks in a loop of their own behind one branch (`if (!(whole[0] &&
// whole[1]))`), after computing every element as if visible: with `whole[h] || visible(...)` per element the
// compiler evaluated visible() and its shared-memory loads for every element (H100, Llama-3.2-1B heads: dK/dV 1.48
// ms instead of 1.68, dQ 0.74 instead of 0.86).
// Whether the causal and window bounds clear keys [j_first, j_last] for queries at positions
// qpos_first..qpos_last. With a block-wide vote that all its keys (or rows) are usable and of one document, this
// saves the element-wise masks (nearly half the forward's time) everywhere off the diagonal and document edges.
bool bounds_clear(int j_first, int j_last, int qpos_first, int qpos_last) {
  if (causal() && j_last > qpos_first) return false;
  return p.window <= 0 || qpos_last - j_first < p.window;
}

shared bool vote_s[2];
shared int vote_doc_s[2];
// Subgroup `slot` (0 or 1) votes whether `ok` holds on all its lanes and `doc` is one value across them.
void vote(uint slot, bool ok, int doc) {
  bool plain = subgroupAll(ok) && subgroupAllEqual(doc);
  if (gl_SubgroupInvocationID == 0u) {
    vote_s[slot] = plain;
    vote_doc_s[slot] = doc;
  }
}
// After a barrier: whether the `slots` votes all passed with one document, and that document.
bool voted(uint slots, out int doc) {
  doc = vote_doc_s[0];
  return vote_s[0] && (slots < 2u || (vote_s[1] && vote_doc_s[1] == doc));
}

// The key-block loops of the forward and dQ kernels (both families) start with this: K and V rows jb .. jb + BC
// into kv_s (all loads in flight before the stores), a usable / document flag per key (a lane of subgroup 0 each,
// BC <= 32; lanes past BC repeat the last key, which leaves the vote as it is) into key_ok / key_doc, and the
// block's vote: keys_plain says every key is usable and of document block_doc. Declares key_in, kdoc, block_doc
// and keys_plain.
#define STAGE_KEY_BLOCK(jb)                                                                              \
    LOAD_CHUNKS(NCH, wk, K, 1, uint(jb) + r < p.S, k_at(b, min(uint(jb) + r, p.S - 1u), kv, d0))     \
    LOAD_CHUNKS(NCH, wv, V, 2, uint(jb) + r < p.S, v_at(b, min(uint(jb) + r, p.S - 1u), kv, d0))     \
    const uint kj = uint(jb) + min(lane, BC - 1u);                                                   \
    const bool key_in = int(kj) < keys.y && key_usable(b, kj);                                       \
    const int kdoc = kj < p.S ? doc_of(b, kj) : 0;                                                   \
    barrier();                                                                                       \
    STORE_CHUNKS(NCH, wk, 1, kv_s, 0u, uint(jb) + r < p.S)                                           \
    STORE_CHUNKS(NCH, wv, 2, kv_s, BC * DS, uint(jb) + r < p.S)                                      \
    if (sg == 0u) {                                                                                  \
      if (lane < BC) {                                                                               \
        key_ok[lane] = key_in;                                                                       \
        key_doc[lane] = kdoc;                                                                        \
      }                                                                                              \
      vote(0u, key_in, kdoc);                                                                        \
    }                                                                                                \
    barrier();                                                                                       \
    int block_doc;                                                                                   \
    const bool keys_plain = voted(1u, block_doc);                                                   

// The forward and dQ kernels (both families) take their Q (and dQ's dO) rows into fragments through the K/V tile
// kv_s, 2 BC rows per pass; after a pass's barrier the subgroups that own its rows load their fragments.
// STAGE_Q_PASS(pass): forward pass `pass` of QPASS, Q rows q0 .. q0 + 2 BC. STAGE_Q_DO_PASS(pass): dQ pass `pass` of
// 2 QPASS, Q rows, then (pass >= QPASS) the same rows of dO. Rows past the problem are zero (their addresses are
// clamped into it). Both declare q0, STAGE_Q_DO_PASS also f_dt (the staged tensor's dtype field).
#define ROW_AT(AT, R0) AT(b, min((R0) + r, rows - 1u) / G, kv * G + min((R0) + r, rows - 1u) % G, d0)
#define LOAD_ROW_PAIR(T, F, AT, R0)                                                                     \
    LOAD_CHUNKS(NCH, wk, T, F, R0 + r < rows, ROW_AT(AT, R0))                                           \
    LOAD_CHUNKS(NCH, wv, T, F, R0 + BC + r < rows, ROW_AT(AT, R0 + BC))
#define STORE_ROW_PAIR(F, R0)                                                                           \
    STORE_CHUNKS(NCH, wk, F, kv_s, 0u, R0 + r < rows)                                                   \
    STORE_CHUNKS(NCH, wv, F, kv_s, BC * DS, R0 + BC + r < rows)
#define STAGE_Q_PASS(pass)                                                                              \
    const uint q0 = r0 + pass * 2u * BC;                                                                \
    LOAD_ROW_PAIR(Q, 0, q_at, q0)                                                                       \
    if (pass > 0u) barrier();                                                                           \
    STORE_ROW_PAIR(0, q0)                                                                               \
    barrier();
#define STAGE_Q_DO_PASS(pass)                                                                           \
    const uint q0 = r0 + (pass % QPASS) * 2u * BC;                                                      \
    if (pass < QPASS) {                                                                                 \
      LOAD_ROW_PAIR(Q, 0, q_at, q0)                                                                     \
    } else {                                                                                            \
      LOAD_ROW_PAIR(X, 3, x_at, q0)                                                                     \
    }                                                                                                   \
    if (pass > 0u) barrier();                                                                           \
    const uint f_dt = pass < QPASS ? 0u : 3u;                                                           \
    STORE_ROW_PAIR(f_dt, q0)                                                                            \
    barrier();

// The products of the _cm kernels whose second operand would be transposed, run transposed (see the top of this
// file): for each 16 rows nb of an operand tile of N rows, the product of those rows (A fragments, loaded row-major
// from TILE at uvec4 offset A_AT, an expression of nb and f) and the subgroup's fixed fragments B[f] over the head
// dim, stored transposed into the subgroup's f32 area (s_s from sbase on, stride SST). A names the A fragment.
#define TRANSPOSED_PRODUCT(N, A, TILE, A_AT, B)                                                          \
    [[unroll]] for (uint nb = 0; nb < N / 16u; ++nb) {                                                  \
      F32M acc = F32M(0.0);                                                                             \
      [[unroll]] for (uint f = 0; f < FD; ++f) {                                                        \
        F16M A;                                                                                         \
        coopMatLoadNV(A, TILE, A_AT, DS, false);                                                        \
        acc = coopMatMulAddNV(A, B[f], acc);                                                            \
      }                                                                                                 \
      coopMatStoreNV(acc, s_s, sbase + nb * 16u, SST, true);                                            \
    }

// The start of the tensor-core dK/dV kernels' main(): declares id (block_major_id), b, split, kv and j0 (the batch,
// the part of the rows, the kv head and the first of the workgroup's BC keys; key blocks count from the first,
// which the most rows see under a causal mask) and G (query heads per kv head).
#define KEY_BLOCK                                                                                       \
  const uvec3 id = block_major_id();                                                                    \
  const uint b = id.z / p.splits, split = id.z % p.splits, kv = id.y, j0 = id.x * BC;                   \
  const uint G = p.H / p.KV;

// The rows of the tensor-core dK/dV kernels: rows [queries.x G, row_end) may see keys j0 .. j0 + BC. Where few
// workgroups would run they are cut into p.splits parts (grid z = batch * splits): this workgroup takes rows
// [row_begin, split_end), whole blocks of BR, and writes f32 partial dK and dV from out_shift on
// (flash_attention_bwd_sum.comp adds them up). Declares queries, row_end, chunk, row_begin, split_end, out_shift.
#define SPLIT_ROWS                                                                                      \
  const ivec2 queries = query_range(j0, min(j0 + BC, p.S) - 1u);                                        \
  const uint row_end = uint(queries.y) * G;                                                             \
  const uint chunk = (row_end - uint(queries.x) * G + p.splits * BR - 1u) / (p.splits * BR) * BR;       \
  const uint row_begin = min(uint(queries.x) * G + split * chunk, row_end);                             \
  const uint split_end = min(row_end, row_begin + chunk);                                               \
  const uint out_shift = split * (gl_NumWorkGroups.z / p.splits) * p.S * p.KV * p.D;

void subgroup_sync() {
  subgroupMemoryBarrierShared();
  subgroupBarrier();
}

#endif
