// Chunk c (8 contiguous elements) of a K tile of A or B in the cooperative-matrix GEMMs: its row in the staged
// layout and its first contiguous index (m, k of A; k, n of B). Include after the tile defines and BK
// (matmul_coopmat_tile.glsl).
#ifndef LMTUNE_MATMUL_COOPMAT_CHUNKS_GLSL
#define LMTUNE_MATMUL_COOPMAT_CHUNKS_GLSL

void a_chunk(uint c, out uint m, out uint k) {
#if TA
  k = c / (BM / 8); m = (c % (BM / 8)) * 8;
#else
  m = c / (BK / 8); k = (c % (BK / 8)) * 8;
#endif
}
void b_chunk(uint c, out uint k, out uint n) {
#if TB
  n = c / (BK / 8); k = (c % (BK / 8)) * 8;
#else
  k = c / (BN / 8); n = (c % (BN / 8)) * 8;
#endif
}

#endif
