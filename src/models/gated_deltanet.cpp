// Qwen3-Next's Gated DeltaNet layer (see gated_deltanet.h).
#include "models/gated_deltanet.h"

#include <cmath>
#include <string>

#include "core/error.h"
#include "core/ops.h"

namespace lmtune::models {

namespace {

constexpr int64_t kChunk = 64;
// (I + L)^-1 = (I - L)(I + L^2)(I + L^4)...: squarings until the power passes the chunk's last row.
constexpr int kSquarings = 5;  // L^64 = 0 for a 64-row strictly lower triangular L
static_assert(int64_t(1) << (kSquarings + 1) == kChunk);

Tensor drop_axis(const Tensor& t, int axis) {
  Shape s = t.shape();
  s.erase(s.begin() + axis);
  return ops::reshape(t, s);
}

// Chunk n of t [B, H, n, ...] as [B, H, ...].
Tensor chunk_at(const Tensor& t, int64_t n) { return drop_axis(ops::slice(t, 2, n, n + 1), 2); }

// x [B, T, H, D] -> [B, H, n, c, D], zero-padded to whole chunks.
Tensor to_chunks(const Tensor& x, int64_t chunks, int64_t chunk) {
  const int64_t B = x.dim(0), T = x.dim(1), H = x.dim(2), D = x.dim(3);
  Tensor y = ops::permute(x, {0, 2, 1, 3});
  if (chunks * chunk > T)
    y = ops::concat({y, Tensor::zeros({B, H, chunks * chunk - T, D}, x.dtype(), x.device())}, 2);
  return ops::reshape(y, {B, H, chunks, chunk, D});
}

Tensor softplus(const Tensor& x) {  // max(x, 0) + log(1 + exp(-|x|)): no overflow
  const Tensor zero = Tensor::zeros({1}, x.dtype(), x.device());
  const Tensor abs = ops::maximum(x, ops::neg(x));
  return ops::add(ops::maximum(x, zero), ops::log(ops::add_scalar(ops::exp(ops::neg(abs)), 1.0f)));
}

Tensor l2norm(const Tensor& x) {  // x / sqrt(sum x^2 + 1e-6) over the last axis (transformers' FLA-style l2norm)
  return ops::mul(x, ops::rsqrt(ops::add_scalar(ops::sum(ops::square(x), {-1}, true), 1e-6f)));
}

// The depthwise causal convolution of x [B, T, ch] (f32) with w [ch, 1, K]: y[t] = sum_j w[K - 1 - j] x[t - j],
// x[t - j] counting only inside t's sequence (masks.conv) and reaching into the cached inputs where given.
Tensor causal_conv(const Tensor& x, const Tensor& w, const DeltaNetMasks& masks, DeltaNetState* state) {
  const int64_t B = x.dim(0), T = x.dim(1), ch = x.dim(2), K = w.dim(2);
  Tensor prefix =
      state && state->conv.defined() ? state->conv : Tensor::zeros({B, K - 1, ch}, DType::f32, x.device());
  const Tensor ext = K > 1 ? ops::concat({prefix, x}, 1) : x;  // [B, K - 1 + T, ch]
  const Tensor wk = ops::reshape(ops::cast(w, DType::f32), {ch, K});
  Tensor y;
  for (int64_t j = 0; j < K; ++j) {
    Tensor term =
        ops::mul(ops::slice(ext, 1, K - 1 - j, K - 1 - j + T), drop_axis(ops::slice(wk, 1, K - 1 - j, K - j), 1));
    if (j > 0) term = ops::mul(term, drop_axis(ops::slice(masks.conv, 0, j - 1, j), 0));
    y = y.defined() ? ops::add(y, term) : term;
  }
  if (state && K > 1) state->conv = ops::contiguous(ops::slice(ext, 1, T, T + K - 1));
  return y;
}

}  // namespace

DeltaNetMasks delta_net_masks(const std::vector<int32_t>& positions, int64_t B, int64_t T, int64_t K, Device device) {
  if (int64_t(positions.size()) != B * T)
    throw ShapeError("gated deltanet: " + std::to_string(positions.size()) + " positions for batch " +
                     std::to_string(B) + " x " + std::to_string(T) + " tokens");
  DeltaNetMasks m;
  m.batch = B, m.tokens = T, m.chunk = kChunk, m.chunks = (T + kChunk - 1) / kChunk;
  const int64_t c = m.chunk, n = m.chunks;
  auto pos = [&](int64_t b, int64_t t) { return positions[size_t(b * T + t)]; };
  if (K > 1) {
    std::vector<float> conv(size_t((K - 1) * B * T));
    for (int64_t j = 1; j < K; ++j)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t) conv[size_t(((j - 1) * B + b) * T + t)] = pos(b, t) >= j;
    m.conv = Tensor::from_floats(conv, {K - 1, B, T, 1}, DType::f32, device);
  }
  std::vector<float> resets(size_t(B * T));
  for (int64_t i = 0; i < B * T; ++i) resets[size_t(i)] = positions[size_t(i)] == 0 ? 0.0f : 1.0f;
  m.resets = Tensor::from_floats(resets, {B, T, 1}, DType::f32, device);
  if (T == 1) return m;  // one-token calls take the recurrent step, which reads no chunk mask
  std::vector<float> lower(size_t(B * n * c * c)), strict(lower.size()), sees(size_t(B * n * c)), last(sees.size()),
      carry(size_t(B * n));
  std::vector<int64_t> seg(static_cast<size_t>(c));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t k = 0; k < n; ++k) {
      // seg[i]: sequences started in the chunk at or before i (padding past T continues the last one).
      int64_t starts = 0;
      for (int64_t i = 0; i < c; ++i) {
        const int64_t t = k * c + i;
        starts += t < T && pos(b, t) == 0;
        seg[size_t(i)] = starts;
      }
      const size_t base = size_t((b * n + k) * c);
      carry[size_t(b * n + k)] = starts == 0;
      for (int64_t i = 0; i < c; ++i) {
        sees[base + size_t(i)] = seg[size_t(i)] == 0;
        last[base + size_t(i)] = seg[size_t(i)] == seg[size_t(c - 1)];
        for (int64_t j = 0; j <= i; ++j) {
          const bool same = seg[size_t(i)] == seg[size_t(j)];
          lower[(base + size_t(i)) * size_t(c) + size_t(j)] = same;
          strict[(base + size_t(i)) * size_t(c) + size_t(j)] = same && j < i;
        }
      }
    }
  }
  m.lower = Tensor::from_floats(lower, {B, 1, n, c, c}, DType::f32, device);
  m.strict = Tensor::from_floats(strict, {B, 1, n, c, c}, DType::f32, device);
  m.sees_prev = Tensor::from_floats(sees, {B, 1, n, c, 1}, DType::f32, device);
  m.last = Tensor::from_floats(last, {B, 1, n, c, 1}, DType::f32, device);
  m.carry = Tensor::from_floats(carry, {B, 1, n, 1, 1}, DType::f32, device);
  return m;
}

DeltaNetMasks delta_net_step_masks(const Tensor& positions, int64_t K) {
  const int64_t B = positions.dim(0);
  if (positions.ndim() != 2 || positions.dim(1) != 1)
    throw ShapeError("gated deltanet: one-token positions must be [B, 1], got " + to_string(positions.shape()));
  DeltaNetMasks m;
  m.batch = B, m.tokens = 1, m.chunk = kChunk, m.chunks = 1;
  // On the device, from the positions as they are: a decode step reads nothing back.
  const Tensor pos = ops::reshape(ops::cast(positions, DType::f32), {1, B, 1, 1});
  auto at_least = [&](int64_t j) {
    return ops::greater_equal(pos, Tensor::full({1}, float(j), DType::f32, pos.device()));
  };
  m.resets = ops::reshape(at_least(1), {B, 1, 1});
  std::vector<Tensor> conv;
  for (int64_t j = 1; j < K; ++j) conv.push_back(at_least(j));
  if (!conv.empty()) m.conv = conv.size() == 1 ? conv[0] : ops::concat(conv, 0);
  return m;
}

Tensor gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                        const DeltaNetMasks& m, Tensor* state) {
  const int64_t B = q.dim(0), T = q.dim(1), H = q.dim(2), Dk = q.dim(3), Dv = v.dim(3);
  const int64_t n = m.chunks, c = m.chunk;
  if (m.batch != B || m.tokens != T)
    throw ShapeError("gated delta rule: masks for " + std::to_string(m.batch) + " x " + std::to_string(m.tokens) +
                     " tokens, inputs " + to_string(q.shape()));
  const Device dev = q.device();
  const Tensor qc = to_chunks(q, n, c), kc = to_chunks(k, n, c), vc = to_chunks(v, n, c);
  const Tensor gc = to_chunks(ops::reshape(g, {B, T, H, 1}), n, c),
               bc = to_chunks(ops::reshape(beta, {B, T, H, 1}), n, c);
  // cum[i]: the log decay from the chunk's start (or its sequence's start within the chunk) to token i.
  const Tensor cum = ops::matmul(m.lower, gc);  // [B, H, n, c, 1]
  // decay[i, j] = exp(cum_i - cum_j) for j <= i in one sequence, else 0 (masked before exp: no overflow).
  const Tensor diff = ops::sub(cum, ops::transpose(cum, -2, -1));
  const Tensor decay = ops::mul(ops::exp(ops::mul(diff, m.lower)), m.lower);
  const Tensor kb = ops::mul(kc, bc), vb = ops::mul(vc, bc), kt = ops::transpose(kc, -2, -1);
  // inv = (I + A)^-1 with A = (k beta kᵀ) ∘ decay, strictly lower: sum of (-A)^p for p < 64.
  std::vector<float> eye(size_t(c * c), 0.0f);
  for (int64_t i = 0; i < c; ++i) eye[size_t(i * c + i)] = 1.0f;
  const Tensor neg_a = ops::neg(ops::mul(ops::matmul(kb, kt), ops::mul(decay, m.strict)));
  Tensor inv = ops::add(neg_a, Tensor::from_floats(eye, {c, c}, DType::f32, dev)), power = neg_a;
  for (int s = 0; s < kSquarings; ++s) {
    power = ops::matmul(power, power);
    inv = ops::add(inv, ops::matmul(inv, power));
  }
  const Tensor ecum = ops::mul(ops::exp(cum), m.sees_prev);  // reads of the carried state
  const Tensor u = ops::matmul(inv, vb);                     // new values [B, H, n, c, Dv]
  const Tensor w = ops::matmul(inv, ops::mul(kb, ecum));     // decayed keys reading the state [B, H, n, c, Dk]
  const Tensor intra = ops::mul(ops::matmul(qc, kt), decay);
  const Tensor qd = ops::mul(qc, ecum);
  const Tensor cum_last = ops::slice(cum, 3, c - 1, c);  // [B, H, n, 1, 1]
  const Tensor kd = ops::mul(kc, ops::mul(ops::exp(ops::mul(ops::sub(cum_last, cum), m.last)), m.last));
  const Tensor carry = ops::mul(ops::exp(cum_last), m.carry);
  Tensor S = state && state->defined() ? *state : Tensor::zeros({B, H, Dk, Dv}, DType::f32, dev);
  std::vector<Tensor> out;
  for (int64_t i = 0; i < n; ++i) {
    const Tensor vn = ops::sub(chunk_at(u, i), ops::matmul(chunk_at(w, i), S));
    out.push_back(ops::add(ops::matmul(chunk_at(qd, i), S), ops::matmul(chunk_at(intra, i), vn)));
    S = ops::add(ops::mul(S, chunk_at(carry, i)), ops::matmul(ops::transpose(chunk_at(kd, i), -2, -1), vn));
  }
  if (state) *state = S;
  Tensor o = n == 1 ? out[0] : ops::concat(out, 2);  // [B, H, n c, Dv]
  if (n * c > T) o = ops::slice(o, 2, 0, T);
  return ops::contiguous(ops::permute(o, {0, 2, 1, 3}));
}

Tensor gated_delta_rule_recurrent(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                  const Tensor& beta, const DeltaNetMasks& m, Tensor* state) {
  const int64_t B = q.dim(0), T = q.dim(1), H = q.dim(2), Dk = q.dim(3), Dv = v.dim(3);
  Tensor S = state && state->defined() ? *state : Tensor::zeros({B, H, Dk, Dv}, DType::f32, q.device());
  auto at = [&](const Tensor& x, int64_t t) { return drop_axis(ops::slice(x, 1, t, t + 1), 1); };  // [B, H, ...]
  std::vector<Tensor> out;
  for (int64_t t = 0; t < T; ++t) {
    const Tensor qt = ops::reshape(at(q, t), {B, H, 1, Dk}), kt = ops::reshape(at(k, t), {B, H, 1, Dk});
    // A sequence starting at t forgets the state.
    S = ops::mul(
        S, ops::mul(ops::exp(ops::reshape(at(g, t), {B, H, 1, 1})), ops::reshape(at(m.resets, t), {B, 1, 1, 1})));
    const Tensor delta = ops::mul(ops::sub(ops::reshape(at(v, t), {B, H, 1, Dv}), ops::matmul(kt, S)),
                                  ops::reshape(at(beta, t), {B, H, 1, 1}));
    S = ops::add(S, ops::matmul(ops::transpose(kt, -2, -1), delta));
    out.push_back(ops::reshape(ops::matmul(qt, S), {B, 1, H, Dv}));
  }
  if (state) *state = S;
  return T == 1 ? out[0] : ops::concat(out, 1);
}

Tensor gated_deltanet(const DeltaNetWeights& w, const LinearAttentionConfig& la, const Tensor& h,
                      const DeltaNetMasks& masks, DeltaNetState* state, const RowAdapters* row_adapters, float eps) {
  const int64_t B = h.dim(0), T = h.dim(1), Hk = la.key_heads, Hv = la.value_heads, Dk = la.key_head_dim,
                Dv = la.value_head_dim, r = Hv / Hk;
  Tensor mixed, z, b, a;  // the convolution's input [B, T, Hk Dk | Hk Dk | Hv Dv]; z [B, T, Hv, Dv]; b, a [B, T, Hv]
  if (la.split_projections) {
    mixed = ops::cast(w.in_qkv(h, row_adapters), DType::f32);
    z = ops::reshape(w.in_z(h, row_adapters), {B, T, Hv, Dv});
    b = ops::cast(w.in_b(h, row_adapters), DType::f32);
    a = ops::cast(w.in_a(h, row_adapters), DType::f32);
  } else {
    // Per key head: q [Dk], k [Dk], v [r Dv], z [r Dv]; then b [r], a [r].
    const Tensor qkvz = ops::reshape(w.in_qkvz(h, row_adapters), {B, T, Hk, 2 * Dk + 2 * r * Dv});
    const Tensor ba = ops::reshape(w.in_ba(h, row_adapters), {B, T, Hk, 2 * r});
    auto part = [&](const Tensor& x, int64_t from, int64_t size, Shape shape) {
      return ops::reshape(ops::slice(x, 3, from, from + size), shape);
    };
    mixed = ops::cast(ops::concat({part(qkvz, 0, Dk, {B, T, Hk * Dk}), part(qkvz, Dk, Dk, {B, T, Hk * Dk}),
                                   part(qkvz, 2 * Dk, r * Dv, {B, T, Hv * Dv})},
                                  2),
                      DType::f32);
    z = part(qkvz, 2 * Dk + r * Dv, r * Dv, {B, T, Hv, Dv});
    b = ops::cast(part(ba, 0, r, {B, T, Hv}), DType::f32);
    a = ops::cast(part(ba, r, r, {B, T, Hv}), DType::f32);
  }

  const Tensor conv = ops::silu(causal_conv(mixed, w.conv, masks, state));
  // Queries and keys of each key head serve its r value heads (repeat_interleave).
  auto heads = [&](const Tensor& x) {
    const Tensor y = ops::reshape(x, {B, T, Hk, 1, Dk});
    return ops::reshape(r == 1 ? y : ops::expand(y, {B, T, Hk, r, Dk}), {B, T, Hv, Dk});
  };
  const Tensor q = heads(ops::scale(l2norm(ops::reshape(ops::slice(conv, 2, 0, Hk * Dk), {B, T, Hk, Dk})),
                                    float(1.0 / std::sqrt(double(Dk)))));
  const Tensor k = heads(l2norm(ops::reshape(ops::slice(conv, 2, Hk * Dk, 2 * Hk * Dk), {B, T, Hk, Dk})));
  const Tensor v = ops::reshape(ops::slice(conv, 2, 2 * Hk * Dk, 2 * Hk * Dk + Hv * Dv), {B, T, Hv, Dv});
  const Tensor beta = ops::sigmoid(b);
  const Tensor rate = ops::neg(ops::exp(ops::cast(w.a_log, DType::f32)));
  const Tensor g = ops::mul(rate, softplus(ops::add(a, ops::cast(w.dt_bias, DType::f32))));

  Tensor* S = state ? &state->delta : nullptr;
  const Tensor o =
      T == 1 ? gated_delta_rule_recurrent(q, k, v, g, beta, masks, S) : gated_delta_rule(q, k, v, g, beta, masks, S);
  const Tensor normed = ops::rms_norm(ops::cast(o, h.dtype()), w.norm, eps);
  return w.out(ops::reshape(ops::mul(normed, ops::silu(z)), {B, T, Hv * Dv}), row_adapters);
}

}  // namespace lmtune::models
