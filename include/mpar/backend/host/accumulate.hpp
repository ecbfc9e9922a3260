#pragma once
/**
 * @file Host reference of `accumulate`: a sum of rank memory added into a double scalar of rank memory.
 *
 * Why an operation: the per-step statistics (the loss of every micro-batch) stay where the work runs
 * and reach the host once per step with the optimizer's statistics, instead of one host read per
 * micro-batch.
 */
#include <cstddef>

namespace mpar::host {

/** `*acc += scale * (x[0] + ... + x[n-1])`, summed in double in index order. */
inline void accumulate(std::size_t n, const float* x, double scale, double* acc) {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += double(x[i]);
  *acc += scale * s;
}

}  // namespace mpar::host
