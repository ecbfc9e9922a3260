#pragma once
/**
 * @file Host kernels of the optimizers: the AdamW and SGD updates, the sum of squares behind the
 * global gradient norm, in-place scaling. They are the reference of the backends' optimizer
 * operations (see the `backend` concept); the device kernels compute the same expressions in the
 * same order.
 *
 * All arrays are fp32 of `n` elements. The updates are elementwise, so they apply unchanged to a
 * local shard, a ZeRO block or a whole tensor.
 */
#include <cmath>
#include <cstddef>

namespace mpar::host {

/**
 * @brief One AdamW update (Loshchilov & Hutter), in the direct textbook form:
 * `g' = grad_scale g; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
 *  w = w (1 - lr wd) - lr (m / c1) / (sqrt(v / c2) + eps)` with `c1, c2` the bias corrections
 * `1 - beta^t` of step `t`.
 */
inline void adamw_update(std::size_t n, float* w, const float* g, float* m, float* v, float beta1, float beta2,
                         float eps, float lr, float weight_decay, float bias_correction1, float bias_correction2,
                         float grad_scale) {
  const float decay = 1.0f - lr * weight_decay;
  // Folding the bias corrections into the step size and epsilon is the usual trick, but it changes the
  // rounding; the direct form keeps the update identical to the textbook formula the tests check.
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = g[i] * grad_scale;
    m[i] = beta1 * m[i] + (1.0f - beta1) * gi;
    v[i] = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    const float mhat = m[i] / bias_correction1;
    const float vhat = v[i] / bias_correction2;
    w[i] = w[i] * decay - lr * mhat / (std::sqrt(vhat) + eps);
  }
}

/**
 * @brief One SGD update with L2 weight decay and (optionally Nesterov) momentum:
 * `d = grad_scale g + wd w; buf = first ? d : mu buf + (1 - dampening) d;
 *  w -= lr (nesterov ? d + mu buf : buf)`; with `momentum == 0` there is no buffer (`buf` may be
 * null) and `w -= lr d`. `first` says the buffer holds nothing yet (the optimizer's first step).
 */
inline void sgd_update(std::size_t n, float* w, const float* g, float* buf, float momentum, float dampening,
                       bool nesterov, float lr, float weight_decay, bool first, float grad_scale) {
  for (std::size_t i = 0; i < n; ++i) {
    float d = g[i] * grad_scale + weight_decay * w[i];
    if (momentum != 0.0f) {
      buf[i] = first ? d : momentum * buf[i] + (1.0f - dampening) * d;
      d = nesterov ? d + momentum * buf[i] : buf[i];
    }
    w[i] -= lr * d;
  }
}

/** @brief `sum x[i]^2`, each square and the running sum in double (the gradient norm's local part). */
[[nodiscard]] inline double sum_squares(std::size_t n, const float* x) {
  double acc = 0.0;
  for (std::size_t i = 0; i < n; ++i) acc += double(x[i]) * double(x[i]);
  return acc;
}

}  // namespace mpar::host
