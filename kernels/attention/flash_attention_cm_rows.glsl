// Block geometry of the shared-memory tensor-core kernels that own rows, flash_attention_fwd_cm.comp and
// flash_attention_bwd_dq_cm.comp (after flash_attention_cm.glsl): blocks of 32 keys and a subgroup per 16 rows (see
// flash_attention_fwd_cm.comp for why), and the strides of a subgroup's areas in shared memory.
#ifndef LMTUNE_FLASH_ATTENTION_CM_ROWS_GLSL
#define LMTUNE_FLASH_ATTENTION_CM_ROWS_GLSL

const uint BC = 32u;                          // keys per block
const uint BR = NSG * 16u;                    // rows per workgroup
const uint SST = BC + 4u;                     // f32 stride of a subgroup's scores (dQ: S, then dP)
const uint FST = 20u;                         // f32 stride of a subgroup's 16x16 output fragment (same area)
const uint PST = (BC + 8u) / 8u;              // uvec4 stride of P (dQ: dS)
const uint HC = BC / 2u;                      // score columns per lane

#endif
