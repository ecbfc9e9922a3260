#pragma once
/**
 * @file Host reference of the Llama-class layers' kernels (`llama_kernel_backend`): RMSNorm, the rotate-half
 * rotary position embedding and the SwiGLU gate. Plain loops, one row at a time; every reduction runs in the
 * order of the columns, so a row's result does not depend on which rank or micro-batch holds it.
 */
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace mpar::host {

/** RMSNorm: `rstd[r] = 1 / sqrt(mean(x_r^2) + eps)`, `y = x * rstd * gain`. */
inline void rmsnorm_forward(std::size_t rows, std::size_t cols, float eps, const float* x, const float* gain, float* y,
                            float* rstd) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float ss = 0;
    for (std::size_t c = 0; c < cols; ++c) ss += xr[c] * xr[c];
    const float rs = 1.0f / std::sqrt(ss / float(cols) + eps);
    rstd[r] = rs;
    for (std::size_t c = 0; c < cols; ++c) y[r * cols + c] = xr[c] * rs * gain[c];
  }
}

/**
 * RMSNorm's backward: `dx = rstd (g dy - x rstd^2 mean(g dy x))` (overwritten; may alias dy) and
 * `dgain += sum_r dy x rstd` (accumulates).
 */
inline void rmsnorm_backward(std::size_t rows, std::size_t cols, const float* x, const float* rstd, const float* gain,
                             const float* dy, float* dx, float* dgain) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float *xr = x + r * cols, *dyr = dy + r * cols;
    const float rs = rstd[r];
    float dot = 0;
    for (std::size_t c = 0; c < cols; ++c) {
      dot += dyr[c] * gain[c] * xr[c];
      dgain[c] += dyr[c] * xr[c] * rs;
    }
    const float k = dot * rs * rs / float(cols);
    for (std::size_t c = 0; c < cols; ++c) dx[r * cols + c] = rs * (dyr[c] * gain[c] - xr[c] * k);
  }
}

namespace detail {
/**
 * The rotation of every head of every row by its position's angles, `sign` +1 (forward) or -1 (the transpose). The
 * angles are computed in double and rounded once, so a large position loses no more than the float result's
 * precision.
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

/** Rotary position embedding, rotate-half (Hugging Face's Llama); see `llama_kernel_backend`. */
inline void rope_forward(std::size_t rows, std::size_t heads, std::size_t head_dim, std::size_t ld,
                         const std::int32_t* positions, double theta, const float* x, float* y) {
  detail::rope_rotate(rows, heads, head_dim, ld, positions, theta, x, y, 1.0);
}
/** The transpose of `rope_forward` (the rotation by minus each angle): its backward. */
inline void rope_backward(std::size_t rows, std::size_t heads, std::size_t head_dim, std::size_t ld,
                          const std::int32_t* positions, double theta, const float* dy, float* dx) {
  detail::rope_rotate(rows, heads, head_dim, ld, positions, theta, dy, dx, -1.0);
}

/** `y = silu(gate) * up`, row `r` of `gate_up` holding `cols` gate values then `cols` up values. */
inline void silu_gate_forward(std::size_t rows, std::size_t cols, const float* gate_up, float* y) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float *g = gate_up + r * 2 * cols, *u = g + cols;
    for (std::size_t c = 0; c < cols; ++c) y[r * cols + c] = g[c] / (1.0f + std::exp(-g[c])) * u[c];
  }
}
/** The gradient of both halves: `dgate = dy up silu'(gate)`, `dup = dy silu(gate)` (overwritten). */
inline void silu_gate_backward(std::size_t rows, std::size_t cols, const float* gate_up, const float* dy,
                               float* dgate_up) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float *g = gate_up + r * 2 * cols, *u = g + cols, *d = dy + r * cols;
    float *dg = dgate_up + r * 2 * cols, *du = dg + cols;
    for (std::size_t c = 0; c < cols; ++c) {
      const float s = 1.0f / (1.0f + std::exp(-g[c]));
      const float gc = g[c], uc = u[c], dc = d[c];  // read before written (dgate_up may be gate_up)
      dg[c] = dc * uc * s * (1.0f + gc * (1.0f - s));
      du[c] = dc * gc * s;
    }
  }
}

}  // namespace mpar::host
