#version 450
// Tiled shared-memory GEMM with f32 accumulation: runs on every Vulkan device (lavapipe included).
// C = A x B per batch (+ alpha U V, see matmul_common.glsl for the addressing). A, B: f32, f16 or bf16 (any strides; the
// dtype is a push constant, 16-bit types are read as halves of 32-bit words, so no 16-bit storage is needed
// for the inputs); C: f32, f16 or bf16, contiguous. PACKED16 (devices without 16-bit storage) writes 16-bit
// outputs with atomic and/or on their 32-bit word, since neighbouring threads may own its other half.
//
// Workgroup tile BM x BN, K step BK, each of the NT = (BM/TM)(BN/TN) threads owns TM x TN outputs spread as
// 4-wide groups over the tile (so shared reads are vec4 and conflict-free). Tiles are specialization
// constants: the host picks 128x128/8x8 for big GPUs and smaller ones for small problems or CPU devices.
// Shared memory is double-buffered (2 * BK * (BM + BN) floats: 16 KiB at 128x128x8) and the next K tile
// is prefetched into registers while the current one is multiplied, so there is one barrier per K step.
// Edges (M, N, K not multiples of the tile) are zero-filled when staging and masked when storing.
#extension GL_EXT_control_flow_attributes : enable
#ifndef PACKED16
#extension GL_EXT_shader_16bit_storage : require
#endif

#include "matmul/matmul_common.glsl"

layout(local_size_x_id = 0) in;             // NT = (BM / TM) * (BN / TN), set by the host
layout(constant_id = 1) const uint BM = 64;
layout(constant_id = 2) const uint BN = 64;
layout(constant_id = 3) const uint BK = 16;
layout(constant_id = 4) const uint TM = 4;  // multiple of 4
layout(constant_id = 5) const uint TN = 4;  // multiple of 4
const uint RA = BM / TM;  // threads along m
const uint RB = BN / TN;  // threads along n
const uint NT = RA * RB;
const uint LA = BM * BK / NT;  // A elements staged per thread (the host keeps these integral)
const uint LB = BK * BN / NT;

layout(set = 0, binding = 0) readonly buffer ABuf { uint a32[]; };
layout(set = 0, binding = 1) readonly buffer BBuf { uint b32[]; };
layout(set = 0, binding = 3) readonly buffer UBuf { uint u32[]; };
layout(set = 0, binding = 4) readonly buffer VBuf { uint v32[]; };
#ifdef PACKED16
layout(set = 0, binding = 2) buffer CBuf { float c32[]; };
layout(set = 0, binding = 2) buffer CBufW { uint cw[]; };
#else
layout(set = 0, binding = 2) writeonly buffer CBuf { float c32[]; };
layout(set = 0, binding = 2) writeonly buffer CBuf16 { uint16_t c16[]; };
#endif

shared vec4 As[2 * BK * BM / 4];  // As[buf][k][m]
shared vec4 Bs[2 * BK * BN / 4];  // Bs[buf][k][n]

#define LOAD_FN(NAME, BUF, DTYPE)                                  \
  float NAME(uint e) {                                             \
    uint dt = DTYPE();                                             \
    if (dt == DT_F32) return uintBitsToFloat(BUF[e]);              \
    uint h = half_bits(BUF[e >> 1], e);                            \
    return dt == DT_F16 ? f16_bits_to_float(h) : bf16_bits_to_float(h); \
  }
LOAD_FN(load_a, a32, a_dtype)
LOAD_FN(load_b, b32, b_dtype)
LOAD_FN(load_u, u32, u_dtype)
LOAD_FN(load_v, v32, v_dtype)

float ra[LA];
float rb[LB];

// Element i of this thread's share of a tile: (row, col) within the tile. Consecutive threads walk the
// operand's contiguous dim so global loads coalesce.
void a_coord(uint idx, out uint m, out uint k) {
  if (pc.a_cs == 1u) { m = idx / BK; k = idx % BK; } else { k = idx / BM; m = idx % BM; }
}
void b_coord(uint idx, out uint k, out uint n) {
  if (pc.b_cs == 1u) { k = idx / BN; n = idx % BN; } else { n = idx / BK; k = idx % BK; }
}

void global_load(uint a_base, uint b_base, uint m0, uint n0, uint k0, uint kend, uint tid) {
  [[unroll]] for (uint i = 0; i < LA; ++i) {
    uint m, k;
    a_coord(tid + i * NT, m, k);
    bool ok = m0 + m < pc.M && k0 + k < kend;
    ra[i] = ok ? load_a(a_base + (m0 + m) * pc.a_rs + (k0 + k) * pc.a_cs) : 0.0;
  }
  [[unroll]] for (uint i = 0; i < LB; ++i) {
    uint k, n;
    b_coord(tid + i * NT, k, n);
    bool ok = n0 + n < pc.N && k0 + k < kend;
    rb[i] = ok ? load_b(b_base + (k0 + k) * pc.b_rs + (n0 + n) * pc.b_cs) : 0.0;
  }
}

void shared_store(uint buf, uint tid) {
  [[unroll]] for (uint i = 0; i < LA; ++i) {
    uint m, k;
    a_coord(tid + i * NT, m, k);
    As[(buf * BK + k) * (BM / 4) + m / 4][m % 4] = ra[i];
  }
  [[unroll]] for (uint i = 0; i < LB; ++i) {
    uint k, n;
    b_coord(tid + i * NT, k, n);
    Bs[(buf * BK + k) * (BN / 4) + n / 4][n % 4] = rb[i];
  }
}

void store_c(uint e, float v) {
  uint dt = c_dtype();
  if (dt == DT_F32) {
    c32[e] = v;
    return;
  }
  uint bits = dt == DT_F16 ? float_to_f16_bits(v) : float_to_bf16_bits(v);
#ifdef PACKED16
  uint sh = (e & 1u) << 4;
  atomicAnd(cw[e >> 1], ~(0xffffu << sh));
  atomicOr(cw[e >> 1], bits << sh);
#else
  c16[e] = uint16_t(bits);
#endif
}

void main() {
  uint tid = gl_LocalInvocationID.x;
  uint tx = tid % RB, ty = tid / RB;
  TILE_ORIGIN

  vec4 acc[TM][TN / 4];
  [[unroll]] for (uint i = 0; i < TM; ++i)
    [[unroll]] for (uint j = 0; j < TN / 4; ++j) acc[i][j] = vec4(0.0);

  uint ntiles = kend > kbeg ? (kend - kbeg + BK - 1) / BK : 0u;
  if (ntiles > 0u) {
    global_load(a_base, b_base, m0, n0, kbeg, kend, tid);
    shared_store(0u, tid);
  }
  barrier();
  for (uint t = 0; t < ntiles; ++t) {
    uint cur = t & 1u;
    if (t + 1u < ntiles) global_load(a_base, b_base, m0, n0, kbeg + (t + 1u) * BK, kend, tid);
    [[unroll]] for (uint k = 0; k < BK; ++k) {
      vec4 a[TM / 4];
      vec4 b[TN / 4];
      [[unroll]] for (uint i = 0; i < TM / 4; ++i) a[i] = As[(cur * BK + k) * (BM / 4) + i * RA + ty];
      [[unroll]] for (uint j = 0; j < TN / 4; ++j) b[j] = Bs[(cur * BK + k) * (BN / 4) + j * RB + tx];
      [[unroll]] for (uint i = 0; i < TM / 4; ++i)
        [[unroll]] for (uint r = 0; r < 4; ++r)
          [[unroll]] for (uint j = 0; j < TN / 4; ++j) acc[i * 4 + r][j] += a[i][r] * b[j];
    }
    if (t + 1u < ntiles) shared_store(cur ^ 1u, tid);
    barrier();
  }

  // The low-rank addend alpha U V, read straight from memory (R is small).
  for (uint k = 0; k < pc.R; ++k) {
    vec4 u[TM / 4];
    vec4 v[TN / 4];
    [[unroll]] for (uint i = 0; i < TM / 4; ++i)
      [[unroll]] for (uint r = 0; r < 4; ++r) {
        uint m = m0 + (i * RA + ty) * 4u + r;
        u[i][r] = m < pc.M ? pc.alpha * load_u(pc.u_off + m * pc.u_rs + k * pc.u_cs) : 0.0;
      }
    [[unroll]] for (uint j = 0; j < TN / 4; ++j)
      [[unroll]] for (uint c = 0; c < 4; ++c) {
        uint n = n0 + (j * RB + tx) * 4u + c;
        v[j][c] = n < pc.N ? load_v(pc.v_off + k * pc.v_rs + n * pc.v_cs) : 0.0;
      }
    [[unroll]] for (uint i = 0; i < TM / 4; ++i)
      [[unroll]] for (uint r = 0; r < 4; ++r)
        [[unroll]] for (uint j = 0; j < TN / 4; ++j) acc[i * 4 + r][j] += u[i][r] * v[j];
  }

  [[unroll]] for (uint i = 0; i < TM / 4; ++i)
    [[unroll]] for (uint r = 0; r < 4; ++r) {
      uint m = m0 + (i * RA + ty) * 4u + r;
      if (m >= pc.M) continue;
      [[unroll]] for (uint j = 0; j < TN / 4; ++j)
        [[unroll]] for (uint c = 0; c < 4; ++c) {
          uint n = n0 + (j * RB + tx) * 4u + c;
          if (n < pc.N) store_c(c_base + m * pc.N + n, acc[i * 4 + r][j][c]);
        }
    }
}
