// GGUF's k-quants (included by quant_block.glsl), 256-element super-blocks as ggml's ggml-common.h and
// dequantize_row_q*_K define them:
//   q4_k (144 bytes): f16 d, f16 dmin, u8 scales[12], u8 qs[128]; sub-block s (32 elements) has 6-bit scale sc and
//     min m (kscale); x = d sc q - dmin m with q the low (even s) or high (odd s) nibbles of qs[32 (s / 2) + l].
//   q5_k (176 bytes): as q4_k with u8 qh[32] before qs; bit s of qh[l] adds 16 to q.
//   q6_k (210 bytes): u8 ql[128], u8 qh[64], int8 scales[16], f16 d; x = d scales[..] (q - 32), q 6 bits.
#define QK 256u
#if QFORMAT == 2
#define QB 144u
#elif QFORMAT == 3
#define QB 176u
#else
#define QB 210u
#endif

#if QFORMAT != 4
// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block s from the 12 bytes at sb.
void kscale(uint sb, uint s, out float sc, out float m) {
  if (s < 4u) {
    sc = float(q_byte(sb + s) & 63u);
    m = float(q_byte(sb + s + 4u) & 63u);
  } else {
    sc = float((q_byte(sb + s + 4u) & 15u) | ((q_byte(sb + s - 4u) >> 6) << 4));
    m = float((q_byte(sb + s + 4u) >> 4) | ((q_byte(sb + s) >> 6) << 4));
  }
}

void dequant8(uint blk, uint g, out vec4 lo, out vec4 hi) {
  const uint s = g >> 2, l = (g & 3u) * 8u;  // sub-block, first element within it
  float sc, m;
  kscale(blk + 4u, s, sc, m);
  const float d = q_f16(blk) * sc, dm = q_f16(blk + 2u) * m;
#if QFORMAT == 2
  const uvec2 q = q_words8(blk + 16u + 32u * (s >> 1) + l);
#else
  const uvec2 q = q_words8(blk + 48u + 32u * (s >> 1) + l);
  const uvec2 h = q_words8(blk + 16u + l);
#endif
  const uint sh = (s & 1u) * 4u;
  float v[8];
  [[unroll]] for (uint e = 0u; e < 8u; ++e) {
    uint x = (q_byte8(q, e) >> sh) & 15u;
#if QFORMAT == 3
    x |= ((q_byte8(h, e) >> s) & 1u) << 4;
#endif
    v[e] = d * float(x) - dm;
  }
  lo = vec4(v[0], v[1], v[2], v[3]);
  hi = vec4(v[4], v[5], v[6], v[7]);
}
#else
void dequant8(uint blk, uint g, out vec4 lo, out vec4 hi) {
  // Half hf (128 elements) of the block, quarter qq (32) of the half, first element l within the quarter.
  const uint e0 = g * 8u, hf = e0 >> 7, qq = (e0 >> 5) & 3u, l = e0 & 31u;
  const uvec2 ql = q_words8(blk + 64u * hf + 32u * (qq & 1u) + l);
  const uvec2 qh = q_words8(blk + 128u + 32u * hf + l);
  const int sc = bitfieldExtract(int(q_byte(blk + 192u + 8u * hf + (l >> 4) + 2u * qq)), 0, 8);
  const float d = q_f16(blk + 208u) * float(sc);
  const uint sl = (qq >> 1) * 4u, sh = 2u * qq;
  float v[8];
  [[unroll]] for (uint e = 0u; e < 8u; ++e) {
    const uint x = ((q_byte8(ql, e) >> sl) & 15u) | (((q_byte8(qh, e) >> sh) & 3u) << 4);
    v[e] = d * (float(x) - 32.0);
  }
  lo = vec4(v[0], v[1], v[2], v[3]);
  hi = vec4(v[4], v[5], v[6], v[7]);
}
#endif
