// The loss `lmtune eval` reports (infer::evaluate_loss over a text sample) equals the independent PyTorch
// reference (scripts/reference_models.py: mean next-token cross-entropy of row 0) on every architecture fixture.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "data/dataset.h"
#include "infer/evaluate.h"
#include "infer_test_util.h"
#include "io/safetensors.h"
#include "models/weights.h"

namespace lmtune::infer::test {
namespace {

class EvalReference : public ::testing::TestWithParam<std::string> {};

TEST_P(EvalReference, EvalLossEqualsReference) {
  fs::path dir = model_fixture(GetParam());
  SafetensorsFile ref(dir / "reference.safetensors");
  ASSERT_TRUE(ref.metadata().count("eval_loss_row0_f64")) << "regenerate with scripts/reference_models.py";
  double want = std::stod(ref.metadata().at("eval_loss_row0_f64"));
  const SafetensorsTensor& ids = ref.at("ids");
  ASSERT_EQ(ids.st_dtype, StDType::I32);
  std::vector<int32_t> all(size_t(ids.numel()));
  std::memcpy(all.data(), ids.data.data(), all.size() * 4);
  int64_t T = ids.shape[1];
  Dataset ds;
  Sample s;
  for (int64_t t = 0; t < T; ++t) {
    s.ids.push_back(all[size_t(t)]);
    s.trainable.push_back(t == 0 ? 0 : 1);
  }
  ds.samples.push_back(s);
  models::Decoder decoder = models::load_decoder(dir, DType::f32, DType::f32, Device::cpu());
  LossResult got = evaluate_loss(decoder, ds, 1, int(T), false);
  EXPECT_EQ(got.tokens, T - 1);
  EXPECT_NEAR(got.loss, want, 1e-5 * std::abs(want)) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EvalReference, ::testing::ValuesIn(fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace lmtune::infer::test
