// Samplers: parameter validation, the support and frequencies of top-k / top-p / min-p / temperature draws
// (chi-square against distributions computed here from the definitions), seeds, and the repetition penalty.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "core/error.h"
#include "infer/sampler.h"

namespace lmtune::infer {
namespace {

const std::vector<float> kLogits = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -3.0f};

// softmax(logits / t) in double.
std::vector<double> softmax(const std::vector<float>& l, double t) {
  double m = *std::max_element(l.begin(), l.end()), z = 0;
  std::vector<double> p(l.size());
  for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp((l[i] - m) / t);
  for (double& v : p) v /= z;
  return p;
}

// Keeps `kept` ids of p and renormalises (logits are sorted descending, so ids are ranks).
std::vector<double> restrict(std::vector<double> p, const std::set<int>& kept) {
  double z = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (!kept.count(int(i))) p[i] = 0;
    z += p[i];
  }
  for (double& v : p) v /= z;
  return p;
}

// Draws n samples and returns the chi-square statistic against `want`; fails on any draw outside its support.
double chi_square(const SamplingParams& params, const std::vector<double>& want, int n) {
  Sampler s(params);
  std::vector<int> counts(want.size(), 0);
  for (int i = 0; i < n; ++i) {
    int32_t id = s.sample(kLogits, {});
    EXPECT_GT(want[size_t(id)], 0) << "drew excluded token " << id;
    ++counts[size_t(id)];
  }
  double chi = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (want[i] > 0) chi += std::pow(counts[i] - n * want[i], 2) / (n * want[i]);
  return chi;
}

// Upper 0.1% points of chi-square with k - 1 degrees of freedom (k = 1..8).
double chi_bound(size_t support) {
  static const double q[] = {0, 0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32};
  return q[support];
}

size_t support(const std::vector<double>& p) { return size_t(std::count_if(p.begin(), p.end(), [](double v) { return v > 0; })); }

struct Case {
  const char* name;
  SamplingParams params;
  std::vector<double> want;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  SamplingParams t;  // plain temperature 0.7
  t.temperature = 0.7f;
  c.push_back({"temperature", t, softmax(kLogits, 0.7)});
  SamplingParams k = t;
  k.top_k = 3;
  c.push_back({"top_k", k, restrict(softmax(kLogits, 0.7), {0, 1, 2})});
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.8f;
  {
    std::vector<double> q = softmax(kLogits, 1.0);
    std::set<int> kept;
    double before = 0;
    for (int i = 0; i < int(q.size()) && (i == 0 || before < 0.8); ++i) {
      kept.insert(i);
      before += q[size_t(i)];
    }
    c.push_back({"top_p", p, restrict(q, kept)});
  }
  SamplingParams m;
  m.temperature = 1.0f;
  m.min_p = 0.2f;
  {
    std::vector<double> q = softmax(kLogits, 1.0);
    std::set<int> kept;
    for (int i = 0; i < int(q.size()); ++i)
      if (q[size_t(i)] >= 0.2 * q[0]) kept.insert(i);
    c.push_back({"min_p", m, restrict(q, kept)});
  }
  return c;
}

TEST(Sampler, FrequenciesMatchTheFilteredDistribution) {
  for (Case& c : cases()) {
    c.params.seed = 1234;
    double chi = chi_square(c.params, c.want, 40000);
    EXPECT_LT(chi, chi_bound(support(c.want))) << c.name;
    // The exposed distribution is the one the test derived.
    auto dist = sampling_distribution(kLogits, c.params);
    EXPECT_EQ(dist.size(), support(c.want)) << c.name;
    for (const auto& [id, prob] : dist) EXPECT_NEAR(prob, c.want[size_t(id)], 1e-7) << c.name << " id " << id;
  }
}

TEST(Sampler, ChiSquareDetectsAWrongDistribution) {
  // The check above can fail: draws from top-k 3 judged against top-k 4 exceed the bound by far.
  Case k3 = cases()[1];
  k3.params.seed = 5;
  std::vector<double> k4 = restrict(softmax(kLogits, 0.7), {0, 1, 2, 3});
  EXPECT_GT(chi_square(k3.params, k4, 40000), 10 * chi_bound(4));
}

TEST(Sampler, SeedReproducesAndCandidatesMatchFullRows) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 4;
  p.seed = 77;
  Sampler a(p), b(p), c(p);
  std::vector<float> top = {kLogits[0], kLogits[1], kLogits[2], kLogits[3]};
  std::vector<int32_t> ids = {0, 1, 2, 3};
  for (int i = 0; i < 200; ++i) {
    int32_t x = a.sample(kLogits, {});
    EXPECT_EQ(x, b.sample(kLogits, {}));
    EXPECT_EQ(x, c.sample_candidates(top, ids));  // the device top-k path draws the same token
  }
  p.seed = 78;
  Sampler d(p), e(SamplingParams(a.params()));
  int differ = 0;
  for (int i = 0; i < 50; ++i) differ += d.sample(kLogits, {}) != e.sample(kLogits, {});
  EXPECT_GT(differ, 0);
}

TEST(Sampler, GreedyIsArgmax) {
  Sampler s(SamplingParams{});
  std::vector<float> l = {0.1f, 3.0f, -2.0f, 2.9f};
  EXPECT_EQ(s.sample(l, {}), 1);
}

TEST(Sampler, RepetitionPenaltyFollowsTransformers) {
  std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f};
  apply_repetition_penalty(l, {0, 1, 1, 1}, 2.0f);  // each id once, however often it occurs
  EXPECT_FLOAT_EQ(l[0], 1.0f);    // positive: divided
  EXPECT_FLOAT_EQ(l[1], -2.0f);   // negative: multiplied
  EXPECT_FLOAT_EQ(l[2], 0.5f);
  EXPECT_FLOAT_EQ(l[3], 3.0f);
  // Greedy with the penalty avoids the repeated token.
  SamplingParams p;
  p.repetition_penalty = 1.5f;
  Sampler s(p);
  EXPECT_EQ(s.sample({3.0f, 2.5f}, {0}), 1);
}

TEST(Sampler, BadParametersNameTheParameter) {
  auto expect_error = [](SamplingParams p, const std::string& name) {
    try {
      p.validate();
      ADD_FAILURE() << "no error for " << name;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  SamplingParams p;
  p.top_p = 0;
  expect_error(p, "top_p");
  p = {};
  p.top_p = 1.5f;
  expect_error(p, "top_p");
  p = {};
  p.temperature = -0.1f;
  expect_error(p, "temperature");
  p = {};
  p.top_k = -1;
  expect_error(p, "top_k");
  p = {};
  p.min_p = 1.1f;
  expect_error(p, "min_p");
  p = {};
  p.min_p = -0.1f;
  expect_error(p, "min_p");
  p = {};
  p.repetition_penalty = 0;
  expect_error(p, "repetition_penalty");
  EXPECT_THROW(Sampler{p}, ConfigError);
}

}  // namespace
}  // namespace lmtune::infer
