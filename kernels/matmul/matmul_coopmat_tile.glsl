// The tiles of the cooperative-matrix GEMMs (matmul_coopmat.comp, matmul_coopmat_fast.comp), set per module in
// kernels/variants.txt: workgroup tile BM x BN, subgroup tile WM x WN (FM x FN 16x16 fragments; NSG subgroups of 32,
// NT invocations), NSTAGE shared stages, TA / TB = 1 where A / B is stored transposed ([K, M] / [N, K]). Each kernel
// defines its K step BK after including this. Brings in the push constants and conversions of matmul_common.glsl.
#ifndef LMTUNE_MATMUL_COOPMAT_TILE_GLSL
#define LMTUNE_MATMUL_COOPMAT_TILE_GLSL

#include "matmul/matmul_common.glsl"

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 256
#endif
#ifndef WM
#define WM 64
#endif
#ifndef WN
#define WN 64
#endif
#ifndef NSTAGE
#define NSTAGE 1
#endif
#ifndef TA
#define TA 0
#endif
#ifndef TB
#define TB 0
#endif
#define NWN (BN / WN)
#define NSG ((BM / WM) * NWN)
#define NT (NSG * 32)
#define FM (WM / 16)
#define FN (WN / 16)

#endif
