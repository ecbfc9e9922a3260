#pragma once
/** @file Learning-rate schedules: linear warm-up followed by cosine decay to a floor. */
#include <cmath>
#include <cstddef>
#include <numbers>

#include "mpar/core/error.hpp"

namespace mpar::optim {

/**
 * @brief Linear warm-up for `warmup_steps`, then cosine decay from `peak_lr` to `min_lr` at `total_steps`,
 * constant `min_lr` afterwards. Steps count from 0 (the first optimizer step is step 0):
 * - `step < warmup_steps`: `peak_lr * (step + 1) / warmup_steps` — the first step already moves the weights
 *   and the last warm-up step reaches the peak;
 * - otherwise, with `progress = (step - warmup_steps) / (total_steps - warmup_steps)` clamped to [0, 1]:
 *   `min_lr + (peak_lr - min_lr) * (1 + cos(pi * progress)) / 2`.
 */
struct WarmupCosine {
  double peak_lr = 1e-3;
  double min_lr = 0.0;
  std::size_t warmup_steps = 0;
  std::size_t total_steps = 1;

  WarmupCosine(double peak, double min, std::size_t warmup, std::size_t total)
      : peak_lr(peak), min_lr(min), warmup_steps(warmup), total_steps(total) {
    require(peak >= 0.0 && min >= 0.0 && min <= peak, "WarmupCosine: need 0 <= min_lr (", min, ") <= peak_lr (", peak,
            ")");
    require(total >= warmup && total > 0, "WarmupCosine: total_steps (", total,
            ") must be positive and at least warmup_steps (", warmup, ")");
  }

  [[nodiscard]] double operator()(std::size_t step) const {
    if (step < warmup_steps) return peak_lr * double(step + 1) / double(warmup_steps);
    const std::size_t decay_steps = total_steps - warmup_steps;
    if (decay_steps == 0) return min_lr;
    double progress = double(step - warmup_steps) / double(decay_steps);
    if (progress > 1.0) progress = 1.0;
    return min_lr + (peak_lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  }
};

}  // namespace mpar::optim
