#version 450
// Matrix-vector products for decode: C [rows, N] = alpha A [rows, K] W [N, K]ᵀ for at most 4 rows, any float
// dtypes, f32 sums. A weight row is read once, as 16-byte loads (8 elements of a 16-bit type, two loads of f32):
// the product is bound by the weights' bytes, so tensor cores or shared-memory tiles would only add waste at
// rows <= 4. A workgroup of 4 subgroups (its size is specialization constant 0) takes COLS columns (weight rows),
// one subgroup per column at a time: its invocations stride K by 8 x the subgroup size, four loads in flight
// each, and meet in a subgroupAdd (no shared memory, no barrier). The host takes this kernel
// (matmul_plan.cpp) on devices with subgroup arithmetic when K, the row strides and offsets are multiples of 8.
// With a low-rank addend (FLAG_LOW_RANK: C = A Wᵀ + lr_alpha U Vᵀ, U [rows, R], V [N, R], a LoRA adapter's
// s x Aᵀ and B) each subgroup adds its column's R terms to its sums before the subgroupAdd: the adapter costs R
// more loads per column, not a product and an add pass of its own. With FLAG_ADDEND, E [rows, N] (row stride 0:
// a bias row) is added to the sums as they are written (a bias, or the decoder's residual stream). With FLAG_GATED
// (the decoder's gate and up projections as one weight [2F, K], C [rows, F]) a subgroup takes weight rows n and
// n + F and writes act(gate) * up, gate and up rounded to C's type first, as the product and the gated activation
// (elementwise/gated_activation.comp) would compute them one after the other.
// With FLAG_BY_ID (ops::matmul_by_id: a mixture of experts' products in decoding, routed on the device) W is a
// stack of `matrices` weights `w_ms` elements apart and C row r (workgroup z) is A row r / a_div times the matrix
// ids[r] names (clamped to the stack): one row per workgroup, no host round trip for the routing.
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#include "common/common.glsl"
#include "elementwise/unary_ops.glsl"

layout(local_size_x_id = 0) in;

TENSOR(0, A)
TENSOR4(0, A)
TENSOR(1, W)
TENSOR4(1, W)
TENSOR(2, C)
TENSOR(3, U)
TENSOR(4, V)
TENSOR(5, E)
TENSOR(6, ID)

layout(push_constant) uniform GemvParams {
  uint N, K, rows;
  uint a_off, a_rs;  // A's element offset and row stride
  uint w_off, w_rs;  // W's element offset and row stride (unit stride along K)
  uint c_off;        // C is [rows, N], contiguous
  uint dtypes;       // A | W << 4 | C << 8 | U << 12 | V << 16 | E << 20 (read as DTYPES below)
  float alpha;
  uint flags;        // (read as FLAGS below)
  uint R;            // the addend's rank
  uint u_off, u_rs;  // U's element offset and row stride (unit stride along R)
  uint v_off, v_rs;  // V's element offset and row stride (unit stride along R)
  float lr_alpha;
  uint e_off, e_rs;  // E's element offset and row stride (0: one row for all)
  uint act;          // FLAG_GATED: the gate's activation (UnaryOp code: 8 silu, 9 gelu_tanh, 10 gelu_erf)
  uint w_ms, id_off, a_div, matrices;  // FLAG_BY_ID: W's matrix stride, ids' offset, C rows per A row, stack size
} p;

const uint FLAG_LOW_RANK = 1u, FLAG_ADDEND = 2u, FLAG_GATED = 4u, FLAG_BY_ID = 8u;
// The dtypes and flags as specialization constants 3 and 4 (the host passes the push constants' values, which
// the kernel does not read): a pipeline per combination, compiled without the dtype switches and the terms it
// lacks (bench/RESULTS.md: a decode step's small products are bound by their code's length).
layout(constant_id = 3) const uint DTYPES = 0u;
layout(constant_id = 4) const uint FLAGS = 0u;

layout(constant_id = 1) const uint COLS = 4u;    // columns per workgroup (without split-K)
layout(constant_id = 2) const uint KSPLIT = 1u;  // 1, or the subgroups of a workgroup (4): they share one column
// MAXR: the most rows this variant takes (matmul_plan.cpp's kGemvMaxRows; the _r1 variant one). Sums of rows a
// call cannot have still cost registers, and fewer registers per invocation leave room for more loads in flight
// per SM (bench/RESULTS.md: a one-row probe of this kernel beat it on every decode shape of the H100).
#ifndef GEMV_ROWS
#define GEMV_ROWS 4
#endif
const uint MAXR = GEMV_ROWS, UNROLL = 4u;

// Split-K: with few columns and a long K (a LoRA adapter's x Aᵀ: 16 columns of 4096 or 14336) one subgroup per
// column would leave the GPU idle and walk K alone; there a workgroup takes one column, its subgroups take
// interleaved stretches of K, and their sums meet in shared memory.
shared float partial[KSPLIT][MAXR];

// Column wn's sums of every row, the low-rank terms and alpha included, met over the subgroup (with split-K over
// the workgroup: then valid in subgroup 0). W's matrix starts at w_base, A's first row at a_base.
void column_sums(uint wn, uint sub, uint nr, uint w_base, uint a_base, out float acc[MAXR]) {
  const uint lane = gl_SubgroupInvocationID;
  const uint step = gl_SubgroupSize * 8u * KSPLIT;  // K between one invocation's consecutive loads
  const uint adt = DTYPES & 15u, wdt = (DTYPES >> 4) & 15u;
  float low[MAXR];
  [[unroll]] for (uint r = 0u; r < MAXR; ++r) acc[r] = low[r] = 0.0;
  // The low-rank terms' first loads go out before the weight row streams and are used after it (R <= the
  // subgroup's width: no other load).
  const bool lr = (FLAGS & FLAG_LOW_RANK) != 0u;
  const uint udt = (DTYPES >> 12) & 15u, vdt = (DTYPES >> 16) & 15u;
  const uint j0 = sub * gl_SubgroupSize + lane, jstep = gl_SubgroupSize * KSPLIT;
  float v0 = 0.0, u0[MAXR];
  [[unroll]] for (uint r = 0u; r < MAXR; ++r) u0[r] = 0.0;
  if (lr && j0 < p.R) {
    v0 = V_ld(vdt, p.v_off + wn * p.v_rs + j0);
    [[unroll]] for (uint r = 0u; r < MAXR; ++r) {
      if (r >= nr) break;
      u0[r] = U_ld(udt, p.u_off + r * p.u_rs + j0);
    }
  }
  const uint wrow = w_base + wn * p.w_rs, arow = a_base;
  for (uint k0 = (sub * gl_SubgroupSize + lane) * 8u; k0 < p.K; k0 += step * UNROLL) {
    vec4 lo[UNROLL], hi[UNROLL];
    [[unroll]] for (uint u = 0u; u < UNROLL; ++u) {  // the loads first: UNROLL x 16 bytes in flight
      lo[u] = vec4(0.0);
      hi[u] = vec4(0.0);
      if (k0 + u * step < p.K) W_ld8(wdt, wrow + k0 + u * step, lo[u], hi[u]);
    }
    [[unroll]] for (uint u = 0u; u < UNROLL; ++u) {
      const uint k = k0 + u * step;
      if (k >= p.K) break;
      [[unroll]] for (uint r = 0u; r < MAXR; ++r) {
        if (r >= nr) break;
        vec4 alo, ahi;
        A_ld8(adt, arow + r * p.a_rs + k, alo, ahi);
        acc[r] += dot(alo, lo[u]) + dot(ahi, hi[u]);
      }
    }
  }
  if (lr) {
    [[unroll]] for (uint r = 0u; r < MAXR; ++r) low[r] = u0[r] * v0;
    for (uint j = j0 + jstep; j < p.R; j += jstep) {
      const float vj = V_ld(vdt, p.v_off + wn * p.v_rs + j);
      [[unroll]] for (uint r = 0u; r < MAXR; ++r) {
        if (r >= nr) break;
        low[r] += U_ld(udt, p.u_off + r * p.u_rs + j) * vj;
      }
    }
  }
  [[unroll]] for (uint r = 0u; r < MAXR; ++r) acc[r] = p.alpha * acc[r] + p.lr_alpha * low[r];
  [[unroll]] for (uint r = 0u; r < MAXR; ++r) acc[r] = subgroupAdd(acc[r]);
  if (KSPLIT > 1u) {  // wn is the same for the whole workgroup here: the barriers are in uniform control flow
    barrier();        // an earlier call's reads of `partial` are done
    if (lane == 0u) {
      [[unroll]] for (uint r = 0u; r < MAXR; ++r) partial[sub][r] = acc[r];
    }
    barrier();
    [[unroll]] for (uint r = 0u; r < MAXR; ++r) {
      acc[r] = 0.0;
      [[unroll]] for (uint i = 0u; i < KSPLIT; ++i) acc[r] += partial[i][r];
    }
  }
}

// A sum as the separate product would have stored it (the gated activation reads the rounded gate and up).
float rounded(uint dt, float v) { return decode(dt, encode(dt, v)); }

void main() {
  const uint lane = gl_SubgroupInvocationID;
  const uint sub = KSPLIT > 1u ? gl_SubgroupID : 0u;  // this subgroup's share of K
  const uint cdt = (DTYPES >> 8) & 15u, edt = (DTYPES >> 20) & 15u;
  const bool gated = (FLAGS & FLAG_GATED) != 0u, addend = (FLAGS & FLAG_ADDEND) != 0u;
  const uint nout = gated ? p.N / 2u : p.N;  // C's columns
  uint nr = min(MAXR, p.rows), w_base = p.w_off, a_base = p.a_off, c_base = p.c_off;
  if ((FLAGS & FLAG_BY_ID) != 0u) {
    const uint r = gl_WorkGroupID.z, id = min(ID_w[p.id_off + r], p.matrices - 1u);  // a negative id clamps too
    nr = 1u, w_base += id * p.w_ms, a_base += (r / p.a_div) * p.a_rs, c_base += r * nout;
  }
  const uint cols = KSPLIT > 1u ? 1u : COLS;
  // Rows of at most 65535 workgroups in y (a vocabulary of 262144 takes 65536 workgroups of 4 columns).
  const uint group = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  const uint n_end = min(nout, (group + 1u) * cols);
  const uint n_first = group * cols + (KSPLIT > 1u ? 0u : gl_SubgroupID);
  for (uint n = n_first; n < n_end; n += KSPLIT > 1u ? 1u : gl_NumSubgroups) {
    float acc[MAXR], up[MAXR];
    column_sums(n, sub, nr, w_base, a_base, acc);
    if (gated) column_sums(n + nout, sub, nr, w_base, a_base, up);
    if (KSPLIT > 1u && sub != 0u) continue;
    [[unroll]] for (uint r = 0u; r < MAXR; ++r) {
      if (r >= nr) break;
      float sum = acc[r];
      if (addend) sum += E_ld(edt, p.e_off + r * p.e_rs + n);
      if (gated) {
        const float u = up[r] + (addend ? E_ld(edt, p.e_off + r * p.e_rs + n + nout) : 0.0);
        sum = unary_op(p.act, rounded(cdt, sum), 0.0) * rounded(cdt, u);
      }
      if (lane == 0u) C_st(cdt, c_base + r * nout + n, sum);
    }
  }
}
