// Rotary inverse frequencies of every rope type (io/hf_config.h), computed as transformers'
// modeling_rope_utils.py does: its arithmetic is f32 tensor code, followed here step by step (python scalars
// become f32 operands; python-only scalar math, like yarn's correction range, stays in double). base^exponent is
// computed in double and rounded, so results are platform-independent.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "core/error.h"
#include "io/hf_config.h"

namespace lmtune {
namespace {

// f32 pow as the tensor op computes it (to within an ulp): in double, rounded once.
float pow_f32(float base, float exponent) { return float(std::pow(double(base), double(exponent))); }

// base^(2i / dim) for i < dim / 2: the denominators of the default frequencies.
std::vector<float> base_powers(double theta, int dim) {
  std::vector<float> out(size_t(dim / 2));
  for (int i = 0; i < dim / 2; ++i) out[size_t(i)] = pow_f32(float(theta), float(2 * i) / float(dim));
  return out;
}

std::vector<float> default_inv_freq(double theta, int dim) {
  std::vector<float> inv = base_powers(theta, dim);
  for (float& f : inv) f = 1.0f / f;
  return inv;
}

void llama3_scale(const RopeConfig& rope, std::vector<float>& inv) {
  const float factor = float(rope.factor);
  const float low = float(rope.low_freq_factor);
  const double old_len = double(rope.original_max_pos);
  const float low_freq_wavelen = float(old_len / rope.low_freq_factor);
  const float high_freq_wavelen = float(old_len / rope.high_freq_factor);
  const float two_pi = float(2.0 * std::numbers::pi);
  for (float& f : inv) {
    float wavelen = two_pi / f;
    if (wavelen > low_freq_wavelen) {
      f = f / factor;  // low frequencies: fully interpolated
    } else if (!(wavelen < high_freq_wavelen)) {
      // Medium frequencies: blend between interpolated and original.
      float smooth = (float(old_len) / wavelen - low) / float(rope.high_freq_factor - rope.low_freq_factor);
      f = (1.0f - smooth) * f / factor + smooth * f;
    }  // high frequencies: unchanged
  }
}

// Dynamic NTK: past the original length the base grows to
// base * (factor * seq_len / original - (factor - 1)) ^ (dim / (dim - 2)), seq_len a tensor (f32 arithmetic).
std::vector<float> dynamic_inv_freq(const RopeConfig& rope, int dim, int64_t seq_len) {
  if (seq_len <= rope.original_max_pos) return default_inv_freq(rope.theta, dim);  // transformers keeps the init
  const float factor = float(rope.factor);
  float growth = factor * float(seq_len) / float(rope.original_max_pos) - float(rope.factor - 1.0);
  float base = float(rope.theta) * pow_f32(growth, float(double(dim) / double(dim - 2)));
  std::vector<float> inv(size_t(dim / 2));
  for (int i = 0; i < dim / 2; ++i) inv[size_t(i)] = 1.0f / pow_f32(base, float(2 * i) / float(dim));
  return inv;
}

// YaRN: frequencies below the correction range are interpolated (divided by factor), those above kept
// (extrapolated), with a linear ramp over the dimensions between.
std::vector<float> yarn_inv_freq(const RopeConfig& rope, int dim) {
  const double base = rope.theta;
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(double(rope.original_max_pos) / (rotations * 2 * std::numbers::pi))) /
           (2 * std::log(base));
  };
  double low = correction_dim(rope.beta_fast), high = correction_dim(rope.beta_slow);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;  // as transformers: no singular ramp
  const float factor = float(rope.factor);
  std::vector<float> pos_freqs = base_powers(base, dim), inv(pos_freqs.size());
  for (size_t i = 0; i < inv.size(); ++i) {
    float extrapolation = 1.0f / pos_freqs[i];
    float interpolation = 1.0f / (factor * pos_freqs[i]);
    float ramp = std::clamp((float(i) - float(low)) / float(high - low), 0.0f, 1.0f);
    float keep = 1.0f - ramp;  // transformers' inv_freq_extrapolation_factor
    inv[i] = interpolation * (1.0f - keep) + extrapolation * keep;
  }
  return inv;
}

// LongRoPE: each frequency divided by its own factor, long_factor once seq_len passes the original length.
std::vector<float> longrope_inv_freq(const RopeConfig& rope, int dim, int64_t seq_len) {
  const std::vector<double>& ext = seq_len > rope.original_max_pos ? rope.long_factor : rope.short_factor;
  std::vector<float> pos_freqs = base_powers(rope.theta, dim), inv(pos_freqs.size());
  if (ext.size() != inv.size())
    throw ConfigError("rope: longrope has " + std::to_string(ext.size()) + " factors for " +
                      std::to_string(inv.size()) + " frequencies");
  for (size_t i = 0; i < inv.size(); ++i) inv[i] = 1.0f / (float(ext[i]) * pos_freqs[i]);
  return inv;
}

// Proportional (Gemma 4): the head's first floor(fraction · dim / 2) frequencies as the default type's over the
// whole head dimension, the rest 0 (those pairs do not rotate), all divided by factor.
std::vector<float> proportional_inv_freq(const RopeConfig& rope, int dim) {
  const int64_t angles = int64_t(std::floor(rope.rotated_fraction * double(dim) / 2.0));
  std::vector<float> inv(size_t(dim / 2), 0.0f);
  for (int64_t i = 0; i < angles && i < dim / 2; ++i)
    inv[size_t(i)] = 1.0f / pow_f32(float(rope.theta), float(2 * i) / float(dim));
  for (float& f : inv) f /= float(rope.factor);
  return inv;
}

}  // namespace

std::string_view rope_type_name(RopeType t) {
  switch (t) {
    case RopeType::standard: return "default";
    case RopeType::linear: return "linear";
    case RopeType::llama3: return "llama3";
    case RopeType::dynamic: return "dynamic";
    case RopeType::yarn: return "yarn";
    case RopeType::longrope: return "longrope";
    case RopeType::proportional: return "proportional";
  }
  return "?";
}

bool rope_depends_on_length(const RopeConfig& rope) {
  return rope.type == RopeType::dynamic || rope.type == RopeType::longrope;
}

std::vector<float> rope_inv_freq(const RopeConfig& rope, int rotary_dim, int64_t seq_len) {
  if (rotary_dim <= 0 || rotary_dim % 2 != 0)
    throw ConfigError("rope: rotary dimension must be positive and even, got " + std::to_string(rotary_dim));
  std::vector<float> inv;
  switch (rope.type) {
    case RopeType::standard: inv = default_inv_freq(rope.theta, rotary_dim); break;
    case RopeType::linear:
      // Linear scaling divides positions by factor; rotating by (p / factor) * f equals p * (f / factor).
      inv = default_inv_freq(rope.theta, rotary_dim);
      for (float& f : inv) f /= float(rope.factor);
      break;
    case RopeType::llama3:
      inv = default_inv_freq(rope.theta, rotary_dim);
      llama3_scale(rope, inv);
      break;
    case RopeType::dynamic: inv = dynamic_inv_freq(rope, rotary_dim, seq_len); break;
    case RopeType::yarn: inv = yarn_inv_freq(rope, rotary_dim); break;
    case RopeType::longrope: inv = longrope_inv_freq(rope, rotary_dim, seq_len); break;
    case RopeType::proportional: inv = proportional_inv_freq(rope, rotary_dim); break;
  }
  if (!rope.freq_factors.empty()) {
    if (rope.freq_factors.size() != inv.size())
      throw ConfigError("rope: " + std::to_string(rope.freq_factors.size()) + " frequency factors for " +
                        std::to_string(inv.size()) + " frequencies");
    for (size_t i = 0; i < inv.size(); ++i) inv[i] /= rope.freq_factors[i];
  }
  return inv;
}

}  // namespace lmtune
