// NF4 (included by quant_block.glsl): 256-element blocks of 136 bytes, f32 d, u8 scale[4], u8 qs[128]. Sub-block i
// (64 elements) has absmax d * scale[i]; its element j is absmax * NF4[code], code = qs[32 i + j] & 15 for j < 32
// and qs[32 i + j - 32] >> 4 for j >= 32 (src/core/quant.h). The levels are bitsandbytes' create_normal_map,
// as lmtune::quant::kNf4Levels.
#define QK 256u
#define QB 136u
const float kNf4[16] = float[16](-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                                 -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                                 0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
                                 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                                 0.7229568362236023, 1.0);
// The levels in shared memory: the constant array indexed by each lane's own code serialized on NVIDIA's constant
// cache (the decoder of the panel route ran at a quarter of the memory bandwidth, q4_k's at half).
shared float q_levels[16];
#define Q_PREPARE()                                                                  \
  {                                                                                  \
    for (uint q_i = gl_LocalInvocationIndex; q_i < 16u; q_i += gl_WorkGroupSize.x) \
      q_levels[q_i] = kNf4[q_i];                                                     \
    barrier();                                                                       \
  }
void dequant8(uint blk, uint g, out vec4 lo, out vec4 hi) {
  const uint i = g >> 3, j = (g & 7u) * 8u;
  const float absmax = uintBitsToFloat(qw[blk >> 2]) * float(q_byte(blk + 4u + i));
  const uvec2 w = q_words8(blk + 8u + 32u * i + (j & 31u));
  const uint sh = j >= 32u ? 4u : 0u;
  float v[8];
  [[unroll]] for (uint e = 0u; e < 8u; ++e) v[e] = absmax * q_levels[(q_byte8(w, e) >> sh) & 15u];
  lo = vec4(v[0], v[1], v[2], v[3]);
  hi = vec4(v[4], v[5], v[6], v[7]);
}
