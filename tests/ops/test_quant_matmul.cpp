// Products with a block-quantized weight (ops::quantized_linear, ops::quantized_matmul) in every format, against the
// double-precision product on the weight quant::dequantize gives: odd row counts (the gemv kernel's 1..4 rows and
// the tiled kernels' larger ones), N not a multiple of any tile, f32/f16/bf16 inputs; on Vulkan every kernel the
// device has (gemv and tiled automatically, the tiled kernel forced for few rows too, the tensor-core kernel where
// present, the panel route forced). The vjp and jvp against finite differences.
#include <array>
#include <functional>

#include "autodiff/gradcheck.h"
#include "backend/vulkan/matmul.h"
#include "backend/vulkan/quant_matmul.h"
#include "backend/vulkan/vulkan_backend.h"
#include "core/error.h"
#include "core/ops/quant_matmul.h"
#include "core/quant.h"
#include "ops/op_test_util.h"

namespace lmtune::test {
namespace {

constexpr std::array<quant::Format, 6> kFormats{quant::Format::q8_0, quant::Format::q4_0, quant::Format::q4_k,
                                                quant::Format::q5_k, quant::Format::q6_k, quant::Format::nf4};

// A weight [N, K] of random values (normal-ish spread, as trained weights) quantized on `dev`.
quant::QuantizedTensor random_weight(quant::Format f, int64_t N, int64_t K, const Device& dev, uint64_t seed) {
  return quant::quantize(make_input({N, K}, DType::f32, Device::cpu(), seed, Layout::contiguous, 0.0f, 0.5f), f, dev);
}

// Forces a kernel choice on a Vulkan device for a scope (nothing on the CPU).
struct ForceMatmul {
  ForceMatmul(const Device& d, vk::MatmulKernel k) : dev(d) {
    if (dev.is_vulkan()) vk::context_for(dev).kernel_choice().matmul = k;
  }
  ~ForceMatmul() {
    if (dev.is_vulkan()) vk::context_for(dev).kernel_choice().matmul = vk::MatmulKernel::automatic;
  }
  Device dev;
};

// Both layouts of one weight for the given rows and dtype, against the dequantized weight.
void check_products(const quant::QuantizedTensor& w, const ref::Array& wd, int64_t M, DType dt, const Device& dev) {
  const int64_t N = w.rows(), K = w.cols();
  Tensor x = make_input({M, K}, dt, dev, 11 + uint64_t(M));
  Tensor y = ops::quantized_linear(x, w);
  EXPECT_EQ(y.dtype(), dt);
  EXPECT_TRUE(close(y, ref::matmul(ref::of(x), ref::transpose(wd, 0, 1)), dt)) << "x Wᵀ";
  Tensor g = make_input({M, N}, dt, dev, 12 + uint64_t(M));
  Tensor dx = ops::quantized_matmul(g, w, dt);
  EXPECT_EQ(dx.dtype(), dt);
  EXPECT_TRUE(close(dx, ref::matmul(ref::of(g), wd), dt)) << "dy W";
}

TEST_P(OpTest, QuantizedProductsEveryFormat) {
  for (quant::Format f : kFormats) {
    const int64_t qk = quant::info(f).block_elems;
    // N = 70 and 130: not multiples of the 64- or 128-row tiles; K = 3 blocks (96 or 768).
    for (auto [N, K] : {std::array<int64_t, 2>{70, 3 * qk}, std::array<int64_t, 2>{130, qk}}) {
      const quant::QuantizedTensor w = random_weight(f, N, K, dev(), 21);
      const ref::Array wd = ref::of(quant::dequantize(w, DType::f32));
      for (int64_t M : {1, 3, 37, 130})
        for (DType dt : float_dtypes()) {
          LMTUNE_CASE(quant::info(f).name << " W [" << N << ", " << K << "] rows " << M << " " << dtype_name(dt));
          check_products(w, wd, M, dt, dev());
        }
    }
  }
}

// The portable tiled kernel for every row count on Vulkan (automatic choice gives gemv up to 4 rows, and the
// tensor-core kernel where the device has one).
TEST_P(OpTest, QuantizedProductsTiledKernel) {
  if (!dev().is_vulkan()) GTEST_SKIP() << "Vulkan kernel choice";
  ForceMatmul force(dev(), vk::MatmulKernel::scalar);
  for (quant::Format f : kFormats) {
    const quant::QuantizedTensor w = random_weight(f, 37, 2 * quant::info(f).block_elems, dev(), 22);
    const ref::Array wd = ref::of(quant::dequantize(w, DType::f32));
    for (int64_t M : {1, 4})
      for (DType dt : {DType::f32, DType::bf16}) {
        LMTUNE_CASE(quant::info(f).name << " rows " << M << " " << dtype_name(dt));
        check_products(w, wd, M, dt, dev());
      }
  }
}

// The tensor-core kernel, forced: checked against the dequantized product where the device has cooperative
// matrices (f16 operands: bf16 tolerance), a DeviceError elsewhere.
TEST_P(OpTest, QuantizedProductsTensorCoreKernel) {
  if (!dev().is_vulkan()) GTEST_SKIP() << "Vulkan kernel choice";
  ForceMatmul force(dev(), vk::MatmulKernel::coopmat);
  const quant::QuantizedTensor w0 = random_weight(quant::Format::q4_k, 70, 512, dev(), 23);
  if (!vk::coopmat_available(dev().index)) {
    EXPECT_THROW(ops::quantized_linear(make_input({5, 512}, DType::bf16, dev(), 24), w0), DeviceError);
    GTEST_SKIP() << "device has no cooperative matrices";
  }
  for (quant::Format f : kFormats) {
    const int64_t qk = quant::info(f).block_elems;
    for (auto [N, K] : {std::array<int64_t, 2>{70, 8 * qk}, std::array<int64_t, 2>{300, 256}}) {
      const quant::QuantizedTensor w = random_weight(f, N, K, dev(), 25);
      const ref::Array wd = ref::of(quant::dequantize(w, DType::f32));
      for (int64_t M : {5, 130, 257})
        for (DType dt : float_dtypes()) {
          LMTUNE_CASE(quant::info(f).name << " W [" << N << ", " << K << "] rows " << M << " " << dtype_name(dt));
          const int64_t n = w.rows(), k = w.cols();
          Tensor x = make_input({M, k}, dt, dev(), 26);
          EXPECT_TRUE(close(ops::quantized_linear(x, w), ref::matmul(ref::of(x), ref::transpose(wd, 0, 1)),
                            DType::bf16));
          Tensor g = make_input({M, n}, dt, dev(), 27);
          EXPECT_TRUE(close(ops::quantized_matmul(g, w, dt), ref::matmul(ref::of(g), wd), DType::bf16));
        }
    }
  }
}

// Forces the panel route (W decoded into dense panels of at most `bytes`, then the dense products) for a scope.
struct ForcePanels {
  ForcePanels(const Device& d, int64_t bytes) : dev(d) {
    if (!dev.is_vulkan()) return;
    vk::context_for(dev).kernel_choice().quant_panels = true;
    vk::context_for(dev).kernel_choice().quant_panel_bytes = bytes;
  }
  ~ForcePanels() {
    if (!dev.is_vulkan()) return;
    vk::context_for(dev).kernel_choice().quant_panels = false;
    vk::context_for(dev).kernel_choice().quant_panel_bytes = 0;
  }
  Device dev;
};

// The panel route, forced on every Vulkan device (automatic on tensor-core devices from 64 rows of 16-bit x): a
// 100 KiB cap gives several panels and a partial last one in both layouts (W [300, 512]: 96- or 48-row panels
// for x Wᵀ, 168- or 80-column ones for dY W), the default one panel; the addend goes in either way.
TEST_P(OpTest, QuantizedProductsPanelRoute) {
  if (!dev().is_vulkan()) GTEST_SKIP() << "Vulkan kernel choice";
  for (int64_t cap : {int64_t(100) << 10, int64_t(0)}) {
    ForcePanels force(dev(), cap);
    for (quant::Format f : kFormats) {
      if (cap == 0 && f != quant::Format::nf4) continue;
      const quant::QuantizedTensor w = random_weight(f, 300, 512, dev(), 28);
      const ref::Array wd = ref::of(quant::dequantize(w, DType::f32));
      for (int64_t M : {5, 70})
        for (DType dt : {DType::f32, M == 5 ? DType::f16 : DType::bf16}) {
          LMTUNE_CASE(quant::info(f).name << " cap " << cap << " rows " << M << " " << dtype_name(dt));
          const DType tol = dt == DType::f32 ? DType::f32 : DType::bf16;
          Tensor x = make_input({M, 512}, dt, dev(), 29), d = make_input({M, 300}, dt, dev(), 30);
          const ref::Array xw = ref::matmul(ref::of(x), ref::transpose(wd, 0, 1));
          EXPECT_TRUE(close(ops::quantized_linear(x, w), xw, tol)) << "x Wᵀ";
          EXPECT_TRUE(close(ops::quantized_linear_add(x, w, d), ref::binary(xw, ref::of(d), std::plus<double>()), tol)) << "x Wᵀ + d";
          Tensor g = make_input({M, 300}, dt, dev(), 31);
          EXPECT_TRUE(close(ops::quantized_matmul(g, w, dt), ref::matmul(ref::of(g), wd), tol)) << "dy W";
        }
    }
  }
}

// Batch dims fold into rows, strided inputs are taken, a bias is added; bad shapes name both operands.
TEST_P(OpTest, QuantizedLinearShapesAndErrors) {
  const quant::QuantizedTensor w = random_weight(quant::Format::q8_0, 33, 64, dev(), 31);
  const ref::Array wd = ref::of(quant::dequantize(w, DType::f32));
  Tensor x = make_input({2, 3, 64}, DType::bf16, dev(), 32, Layout::strided);
  Tensor bias = make_input({33}, DType::f32, dev(), 33);
  Tensor y = ops::quantized_linear(x, w, bias);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 33}));
  const ref::Array b16 = ref::of(ops::cast(bias, DType::bf16));
  EXPECT_TRUE(close(y, ref::linear(ref::of(x), wd, &b16), DType::bf16));
  try {
    ops::quantized_linear(make_input({4, 63}, DType::f32, dev(), 34), w);
    ADD_FAILURE() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("q8_0 weight [33, 64]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops::quantized_matmul(make_input({4, 64}, DType::f32, dev(), 35), w, DType::f32), ShapeError);
}

// x Wᵀ + d with the addend in the epilogue (how a quantized layer adds its LoRA delta), on the gemv and the tiled
// kernels; its gradients against finite differences.
TEST_P(OpTest, QuantizedLinearAddend) {
  const quant::QuantizedTensor w = random_weight(quant::Format::q4_k, 37, 256, dev(), 36);
  const ref::Array wd = ref::of(quant::dequantize(w, DType::f32));
  for (int64_t M : {2, 37})
    for (DType dt : {DType::f32, DType::bf16}) {
      LMTUNE_CASE("rows " << M << " " << dtype_name(dt));
      Tensor x = make_input({M, 256}, dt, dev(), 37);
      Tensor d = make_input({M, 37}, dt, dev(), 38);
      const ref::Array want = ref::binary(ref::matmul(ref::of(x), ref::transpose(wd, 0, 1)), ref::of(d),
                                          [](double p, double q) { return p + q; });
      EXPECT_TRUE(close(ops::quantized_linear_add(x, w, d), want, dt));
    }
  EXPECT_THROW(ops::quantized_linear_add(make_input({3, 256}, DType::f32, dev(), 39), w,
                                         make_input({3, 36}, DType::f32, dev(), 40)),
               ShapeError);
}

// Plans: gemv for decode's rows of x·Wᵀ, the tiled kernel for dY·W and forced, and what bench ops prints.
TEST_P(OpTest, QuantizedProductPlans) {
  if (!dev().is_vulkan()) GTEST_SKIP() << "Vulkan plans";
  vk::Context& ctx = vk::context_for(dev());
  const bool cm = vk::coopmat_available(dev().index), sg = ctx.features().subgroup_arithmetic;
  const auto plan = [&](bool nt, uint64_t M) {
    return vk::plan_quant_matmul(ctx, quant::Format::q4_k, nt, M, 70, 512, DType::bf16);
  };
  EXPECT_EQ(plan(true, 3).route, sg ? vk::QuantMatmulRoute::gemv : cm ? vk::QuantMatmulRoute::coopmat
                                                                      : vk::QuantMatmulRoute::tiled);
  if (sg) {
    EXPECT_EQ(plan(true, 3).describe(), "qgemv q4_k 3 nt");
  }
  EXPECT_EQ(plan(false, 3).route, cm ? vk::QuantMatmulRoute::coopmat : vk::QuantMatmulRoute::tiled);
  if (!cm) {
    EXPECT_EQ(plan(false, 37).describe(), "qtiled q4_k 64x64 nn");
  }
  // f32 products stay exact in f32: the tiled kernel, even where tensor cores are.
  EXPECT_EQ(vk::plan_quant_matmul(ctx, quant::Format::q4_k, false, 37, 70, 512, DType::f32).route,
            vk::QuantMatmulRoute::tiled);
  // From 64 rows of 16-bit x, tensor-core devices decode panels for the dense products.
  if (cm) {
    EXPECT_EQ(plan(true, 64).describe(), "qpanels q4_k 1x70 nt");
    EXPECT_EQ(plan(false, 63).route, vk::QuantMatmulRoute::coopmat);
  }
  {  // A panel holds at most the cap's bytes: 102400 / (512 x 2) = 100 columns -> 96; 102400 / (300 x 4) -> 80.
    ForcePanels panels(dev(), int64_t(100) << 10);
    EXPECT_EQ(vk::plan_quant_matmul(ctx, quant::Format::q4_k, true, 5, 300, 512, DType::bf16).describe(),
              "qpanels q4_k 4x96 nt");
    EXPECT_EQ(vk::plan_quant_matmul(ctx, quant::Format::q4_k, false, 5, 512, 300, DType::f32).describe(),
              "qpanels q4_k 7x80 nn");
  }
  ForceMatmul force(dev(), vk::MatmulKernel::scalar);
  EXPECT_EQ(plan(true, 1).route, vk::QuantMatmulRoute::tiled);
}

// The vjp (dx = g W, the other layout) and jvp against finite differences of the dense reference.
TEST(QuantizedMatmulGrad, VjpAndJvp) {
  for (quant::Format f : {quant::Format::q4_k, quant::Format::nf4, quant::Format::q8_0}) {
    LMTUNE_CASE(quant::info(f).name);
    const quant::QuantizedTensor w = random_weight(f, 5, 256, Device::cpu(), 41);
    const ref::Array wd = ref::of(quant::dequantize(w, DType::f32));
    check_gradients1([&](const Tensor& x) { return ops::quantized_linear(x, w); },
                     [&](const ref::Array& x) { return ref::matmul(x, ref::transpose(wd, 0, 1)); },
                     f32_input({3, 256}, 42), 1e-8);
    check_gradients1([&](const Tensor& g) { return ops::quantized_matmul(g, w, DType::f32); },
                     [&](const ref::Array& g) { return ref::matmul(g, wd); }, f32_input({3, 5}, 43), 1e-8);
    check_gradients(
        [&](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{ops::quantized_linear_add(in[0], w, in[1])};
        },
        [&](const std::vector<ref::Array>& in) {
          return std::vector<ref::Array>{ref::binary(ref::matmul(in[0], ref::transpose(wd, 0, 1)), in[1],
                                                     [](double p, double q) { return p + q; })};
        },
        {f32_input({3, 256}, 44), f32_input({3, 5}, 45)}, 1e-8);
  }
}

}  // namespace
}  // namespace lmtune::test
