// Gradient checkpointing on a 4-layer decoder stack: bitwise-identical gradients (inputs and captured
// parameters) with and without checkpoint, lower peak memory with it, matching jvp, the error for a captured
// tensor that is not a leaf, outputs kept across the recomputation (apply_kept) and unread results dropped.
#include <cstring>
#include <iostream>

#include "autodiff/decoder.h"
#include "autodiff/gradcheck.h"
#include "backend/cpu/strided.h"
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

// In a recomputation, the ops whose outputs nothing reads (the last product and add) are dropped. A deferred
// output that a later op, a view's reader or the host reads runs first. Gradients are bitwise the plain segment's.
TEST(Checkpoint, UnreadResultsAreNotRecomputed) {
  const Tensor w1 = random_like({3, 3}, 93), w2 = random_like({3, 3}, 94);
  std::vector<std::vector<float>> seen;
  Fn segment = [&](const std::vector<Tensor>& in) {
    const Tensor a = ops::add(ops::matmul(in[0], w1), in[0]);  // both deferred, then read through a view
    const Tensor t = ops::tanh(ops::reshape(a, {15}));
    const Tensor m = ops::matmul(ops::reshape(t, {5, 3}), w2);
    seen.push_back(m.to_floats());  // the host reads a deferred output
    const Tensor b = ops::mul(m, in[0]);
    return std::vector<Tensor>{ops::add(ops::matmul(b, w2), b)};  // nothing reads these two
  };
  const Tensor x = f32_input({5, 3}, 91), u = random_like({5, 3}, 92);
  auto want = lmtune::vjp(segment, {x}, {u});
  const uint64_t before = recomputed_ops_dropped();
  auto got = lmtune::vjp(checkpoint(segment), {x}, {u});
  EXPECT_EQ(recomputed_ops_dropped() - before, 2u);
  EXPECT_EQ(want.second[0].to_floats(), got.second[0].to_floats());
  EXPECT_EQ(want.first[0].to_floats(), got.first[0].to_floats());
  ASSERT_EQ(seen.size(), 3u);  // the plain run, the checkpoint's first pass, its recomputation
  EXPECT_EQ(seen[2], seen[0]);
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

namespace lmtune::test {
namespace {

// y = 3 x on the CPU, counting its evaluations.
class CountedTriple final : public Primitive {
 public:
  explicit CountedTriple(int* evals) : evals_(evals) {}
  const char* name() const override { return "counted_triple"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override {
    ++*evals_;
    const float* x = cpu::data<float>(in[0]);
    float* y = cpu::data<float>(out[0]);
    for (int64_t i = 0; i < out[0].numel(); ++i) y[i] = 3.0f * x[i];
  }
  void eval_vulkan(const std::vector<Tensor>&, std::vector<Tensor>&) override { ADD_FAILURE() << "CPU only"; }
  bool has_vjp() const override { return true; }
  std::vector<Tensor> vjp(const Node&, const std::vector<Tensor>& cot, const std::vector<bool>&) override {
    return {ops::scale(cot[0], 3.0f)};
  }

 private:
  int* evals_;
};

// apply_kept inside a checkpointed segment: evaluated once (the recomputation records the kept output), with the
// same gradients as plain apply; outside a checkpoint it computes as usual.
TEST(Checkpoint, KeptOutputsAreNotRecomputed) {
  int evals = 0;
  auto segment = [&](bool keep) {
    return Fn([&evals, keep](const std::vector<Tensor>& in) {
      Tensor a = ops::tanh(in[0]);
      auto prim = std::make_shared<CountedTriple>(&evals);
      std::vector<OutputSpec> spec{{a.shape(), a.dtype()}};
      Tensor b = keep ? apply_kept(prim, {a}, spec)[0] : apply(prim, {a}, spec)[0];
      return std::vector<Tensor>{ops::mul(b, b)};
    });
  };
  Tensor x = f32_input({5, 3}, 91);
  Tensor u = random_like({5, 3}, 92);
  auto want = lmtune::vjp(segment(false), {x}, {u});
  EXPECT_EQ(evals, 1);
  evals = 0;
  auto recomputed = lmtune::vjp(checkpoint(segment(false)), {x}, {u});
  EXPECT_EQ(evals, 2) << "plain apply runs again in the recomputation";
  evals = 0;
  auto kept = lmtune::vjp(checkpoint(segment(true)), {x}, {u});
  EXPECT_EQ(evals, 1) << "the kept output was recomputed";
  EXPECT_EQ(want.second[0].to_floats(), kept.second[0].to_floats());
  EXPECT_EQ(want.first[0].to_floats(), kept.first[0].to_floats());
  evals = 0;
  lmtune::vjp(segment(true), {x}, {u});  // no checkpoint: apply
  EXPECT_EQ(evals, 1);
}

}  // namespace
}  // namespace lmtune::test
