// Learning-rate schedules: linear warmup from 0, then constant, linear decay or cosine decay to min_lr_ratio·lr.
#pragma once
#include "train/recipe.h"

namespace lmtune {

// Learning rate for optimizer step `step` (0-based) of `total` steps.
double learning_rate(const Recipe::Schedule& schedule, double base_lr, int step, int total);

}  // namespace lmtune
