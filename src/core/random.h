// Deterministic, portable random numbers (splitmix64 + Box-Muller) so that the same seed gives the same
// tensors on every platform and device.
#pragma once
#include <cmath>
#include <cstdint>

namespace lmtune {

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return double(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * M_PI * u2);
    has_spare_ = true;
    return r * std::cos(2.0 * M_PI * u2);
  }
  uint64_t state() const { return state_; }

  // Elements [begin, end) of the sequence normal() gives from a fresh Rng(seed), times stddev, without drawing the
  // ones before: splitmix64's n-th output depends on n alone, so disjoint ranges can be filled by separate threads.
  static void fill_normal(float* out, uint64_t begin, uint64_t end, uint64_t seed, float stddev) {
    for (uint64_t i = begin; i < end;) {
      const uint64_t pair = i / 2;  // normals 2k and 2k + 1 come from outputs 2k + 1 and 2k + 2
      Rng r(seed + 2 * pair * 0x9e3779b97f4a7c15ull);
      const double a = r.normal(), b = r.normal();
      if (i % 2 == 0) out[i++ - begin] = float(a * stddev);
      if (i < end) out[i++ - begin] = float(b * stddev);
    }
  }
  void set_state(uint64_t s) { state_ = s; has_spare_ = false; }

 private:
  uint64_t state_;
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace lmtune
