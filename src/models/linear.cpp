// Linear layer with LoRA adapters (see linear.h).
#include "models/linear.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>

#include "core/autodiff.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops/grouped_matmul.h"
#include "core/ops/matmul_add.h"
#include "core/ops/matmul_gated.h"
#include "core/ops/quant_matmul.h"
#include "core/ops/view.h"

namespace lmtune::models {

namespace {

struct DropoutState {
  bool active = false;
  uint64_t seed = 0, step = 0, micro = 0;
};
thread_local DropoutState g_dropout;

// The key of an adapter's dropout mask in this step and micro-batch (ops::dropout draws the mask from it on the
// device).
uint64_t dropout_key(uint64_t adapter_key) {
  return g_dropout.seed * 0x9e3779b97f4a7c15ull ^ (g_dropout.step + 1) * 0xbf58476d1ce4e5b9ull ^
         (g_dropout.micro + 1) * 0x94d049bb133111ebull ^ (adapter_key + 1) * 0xd6e8feb86659fd93ull;
}

// x · factorᵀ: with 16-bit activations and an f32 factor (the trainer's master weights) as under autocast, the
// product on the 16-bit path and the factor's gradient in f32 (ops::autocast_linear).
Tensor factor_product(const Tensor& x, const Tensor& factor) {
  bool half = x.dtype() == DType::f16 || x.dtype() == DType::bf16;
  return half && factor.dtype() == DType::f32 ? ops::autocast_linear(x, factor) : ops::linear(x, factor);
}

bool dropout_on(const LoraAdapter& a) { return g_dropout.active && a.dropout > 0; }

// Whether nothing of a product of these tensors is recorded for autodiff (generation, serving, evaluation): the
// adapter's factors can then be read as stored, with no autocast copies of them for a backward pass, and the
// bias or the residual added in the product's epilogue.
bool unrecorded(std::initializer_list<const Tensor*> tensors) {
  if (!grad_enabled()) return true;
  for (const Tensor* t : tensors)
    if (t->defined() && on_tape(*t)) return false;
  return true;
}

bool inference(const Tensor& x, const Tensor& weight, const LoraAdapter* a) {
  if (a && dropout_on(*a)) return false;
  return a ? unrecorded({&x, &weight, &a->A, &a->B}) : unrecorded({&x, &weight});
}

// Rows (tokens) up to which an adapter's factors are read as stored: decode's products (Vulkan's gemv) at the
// batch sizes generation and serving run.
constexpr int64_t kFewRows = 8;

Tensor rows_of(const Tensor& t) { return ops::reshape(t, {-1, t.dim(-1)}); }

// s x Aᵀ [tokens, R] in f32, the scale in the product: in inference the factor is read in its stored dtype (a
// cast of A per token costs a dispatch and as many bytes as the product reads).
Tensor lora_down(const LoraAdapter& a, const Tensor& x2) {
  return ops::matmul(x2, ops::transpose(a.A), DType::f32, a.scale);
}

// The operands of an adapter's term in inference, {s x2 Aᵀ, Bᵀ} for x2 [rows, in]. Many 16-bit rows (a prompt)
// take f16 factors, which the tensor-core kernels take (as more K tiles of a product, as lora_linear's); stored
// as f32 they would send the products to the exact scalar kernel. A few rows (decode) read the factors as stored,
// where casts would cost a dispatch each and as many bytes as the product reads.
std::pair<Tensor, Tensor> low_rank_operands(const LoraAdapter& a, const Tensor& x2) {
  if ((x2.dtype() == DType::f16 || x2.dtype() == DType::bf16) && x2.dim(0) > kFewRows)
    return {ops::matmul(x2, ops::transpose(ops::cast(a.A, DType::f16)), DType::f16, a.scale),
            ops::transpose(ops::cast(a.B, DType::f16))};
  return {lora_down(a, x2), ops::transpose(a.B)};
}

// (scale · dropout(x) Aᵀ) Bᵀ: R·(in + out) per token instead of materialising B A. The scale multiplies the
// rank-R intermediate, not the [tokens, out] product: one pass over R columns instead of `out` (forward and
// backward).
Tensor lora_delta(const LoraAdapter& a, const Tensor& x) {
  if (inference(x, Tensor(), &a)) {
    Shape out = x.shape();
    out.back() = a.B.dim(0);
    const auto [down, bt] = low_rank_operands(a, rows_of(x));
    return ops::reshape(ops::matmul(down, bt, x.dtype()), out);
  }
  Tensor in = dropout_on(a) ? ops::dropout(x, a.dropout, dropout_key(a.dropout_key)) : x;
  Tensor down = factor_product(in, a.A);
  return factor_product(a.scale == 1.0f ? down : ops::scale(down, a.scale), a.B);
}

// Whether an adapter can be served from a stack: nothing of it trains (no dropout, not recorded for autodiff).
bool servable(const LoraAdapter& a) { return !dropout_on(a) && unrecorded({&a.A, &a.B}); }

// A layer whose adapters go into a stack, at its first output row (a projection group's part).
struct StackPart {
  const Linear* layer;
  int64_t row;
};

// The stack's slot names: every adapter name of the parts, in order of first appearance.
std::vector<std::string> names_of(const std::vector<StackPart>& parts) {
  std::vector<std::string> names;
  for (const StackPart& p : parts)
    for (const LoraAdapter& a : p.layer->adapters)
      if (std::find(names.begin(), names.end(), a.name) == names.end()) names.push_back(a.name);
  return names;
}

// The parts' adapters stacked (AdapterStack in linear.h) for a product of `in` -> `out`: `kept` where it holds
// the same tensors and scales.
std::shared_ptr<const AdapterStack> stack_adapters(const std::vector<StackPart>& parts, int64_t in, int64_t out,
                                                   Device dev, std::shared_ptr<const AdapterStack> kept) {
  std::vector<Tensor> sources;
  std::vector<float> scales;
  for (const StackPart& p : parts)
    for (const LoraAdapter& a : p.layer->adapters) {
      sources.insert(sources.end(), {a.A, a.B});
      scales.push_back(a.scale);
    }
  bool same = kept && kept->scales == scales && kept->sources.size() == sources.size();
  for (size_t i = 0; same && i < sources.size(); ++i) same = kept->sources[i].impl() == sources[i].impl();
  if (same) return kept;
  NoGrad no_grad;
  auto st = std::make_shared<AdapterStack>();
  st->names = names_of(parts);
  const size_t S = st->names.size();
  auto slot_of = [&](const std::string& name) {
    return int64_t(std::find(st->names.begin(), st->names.end(), name) - st->names.begin());
  };
  std::vector<int64_t> rank(S, 0);
  for (const StackPart& p : parts)
    for (const LoraAdapter& a : p.layer->adapters) rank[size_t(slot_of(a.name))] += a.A.dim(0);
  const int64_t R = (*std::max_element(rank.begin(), rank.end()) + 7) / 8 * 8;
  st->a = Tensor::zeros({int64_t(S) + 1, R, in}, DType::f32, dev);
  st->b = Tensor::zeros({int64_t(S) + 1, out, R}, DType::f32, dev);
  std::vector<int64_t> col(S, 0);  // each slot's rank filled so far
  for (const StackPart& p : parts)
    for (const LoraAdapter& a : p.layer->adapters) {
      const int64_t s = slot_of(a.name), r = a.A.dim(0), c = col[size_t(s)], n = p.layer->out_features();
      copy_into(ops::reshape(ops::slice(ops::slice(st->a, 0, s, s + 1), 1, c, c + r), {r, in}),
                ops::scale(ops::cast(a.A, DType::f32), a.scale));
      copy_into(ops::reshape(ops::slice(ops::slice(ops::slice(st->b, 0, s, s + 1), 1, p.row, p.row + n), 2, c, c + r),
                             {n, r}),
                ops::cast(a.B, DType::f32));
      col[size_t(s)] += r;
    }
  st->sources = std::move(sources);
  st->scales = std::move(scales);
  return st;
}

// Each batch row's slot among `names`: its group's name, else the zero slot (names.size()). Empty where no group
// names one of them, where (unless whole_batch) one group names one for every row (the fused product does that
// better), or where a group lies outside the batch (the caller's fallback names the error).
std::vector<int32_t> row_slots(const RowAdapters& rows, const std::vector<std::string>& names, int64_t B,
                               bool whole_batch) {
  std::vector<int32_t> slot_of_row(size_t(B), int32_t(names.size()));
  int64_t groups = 0;
  bool covers_all = false;
  for (const RowAdapters::Group& g : rows.groups) {
    const auto it = std::find(names.begin(), names.end(), g.name);
    if (it == names.end() || g.begin >= g.end) continue;
    if (g.begin < 0 || g.end > B) return {};
    for (int64_t b = g.begin; b < g.end; ++b) slot_of_row[size_t(b)] = int32_t(it - names.begin());
    ++groups;
    covers_all = g.begin == 0 && g.end == B;
  }
  if (groups == 0 || (groups == 1 && covers_all && !whole_batch)) return {};
  return slot_of_row;
}

// Every row's delta [..., out] for x [B, ..., in]: s x Aᵀ, then its Bᵀ, each row's factors taken from `st` by its
// slot (two products however many adapters). The rows' slots go to the device once per set of groups.
Tensor deltas_by_id(const Tensor& x, const RowAdapters& rows, const std::vector<int32_t>& slot_of_row,
                    const AdapterStack& st) {
  const int64_t B = x.dim(0), per_row = x.numel() / std::max<int64_t>(B, 1) / x.dim(-1);
  std::string key = std::to_string(B) + "x" + std::to_string(per_row);
  for (const std::string& n : st.names) key += "/" + n;
  Tensor& id = rows.slot_ids[key];
  if (!id.defined() || id.device() != x.device()) {
    std::vector<int32_t> ids(static_cast<size_t>(B * per_row));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = slot_of_row[i / size_t(per_row)];
    id = Tensor::from_ints(ids, {B * per_row}, x.device());
  }
  const Tensor down = ops::matmul_by_id(rows_of(x), st.a, id, 1, std::nullopt, DType::f32);  // s x Aᵀ [rows, R]
  const Tensor delta = ops::matmul_by_id(down, st.b, id, 1, std::nullopt, x.dtype());
  Shape out = x.shape();
  out.back() = st.b.dim(1);
  return ops::reshape(delta, out);
}

}  // namespace

LoraDropoutScope::LoraDropoutScope(uint64_t seed, uint64_t step, uint64_t micro) {
  g_dropout = {true, seed, step, micro};
}
LoraDropoutScope::~LoraDropoutScope() { g_dropout.active = false; }

Device Linear::device() const { return qweight.defined() ? qweight.device() : weight.device(); }

Tensor Linear::base(const Tensor& x) const {
  return qweight.defined() ? ops::quantized_linear(x, qweight, bias) : ops::linear(x, weight, bias);
}

Tensor Linear::fused(const Tensor& x, const LoraAdapter* a, const Tensor& residual) const {
  const Tensor x2 = rows_of(x), wt = ops::transpose(weight);
  // One addend in the epilogue: the residual, else the bias (a layer with both adds its bias apart).
  const Tensor addend = residual.defined() ? rows_of(residual) : bias;
  Tensor y;
  if (a) {
    const auto [down, bt] = low_rank_operands(*a, x2);
    y = addend.defined() ? ops::matmul_add(x2, wt, addend, down, bt, 1.0f, x.dtype())
                         : ops::matmul_low_rank(x2, wt, down, bt, 1.0f, x.dtype());
  } else {
    y = addend.defined() ? ops::matmul_add(x2, wt, addend, x.dtype()) : ops::matmul(x2, wt, x.dtype());
  }
  if (residual.defined() && bias.defined()) y = ops::add(y, ops::cast(bias, y.dtype()));
  Shape out = x.shape();
  out.back() = out_features();
  return ops::reshape(y, out);
}

Tensor Linear::add_to(const Tensor& residual, const Tensor& x, const RowAdapters* rows) const {
  Shape out = x.shape();
  out.back() = out_features();
  if (!qweight.defined() && residual.shape() == out && residual.dtype() == x.dtype() && unrecorded({&residual})) {
    if (!rows) {  // every adapter
      const LoraAdapter* a = adapters.empty() ? nullptr : &adapters[0];
      if (adapters.size() <= 1 && inference(x, weight, a)) return fused(x, a, residual);
    } else if (inference(x, weight, nullptr)) {
      // No group names an adapter of this layer: the base product alone; else each row's delta by id after it.
      if (!named_in(*rows)) return fused(x, nullptr, residual);
      if (Tensor delta = by_row_ids_delta(x, *rows, false); delta.defined())
        return ops::add(fused(x, nullptr, residual), delta);
    }
  }
  return ops::add(residual, (*this)(x, rows));
}

Tensor Linear::operator()(const Tensor& x) const {
  if (!qweight.defined() && adapters.size() <= 1 && (bias.defined() || !adapters.empty())) {
    const LoraAdapter* a = adapters.empty() ? nullptr : &adapters[0];
    if (inference(x, weight, a)) return fused(x, a, Tensor());
  }
  // One adapter under autocast (how lmtune trains): its delta is multiplied into the base product, forward and
  // backward (ops::lora_linear). A quantized base (QLoRA) is below: its product decodes the weight in the kernel.
  if (adapters.size() == 1 && !bias.defined() && !qweight.defined()) {
    const LoraAdapter& a = adapters[0];
    const bool half = x.dtype() == DType::f16 || x.dtype() == DType::bf16;
    if (half && a.A.dtype() == DType::f32 && a.B.dtype() == DType::f32) {
      Tensor x_in = dropout_on(a) ? ops::dropout(x, a.dropout, dropout_key(a.dropout_key)) : Tensor();
      return ops::lora_linear(x, weight, a.A, a.B, a.scale, x_in, weight_t);
    }
  }
  // A quantized base takes its adapters' deltas (the same autocast products of A and B as the unfused dense path,
  // so the adapters train as on a dense base) into its product's epilogue: no add pass of their own.
  if (qweight.defined() && !bias.defined() && !adapters.empty()) {
    Tensor delta = lora_delta(adapters[0], x);
    for (size_t i = 1; i < adapters.size(); ++i) delta = ops::add(delta, lora_delta(adapters[i], x));
    return ops::quantized_linear_add(x, qweight, delta);
  }
  // matmul takes mixed operand dtypes (f32 accumulation) and writes x's dtype, so no weight copies are made.
  Tensor y = base(x);
  for (const LoraAdapter& a : adapters) y = ops::add(y, lora_delta(a, x));
  return y;
}

const AdapterStack& Linear::adapter_stack() const {
  stack_ = stack_adapters({{this, 0}}, in_features(), out_features(), device(), stack_);
  return *stack_;
}

bool Linear::named_in(const RowAdapters& rows) const {
  for (const RowAdapters::Group& g : rows.groups)
    for (const LoraAdapter& a : adapters)
      if (a.name == g.name && g.begin < g.end) return true;
  return false;
}

Tensor Linear::by_row_ids(const Tensor& x, const RowAdapters& rows) const {
  const Tensor delta = by_row_ids_delta(x, rows, false);
  return delta.defined() ? ops::add(base(x), delta) : Tensor();
}

Tensor Linear::by_row_ids_delta(const Tensor& x, const RowAdapters& rows, bool whole_batch) const {
  const int64_t B = x.dim(0), per_row = x.numel() / std::max<int64_t>(B, 1) / in_features();
  if (B * per_row > kByIdRows || adapters.empty() || !unrecorded({&x, &weight})) return Tensor();
  for (const LoraAdapter& a : adapters)
    if (!servable(a)) return Tensor();
  const std::vector<int32_t> slots = row_slots(rows, names_of({{this, 0}}), B, whole_batch);
  return slots.empty() ? Tensor() : deltas_by_id(x, rows, slots, adapter_stack());
}

Tensor Linear::operator()(const Tensor& x, const RowAdapters* rows) const {
  if (!rows) return (*this)(x);
  if (Tensor y = by_row_ids(x, *rows); y.defined()) return y;
  Tensor y = base(x);
  const int64_t B = x.dim(0);
  // The base product runs once over the whole batch; each group adds its low-rank delta to its own rows, and the
  // pieces are stitched back along the batch axis (one copy of y, only when groups differ).
  std::vector<Tensor> pieces;
  int64_t done = 0;
  for (const RowAdapters::Group& g : rows->groups) {
    const LoraAdapter* a = nullptr;
    for (const LoraAdapter& c : adapters)
      if (c.name == g.name) a = &c;
    if (!a || g.begin >= g.end) continue;
    if (g.begin < done || g.end > B)
      throw ShapeError("linear: adapter rows [" + std::to_string(g.begin) + ", " + std::to_string(g.end) +
                       ") overlap or exceed the batch of " + std::to_string(B));
    if (g.begin == 0 && g.end == B)
      return !qweight.defined() && inference(x, weight, a) ? fused(x, a, Tensor()) : ops::add(y, lora_delta(*a, x));
    if (done < g.begin) pieces.push_back(ops::slice(y, 0, done, g.begin));
    pieces.push_back(ops::add(ops::slice(y, 0, g.begin, g.end), lora_delta(*a, ops::slice(x, 0, g.begin, g.end))));
    done = g.end;
  }
  if (pieces.empty()) return y;
  if (done < B) pieces.push_back(ops::slice(y, 0, done, B));
  return ops::concat(pieces, 0);
}

LoraAdapter& Linear::add_adapter(int64_t rank, float scale, uint64_t seed, const std::string& name) {
  LoraAdapter a;
  a.name = name;
  a.scale = scale;
  const float bound = float(1.0 / std::sqrt(double(in_features())));
  a.A = Tensor::uniform({rank, in_features()}, seed, -bound, bound, DType::f32, device());
  a.B = Tensor::zeros({out_features(), rank}, DType::f32, device());
  a.A.set_requires_grad(true);
  a.B.set_requires_grad(true);
  adapters.push_back(std::move(a));
  return adapters.back();
}

Tensor Linear::merged_weight() const {
  NoGrad no_grad;
  Tensor w = qweight.defined() ? quant::dequantize(qweight, DType::f32) : ops::cast(weight, DType::f32);
  for (const LoraAdapter& a : adapters)
    w = ops::add(w, ops::scale(ops::matmul(ops::cast(a.B, DType::f32), ops::cast(a.A, DType::f32)), a.scale));
  return qweight.defined() ? w : ops::cast(w, weight.dtype());
}

LinearGroup::LinearGroup(const std::vector<Linear*>& parts) {
  if (parts.size() < 2) return;
  const Linear& first = *parts[0];
  for (const Linear* p : parts)
    if (p->qweight.defined() || !p->weight.defined() || p->weight.dtype() != first.weight.dtype() ||
        p->weight.device() != first.weight.device() || p->in_features() != first.in_features() ||
        p->bias.defined() != first.bias.defined() ||
        (p->bias.defined() && p->bias.dtype() != first.bias.dtype()))
      return;
  NoGrad no_grad;
  std::vector<Tensor> weights, biases;
  for (const Linear* p : parts) {
    weights.push_back(p->weight);
    if (p->bias.defined()) biases.push_back(p->bias);
    outs_.push_back(p->out_features());
  }
  weight_ = ops::concat(weights, 0);
  if (!biases.empty()) bias_ = ops::concat(biases, 0);
  int64_t row = 0;
  for (Linear* p : parts) {
    const int64_t n = p->out_features();
    p->weight = ops::slice(weight_, 0, row, row + n);
    if (p->bias.defined()) p->bias = ops::slice(bias_, 0, row, row + n);
    row += n;
  }
}

bool LinearGroup::fused_adapter(const std::vector<const Linear*>& parts, const LoraAdapter*& out) const {
  const LoraAdapter* named = nullptr;
  // The cache holds the sources it was made from, so a tensor it names cannot be freed and another take its place.
  bool same = cache_.sources.size() == 2 * parts.size();
  for (size_t i = 0; i < parts.size(); ++i) {
    const Linear* p = parts[i];
    if (p->adapters.size() > 1) return false;
    const LoraAdapter* a = p->adapters.empty() ? nullptr : &p->adapters[0];
    if (a && (dropout_on(*a) || (named && a->name != named->name))) return false;
    if (a) named = a;
    same = same && cache_.sources[2 * i].impl() == (a ? a->A.impl() : nullptr) &&
           cache_.sources[2 * i + 1].impl() == (a ? a->B.impl() : nullptr);
  }
  out = nullptr;
  if (!named) return true;
  if (!same) {
    std::vector<Tensor> sources;
    for (const Linear* p : parts) {
      sources.push_back(p->adapters.empty() ? Tensor() : p->adapters[0].A);
      sources.push_back(p->adapters.empty() ? Tensor() : p->adapters[0].B);
    }
    NoGrad no_grad;
    int64_t rank = 0, rows = 0;
    std::vector<Tensor> as;
    for (const Linear* p : parts)
      if (!p->adapters.empty()) {
        const LoraAdapter& a = p->adapters[0];
        as.push_back(ops::scale(ops::cast(a.A, DType::f32), a.scale));
        rank += a.A.dim(0);
      }
    LoraAdapter f;
    f.name = named->name;
    f.A = ops::concat(as, 0);
    f.B = Tensor::zeros({weight_.dim(0), rank}, DType::f32, weight_.device());
    int64_t col = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (!parts[i]->adapters.empty()) {
        const LoraAdapter& a = parts[i]->adapters[0];
        const int64_t r = a.A.dim(0);
        copy_into(ops::slice(ops::slice(f.B, 0, rows, rows + outs_[i]), 1, col, col + r), a.B);
        col += r;
      }
      rows += outs_[i];
    }
    cache_ = {std::move(sources), std::move(f)};
  }
  out = &cache_.fused;
  return true;
}

bool LinearGroup::applies(const std::vector<const Linear*>& parts, const Tensor& x, const RowAdapters* rows,
                          const LoraAdapter*& a) const {
  // Rows given: the base products, then every row's deltas by id (row_deltas); no rows: the parts' adapters fused.
  a = nullptr;
  if (!defined() || parts.size() != outs_.size() || !inference(x, weight_, nullptr)) return false;
  if (rows) return x.numel() <= Linear::kByIdRows * x.dim(-1);
  return x.numel() <= kRows * x.dim(-1) && fused_adapter(parts, a) && (!a || inference(x, weight_, a));
}

bool LinearGroup::row_deltas(const std::vector<const Linear*>& parts, const Tensor& x, const RowAdapters& rows,
                             Tensor& delta) const {
  delta = Tensor();
  std::vector<StackPart> stacked;
  bool named = false;
  int64_t row = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    stacked.push_back({parts[i], row});
    row += outs_[i];
    named |= parts[i]->named_in(rows);
    for (const LoraAdapter& a : parts[i]->adapters)
      if (!servable(a)) return false;
  }
  if (!named) return true;
  const std::vector<int32_t> slots = row_slots(rows, names_of(stacked), x.dim(0), true);
  if (slots.empty()) return false;
  row_stack_ = stack_adapters(stacked, weight_.dim(1), weight_.dim(0), weight_.device(), row_stack_);
  delta = deltas_by_id(x, rows, slots, *row_stack_);
  return true;
}

std::vector<Tensor> LinearGroup::operator()(const std::vector<const Linear*>& parts, const Tensor& x,
                                            const RowAdapters* rows, Tensor* whole) const {
  const LoraAdapter* a = nullptr;
  std::vector<Tensor> out;
  Tensor delta;
  if (whole) *whole = Tensor();
  if (!applies(parts, x, rows, a) || (rows && !row_deltas(parts, x, *rows, delta))) {
    for (const Linear* p : parts) out.push_back((*p)(x, rows));
    return out;
  }
  Linear group(weight_, bias_);
  Tensor y = a ? group.fused(x, a, Tensor()) : group(x);
  if (delta.defined()) y = ops::add(y, delta);
  if (whole) *whole = y;
  int64_t col = 0;
  for (int64_t n : outs_) {
    out.push_back(ops::slice(y, -1, col, col + n));
    col += n;
  }
  return out;
}

Tensor LinearGroup::gated(const Linear& gate, const Linear& up, const Tensor& x, ops::GateActivation act,
                          const RowAdapters* rows) const {
  const LoraAdapter* a = nullptr;
  if (outs_.size() != 2 || outs_[0] != outs_[1] || !applies({&gate, &up}, x, rows, a)) return Tensor();
  if (rows && (gate.named_in(*rows) || up.named_in(*rows))) return Tensor();  // deltas before the activation
  // The operands Linear::fused gives the product (the adapter's x Aᵀ read as stored, scale folded in).
  const Tensor x2 = rows_of(x), down = a ? lora_down(*a, x2) : Tensor();
  const Tensor y = ops::matmul_gated(x2, ops::transpose(weight_), bias_, down, a ? ops::transpose(a->B) : Tensor(),
                                     1.0f, act, x.dtype());
  Shape out = x.shape();
  out.back() = outs_[0];
  return ops::reshape(y, out);
}

}  // namespace lmtune::models
