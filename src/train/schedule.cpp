// Learning-rate schedules (the shapes transformers' get_{constant,linear,cosine}_schedule_with_warmup produce).
#include "train/schedule.h"

#include <algorithm>
#include <cmath>

namespace lmtune {

double learning_rate(const Recipe::Schedule& s, double base_lr, int step, int total) {
  if (s.warmup_steps > 0 && step < s.warmup_steps) return base_lr * double(step + 1) / double(s.warmup_steps);
  if (s.name == "constant") return base_lr;
  int decay_steps = std::max(1, total - s.warmup_steps);
  double progress = std::clamp(double(step - s.warmup_steps) / double(decay_steps), 0.0, 1.0);
  double factor = s.name == "linear" ? 1.0 - progress : 0.5 * (1.0 + std::cos(M_PI * progress));
  return base_lr * (s.min_lr_ratio + (1.0 - s.min_lr_ratio) * factor);
}

}  // namespace lmtune
