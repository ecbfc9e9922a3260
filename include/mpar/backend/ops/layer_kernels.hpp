#pragma once
/**
 * @file The layers' elementwise and row operations: `ops::add`, `ops::bias_add_forward`, `ops::bias_add_backward`,
 * `ops::gelu_forward`, `ops::gelu_backward`, `ops::softmax_forward`, `ops::softmax_backward`,
 * `ops::layernorm_forward`, `ops::layernorm_backward`, `ops::dropout_apply`. See backend/ops/operation.hpp for the
 * pattern.
 *
 * Their host reference is the host kernels of backend/host/kernels.hpp (vectorised at the CPU's level, checked on
 * their own against plain loops and finite differences in tests/backend); all arrays are fp32, row-major
 * `[rows, cols]`. Parameter gradients accumulate (`+=`), as every parameter gradient does; activation gradients
 * are overwritten.
 */
#include <cstddef>

#include "mpar/backend/host/kernels.hpp"
#include "mpar/backend/types.hpp"  // host::DropoutMask

namespace mpar::ops {

/** `y[i] = x[i] + z[i]`; `y` may alias `x` or `z`. */
struct add {
  static constexpr const char* name = "add";
  std::size_t n = 0;
  const float* x = nullptr;
  const float* z = nullptr;
  float* y = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(x), f(z), f(y);
  }
};

/** `y[r, c] += bias[c]`. */
struct bias_add_forward {
  static constexpr const char* name = "bias_add_forward";
  std::size_t rows = 0, cols = 0;
  const float* bias = nullptr;
  float* y = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(bias), f(y);
  }
};

/** `dbias[c] += sum over rows of dy[r, c]` (accumulates). */
struct bias_add_backward {
  static constexpr const char* name = "bias_add_backward";
  std::size_t rows = 0, cols = 0;
  const float* dy = nullptr;
  float* dbias = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(dy), f(dbias);
  }
};

/** `y = gelu(x)`, GPT-2's tanh approximation; `y` may alias `x`. */
struct gelu_forward {
  static constexpr const char* name = "gelu_forward";
  std::size_t n = 0;
  const float* x = nullptr;
  float* y = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(x), f(y);
  }
};

/** `dx = gelu'(x) dy` (overwritten; may alias `dy`). */
struct gelu_backward {
  static constexpr const char* name = "gelu_backward";
  std::size_t n = 0;
  const float* x = nullptr;
  const float* dy = nullptr;
  float* dx = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(x), f(dy), f(dx);
  }
};

/**
 * Row softmax of `scale x`; with `causal`, row `r` of each block of `cols` rows sees its first `r mod cols + 1`
 * columns and the rest are 0 (attention's mask over `[s, s]` score blocks). `y` may alias `x`.
 */
struct softmax_forward {
  static constexpr const char* name = "softmax_forward";
  std::size_t rows = 0, cols = 0;
  const float* x = nullptr;
  float* y = nullptr;
  bool causal = false;
  float scale = 1;
  template <class F>
  void each_operand(F&& f) {
    f(x), f(y);
  }
};

/** `dx = y (dy - sum(dy y))` per row (masked entries have `y = 0`, so `dx = 0`); `dx` may alias `dy`. */
struct softmax_backward {
  static constexpr const char* name = "softmax_backward";
  std::size_t rows = 0, cols = 0;
  const float* y = nullptr;
  const float* dy = nullptr;
  float* dx = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(y), f(dy), f(dx);
  }
};

/** `y = (x - mean) rstd gamma + beta` per row, keeping `mean` and `rstd` (one per row) for the backward. */
struct layernorm_forward {
  static constexpr const char* name = "layernorm_forward";
  std::size_t rows = 0, cols = 0;
  const float* x = nullptr;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  float* y = nullptr;
  float* mean = nullptr;
  float* rstd = nullptr;
  float eps = 1e-5f;
  template <class F>
  void each_operand(F&& f) {
    f(x), f(gamma), f(beta), f(y), f(mean), f(rstd);
  }
};

/** The input gradient `dx` (overwritten) and `dgamma`, `dbeta` (accumulated) from the forward's `mean`, `rstd`. */
struct layernorm_backward {
  static constexpr const char* name = "layernorm_backward";
  std::size_t rows = 0, cols = 0;
  const float* x = nullptr;
  const float* mean = nullptr;
  const float* rstd = nullptr;
  const float* gamma = nullptr;
  const float* dy = nullptr;
  float* dx = nullptr;
  float* dgamma = nullptr;
  float* dbeta = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(x), f(mean), f(rstd), f(gamma), f(dy), f(dx), f(dgamma), f(dbeta);
  }
};

/**
 * `y = x / (1 - p)` where `mask` keeps the element, else 0; the mask is a function of the element's global
 * coordinates (seed, stream, offsets), so every layout drops the same elements. The backward is the same operation
 * on the gradient. `y` may alias `x`.
 */
struct dropout_apply {
  static constexpr const char* name = "dropout_apply";
  host::DropoutMask mask;
  std::size_t rows = 0, cols = 0;
  const float* x = nullptr;
  float* y = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(x), f(y);
  }
};

inline void host_reference(const add& op) { host::add(op.n, op.x, op.z, op.y); }
inline void host_reference(const bias_add_forward& op) { host::bias_add_forward(op.rows, op.cols, op.bias, op.y); }
inline void host_reference(const bias_add_backward& op) { host::bias_add_backward(op.rows, op.cols, op.dy, op.dbias); }
inline void host_reference(const gelu_forward& op) { host::gelu_forward(op.n, op.x, op.y); }
inline void host_reference(const gelu_backward& op) { host::gelu_backward(op.n, op.x, op.dy, op.dx); }
inline void host_reference(const softmax_forward& op) {
  host::softmax_forward(op.rows, op.cols, op.x, op.y, op.causal, op.scale);
}
inline void host_reference(const softmax_backward& op) { host::softmax_backward(op.rows, op.cols, op.y, op.dy, op.dx); }
inline void host_reference(const layernorm_forward& op) {
  host::layernorm_forward(op.rows, op.cols, op.x, op.gamma, op.beta, op.y, op.mean, op.rstd, op.eps);
}
inline void host_reference(const layernorm_backward& op) {
  host::layernorm_backward(op.rows, op.cols, op.x, op.mean, op.rstd, op.gamma, op.dy, op.dx, op.dgamma, op.dbeta);
}
inline void host_reference(const dropout_apply& op) { host::dropout_apply(op.mask, op.rows, op.cols, op.x, op.y); }

}  // namespace mpar::ops
