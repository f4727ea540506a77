// Gradients that meet at a shared input, added by the kernel of the vjp that produces one (Primitive::vjp_into):
// an RMSNorm beside a residual path, as in every decoder layer (its gradient pass adds into the residual's
// gradient), with two LoRA layers on the normed input (whose gradients the backward pass adds as usual). Checked
// against one backward pass per path, summed in double.
#include "core/autodiff.h"
#include "ops/op_test_util.h"

namespace lmtune::test {
namespace {

TEST_P(OpTest, GradientsAddedInPlace) {
  const int64_t M = 128, K = 64, N = 128, R = 16;
  for (DType dt : {DType::bf16, DType::f16}) {
    LMTUNE_CASE(dtype_name(dt));
    Tensor x = make_input({M, K}, dt, dev(), 300);
    Tensor norm_w = make_input({K}, dt, dev(), 301, Layout::contiguous, 0.5f, 1.5f, true);
    Tensor w1 = make_input({N, K}, dt, dev(), 302), w2 = make_input({N, K}, dt, dev(), 303);
    Tensor a1 = make_input({R, K}, DType::f32, dev(), 304), b1 = make_input({N, R}, DType::f32, dev(), 305);
    Tensor a2 = make_input({R, K}, DType::f32, dev(), 306), b2 = make_input({N, R}, DType::f32, dev(), 307);
    Tensor c1 = make_input({M, N}, dt, dev(), 308), c2 = make_input({M, N}, dt, dev(), 309);
    Tensor c3 = make_input({M, K}, dt, dev(), 310, Layout::contiguous, 16.0f, 64.0f);  // the larger part
    auto weighted = [](const Tensor& y, const Tensor& c) { return ops::sum_all(ops::cast(ops::mul(y, c), DType::f32)); };
    // Which paths the loss takes: 1 and 2 are the LoRA layers on norm(r), 3 the residual r itself, r = x / 2 (an
    // op's output, as the residual stream is: a leaf's gradient is collected apart).
    auto loss_of = [&](bool p1, bool p2, bool p3) {
      return [=](const std::vector<Tensor>& in) {
        const Tensor r = ops::scale(in[0], 0.5f);
        const Tensor h = ops::rms_norm(r, norm_w, 1e-5f);
        Tensor sum;
        auto plus = [&](const Tensor& t) { sum = sum.defined() ? ops::add(sum, t) : t; };
        if (p1) plus(weighted(ops::lora_linear(h, w1, a1, b1, 2.0f), c1));
        if (p2) plus(weighted(ops::lora_linear(h, w2, a2, b2, 2.0f), c2));
        if (p3) plus(weighted(r, c3));
        return std::vector<Tensor>{sum};
      };
    };
    const uint64_t before = gradients_added_in_place();
    const Tensor dx = value_and_grad(loss_of(true, true, true))({x}).second[0];
    EXPECT_EQ(gradients_added_in_place() - before, 1u) << "the RMSNorm gradient pass adds in place";
    ref::Array want = ref::of(value_and_grad(loss_of(true, false, false))({x}).second[0]);
    for (const auto& path : {loss_of(false, true, false), loss_of(false, false, true)}) {
      const ref::Array g = ref::of(value_and_grad(path)({x}).second[0]);
      want = ref::binary(want, g, [](double p, double q) { return p + q; });
    }
    EXPECT_EQ(dx.dtype(), dt);
    EXPECT_TRUE(close(dx, want, dt));
  }
}

}  // namespace
}  // namespace lmtune::test
