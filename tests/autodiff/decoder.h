// A pre-norm decoder layer (rms_norm -> q/k/v linear -> rope -> GQA attention -> o linear -> residual ->
// rms_norm -> SwiGLU MLP -> residual), in the library and as a double reference, for the composite gradient
// tests and the checkpoint tests.
#pragma once
#include <cmath>
#include <vector>

#include "core/autodiff.h"
#include "ops/op_test_util.h"

namespace lmtune::test {

struct DecoderDims {
  int64_t B = 2, T = 5, C = 8, H = 4, KV = 2, D = 2, F = 12;
  float softcap = 0;
};

// Parameters in order: ln1 [C], wq [H*D, C], wk [KV*D, C], wv [KV*D, C], wo [C, H*D], ln2 [C], wg [F, C],
// wu [F, C], wd [C, F].
inline std::vector<Shape> decoder_param_shapes(const DecoderDims& d) {
  return {{d.C}, {d.H * d.D, d.C}, {d.KV * d.D, d.C}, {d.KV * d.D, d.C}, {d.C, d.H * d.D},
          {d.C}, {d.F, d.C},       {d.F, d.C},        {d.C, d.F}};
}

inline std::vector<Tensor> decoder_params(const DecoderDims& d, uint64_t seed, bool requires_grad,
                                          Device dev = Device::cpu()) {
  std::vector<Tensor> p;
  for (const Shape& s : decoder_param_shapes(d)) {
    bool norm = s.size() == 1;
    float scale = norm ? 1.0f : 1.0f / std::sqrt(float(s[1]));
    std::vector<float> v = random_values(numel(s), seed++, norm ? 0.5f : 0.2f * scale, norm ? 1.5f : 1.5f * scale, norm);
    Tensor t = Tensor::from_floats(v, s, DType::f32, dev);
    if (requires_grad) t.set_requires_grad(true);
    p.push_back(t);
  }
  return p;
}

struct RopeTables {
  Tensor positions, inv_freq;
};
inline RopeTables rope_tables(const DecoderDims& d, Device dev = Device::cpu()) {
  std::vector<int32_t> pos;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t t = 0; t < d.T; ++t) pos.push_back(int32_t(t));
  std::vector<float> inv;
  for (int64_t i = 0; i < d.D / 2; ++i) inv.push_back(float(std::pow(10000.0, -2.0 * double(i) / double(d.D))));
  return {Tensor::from_ints(pos, {d.B, d.T}, dev), Tensor::from_floats(inv, {d.D / 2}, DType::f32, dev)};
}

// Attention sub-block: q/k/v projections, rope, causal GQA attention (with the dims' softcap), o projection.
inline Tensor attention_block(const DecoderDims& d, const Tensor& h, const Tensor& wq, const Tensor& wk, const Tensor& wv,
                              const Tensor& wo, const RopeTables& rt) {
  using namespace ops;
  Tensor q = rope(reshape(linear(h, wq), {d.B, d.T, d.H, d.D}), rt.positions, rt.inv_freq, RopeLayout::half_split);
  Tensor k = rope(reshape(linear(h, wk), {d.B, d.T, d.KV, d.D}), rt.positions, rt.inv_freq, RopeLayout::half_split);
  Tensor v = reshape(linear(h, wv), {d.B, d.T, d.KV, d.D});
  AttentionOptions opt;
  opt.causal = true;
  opt.softcap = d.softcap;
  return linear(reshape(attention(q, k, v, opt), {d.B, d.T, d.H * d.D}), wo);
}

inline Tensor decoder_layer(const DecoderDims& d, const Tensor& x, const std::vector<Tensor>& p, const RopeTables& rt) {
  using namespace ops;
  Tensor h = add(x, attention_block(d, rms_norm(x, p[0], 1e-5f), p[1], p[2], p[3], p[4], rt));
  Tensor n = rms_norm(h, p[5], 1e-5f);
  return add(h, linear(mul(silu(linear(n, p[6])), linear(n, p[7])), p[8]));
}

inline ref::Array ref_attention_block(const DecoderDims& d, const ref::Array& h, const ref::Array& wq,
                                      const ref::Array& wk, const ref::Array& wv, const ref::Array& wo,
                                      const RopeTables& rt) {
  auto pos = ref::ints_of(rt.positions);
  ref::Array inv = ref::of(rt.inv_freq);
  auto hs = ops::RopeLayout::half_split;
  ref::Array q = ref::rope(ref::reshape(ref::linear(h, wq, nullptr), {d.B, d.T, d.H, d.D}), pos, inv, hs);
  ref::Array k = ref::rope(ref::reshape(ref::linear(h, wk, nullptr), {d.B, d.T, d.KV, d.D}), pos, inv, hs);
  ref::Array v = ref::reshape(ref::linear(h, wv, nullptr), {d.B, d.T, d.KV, d.D});
  ref::AttentionRef ro{0, true, 0, d.softcap, {}, 0};
  return ref::linear(ref::reshape(ref::attention(q, k, v, ro), {d.B, d.T, d.H * d.D}), wo, nullptr);
}

inline ref::Array ref_decoder_layer(const DecoderDims& d, const ref::Array& x, const std::vector<ref::Array>& p,
                                    const RopeTables& rt) {
  auto plus = [](double a, double b) { return a + b; };
  ref::Array h = ref::binary(x, ref_attention_block(d, ref::rms_norm(x, p[0], 1e-5), p[1], p[2], p[3], p[4], rt), plus);
  ref::Array n = ref::rms_norm(h, p[5], 1e-5);
  ref::Array g = ref::unary(ref::linear(n, p[6], nullptr), [](double v) { return v / (1 + std::exp(-v)); });
  ref::Array m = ref::binary(g, ref::linear(n, p[7], nullptr), [](double a, double b) { return a * b; });
  return ref::binary(h, ref::linear(m, p[8], nullptr), plus);
}

// A stack of decoder layers (each optionally checkpointed) under a mean-square loss: the gradients of x and of
// every parameter, the loss, and the peak memory above the starting level on x0's device during forward +
// backward. Parameters must require grad; their .grad() is cleared afterwards.
struct StackRun {
  std::vector<std::vector<float>> grads;  // x first, then every parameter
  size_t peak = 0;
  float loss = 0;
};

// The dims of the checkpoint tests' 4-layer stack.
inline DecoderDims stack_dims() {
  DecoderDims d;
  d.B = 2, d.T = 48, d.C = 32, d.H = 4, d.KV = 2, d.D = 8, d.F = 64, d.softcap = 0;
  return d;
}

inline StackRun run_stack(bool use_checkpoint, const DecoderDims& d, const std::vector<std::vector<Tensor>>& layers,
                          const RopeTables& rt, const Tensor& x0) {
  Backend& be = backend(x0.device());
  Tensor x = x0.detach();
  x.set_requires_grad(true);
  size_t base = be.bytes_in_use();
  be.reset_peak();
  Tensor h = x;
  for (const auto& p : layers) {
    Fn layer = [&d, &p, &rt](const std::vector<Tensor>& in) { return std::vector<Tensor>{decoder_layer(d, in[0], p, rt)}; };
    h = (use_checkpoint ? checkpoint(layer) : layer)({h})[0];
  }
  Tensor loss = ops::mean(ops::square(h), {0, 1, 2});
  StackRun r;
  r.loss = loss.item();
  backward(loss);
  r.peak = be.peak_bytes() - base;
  r.grads.push_back(x.grad().to_floats());
  for (const auto& p : layers)
    for (const auto& t : p) r.grads.push_back(t.grad().to_floats());
  for (const auto& p : layers)
    for (auto t : p) t.zero_grad();
  return r;
}

}  // namespace lmtune::test
