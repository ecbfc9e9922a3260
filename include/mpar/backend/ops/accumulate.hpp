#pragma once
/**
 * @file `ops::accumulate`: a sum of rank memory added into a double scalar of rank memory, with its host reference.
 * See backend/ops/operation.hpp.
 *
 * Why an operation: the per-step statistics (the loss of every micro-batch, the MoE's auxiliary loss and dropped
 * tokens) stay where the work runs and reach the host once per step with the optimizer's statistics, instead of one
 * host read per micro-batch.
 */
#include <cstddef>

namespace mpar::ops {

/** `*acc += scale * (x[0] + ... + x[n-1])`, summed in double in index order. */
struct accumulate {
  static constexpr const char* name = "accumulate";
  std::size_t n = 0;
  const float* x = nullptr;
  double scale = 1.0;
  double* acc = nullptr;  ///< one double of rank memory
  template <class F>
  void each_operand(F&& f) {
    f(x), f(acc);
  }
};

inline void host_reference(const accumulate& op) {
  double s = 0;
  for (std::size_t i = 0; i < op.n; ++i) s += double(op.x[i]);
  *op.acc += op.scale * s;
}

}  // namespace mpar::ops
