#version 450
// GEMM on workgroup-scope cooperative matrices (VK_NV_cooperative_matrix2), the fastest product on NVIDIA: one
// workgroup per 128x256 tile of C = A B (+ U V, a LoRA adapter's low-rank addend), the operands read straight from
// the buffers through tensor layouts, the staging through shared memory left to the driver. Built with glslang 15
// (scripts/build_glslang.sh) for Vulkan 1.3, per operand type and C type:
// - the operand type is written float16_t; the bf16 builds turn the module's 16-bit float type into bfloat16
//   (cmake/spirv_bfloat16.cpp, SPV_KHR_bfloat16), so A, B and a 16-bit C are real bf16 and the tensor cores take
//   bf16 operands as they are (no rounding to f16, no f16 range limit);
// - C32: C is f32, else C has the operands' type.
// TB = 1: B is given transposed (stored [N, K], a linear layer's weight), read through a transposing view.
// The addend's U [M, R] and V (laid out as B, R rows) are 16-bit, f16 or bf16 (flag 1), in either build: a decode
// function reads them as raw 16-bit words. Tiles inside the problem take unclamped layouts and a K loop unrolled
// 16 times (the driver pipelines the loads across the unrolled steps: 4096^3 at 232 / 267 / 292 / 307 TFLOP/s
// for 2 / 4 / 8 / 16 steps on the H100); edge tiles and the last partial K step read through clamped layouts,
// zero outside the matrices, and edge stores drop what lies outside C.
// GROUPED = 1: the experts' products of a mixture-of-experts layer in one dispatch (ops::grouped_matmul). The rows
// of A come in groups, group g's rows times matrix g of a stacked B [G, K, N] (TB: [G, N, K]), g * b_gs elements
// after b_off. Workgroup row y takes tiles[y] = (first row, end of its group's rows, g): each group's last tile
// reads zeros and stores nothing past its group's end. No addend.
// OUTER = 1: the stacked weight's gradient of those products (GroupedOuter): C[g] = A_gᵀ B_g over the rows of
// group g, A [R, M] and B [R, N] row-major, C [G, M, N] (b_gs = M N apart). Workgroup (x, y, z) takes the 128x256
// tile (y, x) of C[z]; tiles[z] = (first row, end row) of group z: the K loop runs over those rows only, zero for
// an empty group. No addend.
#extension GL_EXT_control_flow_attributes : enable
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require
#extension GL_KHR_memory_scope_semantics : enable
#extension GL_KHR_cooperative_matrix : enable
#extension GL_NV_cooperative_matrix2 : enable
#extension GL_EXT_buffer_reference : enable

#ifndef TB
#define TB 0
#endif
#ifndef C32
#define C32 0
#endif
#ifndef GROUPED
#define GROUPED 0
#endif
#ifndef OUTER
#define OUTER 0
#endif
const uint BM = 128, BN = 256, BK = 32, UNROLL = 16;
layout(local_size_x = 256) in;

// Mirrored by Cm2Params in src/backend/vulkan/matmul_cm2.cpp. Offsets and row strides in elements; row strides
// and offsets of A, B and C are multiples of 8 (16-byte rows, which the layouts below assume).
layout(push_constant) uniform Cm2Params {
  uint M, N, K;
  uint a_off, a_rs;  // A [M, K]
  uint b_off, b_rs;  // B [K, N], or with TB its transpose [N, K]
  uint c_off, c_rs;  // C [M, N]
  uint u_off, u_rs, v_off, v_rs, R;  // U [M, R], V [R, N] (with TB [N, R]); R = 0: no addend
  uint flags;        // 1: U and V are bf16 (else f16)
  uint b_gs;         // GROUPED: elements from one matrix of B to the next
} p;

layout(binding = 0) readonly buffer ABuf { float16_t a[]; };
layout(binding = 1) readonly buffer BBuf { float16_t b[]; };
#if C32
layout(binding = 2) writeonly buffer CBuf { float c[]; };
#else
layout(binding = 2) writeonly buffer CBuf { float16_t c[]; };
#endif
#if GROUPED || OUTER
layout(binding = 3) readonly buffer Tiles { uvec4 tiles[]; };
#else
layout(binding = 3) readonly buffer UBuf { uint16_t u[]; };
layout(binding = 4) readonly buffer VBuf { uint16_t v[]; };
#endif

#if !GROUPED && !OUTER
layout(buffer_reference, std430, buffer_reference_align = 2) buffer Word16 { uint16_t w[]; };
float16_t decode_addend(const in Word16 bl, const in uint block[2], const in uint in_block[2]) {
  const uint h = uint(bl.w[0]);
  return float16_t((p.flags & 1u) != 0u ? uintBitsToFloat(h << 16) : unpackHalf2x16(h).x);
}
#endif

#define ACC coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>
#define MAT_A coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB>
#define CLAMP gl_CooperativeMatrixClampModeConstantNV

// One K step at k through layouts LA and LB.
#if TB
#define STEP(LA, LB, K0)                                                                   \
  {                                                                                        \
    MAT_A ma;                                                                              \
    MAT_B mb;                                                                              \
    coopMatLoadTensorNV(ma, a, a_off, sliceTensorLayoutNV(LA, m0, BM, (K0), BK));        \
    coopMatLoadTensorNV(mb, b, b_off, sliceTensorLayoutNV(LB, n0, BN, (K0), BK), trans); \
    acc = coopMatMulAdd(ma, mb, acc);                                                      \
  }
#else
#define STEP(LA, LB, K0)                                                                   \
  {                                                                                        \
    MAT_A ma;                                                                              \
    MAT_B mb;                                                                              \
    coopMatLoadTensorNV(ma, a, a_off, sliceTensorLayoutNV(LA, m0, BM, (K0), BK));        \
    coopMatLoadTensorNV(mb, b, b_off, sliceTensorLayoutNV(LB, (K0), BK, n0, BN));        \
    acc = coopMatMulAdd(ma, mb, acc);                                                      \
  }
#endif

#if OUTER
void main() {
  const uint n0 = gl_WorkGroupID.x * BN, m0 = gl_WorkGroupID.y * BM, g = gl_WorkGroupID.z;
  const uint begin = tiles[g].x, end = tiles[g].y;
  const uint a_rs = p.a_rs & ~7u, b_rs = p.b_rs & ~7u, c_rs = p.c_rs & ~7u;
  const uint a_off = p.a_off & ~7u, b_off = p.b_off & ~7u, c_off = (p.c_off + g * p.b_gs) & ~7u;
  tensorViewNV<2, false, 1, 0> trans = createTensorViewNV(2, false, 1, 0);
  // Rows past the group's end read as zeros: the last K step may be partial.
  tensorLayoutNV<2, CLAMP> la = createTensorLayoutNV(2, CLAMP), lb = createTensorLayoutNV(2, CLAMP);
  la = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(la, end, p.M), a_rs, 1);
  lb = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(lb, end, p.N), b_rs, 1);
  ACC acc = ACC(0.0);
  uint k = begin;
  for (; k + 4u * BK <= end; k += 4u * BK)
    [[unroll]] for (uint s = 0; s < 4u; ++s) {
      MAT_A ma;
      MAT_B mb;
      coopMatLoadTensorNV(ma, a, a_off, sliceTensorLayoutNV(la, k + s * BK, BK, m0, BM), trans);
      coopMatLoadTensorNV(mb, b, b_off, sliceTensorLayoutNV(lb, k + s * BK, BK, n0, BN));
      acc = coopMatMulAdd(ma, mb, acc);
    }
  for (; k < end; k += BK) {
    MAT_A ma;
    MAT_B mb;
    coopMatLoadTensorNV(ma, a, a_off, sliceTensorLayoutNV(la, k, BK, m0, BM), trans);
    coopMatLoadTensorNV(mb, b, b_off, sliceTensorLayoutNV(lb, k, BK, n0, BN));
    acc = coopMatMulAdd(ma, mb, acc);
  }
  tensorLayoutNV<2, CLAMP> lc = createTensorLayoutNV(2, CLAMP);
  lc = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(lc, p.M, p.N), c_rs, 1);
  coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> c16 =
      coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(acc);
  coopMatStoreTensorNV(c16, c, c_off, sliceTensorLayoutNV(lc, m0, BM, n0, BN));
}
#else
void main() {
  const uint n0 = gl_WorkGroupID.x * BN;
  // 16-byte aligned rows and starts (the host checks them), in a form the compiler can see.
  const uint a_rs = p.a_rs & ~7u, b_rs = p.b_rs & ~7u, c_rs = p.c_rs & ~7u;
  const uint a_off = p.a_off & ~7u, c_off = p.c_off & ~7u;
#if GROUPED
  const uvec4 tile = tiles[gl_WorkGroupID.y];
  const uint m0 = tile.x, M = tile.y, b_off = (p.b_off + tile.z * p.b_gs) & ~7u;
#else
  const uint m0 = gl_WorkGroupID.y * BM, M = p.M, b_off = p.b_off & ~7u;
#endif
  tensorViewNV<2, false, 1, 0> trans = createTensorViewNV(2, false, 1, 0);

  tensorLayoutNV<2> la = createTensorLayoutNV(2), lb = createTensorLayoutNV(2);
  tensorLayoutNV<2, CLAMP> lac = createTensorLayoutNV(2, CLAMP), lbc = createTensorLayoutNV(2, CLAMP);
  la = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(la, M, p.K), a_rs, 1);
  lac = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(lac, M, p.K), a_rs, 1);
#if TB
  lb = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(lb, p.N, p.K), b_rs, 1);
  lbc = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(lbc, p.N, p.K), b_rs, 1);
#else
  lb = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(lb, p.K, p.N), b_rs, 1);
  lbc = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(lbc, p.K, p.N), b_rs, 1);
#endif

  ACC acc = ACC(0.0);
  const uint kfull = p.K & ~(BK - 1u);
  uint k = 0;
  if (m0 + BM <= M && n0 + BN <= p.N) {
    for (; k + UNROLL * BK <= kfull; k += UNROLL * BK)
      [[unroll]] for (uint s = 0; s < UNROLL; ++s) STEP(la, lb, k + s * BK)
    for (; k + 4u * BK <= kfull; k += 4u * BK)
      [[unroll]] for (uint s = 0; s < 4u; ++s) STEP(la, lb, k + s * BK)
    for (; k < kfull; k += BK) STEP(la, lb, k)
  } else {
    for (; k + 4u * BK <= kfull; k += 4u * BK)
      [[unroll]] for (uint s = 0; s < 4u; ++s) STEP(lac, lbc, k + s * BK)
    for (; k < kfull; k += BK) STEP(lac, lbc, k)
  }
  if (k < p.K) STEP(lac, lbc, k)  // the last partial K step, zero past K

#if !GROUPED
  // The addend, R a multiple of 8: steps of BK over R, zero past R.
  if (p.R > 0u) {
    tensorLayoutNV<2, CLAMP> lu = createTensorLayoutNV(2, CLAMP), lv = createTensorLayoutNV(2, CLAMP);
    lu = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(lu, p.M, p.R), p.u_rs & ~7u, 1);
#if TB
    lv = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(lv, p.N, p.R), p.v_rs & ~7u, 1);
#else
    lv = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(lv, p.R, p.N), p.v_rs & ~7u, 1);
#endif
    for (uint r = 0; r < p.R; r += BK) {
      MAT_A mu;
      MAT_B mv;
      coopMatLoadTensorNV(mu, u, p.u_off & ~7u, sliceTensorLayoutNV(lu, m0, BM, r, BK), decode_addend);
#if TB
      coopMatLoadTensorNV(mv, v, p.v_off & ~7u, sliceTensorLayoutNV(lv, n0, BN, r, BK), trans, decode_addend);
#else
      coopMatLoadTensorNV(mv, v, p.v_off & ~7u, sliceTensorLayoutNV(lv, r, BK, n0, BN), decode_addend);
#endif
      acc = coopMatMulAdd(mu, mv, acc);
    }
  }
#endif

  tensorLayoutNV<2, CLAMP> lc = createTensorLayoutNV(2, CLAMP);
  lc = setTensorLayoutStrideNV(setTensorLayoutDimensionNV(lc, M, p.N), c_rs, 1);
#if C32
  coopMatStoreTensorNV(acc, c, c_off, sliceTensorLayoutNV(lc, m0, BM, n0, BN));
#else
  coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> c16 =
      coopmat<float16_t, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(acc);
  coopMatStoreTensorNV(c16, c, c_off, sliceTensorLayoutNV(lc, m0, BM, n0, BN));
#endif
}
#endif
