// Samplers (see sampler.h). Probabilities are computed in double; the filters follow transformers' warpers:
//   top-k:  keep the k largest logits (ties at the k-th value are cut by the sort order)
//   top-p:  sorted descending, keep token i while the probability of the tokens before it is < top_p
//           (HF removes the tokens whose ascending cumulative probability is <= 1 - top_p; the same set)
//   min-p:  keep tokens with p >= min_p * p_max (p after temperature and the filters above)
// At least one token always survives.
#include "infer/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <unordered_set>

#include "core/error.h"

namespace lmtune::infer {

void SamplingParams::validate() const {
  auto bad = [](const std::string& what, double v, const char* rule) {
    throw ConfigError("sampling: " + what + " = " + std::to_string(v) + " is invalid (" + rule + ")");
  };
  if (!(temperature >= 0) || !std::isfinite(temperature)) bad("temperature", temperature, "must be >= 0");
  if (top_k < 0) bad("top_k", top_k, "must be >= 0; 0 disables it");
  if (!(top_p > 0 && top_p <= 1)) bad("top_p", top_p, "must be in (0, 1]");
  if (!(min_p >= 0 && min_p <= 1)) bad("min_p", min_p, "must be in [0, 1]");
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty))
    bad("repetition_penalty", repetition_penalty, "must be > 0; 1 disables it");
}

void apply_repetition_penalty(std::vector<float>& logits, const std::vector<int32_t>& history, float penalty) {
  if (penalty == 1) return;
  std::unordered_set<int32_t> seen;
  for (int32_t id : history) {
    if (id < 0 || size_t(id) >= logits.size() || !seen.insert(id).second) continue;
    float& l = logits[size_t(id)];
    l = l > 0 ? l / penalty : l * penalty;
  }
}

std::vector<std::pair<int32_t, double>> sampling_distribution(const std::vector<float>& logits,
                                                              const SamplingParams& p,
                                                              const std::vector<int32_t>& ids) {
  const size_t n = logits.size();
  if (n == 0) throw ConfigError("sampling: empty logits");
  const double inv_t = p.temperature > 0 ? 1.0 / p.temperature : 1.0;
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  auto desc = [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b); };
  size_t keep = n;
  if (p.top_k > 0 && size_t(p.top_k) < n) {
    keep = size_t(p.top_k);
    std::partial_sort(order.begin(), order.begin() + std::ptrdiff_t(keep), order.end(), desc);
    order.resize(keep);
  } else if (p.top_p < 1) {
    std::sort(order.begin(), order.end(), desc);  // top-p needs the order; min-p alone does not
  }
  double max_logit = -INFINITY;
  for (int32_t i : order) max_logit = std::max(max_logit, double(logits[size_t(i)]));
  std::vector<std::pair<int32_t, double>> dist;
  dist.reserve(order.size());
  double total = 0;
  for (int32_t i : order) {
    double e = std::exp((double(logits[size_t(i)]) - max_logit) * inv_t);
    dist.emplace_back(i, e);
    total += e;
  }
  for (auto& d : dist) d.second /= total;
  if (p.top_p < 1) {
    double before = 0;
    size_t k = 0;
    while (k < dist.size() && (k == 0 || before < p.top_p)) before += dist[k++].second;
    dist.resize(k);
  }
  if (p.min_p > 0) {
    double pmax = 0;
    for (auto& d : dist) pmax = std::max(pmax, d.second);
    double cut = p.min_p * pmax;
    dist.erase(std::remove_if(dist.begin(), dist.end(), [&](const auto& d) { return d.second < cut; }), dist.end());
  }
  std::sort(dist.begin(), dist.end(), [](const auto& a, const auto& b) { return a.second > b.second || (a.second == b.second && a.first < b.first); });
  total = 0;
  for (auto& d : dist) total += d.second;
  for (auto& d : dist) {
    d.second /= total;
    if (!ids.empty()) d.first = ids[size_t(d.first)];
  }
  return dist;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) { params_.validate(); }

int32_t Sampler::draw(const std::vector<std::pair<int32_t, double>>& dist) {
  double u = rng_.uniform(), c = 0;
  for (const auto& [id, prob] : dist) {
    c += prob;
    if (u < c) return id;
  }
  return dist.back().first;  // rounding: u just below 1
}

int32_t Sampler::sample(std::vector<float> logits, const std::vector<int32_t>& history) {
  apply_repetition_penalty(logits, history, params_.repetition_penalty);
  if (params_.greedy()) return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  return draw(sampling_distribution(logits, params_));
}

int32_t Sampler::sample_candidates(const std::vector<float>& values, const std::vector<int32_t>& ids) {
  if (values.empty() || values.size() != ids.size()) throw ConfigError("sampling: bad candidate list");
  if (params_.greedy()) return ids[0];
  return draw(sampling_distribution(values, params_, ids));
}

}  // namespace lmtune::infer
