#version 450
// Reports how the device lays out 16x16 cooperative-matrix fragments (flash_attention.cpp:
// fragment_layout_is_mma): out[l * 8 + e] is r * 16 + c for element e of lane l of an f32 fragment loaded from
// the matrix whose (r, c) entry is r * 16 + c, out[256 + l * 8 + e] the same for an f16 fragment (-1 past a lane's
// elements), and out[512] is 1 where that f32 fragment, put element by element into an f16 one used as the A
// operand of a product with the identity, comes back unchanged (what the register-softmax kernels do with P);
// out[513] the same for the f16 fragment used as the B operand (what matmul_skinny.comp does with B).
#extension GL_KHR_memory_scope_semantics : enable
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : enable
#extension GL_KHR_shader_subgroup_vote : enable

layout(local_size_x = 32) in;
layout(set = 0, binding = 0) writeonly buffer Out { int o[]; };

shared float f32s[256];
shared float back[256];
shared uvec4 h16[32];  // f16 [16][16], 8 per uvec4
shared uvec4 eye[32];

void main() {
  const uint lane = gl_LocalInvocationID.x;
  for (uint i = lane; i < 256u; i += 32u) f32s[i] = float(i);
  const uint r = lane / 2u, c0 = (lane % 2u) * 8u;
  uvec4 w, e;
  for (uint q = 0; q < 4u; ++q) {
    const uint c = c0 + 2u * q;
    w[q] = packHalf2x16(vec2(float(r * 16u + c), float(r * 16u + c + 1u)));
    e[q] = packHalf2x16(vec2(r == c ? 1.0 : 0.0, r == c + 1u ? 1.0 : 0.0));
  }
  h16[lane] = w;
  eye[lane] = e;
  barrier();

  fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> a;
  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> b, pa, id;
  coopMatLoadNV(a, f32s, 0u, 16u, false);
  coopMatLoadNV(b, h16, 0u, 2u, false);
  for (uint i = 0; i < 8u; ++i) {
    o[lane * 8u + i] = i < a.length() ? int(a[i]) : -1;
    o[256u + lane * 8u + i] = i < b.length() ? int(b[i]) : -1;
  }
  for (uint i = 0; i < pa.length(); ++i) pa[i] = float16_t(a[i]);
  coopMatLoadNV(id, eye, 0u, 2u, false);
  coopMatStoreNV(coopMatMulAddNV(pa, id, fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0)), back, 0u, 16u, false);
  barrier();
  bool same = true;
  for (uint i = lane; i < 256u; i += 32u) same = same && back[i] == float(i);
  same = subgroupAll(same);
  if (lane == 0u) o[512] = same ? 1 : 0;
  barrier();
  coopMatStoreNV(coopMatMulAddNV(id, pa, fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0)), back, 0u, 16u, false);
  barrier();
  same = true;
  for (uint i = lane; i < 256u; i += 32u) same = same && back[i] == float(i);
  same = subgroupAll(same);
  if (lane == 0u) o[513] = same ? 1 : 0;
}
