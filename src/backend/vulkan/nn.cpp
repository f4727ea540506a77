// Vulkan kernels for RMSNorm, LayerNorm, rotary embedding, dropout and embedding gather / scatter-add:
// kernels/norm/norm.comp, kernels/norm/rms_norm_grad.comp, kernels/attention/rope.comp,
// kernels/elementwise/dropout.comp, kernels/embedding/embedding.comp, kernels/embedding/embedding_backward.comp.
#include "backend/vulkan/kernel_util.h"
#include "backend/vulkan/nn_kernels.h"
#include "core/error.h"
#include "core/ops/nn.h"
#include "core/ops/rope_append.h"

namespace lmtune::vk {
namespace {

uint32_t row_group_size(int64_t n) { return n >= 4096 ? 256 : n >= 512 ? 128 : 64; }

void require_dense(const Tensor& t, const char* op) {
  if (!t.is_contiguous()) throw ShapeError(std::string("vulkan ") + op + ": output must be contiguous");
}

struct NormPush {
  uint32_t c, rows, x_off, w_off, b_off, y_off, mean_off, rstd_off, dtypes;
  float eps;
  uint32_t has_bias;
  uint32_t vec = 0;
};
struct RmsGradPush {
  uint32_t c, rows, x_off, w_off, rstd_off, g_off, dx_off, dtypes, vec, acc;
};
struct RopePush {
  uint32_t total, d, h, r, x_off, pos_off, freq_off, y_off, dtypes, interleaved, inverse, vec;
  float scale;
};
// Mirrors the push constants of kernels/attention/rope_append.comp.
struct RopeAppendPush {
  uint32_t rot_units, copy_units, T, H, KV, D, R;
  uint32_t x_off, x_sb, x_st, pos_off, freq_off, y_off, z_off, z_sb, z_st, v_off, v_sb, v_st, w_off, w_sb, w_st;
  uint32_t dtypes;
  float scale;
};
struct EmbeddingPush {
  uint32_t total, c, v, w_off, ids_off, y_off, dtypes;
};

}  // namespace

void rms_norm_rows(const Tensor& x_in, const Tensor& w_in, const Tensor& y, const Tensor& rstd, float eps) {
  if (y.numel() == 0) return;
  require_dense(y, "rms_norm");
  require_dense(rstd, "rms_norm");
  Tensor x = dense(x_in), w = dense(w_in);
  Context& ctx = context_for(y.device());
  int64_t c = x.shape().back();
  NormPush p{u32(c, "row length"), u32(x.numel() / c, "rows"), elem_offset(x), elem_offset(w), 0, elem_offset(y),
             0, elem_offset(rstd), uint32_t(x.dtype()) | uint32_t(w.dtype()) << 4 | uint32_t(y.dtype()) << 12, eps, 0};
  p.vec = p.c % 4 == 0 && p.x_off % 4 == 0 && p.w_off % 4 == 0 && p.y_off % 4 == 0;
  if (p.vec && p.c % 8 == 0 && p.x_off % 8 == 0 && p.w_off % 8 == 0 && p.y_off % 8 == 0 && dtype_size(x.dtype()) == 2)
    p.vec = 2;  // 16-byte loads
  ctx.dispatch(variant(ctx, "rms_norm"), {in(x), in(w), out(y), out(rstd)}, p,
               {std::min<uint32_t>(p.rows, 65535), 1, 1}, {row_group_size(c), p.dtypes, p.vec});
}

void rms_norm_grad_rows(const Tensor& x_in, const Tensor& w_in, const Tensor& rstd_in, const Tensor& g_in,
                        const Tensor& dx, bool accumulate) {
  if (dx.numel() == 0) return;
  require_dense(dx, "rms_norm_grad");
  Tensor x = dense(x_in), w = dense(w_in), rstd = dense(rstd_in), g = dense(g_in);
  Context& ctx = context_for(dx.device());
  int64_t c = x.shape().back();
  RmsGradPush p{u32(c, "row length"), u32(x.numel() / c, "rows"), elem_offset(x), elem_offset(w), elem_offset(rstd),
                elem_offset(g), elem_offset(dx),
                uint32_t(x.dtype()) | uint32_t(w.dtype()) << 4 | uint32_t(g.dtype()) << 8 | uint32_t(dx.dtype()) << 12,
                0, accumulate ? 1u : 0u};
  p.vec = p.c % 4 == 0 && p.x_off % 4 == 0 && p.w_off % 4 == 0 && p.g_off % 4 == 0 &&
          p.dx_off % 4 == 0;
  if (p.vec && p.c % 8 == 0 && p.x_off % 8 == 0 && p.w_off % 8 == 0 && p.g_off % 8 == 0 && p.dx_off % 8 == 0 &&
      dtype_size(x.dtype()) == 2 && dtype_size(g.dtype()) == 2)
    p.vec = 2;  // 16-byte loads
  ctx.dispatch(variant(ctx, "rms_norm_grad"), {in(x), in(w), in(rstd), in(g), out(dx)}, p,
               {std::min<uint32_t>(p.rows, 65535), 1, 1}, {row_group_size(c)});
}

void layer_norm_rows(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, const Tensor& y, const Tensor& mean,
                     const Tensor& rstd, float eps) {
  if (y.numel() == 0) return;
  require_dense(y, "layer_norm");
  require_dense(mean, "layer_norm");
  require_dense(rstd, "layer_norm");
  Tensor x = dense(x_in), w = dense(w_in);
  bool has_bias = b_in.defined();
  Tensor b = has_bias ? dense(b_in) : w;  // bound but unread without a bias
  Context& ctx = context_for(y.device());
  int64_t c = x.shape().back();
  NormPush p{u32(c, "row length"), u32(x.numel() / c, "rows"), elem_offset(x), elem_offset(w), elem_offset(b),
             elem_offset(y), elem_offset(mean), elem_offset(rstd),
             uint32_t(x.dtype()) | uint32_t(w.dtype()) << 4 | uint32_t(b.dtype()) << 8 | uint32_t(y.dtype()) << 12,
             eps, has_bias};
  ctx.dispatch(variant(ctx, "layer_norm"), {in(x), in(w), in(b), out(y), out(mean), out(rstd)}, p,
               {std::min<uint32_t>(p.rows, 65535), 1, 1}, {row_group_size(c)});
}

void rope_apply(const Tensor& x_in, const Tensor& positions_in, const Tensor& inv_freq_in, const Tensor& y,
                bool interleaved, bool inverse, float scale) {
  if (y.numel() == 0) return;
  require_dense(y, "rope");
  if (x_in.ndim() != 4) throw ShapeError("vulkan rope: x must be [B, T, H, D], got " + to_string(x_in.shape()));
  Tensor x = dense(x_in), pos = dense(positions_in), freq = dense(inv_freq_in);
  if (freq.dtype() != DType::f32 || pos.dtype() != DType::i32)
    throw ShapeError("vulkan rope: positions must be i32 and inv_freq f32");
  Context& ctx = context_for(y.device());
  int64_t r = 2 * freq.numel();
  if (r > x.dim(3)) throw ShapeError("vulkan rope: 2 * inv_freq size " + std::to_string(r) + " exceeds head dim");
  u32(x.numel(), "element count");
  // One invocation per rotated pair or pass-through dim of each [B, T, H] row; on the vector path per 4 of them.
  const int64_t D = x.dim(3), rows = x.dim(0) * x.dim(1) * x.dim(2);
  const bool vec = !interleaved && (r / 2) % 4 == 0 && (D - r) % 4 == 0 &&
                   elem_offset(x) % 4 == 0 && elem_offset(y) % 4 == 0;
  const int64_t units = rows * (r / 2 + D - r) / (vec ? 4 : 1);
  RopePush p{u32(units, "rope units"), u32(D, "head dim"), u32(x.dim(2), "heads"), u32(r, "rotary dims"),
             elem_offset(x), elem_offset(pos), elem_offset(freq), elem_offset(y),
             uint32_t(x.dtype()) | uint32_t(y.dtype()) << 4, interleaved, inverse, vec, scale};
  ctx.dispatch(variant(ctx, "rope"), {in(x), in(pos), in(freq), out(y)}, p, groups_1d(p.total, 256), {256});
}

void embedding_gather(const Tensor& weight_in, const Tensor& ids_in, const Tensor& y) {
  if (y.numel() == 0) return;
  require_dense(y, "embedding");
  Tensor w = dense(weight_in), ids = dense(ids_in);
  Context& ctx = context_for(y.device());
  EmbeddingPush p{u32(y.numel(), "element count"), u32(w.dim(1), "embedding dim"), u32(w.dim(0), "vocabulary"),
                  elem_offset(w), elem_offset(ids), elem_offset(y), uint32_t(w.dtype()) | uint32_t(y.dtype()) << 4};
  ctx.dispatch(variant(ctx, "embedding"), {in(w), in(ids), out(y)}, p, groups_1d(p.total, 256), {256});
}

void embedding_scatter_add(const Tensor& grad_in, const Tensor& ids_in, const Tensor& out_t) {
  if (out_t.numel() == 0) return;
  require_dense(out_t, "embedding_backward");
  Tensor g = dense(grad_in), ids = dense(ids_in);
  Context& ctx = context_for(out_t.device());
  // Accumulate in f32: straight into the output when it is f32, else in a temporary converted at the end.
  bool direct = out_t.dtype() == DType::f32 && out_t.offset() == 0 &&
                out_t.buffer()->bytes() == size_t(out_t.numel()) * 4;
  Tensor acc = direct ? out_t : Tensor::empty(out_t.shape(), DType::f32, out_t.device());
  ctx.fill_buffer(out(acc), 0);
  if (g.numel() > 0) {
    EmbeddingPush p{u32(g.numel(), "element count"), u32(out_t.dim(1), "embedding dim"),
                    u32(out_t.dim(0), "vocabulary"), elem_offset(g), elem_offset(ids), elem_offset(acc),
                    uint32_t(g.dtype())};
    std::string kernel = ctx.features().atomic_float_add ? "embedding_backward" : "embedding_backward_cas";
    ctx.dispatch(variant(ctx, kernel), {in(g), in(ids), out(acc)}, p, groups_1d(p.total, 256), {256});
  }
  if (!direct) copy_tensor(acc, out_t);
}

}  // namespace lmtune::vk

namespace lmtune {

void RmsNorm::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  vk::rms_norm_rows(in[0], in[1], out[0], out[1], eps);
}

void RmsNormGrad::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  vk::rms_norm_grad_rows(in[0], in[1], in[2], in[3], out[0], accumulate);
}

void LayerNorm::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  vk::layer_norm_rows(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), out[0], out[1], out[2], eps);
}

void Rope::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  vk::rope_apply(in[0], in[1], in[2], out[0], layout == ops::RopeLayout::interleaved, inverse, scale);
}

// One dispatch: one invocation per rotated pair or pass-through dim of qk's rows, then per value element.
void RopeAppend::eval_vulkan(const std::vector<Tensor>& inputs, std::vector<Tensor>& outputs) {
  using namespace vk;
  const Tensor &qk = inputs[0], &v = inputs[1], pos = dense(inputs[2]), freq = dense(inputs[3]);
  const Tensor &q = outputs[0], &k_slots = outputs[1], &v_slots = outputs[2];
  if (q.numel() == 0) return;
  Context& ctx = context_for(q.device());
  const int64_t B = qk.dim(0), T = qk.dim(1), H = q.dim(2), KV = v.dim(2), D = qk.dim(3), R = 2 * freq.numel();
  auto stride = [](const Tensor& t, int axis) { return u32(t.strides()[size_t(axis)], "stride"); };
  RopeAppendPush p{};
  p.rot_units = u32(B * T * (H + KV) * (R / 2 + D - R), "rope units");
  p.copy_units = u32(B * T * KV * D, "values");
  p.T = u32(T, "tokens"), p.H = u32(H, "heads"), p.KV = u32(KV, "kv heads"), p.D = u32(D, "head dim");
  p.R = u32(R, "rotary dims");
  p.x_off = elem_offset(qk), p.x_sb = stride(qk, 0), p.x_st = stride(qk, 1);
  p.pos_off = elem_offset(pos), p.freq_off = elem_offset(freq), p.y_off = elem_offset(q);
  p.z_off = elem_offset(k_slots), p.z_sb = stride(k_slots, 0), p.z_st = stride(k_slots, 1);
  p.v_off = elem_offset(v), p.v_sb = stride(v, 0), p.v_st = stride(v, 1);
  p.w_off = elem_offset(v_slots), p.w_sb = stride(v_slots, 0), p.w_st = stride(v_slots, 1);
  p.dtypes = uint32_t(qk.dtype()) | uint32_t(q.dtype()) << 4 | uint32_t(k_slots.dtype()) << 8 |
             uint32_t(v.dtype()) << 12 | uint32_t(v_slots.dtype()) << 16;
  p.scale = scale;
  const uint64_t units = uint64_t(p.rot_units) + p.copy_units;
  u32(int64_t(units), "rope units");
  ctx.dispatch(variant(ctx, "rope_append"), {in(qk), in(pos), in(freq), out(q), out(k_slots), in(v), out(v_slots)},
               p, groups_1d(units, 256), {256, p.dtypes});
}

void Dropout::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  const Tensor x = vk::dense(in[0]);
  const Tensor& y = out[0];
  if (y.numel() == 0) return;
  struct Push {
    uint32_t total, x_off, y_off, dtypes, key0, key1, threshold;
    float scale;
  } p{vk::u32(y.numel(), "element count"), vk::elem_offset(x), vk::elem_offset(y),
      uint32_t(x.dtype()) | uint32_t(y.dtype()) << 4, uint32_t(key), uint32_t(key >> 32), threshold(), scale()};
  vk::Context& ctx = vk::context_for(y.device());
  ctx.dispatch(vk::variant(ctx, "dropout"), {vk::in(x), vk::out(y)}, p, vk::groups_1d(p.total, 256), {256});
}

void Embedding::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  vk::embedding_gather(in[0], in[1], out[0]);
}

void EmbeddingBackward::eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) {
  vk::embedding_scatter_add(in[0], in[1], out[0]);
}

}  // namespace lmtune
