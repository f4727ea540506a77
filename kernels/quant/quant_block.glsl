// Block-quantized weights in kernels: byte access to a weight stored as 32-bit words, and, by QFORMAT (the order
// of lmtune::quant::Format: 0 q8_0, 1 q4_0, 2 q4_k, 3 q5_k, 4 q6_k, 5 nf4), the include of its format family,
// which defines QK (elements per block), QB (bytes per block) and
//   void dequant8(uint blk, uint g, out vec4 lo, out vec4 hi)
// the 8 elements 8g .. 8g + 7 of the block starting at byte `blk`, and Q_PREPARE(), which every kernel runs first
// in uniform control flow (a format's tables into shared memory, then a barrier; nothing for most formats). The products (qmatmul*.comp) decode weights
// only through dequant8, so the portable kernels lavapipe runs check the code the tensor-core kernels use.
// Include after declaring `qw`, the weight's words: layout(...) readonly buffer { uint qw[]; }.
// Every field of every format sits at an even byte address (blocks are 18, 34, 136, 144, 176 or 210 bytes).
#ifndef LMTUNE_QUANT_BLOCK_GLSL
#define LMTUNE_QUANT_BLOCK_GLSL

uint q_byte(uint b) { return (qw[b >> 2] >> ((b & 3u) << 3)) & 0xffu; }
uint q_half(uint b) { return (qw[b >> 2] >> ((b & 2u) << 3)) & 0xffffu; }
float q_f16(uint b) { return unpackHalf2x16(q_half(b)).x; }
// The little-endian word at an even byte address.
uint q_word(uint b) {
  const uint w = qw[b >> 2];
  return (b & 2u) == 0u ? w : (w >> 16) | (qw[(b >> 2) + 1u] << 16);
}
// Byte i (0..7) of the pair of words (w0, w1).
uint q_byte8(uvec2 w, uint i) { return (w[i >> 2] >> ((i & 3u) << 3)) & 0xffu; }
uvec2 q_words8(uint b) { return uvec2(q_word(b), q_word(b + 4u)); }

#ifndef QFORMAT
#error "QFORMAT must be defined"
#endif
#if QFORMAT <= 1
#include "quant/quant_legacy.glsl"
#elif QFORMAT <= 4
#include "quant/quant_kquants.glsl"
#else
#include "quant/quant_nf4.glsl"
#endif
#ifndef Q_PREPARE
#define Q_PREPARE()
#endif

#endif
