// Where the Vulkan backend has several kernels for one op, which it runs: the automatic choice in use; tests force
// each kernel to check it on the device. One per Context (Context::kernel_choice()).
#pragma once
#include <cstdint>

namespace lmtune::vk {

enum class MatmulKernel { automatic, scalar, coopmat };
enum class FlashKernel { automatic, portable, coopmat, coopmat_shared };

struct KernelChoice {
  // scalar: the tiled f32 kernel; coopmat: the VK_NV_cooperative_matrix kernels (DeviceError without them).
  MatmulKernel matmul = MatmulKernel::automatic;
  // 0 = choose. Cooperative-matrix tiles: 'l' 128x256, 'm' 128x128, 's' 64x64, and where every tile is interior
  // 'w' 256x128, 'n' 128x16, 'q' 16x128; scalar tiles: 'l' 128x128, 'm' 64x64, 's' 32x32.
  char matmul_tile = 0;
  int matmul_splitk = 0;  // 0 = choose, else this many splits of K
  // coopmat: the tensor-core kernels (registers where the fragment layout is NVIDIA's, else shared memory);
  // coopmat_shared: the shared-memory ones (head dims up to 64).
  FlashKernel flash = FlashKernel::automatic;
  // Products with a quantized weight: true forces the panel route (W decoded a panel at a time, dense products;
  // backend/vulkan/quant_matmul.h) for any rows and dtype; quant_panel_bytes > 0 caps a panel (tests take several).
  bool quant_panels = false;
  int64_t quant_panel_bytes = 0;

  bool automatic_matmul() const { return matmul == MatmulKernel::automatic && !matmul_tile && !matmul_splitk; }
};

}  // namespace lmtune::vk
