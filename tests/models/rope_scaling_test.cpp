// Rope scaling past the original context (fixtures llama_yarn, qwen2_longrope, llama_dynamic; their batch
// goes past it and is covered by the parity tests): a call within the original length (longrope's short factors,
// dynamic unscaled) against the float64 reference, the KV-cache timeline of transformers' generate (each key keeps
// the rotation of the call that computed it), and greedy decoding with the cache against full recomputation
// where the frequencies stay fixed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "core/autodiff.h"
#include "core/ops.h"
#include "models/decoder.h"
#include "models/weights.h"
#include "models_test_util.h"

namespace lmtune::models {
namespace {

using test::fixture_dir;
using test::Reference;
using test::rel_err;

using Case = std::tuple<std::string, std::string>;  // fixture, device

class RopeScaling : public ::testing::TestWithParam<Case> {
 protected:
  const std::string& arch() const { return std::get<0>(GetParam()); }
  Device device() const { return parse_device(std::get<1>(GetParam())); }
  Decoder load() const { return load_decoder(fixture_dir(arch()), DType::f32, DType::f32, device()); }
};

Tensor positions_from(int64_t start, int64_t n, Device d) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = int32_t(start + i);
  return Tensor::from_ints(p, {1, n}, d);
}

std::vector<float> row(const std::vector<float>& rows, int64_t index, int64_t V) {
  return {rows.begin() + index * V, rows.begin() + (index + 1) * V};
}

// The packed row 1 alone: its largest position (4) is within the original length, so longrope uses its short
// factors and dynamic its unscaled base (in the batch, row 0 took both rows past it).
TEST_P(RopeScaling, CallWithinTheOriginalLength) {
  Reference ref(arch());
  Decoder model = load();
  const Device d = device();
  NoGrad no_grad;
  auto second = [&](const std::string& name) {
    return ops::contiguous(ops::slice(ref.int_tensor(name, d), 0, 1, 2));
  };
  ForwardOptions opt;
  opt.doc_ids = second("doc_ids");
  Tensor logits = model.forward(second("ids"), second("positions"), opt);
  double e = rel_err(logits.to_floats(), ref.floats("short.logits"));
  std::printf("[rope] %-14s %-9s within the original length: logits %.2e\n", arch().c_str(),
              std::get<1>(GetParam()).c_str(), e);
  EXPECT_LT(e, 1e-4);
}

// Row 0 fed as transformers' generate feeds it: the prompt in one call, then one token per call through the KV
// cache. Every call's last logits match the reference's cache timeline, past the original length too.
TEST_P(RopeScaling, CachedCallsFollowTransformersGenerate) {
  Reference ref(arch());
  Decoder model = load();
  const Device d = device();
  NoGrad no_grad;
  const std::vector<int32_t> ids = ref.ints("ids");
  const int64_t T = ref.at("ids").shape[1], V = model.config().vocab_size;
  const int64_t P = ref.ints("generate.prompt_len")[0];
  const std::vector<float> want = ref.floats("generate.logits");
  KvCache cache(model.config(), 1, DType::f32, d, /*chunk=*/4);
  ForwardOptions opt;
  opt.cache = &cache;
  Tensor logits = model.forward(Tensor::from_ints({ids.begin(), ids.begin() + P}, {1, P}, d), positions_from(0, P, d),
                                opt);
  double worst = rel_err(row(logits.to_floats(), P - 1, V), row(want, P - 1, V));
  for (int64_t t = P; t < T; ++t) {
    logits = model.forward(Tensor::from_ints({ids[size_t(t)]}, {1, 1}, d), positions_from(t, 1, d), opt);
    worst = std::max(worst, rel_err(logits.to_floats(), row(want, t, V)));
  }
  std::printf("[rope] %-14s %-9s cached calls vs generate timeline: logits %.2e\n", arch().c_str(),
              std::get<1>(GetParam()).c_str(), worst);
  EXPECT_LT(worst, 1e-4);
}

// Once the prompt is past the original length, longrope's frequencies no longer change (long factors) and yarn's
// never do: greedy decoding through the cache equals recomputing the whole sequence at every step.
// (dynamic rescales at every step past the original length, so it is not among these.)
class RopeScalingFixed : public RopeScaling {};

TEST_P(RopeScalingFixed, GreedyDecodePastTheOriginalLengthMatchesRecompute) {
  Decoder model = load();
  const Device d = device();
  NoGrad no_grad;
  std::vector<int32_t> tokens = {5, 17, 99, 3, 42, 7, 64, 11, 90};  // 9 tokens: past the original 8
  KvCache cache(model.config(), 1, DType::f32, d, /*chunk=*/4);
  ForwardOptions opt;
  opt.cache = &cache;
  const int64_t P = int64_t(tokens.size()), V = model.config().vocab_size;
  Tensor logits = model.forward(Tensor::from_ints(tokens, {1, P}, d), positions_from(0, P, d), opt);
  std::vector<float> got = row(logits.to_floats(), P - 1, V);
  double worst = 0;
  for (int step = 0; step < 6; ++step) {
    const int64_t n = int64_t(tokens.size());
    Tensor full = model.forward(Tensor::from_ints(tokens, {1, n}, d), default_positions(1, n, d));
    std::vector<float> want = row(full.to_floats(), n - 1, V);
    worst = std::max(worst, rel_err(got, want));
    const int32_t next = int32_t(std::max_element(got.begin(), got.end()) - got.begin());
    ASSERT_EQ(next, int32_t(std::max_element(want.begin(), want.end()) - want.begin())) << "step " << step;
    tokens.push_back(next);
    got = model.forward(Tensor::from_ints({next}, {1, 1}, d), positions_from(n, 1, d), opt).to_floats();
  }
  EXPECT_LT(worst, 1e-5) << arch();
}

std::vector<Case> cases(std::vector<const char*> fixtures) {
  std::vector<Case> out;
  for (const std::string& dev : test::test_devices())
    for (const char* a : fixtures) out.emplace_back(a, dev);
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string s = std::get<0>(info.param) + "_" + std::get<1>(info.param);
  for (char& c : s)
    if (c == ':') c = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(Models, RopeScaling,
                         ::testing::ValuesIn(cases({"llama_yarn", "qwen2_longrope", "llama_dynamic"})), case_name);
INSTANTIATE_TEST_SUITE_P(Models, RopeScalingFixed, ::testing::ValuesIn(cases({"llama_yarn", "qwen2_longrope"})),
                         case_name);

}  // namespace
}  // namespace lmtune::models
