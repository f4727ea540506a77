// Composite functions: the dot-product identity <J v, u> = <v, Jᵀ u> between jvp and vjp, and both against a
// directional finite difference of the double reference, for a GQA + causal + softcap attention block and a
// whole pre-norm decoder layer.
#include "autodiff/decoder.h"
#include "autodiff/gradcheck.h"

namespace lmtune::test {
namespace {

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
