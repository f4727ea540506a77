// The autodiff machinery: accumulation through reuse and broadcasting, frozen tensors, NoGrad, ops without a
// vjp, value_and_grad, backward through a consumed graph, and gradient dtypes.
#include "autodiff/gradcheck.h"
#include "core/error.h"
#include "core/primitive.h"

namespace lmtune::test {
namespace {

std::vector<double> host(const Tensor& t) { return t.to_doubles(); }

TEST(Autodiff, ReuseAccumulates) {
  Tensor x = f32_input({3, 5}, 1);
  x.set_requires_grad(true);
  Tensor y = ops::add(ops::mul(x, x), ops::scale(x, 3.0f));  // x used three times
  backward(ops::sum_all(y));
  auto g = host(x.grad()), xv = host(x);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], 2 * xv[i] + 3, 1e-6);
  // A second backward on a fresh graph adds to .grad.
  backward(ops::sum_all(ops::scale(x, 2.0f)));
  g = host(x.grad());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], 2 * xv[i] + 5, 1e-6);
}

TEST(Autodiff, BroadcastingSumsGradients) {
  Tensor a = f32_input({3, 1}, 2), b = f32_input({4}, 3);
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  backward(ops::sum_all(ops::mul(a, b)));
  ASSERT_EQ(a.grad().shape(), (Shape{3, 1}));
  ASSERT_EQ(b.grad().shape(), (Shape{4}));
  auto av = host(a), bv = host(b), ga = host(a.grad()), gb = host(b.grad());
  double sa = av[0] + av[1] + av[2], sb = bv[0] + bv[1] + bv[2] + bv[3];
  for (double g : ga) EXPECT_NEAR(g, sb, 1e-6);
  for (double g : gb) EXPECT_NEAR(g, sa, 1e-6);
}

TEST(Autodiff, FrozenTensorsGetNoGrad) {
  Tensor x = f32_input({2, 4}, 4), w = f32_input({3, 4}, 5);
  x.set_requires_grad(true);
  backward(ops::sum_all(ops::linear(x, w)));
  EXPECT_TRUE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(w.requires_grad());
}

TEST(Autodiff, NoGradRecordsNothing) {
  Tensor x = f32_input({2, 4}, 6);
  x.set_requires_grad(true);
  {
    NoGrad no_grad;
    EXPECT_FALSE(grad_enabled());
    Tensor y = ops::exp(x);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.impl()->node, nullptr);
    EXPECT_THROW(backward(ops::sum_all(y)), AutodiffError);
  }
  EXPECT_TRUE(grad_enabled());
  EXPECT_TRUE(ops::exp(x).requires_grad());
}

// A test-local op with a CPU kernel but no vjp.
class Twice final : public Primitive {
 public:
  const char* name() const override { return "test_twice"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override {
    auto v = in[0].to_floats();
    for (float& f : v) f *= 2;
    std::vector<Tensor> tmp{Tensor::from_floats(v, in[0].shape(), out[0].dtype(), Device::cpu())};
    copy_into(out[0], tmp[0]);
  }
  void eval_vulkan(const std::vector<Tensor>& in, std::vector<Tensor>& out) override { eval_cpu(in, out); }
  static void copy_into(const Tensor& dst, const Tensor& src) {
    auto v = src.to_floats();
    backend(Device::cpu()).write(*dst.buffer(), 0, v.data(), v.size() * 4);
  }
};

TEST(Autodiff, OpWithoutVjpFailsAtRecordTime) {
  Tensor x = f32_input({3}, 7);
  // Fine without grad: the kernel runs.
  EXPECT_EQ(apply1(std::make_shared<Twice>(), {x}, {x.shape(), DType::f32}).to_floats()[0], 2 * x.to_floats()[0]);
  x.set_requires_grad(true);
  try {
    apply1(std::make_shared<Twice>(), {x}, {x.shape(), DType::f32});
    ADD_FAILURE() << "no AutodiffError";
  } catch (const AutodiffError& e) {
    EXPECT_NE(std::string(e.what()).find("test_twice"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::greater_equal(x, x), AutodiffError);
  // Integer results (argmax) carry no gradient and are not recorded.
  EXPECT_FALSE(ops::argmax(ops::reshape(x, {1, 3}), -1).requires_grad());
}

TEST(Autodiff, ValueAndGrad) {
  Tensor x = f32_input({2, 3}, 8), y = f32_input({2, 3}, 9);
  auto f = value_and_grad([](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{ops::sum_all(ops::mul(ops::square(in[0]), in[1]))};
  });
  auto [value, grads] = f({x, y});
  auto xv = host(x), yv = host(y);
  double want = 0;
  for (size_t i = 0; i < xv.size(); ++i) want += xv[i] * xv[i] * yv[i];
  EXPECT_NEAR(value.item(), want, 1e-5);
  ASSERT_EQ(grads.size(), 2u);
  auto gx = host(grads[0]), gy = host(grads[1]);
  for (size_t i = 0; i < xv.size(); ++i) {
    EXPECT_NEAR(gx[i], 2 * xv[i] * yv[i], 1e-6);
    EXPECT_NEAR(gy[i], xv[i] * xv[i], 1e-6);
  }
  EXPECT_FALSE(x.grad().defined());  // the transform does not touch .grad of its arguments
  EXPECT_FALSE(value.requires_grad());
}

TEST(Autodiff, BackwardTwiceThroughOneGraphFails) {
  Tensor x = f32_input({4}, 10);
  x.set_requires_grad(true);
  Tensor loss = ops::sum_all(ops::exp(x));
  backward(loss);
  try {
    backward(loss);
    ADD_FAILURE() << "no AutodiffError";
  } catch (const AutodiffError& e) {
    EXPECT_NE(std::string(e.what()).find("already used"), std::string::npos) << e.what();
  }
}

TEST(Autodiff, GradientsKeepTheParameterDtype) {
  Tensor x = make_input({3, 8}, DType::bf16, Device::cpu(), 11);
  Tensor w = make_input({4, 8}, DType::bf16, Device::cpu(), 12);
  Tensor b = make_input({4}, DType::f32, Device::cpu(), 13);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  // bf16 matmul, an f32 bias added after a cast, an f32 loss.
  Tensor y = ops::add(ops::cast(ops::linear(x, w), DType::f32), b);
  backward(ops::sum_all(ops::square(y)));
  EXPECT_EQ(w.grad().dtype(), DType::bf16);
  EXPECT_EQ(b.grad().dtype(), DType::f32);
  EXPECT_EQ(w.grad().shape(), w.shape());
}

TEST(Autodiff, JvpAndVjpOfIdentityAndUnusedInputs) {
  Tensor x = f32_input({3}, 14), y = f32_input({3}, 15);
  Fn f = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; };
  auto [o, g] = lmtune::vjp(f, {x, y}, {random_like({3}, 16)});
  EXPECT_EQ(host(g[0]), host(random_like({3}, 16)));
  EXPECT_EQ(host(g[1]), std::vector<double>(3, 0.0));
  auto [o2, t] = lmtune::jvp(f, {x, y}, {random_like({3}, 17), Tensor()});
  EXPECT_EQ(host(t[0]), host(random_like({3}, 17)));
}

}  // namespace
}  // namespace lmtune::test
