#pragma once
/**
 * @file The SwiGLU gate operations (`ops::silu_gate_forward`, `ops::silu_gate_backward`) of the Llama-class MLP, with
 * their host reference. See backend/ops/operation.hpp.
 */
#include <cmath>
#include <cstddef>

namespace mpar::ops {

/** `y = silu(gate) * up`, row `r` of `gate_up` holding `cols` gate values then `cols` up values. */
struct silu_gate_forward {
  static constexpr const char* name = "silu_gate_forward";
  std::size_t rows = 0, cols = 0;
  const float* gate_up = nullptr;
  float* y = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(gate_up), f(y);
  }
};

/** The gradient of both halves, `dgate = dy up silu'(gate)` and `dup = dy silu(gate)` (overwritten; may be `gate_up`). */
struct silu_gate_backward {
  static constexpr const char* name = "silu_gate_backward";
  std::size_t rows = 0, cols = 0;
  const float* gate_up = nullptr;
  const float* dy = nullptr;
  float* dgate_up = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(gate_up), f(dy), f(dgate_up);
  }
};

inline void host_reference(const silu_gate_forward& op) {
  const std::size_t cols = op.cols;
  for (std::size_t r = 0; r < op.rows; ++r) {
    const float *g = op.gate_up + r * 2 * cols, *u = g + cols;
    for (std::size_t c = 0; c < cols; ++c) op.y[r * cols + c] = g[c] / (1.0f + std::exp(-g[c])) * u[c];
  }
}

inline void host_reference(const silu_gate_backward& op) {
  const std::size_t cols = op.cols;
  for (std::size_t r = 0; r < op.rows; ++r) {
    const float *g = op.gate_up + r * 2 * cols, *u = g + cols, *d = op.dy + r * cols;
    float *dg = op.dgate_up + r * 2 * cols, *du = dg + cols;
    for (std::size_t c = 0; c < cols; ++c) {
      const float s = 1.0f / (1.0f + std::exp(-g[c]));
      const float gc = g[c], uc = u[c], dc = d[c];  // read before written (dgate_up may be gate_up)
      dg[c] = dc * uc * s * (1.0f + gc * (1.0f - s));
      du[c] = dc * gc * s;
    }
  }
}

}  // namespace mpar::ops
