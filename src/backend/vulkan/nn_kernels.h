// Launchers of the Vulkan softmax / cross-entropy / normalization / rotary / embedding kernels. The primitives'
// eval_vulkan (softmax.cpp, nn.cpp) call these; tests call them directly too. Inputs may be strided (they are
// made dense first); outputs must be dense (as apply() allocates them).
#pragma once
#include "core/tensor.h"

namespace lmtune::vk {

void softmax_rows(const Tensor& x, const Tensor& y, bool log);
// SoftmaxChunk (core/ops/softmax.h); prev undefined: no columns before.
void softmax_chunk_rows(const Tensor& z, const Tensor& ignored, const Tensor& prev, const Tensor& y, const Tensor& lse,
                        float softcap);
// logits [N, V], targets i32 [N] -> loss f32 [N], lse f32 [N].
void cross_entropy_rows(const Tensor& logits, const Tensor& targets, const Tensor& loss, const Tensor& lse,
                        int ignore_index);
// dlogits [N, V] = (softmax(logits) - onehot(targets)) * g[:, None], zero rows where ignored.
void cross_entropy_grad_rows(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& g,
                             const Tensor& dlogits, int ignore_index);
void rms_norm_rows(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, float eps);
// bias may be undefined.
// dx of RMSNorm from x, w, rstd [rows] and the cotangent g (kernels/norm/rms_norm_grad.comp).
void rms_norm_grad_rows(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& g, const Tensor& dx,
                        bool accumulate);
void layer_norm_rows(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, const Tensor& mean,
                     const Tensor& rstd, float eps);
// scale multiplies cos and sin (ops::rope).
void rope_apply(const Tensor& x, const Tensor& positions, const Tensor& inv_freq, const Tensor& y, bool interleaved,
                bool inverse, float scale = 1.0f);
void embedding_gather(const Tensor& weight, const Tensor& ids, const Tensor& out);
// out [V, C] = scatter-add of grad rows (grad [..., C]) into rows ids[...]; out is overwritten.
void embedding_scatter_add(const Tensor& grad, const Tensor& ids, const Tensor& out);

}  // namespace lmtune::vk
