// Composite functions: the dot-product identity <J v, u> = <v, Jᵀ u> between jvp and vjp, and both against a
// directional finite difference of the double reference, for a GQA + causal + softcap attention block and a
// whole pre-norm decoder layer.
#include "autodiff/decoder.h"
#include "autodiff/gradcheck.h"

namespace lmtune::test {
namespace {

double dot(const Tensor& a, const Tensor& b) {
  auto x = a.to_doubles(), y = b.to_doubles();
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}

// Checks <J v, u> == <v, Jᵀ u> (f32 autodiff, both ways) and that both match d/dε <u, f_ref(x + ε v)>.
void check_dot_product_identity(const Fn& f, const RefFn& rf, const std::vector<Tensor>& primals) {
  std::vector<Tensor> v;
  std::vector<ref::Array> x, rv;
  for (size_t i = 0; i < primals.size(); ++i) {
    v.push_back(random_like(primals[i].shape(), 500 + i));
    x.push_back(ref::of(primals[i]));
    rv.push_back(ref::of(v.back()));
  }
  std::vector<Tensor> outs = lmtune::jvp(f, primals, v).first;
  std::vector<Tensor> u;
  for (size_t k = 0; k < outs.size(); ++k) u.push_back(random_like(outs[k].shape(), 600 + k));
  auto [o1, jv] = lmtune::jvp(f, primals, v);
  auto [o2, jtu] = lmtune::vjp(f, primals, u);
  double forward = 0, reverse = 0;
  for (size_t k = 0; k < u.size(); ++k) forward += dot(jv[k], u[k]);
  for (size_t i = 0; i < v.size(); ++i) reverse += dot(v[i], jtu[i]);

  const double h = 1e-5;
  std::vector<ref::Array> xp, xm;
  for (size_t i = 0; i < x.size(); ++i) {
    xp.push_back(axpy(x[i], h, rv[i]));
    xm.push_back(axpy(x[i], -h, rv[i]));
  }
  auto yp = rf(xp), ym = rf(xm);
  double fd = 0;
  for (size_t k = 0; k < u.size(); ++k) {
    ref::Array ru = ref::of(u[k]);
    for (int64_t e = 0; e < ru.size(); ++e) fd += ru[e] * (yp[k][e] - ym[k][e]) / (2 * h);
  }
  std::cout << "    <Jv,u> = " << forward << "  <v,J^T u> = " << reverse << "  finite difference = " << fd << "\n";
  EXPECT_NEAR(forward, reverse, 1e-5 * std::abs(fd));
  EXPECT_NEAR(forward, fd, 1e-4 * std::abs(fd));
  EXPECT_NEAR(reverse, fd, 1e-4 * std::abs(fd));
}

TEST(Composite, AttentionBlockGqaCausalSoftcap) {
  DecoderDims d;
  d.softcap = 2.0f;
  RopeTables rt = rope_tables(d);
  std::vector<Tensor> p = decoder_params(d, 40, false);
  std::vector<Tensor> primals{f32_input({d.B, d.T, d.C}, 41), p[1], p[2], p[3], p[4]};
  check_dot_product_identity(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{attention_block(d, in[0], in[1], in[2], in[3], in[4], rt)};
      },
      [&](const std::vector<ref::Array>& in) {
        return std::vector<ref::Array>{ref_attention_block(d, in[0], in[1], in[2], in[3], in[4], rt)};
      },
      primals);
}

TEST(Composite, DecoderLayer) {
  DecoderDims d;
  RopeTables rt = rope_tables(d);
  std::vector<Tensor> primals = decoder_params(d, 50, false);
  primals.insert(primals.begin(), f32_input({d.B, d.T, d.C}, 51, Layout::contiguous, 0.1f, 2.0f));
  check_dot_product_identity(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{decoder_layer(d, in[0], std::vector<Tensor>(in.begin() + 1, in.end()), rt)};
      },
      [&](const std::vector<ref::Array>& in) {
        return std::vector<ref::Array>{
            ref_decoder_layer(d, in[0], std::vector<ref::Array>(in.begin() + 1, in.end()), rt)};
      },
      primals);
  // And the full gradient of the layer, element by element, against finite differences of the reference.
  check_gradients(
      [&](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{decoder_layer(d, in[0], std::vector<Tensor>(in.begin() + 1, in.end()), rt)};
      },
      [&](const std::vector<ref::Array>& in) {
        return std::vector<ref::Array>{
            ref_decoder_layer(d, in[0], std::vector<ref::Array>(in.begin() + 1, in.end()), rt)};
      },
      primals, 1e-7);
}

}  // namespace
}  // namespace lmtune::test
