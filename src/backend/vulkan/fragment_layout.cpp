// The fragment-layout check (see fragment_layout.h).
#include "backend/vulkan/fragment_layout.h"

#include <map>
#include <mutex>

#include <spdlog/spdlog.h>

#include "backend/vulkan/kernel_util.h"

namespace lmtune::vk {

bool fragment_layout_is_mma(Context& ctx) {
  static std::mutex mu;
  static std::map<int, bool> known;
  std::lock_guard lock(mu);
  if (auto it = known.find(ctx.index()); it != known.end()) return it->second;
  Tensor t = Tensor::empty({514}, DType::i32, Device::vulkan(ctx.index()));
  struct {
    uint32_t unused;
  } push{};
  ctx.dispatch("coopmat_layout", {out(t)}, push, {1, 1, 1});
  const std::vector<int32_t> got = t.to_ints();
  bool mma = got[512] == 1 && got[513] == 1;
  for (int m = 0; m < 2; ++m)
    for (int lane = 0; lane < 32; ++lane)
      for (int e = 0; e < 8; ++e) {
        const int row = lane / 4 + 8 * (e / 4), col = 2 * (lane % 4) + e % 2 + 8 * ((e / 2) % 2);
        mma = mma && got[size_t(m * 256 + lane * 8 + e)] == row * 16 + col;
      }
  spdlog::info("vulkan: {} fragment layout: {}", ctx.name(),
               mma ? "mma.sync (flash attention keeps scores in registers; skinny products build fragments)"
                   : "other (scores go through shared memory)");
  known[ctx.index()] = mma;
  return mma;
}

}  // namespace lmtune::vk
