// Composite functions and checkpointing on Vulkan: the dot-product identity <J v, u> = <v, Jᵀ u> for the attention
// block and the decoder layer (against the finite difference of the double reference and against the CPU's
// figures), their full vjp/jvp against the CPU, and the checkpointed 4-layer stack: gradients with and without
// checkpoint agree to rounding, match the CPU's, and the peak device memory is lower with checkpointing.
#include <cstring>
#include <iostream>

#include "autodiff/decoder.h"
#include "autodiff/device_grads.h"

namespace lmtune::test {
namespace {

using V = std::vector<Tensor>;
using RA = std::vector<ref::Array>;

// The dot products on the device and on the CPU, and how they relate.
void dot_products_on_both(DeviceGrads& t, Device dev, const std::function<Fn(Device)>& make_f, const RefFn& rf,
                          const std::function<V(Device)>& make_primals) {
  DotProducts g = check_dot_product_identity(make_f(dev), rf, make_primals(dev));
  DotProducts c = check_dot_product_identity(make_f(Device::cpu()), rf, make_primals(Device::cpu()));
  EXPECT_NEAR(g.forward, c.forward, 1e-6 * std::abs(c.fd));
  EXPECT_NEAR(g.reverse, c.reverse, 1e-6 * std::abs(c.fd));
  t.compare([&](Device d) { return DeviceGrads::Setup{make_f(d), make_primals(d)}; });
}

TEST_P(DeviceGrads, CompositeAttentionBlockGqaCausalSoftcap) {
  DecoderDims d;
  d.softcap = 2.0f;
  RopeTables rt_cpu = rope_tables(d);
  auto make_f = [&](Device dev) -> Fn {
    RopeTables rt = rope_tables(d, dev);
    return [d, rt](const V& in) { return V{attention_block(d, in[0], in[1], in[2], in[3], in[4], rt)}; };
  };
  auto make_primals = [&](Device dev) {
    V p = decoder_params(d, 40, false, dev);
    return V{make_input({d.B, d.T, d.C}, DType::f32, dev, 41), p[1], p[2], p[3], p[4]};
  };
  RefFn rf = [&](const RA& in) { return RA{ref_attention_block(d, in[0], in[1], in[2], in[3], in[4], rt_cpu)}; };
  dot_products_on_both(*this, dev(), make_f, rf, make_primals);
}

TEST_P(DeviceGrads, CompositeDecoderLayer) {
  DecoderDims d;
  RopeTables rt_cpu = rope_tables(d);
  auto make_f = [&](Device dev) -> Fn {
    RopeTables rt = rope_tables(d, dev);
    return [d, rt](const V& in) { return V{decoder_layer(d, in[0], V(in.begin() + 1, in.end()), rt)}; };
  };
  auto make_primals = [&](Device dev) {
    V p = decoder_params(d, 50, false, dev);
    p.insert(p.begin(), make_input({d.B, d.T, d.C}, DType::f32, dev, 51, Layout::contiguous, 0.1f, 2.0f));
    return p;
  };
  RefFn rf = [&](const RA& in) { return RA{ref_decoder_layer(d, in[0], RA(in.begin() + 1, in.end()), rt_cpu)}; };
  dot_products_on_both(*this, dev(), make_f, rf, make_primals);
}

// The same layer with f16 activations and weights: the vjp and jvp against the CPU's, at f16 thresholds.
TEST_P(DeviceGrads, CompositeDecoderLayerF16) {
  DecoderDims d;
  compare([&](Device dev) {
    RopeTables rt = rope_tables(d, dev);
    V p;
    for (const Tensor& t : decoder_params(d, 55, false, dev)) p.push_back(ops::cast(t, DType::f16));
    p.insert(p.begin(), make_input({d.B, d.T, d.C}, DType::f16, dev, 56, Layout::contiguous, 0.1f, 2.0f));
    return Setup{[d, rt](const V& in) { return V{decoder_layer(d, in[0], V(in.begin() + 1, in.end()), rt)}; }, p};
  });
}

double nmse_f(const std::vector<float>& got, const std::vector<float>& want) {
  return nmse(std::vector<double>(got.begin(), got.end()), std::vector<double>(want.begin(), want.end()));
}

TEST_P(DeviceGrads, CheckpointedStackAgreesAndLowersPeakMemory) {
  DecoderDims d = stack_dims();
  struct Side {
    StackRun plain, ckpt;
  };
  auto run_on = [&](Device dev) {
    RopeTables rt = rope_tables(d, dev);
    std::vector<std::vector<Tensor>> layers;
    for (int l = 0; l < 4; ++l) layers.push_back(decoder_params(d, 100 + 20 * l, true, dev));
    Tensor x0 = make_input({d.B, d.T, d.C}, DType::f32, dev, 99);
    Side s;
    s.plain = run_stack(false, d, layers, rt, x0);
    s.ckpt = run_stack(true, d, layers, rt, x0);
    return s;
  };
  Side dv = run_on(dev());
  Side cpu = run_on(Device::cpu());

  // Checkpointed against plain on the device: the recomputation runs the same kernels on the same inputs, so
  // the gradients agree to rounding (bitwise where the kernels are deterministic; the count is printed).
  ASSERT_EQ(dv.plain.grads.size(), dv.ckpt.grads.size());
  ASSERT_EQ(dv.plain.grads.size(), cpu.plain.grads.size());
  size_t bitwise = 0;
  double worst_ckpt = 0, worst_cpu = 0;
  EXPECT_NEAR(dv.plain.loss, dv.ckpt.loss, 1e-6 * std::abs(dv.plain.loss));
  for (size_t i = 0; i < dv.plain.grads.size(); ++i) {
    const auto& p = dv.plain.grads[i];
    const auto& c = dv.ckpt.grads[i];
    ASSERT_EQ(p.size(), c.size());
    if (std::memcmp(p.data(), c.data(), p.size() * sizeof(float)) == 0) ++bitwise;
    double e = nmse_f(c, p);
    worst_ckpt = std::max(worst_ckpt, e);
    EXPECT_LE(e, 1e-12) << "gradient " << i << (i == 0 ? " (input)" : " (parameter)")
                        << ": checkpointed differs from plain on " << dev().str();
    double e_cpu = nmse_f(p, cpu.plain.grads[i]);
    worst_cpu = std::max(worst_cpu, e_cpu);
    EXPECT_LE(e_cpu, 1e-10) << "gradient " << i << " on " << dev().str() << " differs from the CPU's";
    double norm = 0;
    for (float g : p) norm += double(g) * g;
    EXPECT_GT(norm, 0) << "gradient " << i << " is zero";
  }
  std::cout << "    " << dev().str() << ": checkpointed vs plain gradients: " << bitwise << " of "
            << dv.plain.grads.size() << " bitwise identical, largest NMSE " << worst_ckpt
            << "; plain vs CPU largest NMSE " << worst_cpu << "\n";
  std::cout << "    peak memory over forward + backward (4-layer stack):\n"
            << "      cpu:      without checkpoint " << cpu.plain.peak / 1024 << " KiB, with checkpoint "
            << cpu.ckpt.peak / 1024 << " KiB\n"
            << "      " << dev().str() << ": without checkpoint " << dv.plain.peak / 1024 << " KiB, with checkpoint "
            << dv.ckpt.peak / 1024 << " KiB\n";
  EXPECT_LT(dv.ckpt.peak, dv.plain.peak);
  EXPECT_LT(cpu.ckpt.peak, cpu.plain.peak);
}

// jvp and vjp through a checkpoint on the device, and the fine-tuning case (only captured parameters require grad):
// the same as without the checkpoint, and the same as on the CPU.
TEST_P(DeviceGrads, CheckpointJvpAndCapturedParameters) {
  DecoderDims d;
  auto side = [&](Device dev) {
    RopeTables rt = rope_tables(d, dev);
    V p = decoder_params(d, 60, true, dev);
    Fn layer = [d, p, rt](const V& in) { return V{decoder_layer(d, in[0], p, rt)}; };
    Tensor x = make_input({d.B, d.T, d.C}, DType::f32, dev, 61), v = random_like({d.B, d.T, d.C}, 62, dev);
    Tensor u = random_like({d.B, d.T, d.C}, 63, dev);
    std::vector<Tensor> r;
    auto plain = lmtune::jvp(layer, {x}, {v});
    auto ckpt = lmtune::jvp(checkpoint(layer), {x}, {v});
    // Same kernels on the same inputs: equal to rounding (bitwise with deterministic kernels, as here on lavapipe).
    EXPECT_LE(nmse_f(ckpt.second[0].to_floats(), plain.second[0].to_floats()), 1e-12)
        << "jvp through checkpoint on " << dev.str();
    r.push_back(ckpt.second[0]);
    // x does not require grad: only the captured parameters get gradients, through the recomputation.
    backward(ops::sum_all(ops::mul(checkpoint(layer)({x})[0], u)));
    for (auto t : p) {
      EXPECT_TRUE(t.grad().defined());
      r.push_back(t.grad());
      t.zero_grad();
    }
    backward(ops::sum_all(ops::mul(layer({x})[0], u)));
    for (size_t i = 0; i < p.size(); ++i) {
      EXPECT_LE(nmse_f(r[1 + i].to_floats(), p[i].grad().to_floats()), 1e-12) << "parameter " << i << " on " << dev.str();
      p[i].zero_grad();
    }
    return r;
  };
  V g = side(dev()), c = side(Device::cpu());
  ++cases_;
  ASSERT_EQ(g.size(), c.size());
  for (size_t i = 0; i < g.size(); ++i)
    EXPECT_TRUE(agree(g[i], c[i], grad_tolerance(DType::f32), true)) << (i == 0 ? "jvp" : "parameter gradient ") << i;
}

}  // namespace
}  // namespace lmtune::test
