// Checkpoints of the newer families as transformers 5.17 writes them (save_pretrained: its config keys, its tensor
// layout, e.g. the experts per expert, Mixtral's block_sparse_moe.experts.N.w1), with transformers' own logits and
// loss (float64) as the reference: scripts/transformers_checkpoints.py wrote tests/models/fixtures/hf_<family>/.
#include <gtest/gtest.h>

#include <cmath>
#include <ostream>

#include "core/autodiff.h"
#include "models/decoder.h"
#include "models/weights.h"
#include "models_test_util.h"

namespace lmtune::models {
namespace {

using test::fixture_dir;
using test::Reference;
using test::rel_err;

struct WrittenCase {
  std::string family;
  double tolerance = 1e-5;  // logits, relative to the largest
};
void PrintTo(const WrittenCase& c, std::ostream* os) { *os << c.family; }

const WrittenCase kCases[] = {{"hf_mixtral"},
                              {"hf_qwen3_moe"},
                              {"hf_gemma4"},
                              {"hf_gemma4_moe"},
                              // f32 sums through the chunked delta rule
                              {"hf_qwen3_next", 5e-5},
                              {"hf_qwen3_5_moe", 5e-5}};

class TransformersWritten : public ::testing::TestWithParam<std::tuple<WrittenCase, std::string>> {};

TEST_P(TransformersWritten, LogitsAndLossMatchTransformers) {
  const WrittenCase& c = std::get<0>(GetParam());
  const Device device = parse_device(std::get<1>(GetParam()));
  Reference ref(c.family);
  Decoder model = load_decoder(fixture_dir(c.family), DType::f32, DType::f32, device);
  const Tensor ids = ref.int_tensor("ids", device);
  NoGrad no_grad;
  // One document per row from position 0, as transformers ran them.
  const Tensor out = model.forward(ids, default_positions(ids.dim(0), ids.dim(1), device), ForwardOptions{});
  EXPECT_LT(rel_err(out.to_floats(), ref.floats("logits")), c.tolerance);
  const double want = ref.floats("loss")[0];
  EXPECT_NEAR(mean_cross_entropy(out, ref.int_tensor("targets", device)).item(), want, 1e-5 * std::fabs(want));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TransformersWritten,
                         ::testing::Combine(::testing::ValuesIn(kCases), ::testing::ValuesIn(test::test_devices())),
                         [](const auto& info) {
                           const std::string dev = std::get<1>(info.param);
                           return std::get<0>(info.param).family + "_" + (dev == "cpu" ? "cpu" : "vulkan");
                         });

}  // namespace
}  // namespace lmtune::models
