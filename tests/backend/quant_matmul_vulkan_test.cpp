// Products with a quantized weight on Vulkan against the CPU backend, in the kernels this run's device features
// pick: test_vulkan_fallbacks runs this file without 16-bit storage (the _packed16 builds) and without subgroup
// arithmetic (decode's rows on the tiled kernel instead of qmatmul_gemv). tests/ops/test_quant_matmul.cpp checks
// every format and route against double-precision references.
#include <gtest/gtest.h>

#include "backend/vulkan/quant_matmul.h"
#include "backend/vulkan/context.h"
#include "core/ops.h"
#include "core/ops/quant_matmul.h"
#include "core/quant.h"
#include "vk_test_util.h"

namespace lmtune::test {
namespace {

TEST(VulkanQuantMatmul, MatchesTheCpuInThisDevicesKernels) {
  REQUIRE_VULKAN();
  for (quant::Format f : {quant::Format::q4_0, quant::Format::q6_k}) {
    const Tensor dense = Tensor::randn({45, 256}, 51, 0.2f, DType::f32, Device::cpu());
    const quant::QuantizedTensor wc = quant::quantize(dense, f, Device::cpu()), wg = quant::quantize(dense, f, gpu());
    for (int64_t M : {3, 40})
      for (DType dt : {DType::bf16, DType::f16}) {
        SCOPED_TRACE(std::string(quant::info(f).name) + " rows " + std::to_string(M) + " " +
                     std::string(dtype_name(dt)));
        const Tensor x = Tensor::randn({M, 256}, 52, 1.0f, dt, Device::cpu()), g = ops::slice(x, 1, 0, 45);
        const Tensor d = Tensor::randn({M, 45}, 53, 1.0f, dt, Device::cpu());
        EXPECT_CLOSE(ops::quantized_linear_add(x.to(gpu()), wg, d.to(gpu())).to_floats(),
                     ops::quantized_linear_add(x, wc, d).to_floats(), dt);
        // dY W from a strided dY (a column slice of x): the tiled kernel's nn layout.
        EXPECT_CLOSE(ops::quantized_matmul(g.to(gpu()), wg, dt).to_floats(),
                     ops::quantized_matmul(g, wc, dt).to_floats(), dt);
      }
  }
}

// The panel route with several panels that matmul_cm2 writes in place as column slices of the result (devices with
// VK_NV_cooperative_matrix2; the op tests check the other panel paths everywhere): 2048-row panels of a q4_k
// weight [4096, 1024] against 1536 bf16 rows, the addend added after the last panel.
TEST(VulkanQuantMatmul, PanelsWrittenInPlaceByTheCooperativeMatrix2Product) {
  REQUIRE_VULKAN();
  vk::Context& ctx = vk::context_for(gpu());
  if (!ctx.features().cooperative_matrix2 || !ctx.features().bf16_cooperative_matrix)
    GTEST_SKIP() << "no bf16 cooperative matrices 2";
  ctx.kernel_choice().quant_panels = true;
  ctx.kernel_choice().quant_panel_bytes = int64_t(2048) * 1024 * 2;
  const Tensor dense = Tensor::randn({4096, 1024}, 54, 0.2f, DType::f32, Device::cpu());
  const quant::QuantizedTensor wc = quant::quantize(dense, quant::Format::q4_k, Device::cpu());
  const quant::QuantizedTensor wg = quant::quantize(dense, quant::Format::q4_k, gpu());
  EXPECT_EQ(vk::plan_quant_matmul(ctx, quant::Format::q4_k, true, 1536, 4096, 1024, DType::bf16).describe(),
            "qpanels q4_k 2x2048 nt");
  const Tensor x = Tensor::randn({1536, 1024}, 55, 1.0f, DType::bf16, Device::cpu());
  const Tensor d = Tensor::randn({1536, 4096}, 56, 1.0f, DType::bf16, Device::cpu());
  const std::vector<float> got = ops::quantized_linear_add(x.to(gpu()), wg, d.to(gpu())).to_floats();
  ctx.kernel_choice().quant_panels = false;
  ctx.kernel_choice().quant_panel_bytes = 0;
  EXPECT_CLOSE(got, ops::quantized_linear_add(x, wc, d).to_floats(), DType::bf16);
}

}  // namespace
}  // namespace lmtune::test
