#pragma once
/**
 * @file The rotary position embedding operations (`ops::rope_forward`, `ops::rope_backward`) of the Llama-class
 * layers, rotate-half as Hugging Face's Llama, with their host reference. See backend/ops/operation.hpp.
 */
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mpar::ops {

/**
 * The rotary embedding of `heads` heads of `head_dim` (even) values per row, row `r` at `r * ld`: with
 * `a = positions[r] * theta^(-2i / head_dim)`, `y_i = x_i cos a - x_{i+d/2} sin a` and
 * `y_{i+d/2} = x_{i+d/2} cos a + x_i sin a` for `i < head_dim / 2`. `x` may be `y`: a head is read whole before it
 * is written.
 */
struct rope_forward {
  static constexpr const char* name = "rope_forward";
  std::size_t rows = 0, heads = 0, head_dim = 0, ld = 0;
  const std::int32_t* positions = nullptr;  ///< one global position per row, in rank memory
  double theta = 10000.0;
  const float* x = nullptr;
  float* y = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(positions), f(x), f(y);
  }
};

/** The transpose of `rope_forward` (the rotation by minus each angle), its backward; `dy` may be `dx`. */
struct rope_backward {
  static constexpr const char* name = "rope_backward";
  std::size_t rows = 0, heads = 0, head_dim = 0, ld = 0;
  const std::int32_t* positions = nullptr;
  double theta = 10000.0;
  const float* dy = nullptr;
  float* dx = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(positions), f(dy), f(dx);
  }
};

namespace detail {
/**
 * Every head of every row rotated by its position's angles, `sign` +1 (forward) or -1 (the transpose). The angles
 * are computed in double and rounded once, so a large position loses no more than the float result's precision.
 */
inline void rope_rotate(std::size_t rows, std::size_t heads, std::size_t head_dim, std::size_t ld,
                        const std::int32_t* positions, double theta, const float* x, float* y, double sign) {
  const std::size_t half = head_dim / 2;
  std::vector<double> inv_freq(half);
  for (std::size_t i = 0; i < half; ++i) inv_freq[i] = std::pow(theta, -2.0 * double(i) / double(head_dim));
  std::vector<float> cos_a(half), sin_a(half);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t i = 0; i < half; ++i) {
      const double a = double(positions[r]) * inv_freq[i];
      cos_a[i] = float(std::cos(a));
      sin_a[i] = float(sign * std::sin(a));
    }
    for (std::size_t h = 0; h < heads; ++h) {
      const float* xh = x + r * ld + h * head_dim;
      float* yh = y + r * ld + h * head_dim;
      for (std::size_t i = 0; i < half; ++i) {
        const float lo = xh[i], hi = xh[i + half];  // read both before either is written (x may be y)
        yh[i] = lo * cos_a[i] - hi * sin_a[i];
        yh[i + half] = hi * cos_a[i] + lo * sin_a[i];
      }
    }
  }
}
}  // namespace detail

inline void host_reference(const rope_forward& op) {
  detail::rope_rotate(op.rows, op.heads, op.head_dim, op.ld, op.positions, op.theta, op.x, op.y, 1.0);
}
inline void host_reference(const rope_backward& op) {
  detail::rope_rotate(op.rows, op.heads, op.head_dim, op.ld, op.positions, op.theta, op.dy, op.dx, -1.0);
}

}  // namespace mpar::ops
