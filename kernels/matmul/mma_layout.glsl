// NVIDIA's mma.sync layout of a 16x16 cooperative-matrix fragment (the same for f32 accumulators and f16
// operands, A or B): element e of lane l is at row l/4 + 8 (e/4), column 2 (l%4) + e%2 + 8 ((e/2)%2); a row's
// elements lie on the 4 lanes of a quad. Kernels that build or read fragments element by element (the flash
// attention *_rs kernels, matmul_skinny.comp) take it where vk::fragment_layout_is_mma
// (backend/vulkan/fragment_layout.cpp) found it on the device.
#ifndef LMTUNE_MMA_LAYOUT_GLSL
#define LMTUNE_MMA_LAYOUT_GLSL

uint frag_row(uint lane, uint e) { return lane / 4u + 8u * (e / 4u); }
uint frag_col(uint lane, uint e) { return 2u * (lane % 4u) + e % 2u + 8u * ((e / 2u) % 2u); }

#endif
