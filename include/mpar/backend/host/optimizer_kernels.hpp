#pragma once
/**
 * @file Host kernels of the optimizers: the AdamW and SGD updates, the sum of squares behind the
 * global gradient norm, the per-step factors derived from it, in-place scaling. They are the
 * reference of the backends' optimizer operations (see the `backend` concept); the device kernels
 * compute the same expressions in the same order.
 *
 * All arrays are fp32 of `n` elements. The updates are elementwise, so they apply unchanged to a
 * local shard, a ZeRO block or a whole tensor. What a step's update depends on beyond its
 * hyper-parameters — the gradient scale (clipping coefficient times the inverse loss scale) and
 * whether the step is skipped (an f16 overflow) — is read from rank memory (`UpdateFactors`), where
 * `update_factors` wrote it from the reduced sum of squares: neither clipping nor the overflow skip
 * needs the host to read a device value.
 */
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "mpar/backend/host/adamw_blocks.hpp"
#include "mpar/backend/host/isa.hpp"

namespace mpar {

/**
 * @brief The per-step inputs of the optimizer kernels, in rank memory: `grad_scale` multiplies every
 * gradient first; a non-zero `skip` makes the update leave weights and states untouched.
 */
struct UpdateFactors {
  float grad_scale = 1.0f;
  float skip = 0.0f;
};

/**
 * @brief A run of a flat optimizer range whose elements all decay or all do not: the elements from the previous
 * run's `end` (0 for the first run) up to `end`. A flat AdamW update takes its weight decay per run, from a
 * table in rank memory, so one call covers parameters that decay and parameters that do not.
 */
struct DecayRun {
  std::size_t end = 0;
  std::uint32_t decays = 0;  ///< non-zero: these elements take the weight decay
};

/**
 * @brief The per-step scalars of an AdamW update kept in rank memory, so that an update issued once (a captured
 * graph, replayed every step) reads the step's values: the learning rate (written by the host with an
 * asynchronous copy before the step) and the bias corrections of the update count `steps`, advanced by an
 * operation (`adamw_advance`) that leaves it unchanged when the step's factors skip the update.
 */
struct AdamWScalars {
  float lr = 0.0f;
  float bias_correction1 = 1.0f, bias_correction2 = 1.0f;  ///< 1 - beta^steps
  std::uint32_t steps = 0;                                 ///< updates taken so far
};

}  // namespace mpar

namespace mpar::host {

/**
 * @brief One AdamW update (Loshchilov & Hutter), in the direct textbook form:
 * `g' = s g; m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
 *  w = w (1 - lr wd) - lr (m / c1) / (sqrt(v / c2) + eps)` with `c1, c2` the bias corrections
 * `1 - beta^t` of step `t` and `s = factors->grad_scale`; nothing changes when `factors->skip != 0`.
 */
inline void adamw_update(std::size_t n, float* w, const float* g, float* m, float* v, float beta1, float beta2,
                         float eps, float lr, float weight_decay, float bias_correction1, float bias_correction2,
                         const UpdateFactors* factors) {
  if (factors->skip != 0.0f) return;
  const float grad_scale = factors->grad_scale;
  const float decay = 1.0f - lr * weight_decay;
  // Folding the bias corrections into the step size and epsilon is the usual trick, but it changes the
  // rounding; the direct form keeps the update identical to the textbook formula the tests check.
  std::size_t i = 0;
#if MPAR_HOST_MULTIVERSION
  // The same operations in the same order, a vector at a time at the thread's level (adamw_blocks.hpp); the
  // tail below.
  i = vectorized::adamw_update_blocks({n, w, g, m, v, beta1, 1.0f - beta1, beta2, 1.0f - beta2, eps, lr, decay,
                                       bias_correction1, bias_correction2, grad_scale});
#endif
  for (; i < n; ++i) {
    const float gi = g[i] * grad_scale;
    m[i] = beta1 * m[i] + (1.0f - beta1) * gi;
    v[i] = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    const float mhat = m[i] / bias_correction1;
    const float vhat = v[i] / bias_correction2;
    w[i] = w[i] * decay - lr * mhat / (std::sqrt(vhat) + eps);
  }
}

/**
 * @brief One AdamW update over a flat range of `n` elements (the parameters of a rank laid out one after another)
 * whose weight decay applies per run: the `runs` consecutive `DecayRun`s of `decay_runs` (rank memory; the last
 * ends at `n`) say which elements take `weight_decay` and which take none. Element for element exactly the
 * update above, so it equals one call per parameter bit for bit.
 */
inline void adamw_update(std::size_t n, float* w, const float* g, float* m, float* v, float beta1, float beta2,
                         float eps, float lr, float weight_decay, float bias_correction1, float bias_correction2,
                         const UpdateFactors* factors, const DecayRun* decay_runs, std::size_t runs) {
  if (factors->skip != 0.0f) return;
  std::size_t begin = 0;
  for (std::size_t r = 0; r < runs && begin < n; ++r) {
    const std::size_t end = decay_runs[r].end < n ? decay_runs[r].end : n;
    if (end > begin)
      adamw_update(end - begin, w + begin, g + begin, m + begin, v + begin, beta1, beta2, eps, lr,
                   decay_runs[r].decays != 0 ? weight_decay : 0.0f, bias_correction1, bias_correction2, factors);
    begin = end;
  }
}

/**
 * @brief The scalars of the next AdamW update, in rank memory: `s->lr = *lr`; unless `factors->skip`, one more
 * update counted and its bias corrections `1 - beta^t` (computed in double and rounded to float, as
 * optim::AdamWStep::at does on the host, so both give the same update bit for bit).
 */
inline void adamw_advance(float beta1, float beta2, const float* lr, const UpdateFactors* factors, AdamWScalars* s) {
  s->lr = *lr;
  if (factors->skip != 0.0f) return;  // a skipped update is not counted (AdamW::retract_step on the host)
  ++s->steps;
  s->bias_correction1 = float(1.0 - std::pow(double(beta1), double(s->steps)));
  s->bias_correction2 = float(1.0 - std::pow(double(beta2), double(s->steps)));
}

/**
 * @brief One SGD update with L2 weight decay and (optionally Nesterov) momentum:
 * `d = s g + wd w; buf = first ? d : mu buf + (1 - dampening) d;
 *  w -= lr (nesterov ? d + mu buf : buf)` with `s = factors->grad_scale`; with `momentum == 0` there
 * is no buffer (`buf` may be null) and `w -= lr d`. `first` says the buffer holds nothing yet (the
 * optimizer's first step). Nothing changes when `factors->skip != 0`.
 */
inline void sgd_update(std::size_t n, float* w, const float* g, float* buf, float momentum, float dampening,
                       bool nesterov, float lr, float weight_decay, bool first, const UpdateFactors* factors) {
  if (factors->skip != 0.0f) return;
  const float grad_scale = factors->grad_scale;
  for (std::size_t i = 0; i < n; ++i) {
    float d = g[i] * grad_scale + weight_decay * w[i];
    if (momentum != 0.0f) {
      buf[i] = first ? d : momentum * buf[i] + (1.0f - dampening) * d;
      d = nesterov ? d + momentum * buf[i] : buf[i];
    }
    w[i] -= lr * d;
  }
}

/**
 * @brief `*acc += sum x[i]^2`, each square and the sums in double: the local part of the gradient norm,
 * accumulated in rank memory so it can be all-reduced without a host read.
 *
 * Why eight partial sums: one running sum is a chain of dependent additions (one element per add latency,
 * about 2 % of a bf16 training step on the host); eight sums over `i mod 8`, combined pairwise, let the adds
 * overlap and the compiler vectorize them. The order depends on the index only, never on the address, so
 * the result is the same on every run and rank; a square of a float is exact in double, and the pairwise
 * combination bounds the rounding error no worse than the single chain did.
 */
inline void sum_squares(std::size_t n, const float* x, double* acc) {
  constexpr std::size_t lanes = 8;
  double part[lanes] = {};
  // On the CPU's level (`with_isa`): the eight sums are one AVX-512 vector (two AVX2 ones) instead of four SSE2
  // pairs. The same additions in the same order on every level; a contracted multiply-add gives the same bits,
  // as the square of a float is exact in double.
  with_isa([&] {
    std::size_t i = 0;
    for (; i + lanes <= n; i += lanes)
      for (std::size_t j = 0; j < lanes; ++j) part[j] += double(x[i + j]) * double(x[i + j]);
    for (std::size_t j = 0; i < n; ++i, ++j) part[j] += double(x[i]) * double(x[i]);
  });
  const double s = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  *acc += s;
}

/**
 * @brief The per-step factors of the optimizer kernels from the global sum of squares `*squares` of
 * the gradients as they are (still multiplied by the loss scale `1 / inv_loss_scale`):
 * `*norm = sqrt(*squares) inv_loss_scale` (the norm of the true gradient; a power-of-two loss scale
 * makes this exact), `clip = max_norm > 0 && norm finite ? min(1, max_norm / (norm + 1e-6)) : 1`
 * (rounded to float), `factors->grad_scale = clip inv_loss_scale`, and `factors->skip = 1` when
 * `skip_nonfinite` and the norm is not finite (inf or NaN anywhere in the gradients; the f16
 * overflow), else 0.
 */
inline void update_factors(const double* squares, double max_norm, float inv_loss_scale, bool skip_nonfinite,
                           double* norm, UpdateFactors* factors) {
  const double nrm = std::sqrt(*squares) * double(inv_loss_scale);
  const bool finite = std::isfinite(nrm);
  float clip = 1.0f;
  if (finite && max_norm > 0.0) {
    const double c = max_norm / (nrm + 1e-6);
    clip = c < 1.0 ? float(c) : 1.0f;
  }
  *norm = nrm;
  factors->grad_scale = clip * inv_loss_scale;
  factors->skip = skip_nonfinite && !finite ? 1.0f : 0.0f;
}

}  // namespace mpar::host
