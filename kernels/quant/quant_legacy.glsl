// GGUF's 32-element formats (included by quant_block.glsl): q8_0 (f16 d, int8 q[32]; x = d q) and q4_0 (f16 d,
// u8 qs[16]; x[j] = d ((qs[j] & 15) - 8), x[j + 16] = d ((qs[j] >> 4) - 8)).
#define QK 32u
#if QFORMAT == 0
#define QB 34u
void dequant8(uint blk, uint g, out vec4 lo, out vec4 hi) {
  const float d = q_f16(blk);
  const uvec2 w = q_words8(blk + 2u + 8u * g);
  lo = d * vec4(bitfieldExtract(int(w.x), 0, 8), bitfieldExtract(int(w.x), 8, 8), bitfieldExtract(int(w.x), 16, 8),
                bitfieldExtract(int(w.x), 24, 8));
  hi = d * vec4(bitfieldExtract(int(w.y), 0, 8), bitfieldExtract(int(w.y), 8, 8), bitfieldExtract(int(w.y), 16, 8),
                bitfieldExtract(int(w.y), 24, 8));
}
#else
#define QB 18u
void dequant8(uint blk, uint g, out vec4 lo, out vec4 hi) {
  const float d = q_f16(blk);
  // Groups 0 and 1 are the low nibbles of bytes 0..15, groups 2 and 3 their high nibbles.
  const uvec2 w = q_words8(blk + 2u + 8u * (g & 1u));
  const uint sh = (g >> 1) * 4u;
  float v[8];
  [[unroll]] for (uint i = 0u; i < 8u; ++i) v[i] = d * (float((q_byte8(w, i) >> sh) & 15u) - 8.0);
  lo = vec4(v[0], v[1], v[2], v[3]);
  hi = vec4(v[4], v[5], v[6], v[7]);
}
#endif
