// Vulkan kernels of the fused attention (core/ops/flash_attention.h): kernels/attention/flash_attention_fwd.comp, the
// backward's delta pre-pass (flash_attention_bwd_delta.comp), dQ (flash_attention_bwd_dq.comp) and dK/dV
// (flash_attention_bwd_dkdv.comp), and the merge of a split forward pass (flash_attention_combine.comp); shared
// code in kernels/attention/flash_attention.glsl. Each attention kernel is built
// per head-dim class (D <= 64, 128, 256) with block sizes that keep its shared memory under 32 KiB. Tensor-core
// twins of the forward, dQ and dK/dV kernels (*_rs.comp for every class and for D <= 512, *_cm.comp for D <= 64)
// run where flash_attention.h's choice says.
#include "backend/vulkan/flash_attention.h"

#include <algorithm>
#include <mutex>
#include <string>

#include <spdlog/spdlog.h>

#include "backend/vulkan/fragment_layout.h"
#include "backend/vulkan/kernel_util.h"
#include "backend/vulkan/matmul.h"
#include "core/error.h"
#include "core/ops/flash_attention.h"

namespace lmtune::vk {
namespace {

// Mirrors the push block of kernels/attention/flash_attention.glsl.
struct FlashPush {
  uint32_t T, S, H, KV, D, flags;
  int32_t window, q_offset;
  float scale, softcap;
  uint32_t q_off, q_sb, q_st, k_off, k_sb, k_st, v_off, v_sb, v_st, x_off, x_sb, x_st;
  uint32_t lse_off, delta_off, docs_off, keys_off, y_off, z_off;
  uint32_t dtypes;
  uint32_t splits = 1;
};
static_assert(sizeof(FlashPush) <= 128);

struct CombinePush {
  uint32_t n, T, H, D, splits, part_off, plse_off, o_off, lse_off, o_dtype;
};

// Key-range splits of the forward pass: when the (row block, kv head, batch) workgroups are too few to fill a GPU
// (decoding: T = 1 gives one row block), each one's keys are cut into up to 16 parts of at least 2 key blocks,
// run by separate workgroups and merged by flash_attention_combine.
uint32_t forward_splits(uint32_t workgroups, uint32_t key_blocks) {
  if (workgroups >= 64 || key_blocks < 4) return 1;
  return std::min<uint32_t>({16, ceil_div(128, workgroups), key_blocks / 2});
}

// Row-range splits of the tensor-core dK/dV pass: with grouped-query attention a kv head has T * G rows but
// only S / 128 key blocks, too few workgroups for a GPU, each walking all rows. Up to 16 parts of at least 8 row
// blocks each, run by separate workgroups and summed by flash_attention_bwd_sum.
uint32_t backward_splits(uint32_t workgroups, uint32_t row_blocks) {
  if (workgroups >= 512 || row_blocks < 16) return 1;
  return std::min<uint32_t>({16, ceil_div(512, workgroups), row_blocks / 8});
}

struct SumPush {
  uint32_t n, splits, pk_off, pv_off, dk_off, dv_off, dtypes;
};

struct DeltaPush {
  uint32_t n, T, H, D, o_off, x_off, x_sb, x_st, dlse_off, delta_off, dtypes;
};

constexpr uint32_t kSharedBytes = 32768;  // the most any variant uses (see the table in docs/vulkan.md)

// "_d64", "_d128", "_d256" or "_d512" (tensor-core kernels only): the kernel variant for head dim D.
std::string head_dim_class(const Context& ctx, int64_t D) {
  if (D > 512)
    throw ShapeError("vulkan flash attention: head dim " + std::to_string(D) +
                     " exceeds 512 (ops::attention composes it instead)");
  if (ctx.properties().limits.maxComputeSharedMemorySize < kSharedBytes)
    throw DeviceError("vulkan flash attention needs 32 KiB of shared memory, the device has " +
                      std::to_string(ctx.properties().limits.maxComputeSharedMemorySize) +
                      " bytes (ops::attention composes it instead)");
  return D <= 64 ? "_d64" : D <= 128 ? "_d128" : D <= 256 ? "_d256" : "_d512";
}

// Element offset, batch and time strides of a [B, T, heads, D] operand whose heads and dims are dense.
void rows_of(const Tensor& t, uint32_t& off, uint32_t& sb, uint32_t& st, const char* what) {
  bool dense_rows = (t.dim(3) == 1 || t.strides()[3] == 1) && (t.dim(2) == 1 || t.strides()[2] == t.dim(3));
  if (!dense_rows)
    throw ShapeError(std::string("vulkan flash attention: ") + what + " needs dense heads and dims, got strides " +
                     to_string(t.strides()));
  off = elem_offset(t);
  sb = u32(t.strides()[0], "batch stride");
  st = u32(t.strides()[1], "time stride");
  if (t.numel() > 0)
    u32(t.offset() + (t.dim(0) - 1) * t.strides()[0] + (t.dim(1) - 1) * t.strides()[1] + t.dim(2) * t.dim(3),
        "attention operand extent");
}

// The push block shared by the three attention kernels; masks[0..1] are the doc_ids / key_mask inputs (if any).
FlashPush make_push(const FlashAttentionParams& p, const Tensor& q, const Tensor& k, const Tensor& v,
                    const std::vector<Tensor>& masks) {
  FlashPush f{};
  f.T = u32(p.T, "query length");
  f.S = u32(p.S, "key length");
  f.H = u32(p.H, "heads");
  f.KV = u32(p.KV, "kv heads");
  f.D = u32(p.D, "head dim");
  f.flags = (p.causal ? 1u : 0u) | (p.docs ? 2u : 0u) | (p.key_mask ? 4u : 0u);
  f.window = int32_t(p.window);
  f.q_offset = int32_t(p.q_offset);
  f.scale = p.scale;
  f.softcap = p.softcap;
  rows_of(q, f.q_off, f.q_sb, f.q_st, "q");
  rows_of(k, f.k_off, f.k_sb, f.k_st, "k");
  rows_of(v, f.v_off, f.v_sb, f.v_st, "v");
  size_t next = 0;
  if (p.docs) f.docs_off = elem_offset(masks[next++]);
  if (p.key_mask) f.keys_off = elem_offset(masks[next]);
  f.dtypes = uint32_t(q.dtype()) | uint32_t(k.dtype()) << 4 | uint32_t(v.dtype()) << 8;
  return f;
}

// The doc_ids / key_mask inputs from index `first` on (dense), and their bindings (q's buffer when absent:
// bound but never read).
std::vector<Tensor> mask_inputs(const FlashAttentionParams& p, const std::vector<Tensor>& in, size_t first) {
  std::vector<Tensor> m;
  for (size_t i = first; i < first + size_t(p.docs) + size_t(p.key_mask); ++i) m.push_back(dense(in[i]));
  return m;
}
std::pair<Binding, Binding> mask_bindings(const FlashAttentionParams& p, const std::vector<Tensor>& m, const Tensor& q) {
  Binding docs = p.docs ? in(m[0]) : in(q);
  Binding keys = p.key_mask ? in(m[p.docs ? 1 : 0]) : in(q);
  return {docs, keys};
}

void check_grid(uint32_t blocks, const char* what) {
  if (blocks > 65535) throw ShapeError(std::string("vulkan flash attention: too many ") + what + " blocks");
}

// Which kernels these inputs take (see flash_attention.h): "" (portable), "rs" (tensor cores,
// scores in registers; every head-dim class) or "cm" (tensor cores, scores through shared memory; D <= 64).
std::string tensor_core_family(Context& ctx, const FlashAttentionParams& p, DType q_dtype) {
  const Features& f = ctx.features();
  bool device_ok = f.coopmat_kernels() &&
                   ctx.properties().limits.maxComputeSharedMemorySize >= 48 * 1024;
  const FlashKernel mode = ctx.kernel_choice().flash;
  const bool forced = mode == FlashKernel::coopmat || mode == FlashKernel::coopmat_shared;
  if (forced && !device_ok)
    throw DeviceError("flash attention: the tensor-core kernels were forced but " + ctx.name() +
                      " has no VK_NV_cooperative_matrix with subgroup size 32 and 48 KiB of shared memory");
  bool use = forced;
  if (mode == FlashKernel::automatic) {
    const bool tensor_cores = ctx.kernel_choice().matmul != MatmulKernel::scalar && q_dtype != DType::f32;
    use = device_ok && tensor_cores && p.T * p.G() >= 64;
  }
  std::string family;
  if (use) {
    family = mode != FlashKernel::coopmat_shared && fragment_layout_is_mma(ctx) ? "rs" : "cm";
    if (family == "cm" && p.D > 64) {
      if (forced)
        throw ShapeError("flash attention: the shared-memory tensor-core kernels cover head dims up to 64, got " +
                         std::to_string(p.D));
      family.clear();
      static std::once_flag once;
      std::call_once(once, [&] {
        spdlog::warn("flash attention: {} lacks NVIDIA's fragment layout; head dims past 64 run the portable f32 "
                     "kernels", ctx.name());
      });
    }
  }
  return family;
}

// Rows (forward, dQ) and keys (dK/dV) per workgroup of the tensor-core kernels of a head-dim class: the wide
// classes split the head dim across 2 or 4 subgroups (variants.txt).
struct TensorCoreBlocks {
  uint32_t fwd_rows, dq_rows, dkdv_keys;
};
TensorCoreBlocks tensor_core_blocks(const std::string& cls) {
  if (cls == "_d512") return {32, 32, 16};
  if (cls == "_d256") return {64, 64, 32};
  if (cls == "_d128") return {128, 128, 64};
  return {128, 128, 128};
}

// Flag 8 of the push block: every row of q, k, v (and dO) starts at a multiple of 8 elements, so the tensor-core
// kernels read 8 elements at a time.
bool rows_of_8(const FlashPush& f, bool with_do) {
  if (f.D % 8 != 0) return false;
  for (uint32_t x : {f.q_off, f.q_sb, f.q_st, f.k_off, f.k_sb, f.k_st, f.v_off, f.v_sb, f.v_st})
    if (x % 8 != 0) return false;
  if (with_do)
    for (uint32_t x : {f.x_off, f.x_sb, f.x_st})
      if (x % 8 != 0) return false;
  return true;
}

// Flag 16 of the tensor-core kernels: outputs written 16 bytes at a time (output offsets and D multiples of 8).
uint32_t vec_out_flag(const FlashPush& f) { return f.D % 8 == 0 && f.y_off % 8 == 0 && f.z_off % 8 == 0 ? 16u : 0u; }

// Decoding's attention (flash_attention_decode.comp): at most 16 rows (T x G) per kv head, in blocks of 8; no
// packed documents; rows of q, k, v in multiples of 8 elements. Its key splits: at least 32 keys each (a
// workgroup's loop over keys is latency-bound), up to enough workgroups to fill a GPU.
constexpr int64_t kDecodeRows = 16, kDecodeBlockRows = 8;
constexpr uint32_t kDecodeSplitKeys = 32;
bool decode_fits(const FlashAttentionParams& p) { return p.T * p.G() <= kDecodeRows && !p.docs && p.D % 8 == 0; }
bool decode_takes(const FlashAttentionParams& p, const FlashPush& f) { return decode_fits(p) && rows_of_8(f, false); }
uint32_t decode_splits(const FlashAttentionParams& p) {
  const uint32_t tiles = ceil_div(uint64_t(std::max<int64_t>(p.S, 1)), kDecodeSplitKeys);
  const uint32_t fill = uint32_t(std::max<int64_t>(1, 256 / std::max<int64_t>(1, p.KV * p.B)));
  return std::min<uint32_t>({tiles, fill, 64});
}

// The 512 class has tensor-core kernels and the decode kernel only.
void check_portable_class(const std::string& cls, bool decode) {
  if (cls == "_d512" && !decode)
    throw ShapeError("vulkan flash attention: head dims past 256 need the tensor-core kernels with the scores in "
                     "registers, or decoding's kernel forward (ops::attention composes them elsewhere)");
}

// A dense copy from offset 0: rows on 8-element boundaries wherever D is a multiple of 8.
Tensor aligned_copy(const Tensor& x) {
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  copy_tensor(x, y);
  return y;
}

}  // namespace

bool flash_attention_runs(Context& ctx, const FlashAttentionParams& p, DType q_dtype, bool backward) {
  if (ctx.properties().limits.maxComputeSharedMemorySize < kSharedBytes || p.D > 512) return false;
  return p.D <= 256 || tensor_core_family(ctx, p, q_dtype) == "rs" || (!backward && decode_fits(p));
}

std::string flash_kernel_family(Device d, const FlashAttentionParams& p, DType q_dtype) {
  const std::string family = tensor_core_family(context_for(d), p, q_dtype);
  return family.empty() ? "portable" : family == "rs" ? "coopmat" : "coopmat-shared";
}

}  // namespace lmtune::vk

namespace lmtune {

void FlashAttention::eval_vulkan(const std::vector<Tensor>& ins, std::vector<Tensor>& outs) {
  using namespace vk;
  if (outs[0].numel() == 0 && outs[1].numel() == 0) return;
  Context& ctx = context_for(outs[0].device());
  const std::string cls = head_dim_class(ctx, p.D);
  Tensor q = ins[0], k = ins[1], v = ins[2];
  Tensor &o = outs[0], &lse = outs[1];
  std::vector<Tensor> masks = mask_inputs(p, ins, 3);
  FlashPush f = make_push(p, q, k, v, masks);
  const uint32_t batch = u32(p.B, "batch");
  auto [docs, keys] = mask_bindings(p, masks, q);
  if (const std::string tc = tensor_core_family(ctx, p, q.dtype()); !tc.empty()) {  // no splits
    const uint32_t blocks = ceil_div(uint64_t(p.T * p.G()), tensor_core_blocks(cls).fwd_rows);
    check_grid(blocks, "query");
    f.flags |= rows_of_8(f, false) ? 8u : 0u;
    f.lse_off = elem_offset(lse);
    f.y_off = elem_offset(o);
    f.dtypes |= uint32_t(o.dtype()) << 16;
    f.flags |= vec_out_flag(f);
    ctx.dispatch("flash_attention_fwd_" + tc + cls,
                 {in(q), in(k), in(v), in(q), out(lse), in(q), docs, keys, out(o), in(q)}, f, {blocks, f.KV, batch});
    return;
  }
  if (cls == "_d512" && decode_fits(p) && !decode_takes(p, f)) {  // the 512 class decodes rows of 8 elements only
    q = aligned_copy(q), k = aligned_copy(k), v = aligned_copy(v);
    f = make_push(p, q, k, v, masks);
  }
  const bool decode = decode_takes(p, f);
  check_portable_class(cls, decode);
  const uint32_t br = p.D <= 64 ? 32 : 16 * (p.D <= 128 ? 2 : 1), bc = p.D <= 64 ? 32 : p.D <= 128 ? 16 : 8;
  const uint32_t blocks = ceil_div(uint64_t(p.T * p.G()), decode ? kDecodeBlockRows : br);
  check_grid(blocks, "query");
  if (decode) f.splits = decode_splits(p);
  else f.splits = p.D > 0 ? forward_splits(blocks * f.KV * batch, ceil_div(uint64_t(p.S), bc)) : 1;
  check_grid(batch * f.splits, "batch");
  // Split passes write f32 partials [splits, B, T, H, D] and [splits, B, H, T], merged afterwards.
  Tensor part = f.splits > 1 ? Tensor::empty({int64_t(f.splits), p.B, p.T, p.H, p.D}, DType::f32, o.device()) : o;
  Tensor plse = f.splits > 1 ? Tensor::empty({int64_t(f.splits), p.B, p.H, p.T}, DType::f32, o.device()) : lse;
  f.lse_off = elem_offset(plse);
  f.y_off = elem_offset(part);
  f.dtypes |= uint32_t(part.dtype()) << 16;
  // The decode kernel is built per dtype combination (specialization constant 0).
  const std::vector<uint32_t> spec = decode ? std::vector<uint32_t>{f.dtypes} : std::vector<uint32_t>{};
  ctx.dispatch(variant(ctx, (decode ? "flash_attention_decode" : "flash_attention_fwd") + cls),
               {in(q), in(k), in(v), in(q), out(plse), in(q), docs, keys, out(part), in(q)}, f,
               {blocks, f.KV, batch * f.splits}, spec);
  if (f.splits > 1) {
    CombinePush c{u32(o.numel(), "output size"), f.T, f.H, f.D, f.splits, elem_offset(part), elem_offset(plse),
                  elem_offset(o), elem_offset(lse), uint32_t(o.dtype())};
    u32(part.numel(), "split partials");
    ctx.dispatch(variant(ctx, "flash_attention_combine"), {in(part), in(plse), out(o), out(lse)}, c,
                 groups_1d(c.n, 256), {256});
  }
}

void FlashAttentionBackward::eval_vulkan(const std::vector<Tensor>& ins, std::vector<Tensor>& outs) {
  using namespace vk;
  Context& ctx = context_for(outs[0].device());
  if (outs[0].numel() == 0 && outs[1].numel() == 0) return;
  const std::string cls = head_dim_class(ctx, p.D);
  const Tensor &q = ins[0], &k = ins[1], &v = ins[2];
  const Tensor o = dense(ins[3]), &d_o = ins[4], lse = dense(ins[5]), d_lse = dense(ins[6]);
  if (lse.dtype() != DType::f32 || d_lse.dtype() != DType::f32)
    throw ShapeError("vulkan flash attention backward: LSE and dLSE must be f32");
  std::vector<Tensor> masks = mask_inputs(p, ins, 7);
  FlashPush f = make_push(p, q, k, v, masks);
  rows_of(d_o, f.x_off, f.x_sb, f.x_st, "dO");
  f.dtypes |= uint32_t(d_o.dtype()) << 12;

  // Δ = rowsum(dO ∘ O) - dLSE, f32 [B, H, T].
  Tensor delta = Tensor::empty({p.B, p.H, p.T}, DType::f32, q.device());
  if (delta.numel() > 0) {
    DeltaPush dp{u32(delta.numel(), "rows"), f.T, f.H, f.D, elem_offset(o), f.x_off, f.x_sb, f.x_st,
                 elem_offset(d_lse), elem_offset(delta), uint32_t(o.dtype()) | uint32_t(d_o.dtype()) << 4};
    const bool vec4 = dp.D % 4 == 0 && dp.o_off % 4 == 0 && dp.x_off % 4 == 0 && dp.x_sb % 4 == 0 && dp.x_st % 4 == 0;
    if (vec4) dp.dtypes |= 256u;
    // Eight lanes per row (the kernel's shuffles need subgroups of at least 8).
    if (ctx.features().subgroup_size < 8)
      throw DeviceError("flash attention backward needs a subgroup size of at least 8 on " + ctx.name());
    ctx.dispatch(variant(ctx, "flash_attention_bwd_delta"), {in(o), in(d_o), in(d_lse), out(delta)}, dp,
                 groups_1d(uint64_t(dp.n) * 8, 256), {256});
  }
  f.lse_off = elem_offset(lse);
  f.delta_off = elem_offset(delta);
  auto [docs, keys] = mask_bindings(p, masks, q);
  const uint32_t batch = u32(p.B, "batch");
  const std::string tc = tensor_core_family(ctx, p, q.dtype());
  const bool cm = !tc.empty();
  if (!cm) check_portable_class(cls, false);
  if (cm) f.flags |= rows_of_8(f, true) ? 8u : 0u;

  if (outs[0].numel() > 0) {  // dQ
    FlashPush fq = f;
    fq.y_off = elem_offset(outs[0]);
    fq.dtypes |= uint32_t(outs[0].dtype()) << 16;
    if (cm) fq.flags |= vec_out_flag(fq);
    const uint32_t br = cm ? tensor_core_blocks(cls).dq_rows : p.D <= 64 ? 32 : p.D <= 128 ? 16 : 8;  // BR of the dQ kernel
    const uint32_t blocks = ceil_div(uint64_t(p.T * p.G()), br);
    check_grid(blocks, "query");
    ctx.dispatch(cm ? "flash_attention_bwd_dq_" + tc + cls : variant(ctx, "flash_attention_bwd_dq" + cls),
                 {in(q), in(k), in(v), in(d_o), in(lse), in(delta), docs, keys, out(outs[0]), in(q)}, fq,
                 {blocks, f.KV, batch});
  }
  if (outs[1].numel() > 0) {  // dK, dV
    FlashPush fk = f;
    const uint32_t bc = cm ? tensor_core_blocks(cls).dkdv_keys : p.D <= 64 ? 32 : p.D <= 128 ? 16 : 8;  // BC of the dK/dV kernel
    const uint32_t blocks = ceil_div(uint64_t(p.S), bc);
    check_grid(blocks, "key");
    fk.splits = cm ? backward_splits(blocks * fk.KV * batch, ceil_div(uint64_t(p.T * p.G()), 32)) : 1;
    check_grid(batch * fk.splits, "batch");
    // Split passes write f32 partials [splits, B, S, KV, D], summed afterwards.
    auto partial = [&](const Tensor& t) {
      return fk.splits > 1 ? Tensor::empty({int64_t(fk.splits), p.B, p.S, p.KV, p.D}, DType::f32, t.device()) : t;
    };
    Tensor dk = partial(outs[1]), dv = partial(outs[2]);
    fk.y_off = elem_offset(dk);
    fk.z_off = elem_offset(dv);
    fk.dtypes |= uint32_t(dk.dtype()) << 16 | uint32_t(dv.dtype()) << 20;
    if (cm) fk.flags |= vec_out_flag(fk);
    ctx.dispatch(cm ? "flash_attention_bwd_dkdv_" + tc + cls : variant(ctx, "flash_attention_bwd_dkdv" + cls),
                 {in(q), in(k), in(v), in(d_o), in(lse), in(delta), docs, keys, out(dk), out(dv)}, fk,
                 {blocks, f.KV, batch * fk.splits});
    if (fk.splits > 1) {
      SumPush sp{u32(outs[1].numel(), "dK size"), fk.splits, elem_offset(dk), elem_offset(dv), elem_offset(outs[1]),
                 elem_offset(outs[2]), uint32_t(outs[1].dtype()) | uint32_t(outs[2].dtype()) << 4};
      u32(dk.numel(), "split partials");
      ctx.dispatch("flash_attention_bwd_sum", {in(dk), in(dv), out(outs[1]), out(outs[2])}, sp,
                   groups_1d(sp.n, 256), {256});
    }
  }
}

}  // namespace lmtune
