#pragma once
/**
 * @file Host kernels for the layers' forward and backward passes.
 *
 * Activations are row-major matrices `[rows, cols]` passed as raw pointers with sizes (the layers
 * own the shapes). Backward kernels that produce parameter gradients *accumulate* into them, so
 * gradient accumulation over micro-batches needs no extra buffers.
 */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "mpar/core/error.hpp"
#include "mpar/core/init.hpp"

namespace mpar::host {

// ---- elementwise -------------------------------------------------------------------------------

/** y[i] = a * x[i] + b * y[i] */
template <class T>
void axpby(std::size_t n, T a, const T* x, T b, T* y) {
  for (std::size_t i = 0; i < n; ++i) y[i] = a * x[i] + b * y[i];
}
/** y[i] = x[i] + z[i] (y may alias x or z) */
template <class T>
void add(std::size_t n, const T* x, const T* z, T* y) {
  for (std::size_t i = 0; i < n; ++i) y[i] = x[i] + z[i];
}
/** x[i] *= a */
template <class T>
void scale(std::size_t n, T a, T* x) {
  for (std::size_t i = 0; i < n; ++i) x[i] *= a;
}

// ---- bias --------------------------------------------------------------------------------------

/** y[r, c] += bias[c] */
template <class T>
void bias_add_forward(std::size_t rows, std::size_t cols, const T* bias, T* y) {
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) y[r * cols + c] += bias[c];
}
/** dbias[c] += sum_r dy[r, c] */
template <class T>
void bias_add_backward(std::size_t rows, std::size_t cols, const T* dy, T* dbias) {
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) dbias[c] += dy[r * cols + c];
}

// ---- GeLU (tanh approximation, as in GPT-2 and Megatron) ---------------------------------------

namespace detail {
template <class T>
inline constexpr T gelu_k = T(0.7978845608028654);  // sqrt(2/pi)
template <class T>
inline constexpr T gelu_c = T(0.044715);
}  // namespace detail

template <class T>
void gelu_forward(std::size_t n, const T* x, T* y) {
  using detail::gelu_c, detail::gelu_k;
  for (std::size_t i = 0; i < n; ++i) {
    const T v = x[i];
    y[i] = T(0.5) * v * (T(1) + std::tanh(gelu_k<T> * (v + gelu_c<T> * v * v * v)));
  }
}
/** dx[i] = dy[i] * gelu'(x[i]); dx may alias dy */
template <class T>
void gelu_backward(std::size_t n, const T* x, const T* dy, T* dx) {
  using detail::gelu_c, detail::gelu_k;
  for (std::size_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T t = std::tanh(gelu_k<T> * (v + gelu_c<T> * v * v * v));
    const T dt = gelu_k<T> * (T(1) + T(3) * gelu_c<T> * v * v) * (T(1) - t * t);
    dx[i] = dy[i] * (T(0.5) * (T(1) + t) + T(0.5) * v * dt);
  }
}

// ---- softmax (row-wise, max-subtracted) --------------------------------------------------------

template <class T>
void softmax_forward(std::size_t rows, std::size_t cols, const T* x, T* y) {
  for (std::size_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    T mx = -std::numeric_limits<T>::infinity();
    for (std::size_t c = 0; c < cols; ++c) mx = std::max(mx, xr[c]);
    T sum = 0;
    for (std::size_t c = 0; c < cols; ++c) sum += (yr[c] = std::exp(xr[c] - mx));
    const T inv = T(1) / sum;
    for (std::size_t c = 0; c < cols; ++c) yr[c] *= inv;
  }
}
/** dx = y * (dy - sum(dy * y)); dx may alias dy */
template <class T>
void softmax_backward(std::size_t rows, std::size_t cols, const T* y, const T* dy, T* dx) {
  for (std::size_t r = 0; r < rows; ++r) {
    const T *yr = y + r * cols, *dyr = dy + r * cols;
    T dot = 0;
    for (std::size_t c = 0; c < cols; ++c) dot += yr[c] * dyr[c];
    for (std::size_t c = 0; c < cols; ++c) dx[r * cols + c] = yr[c] * (dyr[c] - dot);
  }
}

// ---- layer norm --------------------------------------------------------------------------------

/** y = (x - mean) * rstd * gamma + beta per row; saves mean and rstd (length rows) for backward. */
template <class T>
void layernorm_forward(std::size_t rows, std::size_t cols, const T* x, const T* gamma, const T* beta, T* y, T* mean,
                       T* rstd, T eps = T(1e-5)) {
  for (std::size_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T m = 0;
    for (std::size_t c = 0; c < cols; ++c) m += xr[c];
    m /= T(cols);
    T v = 0;
    for (std::size_t c = 0; c < cols; ++c) v += (xr[c] - m) * (xr[c] - m);
    v /= T(cols);
    const T rs = T(1) / std::sqrt(v + eps);
    mean[r] = m;
    rstd[r] = rs;
    for (std::size_t c = 0; c < cols; ++c) y[r * cols + c] = (xr[c] - m) * rs * gamma[c] + beta[c];
  }
}
/** dx = layer-norm input gradient (overwritten); dgamma, dbeta accumulate. */
template <class T>
void layernorm_backward(std::size_t rows, std::size_t cols, const T* x, const T* mean, const T* rstd, const T* gamma,
                        const T* dy, T* dx, T* dgamma, T* dbeta) {
  for (std::size_t r = 0; r < rows; ++r) {
    const T *xr = x + r * cols, *dyr = dy + r * cols;
    const T m = mean[r], rs = rstd[r];
    T sum_g = 0, sum_gx = 0;
    for (std::size_t c = 0; c < cols; ++c) {
      const T xhat = (xr[c] - m) * rs;
      const T g = dyr[c] * gamma[c];
      sum_g += g;
      sum_gx += g * xhat;
      dgamma[c] += dyr[c] * xhat;
      dbeta[c] += dyr[c];
    }
    const T inv_n = T(1) / T(cols);
    for (std::size_t c = 0; c < cols; ++c) {
      const T xhat = (xr[c] - m) * rs;
      dx[r * cols + c] = rs * (dyr[c] * gamma[c] - inv_n * (sum_g + xhat * sum_gx));
    }
  }
}

// ---- cross-entropy over logits -----------------------------------------------------------------

/**
 * Mean over rows of -log softmax(logits)[target]. Saves the softmax probabilities in `probs`
 * (rows x cols) for backward. Throws naming the row if a target is out of range.
 */
template <class T>
T cross_entropy_forward(std::size_t rows, std::size_t cols, const T* logits, const std::int32_t* targets, T* probs) {
  softmax_forward(rows, cols, logits, probs);
  T loss = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    require(targets[r] >= 0 && std::size_t(targets[r]) < cols, "cross_entropy: target ", targets[r], " of row ", r,
            " is outside the vocabulary of ", cols);
    loss -= std::log(std::max(probs[r * cols + std::size_t(targets[r])], std::numeric_limits<T>::min()));
  }
  return loss / T(rows);
}
/** dlogits = scale * (probs - onehot(target)) / rows */
template <class T>
void cross_entropy_backward(std::size_t rows, std::size_t cols, const T* probs, const std::int32_t* targets, T* dlogits,
                            T scale = T(1)) {
  const T s = scale / T(rows);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c)
      dlogits[r * cols + c] = s * (probs[r * cols + c] - (std::int32_t(c) == targets[r] ? T(1) : T(0)));
}

// ---- dropout with a counter-based mask ---------------------------------------------------------

/**
 * @brief Dropout whose keep/drop decision for an element depends only on (seed, stream, global index),
 * so a sharded activation drops exactly the elements the unsharded one would.
 *
 * The local block is `[rows, cols]` at `(row_offset, col_offset)` of a global `[*, global_cols]` matrix.
 * Kept elements are scaled by 1 / (1 - p). Backward applies the same mask to the gradient.
 */
struct DropoutMask {
  std::uint64_t seed = 0, stream = 0;
  double p = 0.0;
  std::size_t global_cols = 0, row_offset = 0, col_offset = 0;

  [[nodiscard]] bool keep(std::size_t r, std::size_t c) const {
    const std::uint64_t g = std::uint64_t(row_offset + r) * global_cols + col_offset + c;
    return CounterRng{seed, stream}.uniform(g) >= p;
  }
  template <class T>
  void apply(std::size_t rows, std::size_t cols, const T* x, T* y) const {
    require(p >= 0.0 && p < 1.0, "dropout: probability ", p, " must be in [0, 1)");
    const T s = T(1.0 / (1.0 - p));
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) y[r * cols + c] = keep(r, c) ? x[r * cols + c] * s : T(0);
  }
};

}  // namespace mpar::host
