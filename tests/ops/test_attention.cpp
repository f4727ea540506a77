// Reference attention: MHA and GQA, causal, sliding window, softcap, packed documents, KV-cache offsets and
// rows with no visible key (which must give 0, not NaN).
#include "ops/op_test_util.h"

namespace lmtune::test {
namespace {

struct AttnCase {
  const char* name;
  int64_t B, T, S, H, KV, D;
  bool causal;
  int64_t window;
  float softcap;
  bool docs;
  int64_t q_offset;
  float scale;
};

TEST_P(OpTest, Attention) {
  const std::vector<AttnCase> cases{
      {"mha_full", 2, 7, 7, 3, 3, 8, false, 0, 0, false, 0, 0},
      {"gqa_causal", 2, 7, 7, 4, 2, 8, true, 0, 0, false, 0, 0},
      {"mqa_causal_softcap", 1, 9, 9, 3, 1, 16, true, 0, 5.0f, false, 0, 0.3f},
      {"window", 2, 9, 9, 4, 2, 8, true, 3, 0, false, 0, 0},
      {"docs", 2, 9, 9, 2, 1, 8, true, 0, 0, true, 0, 0},
      {"kv_cache_offset", 1, 3, 10, 4, 2, 8, true, 4, 0, false, 7, 0},
      {"single", 1, 1, 1, 1, 1, 1, true, 0, 0, false, 0, 0},
      {"fully_masked_rows", 1, 5, 5, 2, 2, 4, true, 0, 0, false, -2, 0},
  };
  for (const auto& c : cases)
    for (DType dt : float_dtypes()) {
      LMTUNE_CASE(c.name << " " << dtype_name(dt));
      Tensor q = make_input({c.B, c.T, c.H, c.D}, dt, dev(), 91, Layout::strided, 0.1f, 2.0f);
      Tensor k = make_input({c.B, c.S, c.KV, c.D}, dt, dev(), 92, Layout::contiguous, 0.1f, 2.0f);
      Tensor v = make_input({c.B, c.S, c.KV, c.D}, dt, dev(), 93, Layout::contiguous);
      ops::AttentionOptions opt;
      opt.causal = c.causal;
      opt.window = c.window;
      opt.softcap = c.softcap;
      opt.q_offset = c.q_offset;
      opt.scale = c.scale;
      ref::AttentionRef ro{c.scale, c.causal, c.window, c.softcap, {}, c.q_offset};
      if (c.docs) {
        std::vector<int32_t> d{0, 0, 0, 1, 1, 1, 1, 2, 2, 5, 5, 5, 5, 5, 5, 6, 6, 6};
        opt.doc_ids = Tensor::from_ints(d, {c.B, c.T}, dev());
        ro.doc_ids = ref::ints_of(opt.doc_ids);
      }
      Tensor out = ops::attention(q, k, v, opt);
      EXPECT_EQ(out.shape(), q.shape());
      ref::Array want = ref::attention(ref::of(q), ref::of(k), ref::of(v), ro);
      // Scores and probabilities are rounded to the dtype between the steps: allow a few roundings.
      EXPECT_TRUE(close(out, want, dt == DType::f32 ? 1e-10 : 4 * tolerance(dt)));
      for (double x : out.to_doubles()) ASSERT_FALSE(std::isnan(x));
    }
}

}  // namespace
}  // namespace lmtune::test
