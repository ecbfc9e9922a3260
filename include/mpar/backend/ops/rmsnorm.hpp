#pragma once
/**
 * @file The RMSNorm operations (`ops::rmsnorm_forward`, `ops::rmsnorm_backward`) of the Llama-class layers, with
 * their host reference: plain loops, one row at a time, every reduction in the order of the columns, so a row's
 * result does not depend on which rank or micro-batch holds it. See backend/ops/operation.hpp for the pattern.
 */
#include <cmath>
#include <cstddef>

namespace mpar::ops {

/** `rstd[r] = 1 / sqrt(mean(x_r^2) + eps)` and `y = x * rstd * gain`, rows of `cols` fp32 values. */
struct rmsnorm_forward {
  static constexpr const char* name = "rmsnorm_forward";
  std::size_t rows = 0, cols = 0;
  float eps = 0;
  const float* x = nullptr;
  const float* gain = nullptr;
  float* y = nullptr;
  float* rstd = nullptr;  ///< one per row, kept for the backward
  template <class F>
  void each_operand(F&& f) {
    f(x), f(gain), f(y), f(rstd);
  }
};

/**
 * The input gradient `dx = rstd (gain dy - x rstd^2 mean(gain dy x))` (overwritten; may be `dy`) and
 * `dgain += sum over rows of dy x rstd` (accumulates, as every parameter gradient does).
 */
struct rmsnorm_backward {
  static constexpr const char* name = "rmsnorm_backward";
  std::size_t rows = 0, cols = 0;
  const float* x = nullptr;
  const float* rstd = nullptr;
  const float* gain = nullptr;
  const float* dy = nullptr;
  float* dx = nullptr;
  float* dgain = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(x), f(rstd), f(gain), f(dy), f(dx), f(dgain);
  }
};

inline void host_reference(const rmsnorm_forward& op) {
  const std::size_t cols = op.cols;
  for (std::size_t r = 0; r < op.rows; ++r) {
    const float* xr = op.x + r * cols;
    float ss = 0;
    for (std::size_t c = 0; c < cols; ++c) ss += xr[c] * xr[c];
    const float rs = 1.0f / std::sqrt(ss / float(cols) + op.eps);
    op.rstd[r] = rs;
    for (std::size_t c = 0; c < cols; ++c) op.y[r * cols + c] = xr[c] * rs * op.gain[c];
  }
}

inline void host_reference(const rmsnorm_backward& op) {
  const std::size_t cols = op.cols;
  for (std::size_t r = 0; r < op.rows; ++r) {
    const float *xr = op.x + r * cols, *dyr = op.dy + r * cols;
    const float rs = op.rstd[r];
    float dot = 0;
    for (std::size_t c = 0; c < cols; ++c) {
      dot += dyr[c] * op.gain[c] * xr[c];
      op.dgain[c] += dyr[c] * xr[c] * rs;
    }
    const float k = dot * rs * rs / float(cols);
    for (std::size_t c = 0; c < cols; ++c) op.dx[r * cols + c] = rs * (dyr[c] * op.gain[c] - xr[c] * k);
  }
}

}  // namespace mpar::ops
