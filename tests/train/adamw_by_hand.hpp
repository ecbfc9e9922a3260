#pragma once
// The independent reference of the AdamW tests: the textbook update written out element by element in float, one
// rounding per operation, with no code shared with the optimizer kernels it checks bit for bit.
#include <cmath>
#include <cstddef>
#include <vector>

#include <mpar/optim/adamw.hpp>

namespace mpar::testing {

/**
 * One AdamW step of weights `w` with moments `m`, `v` from gradient `g` scaled by `gs` (the clip and
 * averaging factor), learning rate `lr`, weight decay `wd`, at update count `t` (the bias corrections'
 * exponent: updates taken, skipped ones not counted).
 */
inline void adamw_by_hand(std::vector<float>& w, const std::vector<float>& g, std::vector<float>& m,
                          std::vector<float>& v, const optim::AdamWConfig& c, int t, float lr, float gs, float wd) {
  const float c1 = float(1.0 - std::pow(double(c.beta1), t)), c2 = float(1.0 - std::pow(double(c.beta2), t));
  for (std::size_t i = 0; i < w.size(); ++i) {
    const float gi = g[i] * gs;
    m[i] = c.beta1 * m[i] + (1.0f - c.beta1) * gi;
    v[i] = c.beta2 * v[i] + (1.0f - c.beta2) * gi * gi;
    w[i] = w[i] * (1.0f - lr * wd) - lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + c.eps);
  }
}

}  // namespace mpar::testing
