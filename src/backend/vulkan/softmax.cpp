// Vulkan kernels for softmax / log-softmax and cross-entropy (forward and gradient): kernels/reduce/softmax.comp,
// kernels/loss/cross_entropy.comp.
#include "backend/vulkan/kernel_util.h"
#include "backend/vulkan/nn_kernels.h"
#include "core/error.h"
#include "core/ops/softmax.h"

namespace lmtune::vk {
namespace {

uint32_t row_group_size(int64_t n) { return n >= 4096 ? 256 : n >= 512 ? 128 : 64; }

void require_dense(const Tensor& t, const char* op) {
  if (!t.is_contiguous()) throw ShapeError(std::string("vulkan ") + op + ": output must be contiguous");
}

struct SoftmaxPush {
  uint32_t n, rows, x_off, y_off, dtypes, log_softmax, vec;
};
struct SoftmaxChunkPush {
  uint32_t n, rows, x_off, y_off, dtypes, log_softmax, vec, ign_off, prev_off, lse_off, has_prev;
  float softcap;
};
struct CrossEntropyPush {
  uint32_t n, v, l_off, t_off, a_off, b_off, d_off, dtypes;
  int32_t ignore_index;
};

}  // namespace

void softmax_rows(const Tensor& x_in, const Tensor& y, bool log) {
  if (y.numel() == 0) return;
  require_dense(y, "softmax");
  Tensor x = dense(x_in);
  Context& ctx = context_for(y.device());
  int64_t n = x.ndim() ? x.shape().back() : 1;
  SoftmaxPush p{u32(n, "row length"), u32(x.numel() / n, "rows"), elem_offset(x), elem_offset(y),
                uint32_t(x.dtype()) | uint32_t(y.dtype()) << 4, log, 0};
  p.vec = p.n % 4 == 0 && p.x_off % 4 == 0 && p.y_off % 4 == 0;
  ctx.dispatch(variant(ctx, "softmax"), {in(x), out(y)}, p, {std::min<uint32_t>(p.rows, 65535), 1, 1},
               {row_group_size(n)});
}

void softmax_chunk_rows(const Tensor& z_in, const Tensor& ignored_in, const Tensor& prev_in, const Tensor& y,
                        const Tensor& lse, float softcap) {
  if (y.numel() == 0) return;
  require_dense(y, "softmax_chunk");
  require_dense(lse, "softmax_chunk");
  Tensor z = dense(z_in), ignored = dense(ignored_in), prev = prev_in.defined() ? dense(prev_in) : ignored;  // unread
  Context& ctx = context_for(y.device());
  const int64_t n = z.dim(1);
  SoftmaxChunkPush p{u32(n, "row length"), u32(z.dim(0), "rows"), elem_offset(z), elem_offset(y),
                     uint32_t(z.dtype()) | uint32_t(y.dtype()) << 4, 0, 0, elem_offset(ignored), elem_offset(prev),
                     elem_offset(lse), prev_in.defined(), softcap};
  p.vec = p.n % 4 == 0 && p.x_off % 4 == 0 && p.y_off % 4 == 0;
  if (p.vec && dtype_size(z.dtype()) == 2 && p.n % 8 == 0 && p.x_off % 8 == 0 && p.y_off % 8 == 0)
    p.vec = 2;  // 16-byte loads (kernels/reduce/softmax.comp chunk_wide)
  ctx.dispatch(variant(ctx, "softmax_chunk"), {in(z), out(y), in(ignored), in(prev), out(lse)}, p,
               {std::min<uint32_t>(p.rows, 65535), 1, 1}, {row_group_size(n)});
}

void cross_entropy_rows(const Tensor& logits_in, const Tensor& targets_in, const Tensor& loss, const Tensor& lse,
                        int ignore_index) {
  if (loss.numel() == 0) return;
  require_dense(loss, "cross_entropy");
  require_dense(lse, "cross_entropy");
  Tensor logits = dense(logits_in), targets = dense(targets_in);
  Context& ctx = context_for(loss.device());
  CrossEntropyPush p{u32(logits.dim(0), "rows"), u32(logits.dim(1), "vocabulary"), elem_offset(logits),
                     elem_offset(targets), elem_offset(loss), elem_offset(lse), 0, uint32_t(logits.dtype()),
                     ignore_index};
  ctx.dispatch(variant(ctx, "cross_entropy"), {in(logits), in(targets), out(loss), out(lse)}, p,
               {std::min<uint32_t>(p.n, 65535), 1, 1}, {row_group_size(p.v)});
}

void cross_entropy_grad_rows(const Tensor& logits_in, const Tensor& targets_in, const Tensor& lse_in,
                             const Tensor& g_in, const Tensor& dlogits, int ignore_index) {
  if (dlogits.numel() == 0) return;
  require_dense(dlogits, "cross_entropy_grad");
  Tensor logits = dense(logits_in), targets = dense(targets_in), lse = dense(lse_in), g = dense(g_in);
  if (lse.dtype() != DType::f32 || g.dtype() != DType::f32)
    throw ShapeError("vulkan cross_entropy_grad: lse and g must be f32");
  Context& ctx = context_for(dlogits.device());
  CrossEntropyPush p{u32(logits.dim(0), "rows"), u32(logits.dim(1), "vocabulary"), elem_offset(logits),
                     elem_offset(targets), elem_offset(lse), elem_offset(g), elem_offset(dlogits),
                     uint32_t(logits.dtype()) | uint32_t(dlogits.dtype()) << 4, ignore_index};
  u32(logits.numel(), "element count");
  ctx.dispatch(variant(ctx, "cross_entropy_grad"), {in(logits), in(targets), in(lse), in(g), out(dlogits)}, p,
               groups_1d(uint64_t(logits.numel()), 256), {256});
}

}  // namespace lmtune::vk

namespace lmtune {

void Softmax::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  vk::softmax_rows(in[0], out[0], log);
}

void CrossEntropy::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  vk::cross_entropy_rows(in[0], in[1], out[0], out[1], ignore_index);
}

void SoftmaxChunk::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  vk::softmax_chunk_rows(in[0], in[1], has_prev ? in[2] : Tensor(), out[0], out[1], softcap);
}

void CrossEntropyGrad::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  vk::cross_entropy_grad_rows(in[0], in[1], in[2], in[3], out[0], ignore_index);
}

}  // namespace lmtune
