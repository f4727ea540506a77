// The gated delta rule (models/gated_deltanet.h): the chunked form against the recurrent one over several chunks,
// with sequences starting inside a chunk and on a chunk boundary and a carried initial state: outputs, final
// state, vjp and jvp, on every device. (The whole layer against a float64 reference: the qwen3_next fixture.)
#include "models/gated_deltanet.h"

#include <gtest/gtest.h>

#include <cmath>

#include "autodiff/gradcheck.h"
#include "core/autodiff.h"
#include "core/ops.h"
#include "models_test_util.h"

namespace lmtune::models {
namespace {

using test::rel_err;

class GatedDeltaRule : public ::testing::TestWithParam<std::string> {};

TEST_P(GatedDeltaRule, ChunkedEqualsRecurrent) {
  const Device d = parse_device(GetParam());
  const int64_t B = 2, T = 150, H = 3, Dk = 8, Dv = 12;  // three chunks of 64, the last partial
  // Row 0 one sequence continuing a cached state (positions from 7); row 1 sequences starting at 0, 40, 64, 130.
  std::vector<int32_t> pos(size_t(B * T));
  for (int64_t t = 0; t < T; ++t) {
    pos[size_t(t)] = int32_t(t + 7);
    const int64_t start = t >= 130 ? 130 : t >= 64 ? 64 : t >= 40 ? 40 : 0;
    pos[size_t(T + t)] = int32_t(t - start);
  }
  const DeltaNetMasks masks = delta_net_masks(pos, B, T, 4, d);
  auto unit = [&](const Shape& s, uint64_t seed) {  // l2-normalized rows, as the layer gives the rule
    const Tensor x = Tensor::randn(s, seed, 1.0f, DType::f32, d);
    return ops::mul(x, ops::rsqrt(ops::sum(ops::square(x), {-1}, true)));
  };
  const Tensor q = ops::scale(unit({B, T, H, Dk}, 1), 0.35f), k = unit({B, T, H, Dk}, 2);
  const Tensor v = Tensor::randn({B, T, H, Dv}, 3, 1.0f, DType::f32, d);
  const Tensor g = ops::scale(ops::sigmoid(Tensor::randn({B, T, H}, 4, 1.0f, DType::f32, d)), -0.3f);
  const Tensor beta = ops::sigmoid(Tensor::randn({B, T, H}, 5, 1.0f, DType::f32, d));
  const Tensor s0 = Tensor::randn({B, H, Dk, Dv}, 6, 0.5f, DType::f32, d);
  auto rule = [&](bool chunked) {
    return [&, chunked](const std::vector<Tensor>& in) {
      Tensor state = in[5];
      const Tensor o = chunked ? gated_delta_rule(in[0], in[1], in[2], in[3], in[4], masks, &state)
                               : gated_delta_rule_recurrent(in[0], in[1], in[2], in[3], in[4], masks, &state);
      return std::vector<Tensor>{o, state};
    };
  };
  const std::vector<Tensor> primals{q, k, v, g, beta, s0};
  const std::vector<Tensor> cot{Tensor::randn({B, T, H, Dv}, 7, 1.0f, DType::f32, d),
                                Tensor::randn({B, H, Dk, Dv}, 8, 1.0f, DType::f32, d)};
  const auto [want, want_grads] = lmtune::vjp(rule(false), primals, cot);
  const auto [got, got_grads] = lmtune::vjp(rule(true), primals, cot);
  EXPECT_LT(rel_err(got[0].to_floats(), want[0].to_floats()), 2e-5) << "outputs";
  EXPECT_LT(rel_err(got[1].to_floats(), want[1].to_floats()), 2e-5) << "final state";
  const char* names[] = {"q", "k", "v", "g", "beta", "initial state"};
  for (size_t i = 0; i < primals.size(); ++i)
    EXPECT_LT(rel_err(got_grads[i].to_floats(), want_grads[i].to_floats()), 5e-5) << "gradient of " << names[i];
  std::vector<Tensor> tangents;
  for (size_t i = 0; i < primals.size(); ++i)
    tangents.push_back(Tensor::randn(primals[i].shape(), 20 + i, 0.1f, DType::f32, d));
  const auto [o1, t_want] = lmtune::jvp(rule(false), primals, tangents);
  const auto [o2, t_got] = lmtune::jvp(rule(true), primals, tangents);
  for (size_t k = 0; k < t_want.size(); ++k)
    EXPECT_LT(rel_err(t_got[k].to_floats(), t_want[k].to_floats()), 5e-5) << "tangent of output " << k;
  // Row 1's sequence starting at 130 never sees the earlier ones: its outputs equal those of a call holding it alone.
  const int64_t n = T - 130;
  std::vector<int32_t> alone_pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) alone_pos[size_t(t)] = int32_t(t);
  auto tail = [&](const Tensor& x) { return ops::contiguous(ops::slice(ops::slice(x, 0, 1, 2), 1, 130, T)); };
  Tensor none;
  const Tensor alone =
      gated_delta_rule(tail(q), tail(k), tail(v), tail(g), tail(beta), delta_net_masks(alone_pos, 1, n, 4, d), &none);
  EXPECT_LT(rel_err(alone.to_floats(), tail(got[0]).to_floats()), 2e-5);
}

// A one-token call's masks, made on the device, equal those made on the host from the same positions.
TEST_P(GatedDeltaRule, StepMasksEqualHostMasks) {
  const Device d = parse_device(GetParam());
  const std::vector<int32_t> pos{0, 1, 2, 3, 9};
  const int64_t B = int64_t(pos.size()), K = 4;
  const DeltaNetMasks host = delta_net_masks(pos, B, 1, K, d);
  const DeltaNetMasks step = delta_net_step_masks(Tensor::from_ints(pos, {B, 1}, d), K);
  EXPECT_EQ(step.conv.shape(), host.conv.shape());
  EXPECT_EQ(step.conv.to_floats(), host.conv.to_floats());
  EXPECT_EQ(step.resets.shape(), host.resets.shape());
  EXPECT_EQ(step.resets.to_floats(), host.resets.to_floats());
  EXPECT_EQ(host.resets.to_floats(), (std::vector<float>{0, 1, 1, 1, 1}));
}

INSTANTIATE_TEST_SUITE_P(Devices, GatedDeltaRule, ::testing::ValuesIn(test::test_devices()), [](const auto& info) {
  std::string s = info.param;
  for (char& c : s)
    if (c == ':') c = '_';
  return s;
});

}  // namespace
}  // namespace lmtune::models
