// Gradient checkpointing on a 4-layer decoder stack: bitwise-identical gradients (inputs and captured
// parameters) with and without checkpoint, lower peak memory with it, matching jvp, and the error for a
// captured tensor that is not a leaf.
#include <cstring>
#include <iostream>

#include "autodiff/decoder.h"
#include "autodiff/gradcheck.h"
#include "core/error.h"

namespace lmtune::test {
namespace {

TEST(Checkpoint, BitwiseIdenticalGradientsAndLowerPeakMemory) {
  DecoderDims d = stack_dims();
  RopeTables rt = rope_tables(d);
  std::vector<std::vector<Tensor>> layers;
  for (int l = 0; l < 4; ++l) layers.push_back(decoder_params(d, 100 + 20 * l, true));
  Tensor x0 = f32_input({d.B, d.T, d.C}, 99);

  StackRun plain = run_stack(false, d, layers, rt, x0);
  StackRun ckpt = run_stack(true, d, layers, rt, x0);
  EXPECT_EQ(plain.loss, ckpt.loss);
  ASSERT_EQ(plain.grads.size(), ckpt.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    ASSERT_EQ(plain.grads[i].size(), ckpt.grads[i].size());
    EXPECT_EQ(std::memcmp(plain.grads[i].data(), ckpt.grads[i].data(), plain.grads[i].size() * sizeof(float)), 0)
        << "gradient " << i << (i == 0 ? " (input)" : " (parameter)") << " differs";
    double norm = 0;
    for (float g : plain.grads[i]) norm += double(g) * g;
    EXPECT_GT(norm, 0) << "gradient " << i << " is zero";
  }
  std::cout << "    peak memory over forward + backward: without checkpoint " << plain.peak / 1024
            << " KiB, with checkpoint " << ckpt.peak / 1024 << " KiB\n";
  EXPECT_LT(ckpt.peak, plain.peak);
}

TEST(Checkpoint, JvpMatchesPlainFunction) {
  DecoderDims d;
  RopeTables rt = rope_tables(d);
  std::vector<Tensor> p = decoder_params(d, 60, true);
  Fn layer = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{decoder_layer(d, in[0], p, rt)}; };
  Tensor x = f32_input({d.B, d.T, d.C}, 61), v = random_like({d.B, d.T, d.C}, 62);
  auto plain = lmtune::jvp(layer, {x}, {v});
  auto ckpt = lmtune::jvp(checkpoint(layer), {x}, {v});
  EXPECT_EQ(plain.first[0].to_floats(), ckpt.first[0].to_floats());
  EXPECT_EQ(plain.second[0].to_floats(), ckpt.second[0].to_floats());
  // vjp through the checkpoint also matches, and captured parameters receive gradients.
  Tensor u = random_like({d.B, d.T, d.C}, 63);
  auto g1 = lmtune::vjp(layer, {x}, {u});
  auto g2 = lmtune::vjp(checkpoint(layer), {x}, {u});
  EXPECT_EQ(g1.second[0].to_floats(), g2.second[0].to_floats());
  EXPECT_TRUE(p[1].grad().defined());
}

TEST(Checkpoint, CapturedNonLeafIsRejected) {
  Tensor w = f32_input({4}, 70);
  w.set_requires_grad(true);
  Tensor w2 = ops::scale(w, 2.0f);  // an op output that requires grad, captured by the function below
  Fn f = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::mul(in[0], w2)}; };
  Tensor x = f32_input({4}, 71);
  Tensor y = checkpoint(f)({x})[0];
  try {
    backward(ops::sum_all(y));
    ADD_FAILURE() << "no AutodiffError";
  } catch (const AutodiffError& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lmtune::test

namespace lmtune::test {
namespace {

// The usual fine-tuning case: the checkpointed input does not require grad, only the captured parameters do.
TEST(Checkpoint, CapturedParametersGetGradientsWhenInputsDoNot) {
  DecoderDims d;
  RopeTables rt = rope_tables(d);
  std::vector<Tensor> p = decoder_params(d, 80, true);
  Fn layer = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{decoder_layer(d, in[0], p, rt)}; };
  Tensor x = f32_input({d.B, d.T, d.C}, 81);  // no grad
  std::vector<std::vector<float>> plain, ckpt;
  backward(ops::sum_all(ops::square(layer({x})[0])));
  for (auto t : p) {
    plain.push_back(t.grad().to_floats());
    t.zero_grad();
  }
  backward(ops::sum_all(ops::square(checkpoint(layer)({x})[0])));
  for (auto t : p) {
    ASSERT_TRUE(t.grad().defined());
    ckpt.push_back(t.grad().to_floats());
  }
  EXPECT_EQ(plain, ckpt);
}

}  // namespace
}  // namespace lmtune::test
