#pragma once
/**
 * @file Host kernels for the layers' forward and backward passes.
 *
 * Activations are row-major matrices `[rows, cols]` passed as raw pointers with sizes (the layers
 * own the shapes). Backward kernels that produce parameter gradients *accumulate* into them, so
 * gradient accumulation over micro-batches needs no extra buffers. The float kernels run vectorized
 * for the instruction set of the CPU they find (see isa.hpp).
 */
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "mpar/backend/host/fast_math.hpp"
#include "mpar/backend/host/isa.hpp"
#include "mpar/backend/host/optimizer_kernels.hpp"  // adamw_update, sgd_update, sum_squares
#include "mpar/backend/host/row_kernels.hpp"        // gather_rows, scatter_rows, scatter_add_rows(_backward)
#include "mpar/backend/types.hpp"                   // DropoutMask
#include "mpar/core/error.hpp"
#include "mpar/core/init.hpp"

namespace mpar::host {

namespace detail {
/**
 * Runs a kernel's loops: float ones through `with_isa` (isa.hpp), so they are vectorized for the CPU's
 * best instruction set (AVX-512, AVX2 + FMA or the baseline), other element types as compiled.
 */
template <class T, class F>
inline void vectorized(F&& body) {
  if constexpr (std::is_same_v<T, float>)
    with_isa(body);
  else
    body();
}
}  // namespace detail

// ---- elementwise -------------------------------------------------------------------------------

/** y[i] = a * x[i] + b * y[i] */
template <class T>
void axpby(std::size_t n, T a, const T* x, T b, T* y) {
  detail::vectorized<T>([&] {
    for (std::size_t i = 0; i < n; ++i) y[i] = a * x[i] + b * y[i];
  });
}
/** y[i] = x[i] + z[i] (y may alias x or z) */
template <class T>
void add(std::size_t n, const T* x, const T* z, T* y) {
  detail::vectorized<T>([&] {
    for (std::size_t i = 0; i < n; ++i) y[i] = x[i] + z[i];
  });
}
/** x[i] *= a */
template <class T>
void scale(std::size_t n, T a, T* x) {
  detail::vectorized<T>([&] {
    for (std::size_t i = 0; i < n; ++i) x[i] *= a;
  });
}

// ---- bias --------------------------------------------------------------------------------------

/** y[r, c] += bias[c] */
template <class T>
void bias_add_forward(std::size_t rows, std::size_t cols, const T* bias, T* y) {
  detail::vectorized<T>([&] {
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) y[r * cols + c] += bias[c];
  });
}
/** dbias[c] += sum_r dy[r, c] */
template <class T>
void bias_add_backward(std::size_t rows, std::size_t cols, const T* dy, T* dbias) {
  detail::vectorized<T>([&] {
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) dbias[c] += dy[r * cols + c];
  });
}

// ---- GeLU (tanh approximation, as in GPT-2 and Megatron) ---------------------------------------

namespace detail {
template <class T>
inline constexpr T gelu_k = T(0.7978845608028654);  // sqrt(2/pi)
template <class T>
inline constexpr T gelu_c = T(0.044715);
}  // namespace detail

/**
 * y = gelu(x). The float path uses 0.5 (1 + tanh u) = sigmoid(2u) with the vectorized fast_exp, taking
 * e = exp(-2|u|) <= 1 so nothing overflows: sigmoid(2u) = 1 / (1 + e) for u >= 0 and e / (1 + e)
 * otherwise. This is the same function without the cancellation of 1 + tanh u for negative u. Double
 * keeps std::tanh.
 */
template <class T>
void gelu_forward(std::size_t n, const T* x, T* y) {
  detail::vectorized<T>([&] {
    using detail::gelu_c, detail::gelu_k;
    if constexpr (std::is_same_v<T, float>) {
      fast::map_n(
          n, y,
          [](float v) {
            const float u = gelu_k<float> * (v + gelu_c<float> * v * v * v);
            const float au = std::bit_cast<float>(std::bit_cast<std::uint32_t>(u) & 0x7fffffffu);
            const float e = fast::fast_exp(-2.0f * au);
            return v * fast::select(u >= 0.0f, 1.0f, e) / (1.0f + e);
          },
          x);
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const T v = x[i];
        y[i] = T(0.5) * v * (T(1) + std::tanh(gelu_k<T> * (v + gelu_c<T> * v * v * v)));
      }
    }
  });
}
/**
 * dx[i] = dy[i] * gelu'(x[i]); dx may alias dy. With s = sigmoid(2u) = (1 + tanh u) / 2 and
 * 1 - s = sigmoid(-2u): gelu' = s (1 + 2 v u' (1 - s)), u' = k (1 + 3 c v^2). The float path gets both
 * sigmoids from e = exp(-2|u|) as in gelu_forward, so neither overflows nor cancels.
 */
template <class T>
void gelu_backward(std::size_t n, const T* x, const T* dy, T* dx) {
  detail::vectorized<T>([&] {
    using detail::gelu_c, detail::gelu_k;
    if constexpr (std::is_same_v<T, float>) {
      fast::map_n(
          n, dx,
          [](float v, float g) {
            const float v2 = v * v;
            const float u = gelu_k<float> * (v + gelu_c<float> * v2 * v);
            const float au = std::bit_cast<float>(std::bit_cast<std::uint32_t>(u) & 0x7fffffffu);
            const float e = fast::fast_exp(-2.0f * au);
            const float inv = 1.0f / (1.0f + e);
            const bool pos = u >= 0.0f;
            const float du = gelu_k<float> * (1.0f + 3.0f * gelu_c<float> * v2);
            // s (1 + 2 v u' (1 - s)) with s = inv, 1 - s = e inv (u >= 0) or s = e inv, 1 - s = inv.
            const float sm = fast::select(pos, e * inv, inv);
            return g * (fast::select(pos, 1.0f, e) * (1.0f + 2.0f * v * du * sm)) * inv;
          },
          x, dy);
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const T v = x[i];
        const T t = std::tanh(gelu_k<T> * (v + gelu_c<T> * v * v * v));
        const T dt = gelu_k<T> * (T(1) + T(3) * gelu_c<T> * v * v) * (T(1) - t * t);
        dx[i] = dy[i] * (T(0.5) * (T(1) + t) + T(0.5) * v * dt);
      }
    }
  });
}

// ---- softmax (row-wise, max-subtracted) --------------------------------------------------------

namespace detail {
/**
 * One causal softmax row of `cols` (a multiple of fast::kBlock) entries of which the first `valid` (1 to cols)
 * count, for `scale >= 0`: the whole width in full blocks with the masked entries as exact zeros, instead of the
 * valid prefix with a scalar tail and a fill (attention's rows are 1 to s long, so the tails were most of the work).
 * The bits are those of the prefix alone: the maximum is over the valid entries, a masked entry adds +0 to its
 * lane of the partial sums (which are formed and combined in `fast::map_sum_n`'s order), and the normalisation
 * leaves the zeros zero. Masked scores are read but never reach the result, NaN included.
 */
inline void causal_softmax_row(std::size_t cols, std::size_t valid, const float* x, float* y, float scale) {
  using fast::kBlock, fast::select;
  // The masks compare 32-bit lane indices (one vector compare per block; 64-bit indices take two and the
  // conversions between them). Rows of attention scores are far shorter than 2^31.
  constexpr auto lanes = std::int32_t(kBlock);
  const auto row_valid = std::int32_t(valid);
  float acc[kBlock];
  for (std::size_t j = 0; j < kBlock; ++j) acc[j] = -std::numeric_limits<float>::infinity();
  for (std::size_t i = 0; i < cols; i += kBlock) {
    const std::int32_t left = row_valid - std::int32_t(i);  // valid entries from this block's first on
    for (std::int32_t j = 0; j < lanes; ++j) acc[j] = select((j < left) & (acc[j] < x[i + j]), x[i + j], acc[j]);
  }
  for (std::size_t w = kBlock / 2; w > 0; w /= 2)
    for (std::size_t j = 0; j < w; ++j) acc[j] = select(acc[j] < acc[j + w], acc[j + w], acc[j]);
  const float mx = scale * acc[0];
  float sum[kBlock] = {};
  for (std::size_t i = 0; i < cols; i += kBlock) {
    const std::int32_t left = row_valid - std::int32_t(i);
    float in[kBlock], out[kBlock];
    for (std::size_t j = 0; j < kBlock; ++j) in[j] = x[i + j];
    for (std::int32_t j = 0; j < lanes; ++j) out[j] = select(j < left, fast::fast_exp(scale * in[j] - mx), 0.0f);
    for (std::size_t j = 0; j < kBlock; ++j) y[i + j] = out[j];
    for (std::size_t j = 0; j < kBlock; ++j) sum[j] += out[j];
  }
  for (std::size_t w = kBlock / 2; w > 0; w /= 2)
    for (std::size_t j = 0; j < w; ++j) sum[j] += sum[j + w];
  const float inv = 1.0f / sum[0];
  fast::map_n(
      cols, y, [inv](float v) { return v * inv; }, y);
}
}  // namespace detail

/**
 * Row-wise softmax of `scale * x`. With `causal`, rows are query positions of `[.., s, s]` attention
 * scores (cols = s): row r keeps columns c <= r % s and the others become 0 (as the CUDA kernel).
 */
template <class T>
void softmax_forward(std::size_t rows, std::size_t cols, const T* x, T* y, bool causal = false, T scale = T(1)) {
  detail::vectorized<T>([&] {
    if constexpr (std::is_same_v<T, float>) {
      // Causal rows of a block-aligned width in a loop of their own: sharing the loop with the general path
      // below, its constants took the vector registers and the row ran at half the speed.
      if (causal && cols % fast::kBlock == 0 && cols <= std::size_t(1) << 30 && scale >= 0.0f) {
        for (std::size_t r = 0; r < rows; ++r)
          detail::causal_softmax_row(cols, r % cols + 1, x + r * cols, y + r * cols, scale);
        return;
      }
    }
    for (std::size_t r = 0; r < rows; ++r) {
      const T* xr = x + r * cols;
      T* yr = y + r * cols;
      const std::size_t valid = causal ? r % cols + 1 : cols;
      if constexpr (std::is_same_v<T, float>) {
        // Vectorized: partial maxima, then exp and the row sum in one blocked pass, then the normalisation.
        // For scale >= 0, max(scale * x) = scale * max(x) exactly (rounding is monotonic).
        float mx;
        if (scale >= 0.0f) {
          mx = scale * fast::max_n(valid, xr);
        } else {
          fast::map_n(
              valid, yr, [scale](float v) { return scale * v; }, xr);
          mx = fast::max_n(valid, yr);
        }
        const float inv = 1.0f / fast::map_sum_n(
                                     valid, yr, [scale, mx](float v) { return fast::fast_exp(scale * v - mx); }, xr);
        fast::map_n(
            valid, yr, [inv](float v) { return v * inv; }, yr);
        std::fill(yr + valid, yr + cols, 0.0f);
        continue;
      }
      T mx = -std::numeric_limits<T>::infinity();
      for (std::size_t c = 0; c < valid; ++c) mx = std::max(mx, scale * xr[c]);
      T sum = 0;
      for (std::size_t c = 0; c < valid; ++c) sum += (yr[c] = std::exp(scale * xr[c] - mx));
      const T inv = T(1) / sum;
      for (std::size_t c = 0; c < valid; ++c) yr[c] *= inv;
      for (std::size_t c = valid; c < cols; ++c) yr[c] = T(0);
    }
  });
}
/** dx = y * (dy - sum(dy * y)); dx may alias dy */
template <class T>
void softmax_backward(std::size_t rows, std::size_t cols, const T* y, const T* dy, T* dx) {
  detail::vectorized<T>([&] {
    for (std::size_t r = 0; r < rows; ++r) {
      const T *yr = y + r * cols, *dyr = dy + r * cols;
      if constexpr (std::is_same_v<T, float>) {
        const float dot = fast::sum_n(
            cols, [](float a, float b) { return a * b; }, yr, dyr);
        fast::map_n(
            cols, dx + r * cols, [dot](float a, float b) { return a * (b - dot); }, yr, dyr);
        continue;
      }
      T dot = 0;
      for (std::size_t c = 0; c < cols; ++c) dot += yr[c] * dyr[c];
      for (std::size_t c = 0; c < cols; ++c) dx[r * cols + c] = yr[c] * (dyr[c] - dot);
    }
  });
}

// ---- layer norm --------------------------------------------------------------------------------

/** y = (x - mean) * rstd * gamma + beta per row; saves mean and rstd (length rows) for backward. */
template <class T>
void layernorm_forward(std::size_t rows, std::size_t cols, const T* x, const T* gamma, const T* beta, T* y, T* mean,
                       T* rstd, T eps = T(1e-5)) {
  detail::vectorized<T>([&] {
    for (std::size_t r = 0; r < rows; ++r) {
      const T* xr = x + r * cols;
      if constexpr (std::is_same_v<T, float>) {
        const float m = fast::sum_n(
                            cols, [](float a) { return a; }, xr) /
                        float(cols);
        const float v = fast::sum_n(
                            cols, [m](float a) { return (a - m) * (a - m); }, xr) /
                        float(cols);
        const float rs = 1.0f / std::sqrt(v + eps);
        mean[r] = m;
        rstd[r] = rs;
        fast::map_n(
            cols, y + r * cols, [m, rs](float a, float g, float b) { return (a - m) * rs * g + b; }, xr, gamma, beta);
        continue;
      }
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
  });
}
/** dx = layer-norm input gradient (overwritten); dgamma, dbeta accumulate. */
template <class T>
void layernorm_backward(std::size_t rows, std::size_t cols, const T* x, const T* mean, const T* rstd, const T* gamma,
                        const T* dy, T* dx, T* dgamma, T* dbeta) {
  detail::vectorized<T>([&] {
    for (std::size_t r = 0; r < rows; ++r) {
      const T *xr = x + r * cols, *dyr = dy + r * cols;
      const T m = mean[r], rs = rstd[r];
      if constexpr (std::is_same_v<T, float>) {
        // Vectorized: the two row sums with partial sums (a running float sum cannot be vectorized without
        // reassociation, so the loop below stays scalar), the parameter gradients and dx as blocked maps;
        // every pass reads one row, which stays in L1. dx is written last, so it may alias dy.
        const float sum_g = fast::sum_n(
            cols, [](float d, float g) { return d * g; }, dyr, gamma);
        const float sum_gx = fast::sum_n(
            cols, [m, rs](float d, float g, float a) { return d * g * ((a - m) * rs); }, dyr, gamma, xr);
        fast::map_n(
            cols, dgamma, [m, rs](float acc, float d, float a) { return acc + d * ((a - m) * rs); }, dgamma, dyr, xr);
        fast::map_n(
            cols, dbeta, [](float acc, float d) { return acc + d; }, dbeta, dyr);
        const float inv_n = 1.0f / float(cols);
        fast::map_n(
            cols, dx + r * cols,
            [m, rs, inv_n, sum_g, sum_gx](float d, float g, float a) {
              return rs * (d * g - inv_n * (sum_g + ((a - m) * rs) * sum_gx));
            },
            dyr, gamma, xr);
        continue;
      }
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
  });
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
  detail::vectorized<T>([&] {
    const T s = scale / T(rows);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c)
        dlogits[r * cols + c] = s * (probs[r * cols + c] - (std::int32_t(c) == targets[r] ? T(1) : T(0)));
  });
}

// ---- dropout with a counter-based mask ---------------------------------------------------------

/** Applies `mask` to a `[rows, cols]` block: the function form of DropoutMask::apply (the backends' `dropout_apply`). */
template <class T>
void dropout_apply(const DropoutMask& mask, std::size_t rows, std::size_t cols, const T* x, T* y) {
  mask.apply(rows, cols, x, y);
}

// ---- embedding over a vocabulary block ---------------------------------------------------------

/**
 * out[t, :] = table[ids[t] - vocab_offset, :] for the ids in `[vocab_offset, vocab_offset + vocab_local)`,
 * zero for the others, so the vocabulary blocks of a vocabulary-parallel embedding sum to the full lookup.
 */
template <class T>
void embedding_forward(std::size_t tokens, std::size_t dim, const std::int32_t* ids, const T* table, T* out,
                       std::size_t vocab_offset, std::size_t vocab_local) {
  for (std::size_t t = 0; t < tokens; ++t) {
    const std::int64_t row = std::int64_t(ids[t]) - std::int64_t(vocab_offset);
    T* o = out + t * dim;
    if (row < 0 || row >= std::int64_t(vocab_local)) {
      std::fill(o, o + dim, T(0));
      continue;
    }
    const T* src = table + std::size_t(row) * dim;
    std::copy(src, src + dim, o);
  }
}
/** dtable[ids[t] - vocab_offset, :] += dout[t, :] for the ids this block owns (repeated ids add up). */
template <class T>
void embedding_backward(std::size_t tokens, std::size_t dim, const std::int32_t* ids, const T* dout, T* dtable,
                        std::size_t vocab_offset, std::size_t vocab_local) {
  for (std::size_t t = 0; t < tokens; ++t) {
    const std::int64_t row = std::int64_t(ids[t]) - std::int64_t(vocab_offset);
    if (row < 0 || row >= std::int64_t(vocab_local)) continue;
    T* g = dtable + std::size_t(row) * dim;
    const T* d = dout + t * dim;
    for (std::size_t j = 0; j < dim; ++j) g[j] += d[j];
  }
}

// ---- vocabulary-parallel cross-entropy ---------------------------------------------------------
// Each rank holds the logit columns [col_offset, col_offset + cols); only per-row scalars cross ranks:
// vocab_parallel_max -> all-reduce(max) -> vocab_parallel_sumexp -> all-reduce(sum) -> loss from the
// statistics, and vocab_parallel_backward from the same statistics (the CUDA kernels follow the same steps).

/** row_max[r] = max over this block's columns of row r. */
template <class T>
void vocab_parallel_max(std::size_t rows, std::size_t cols, const T* logits, float* row_max) {
  detail::vectorized<T>([&] {
    if constexpr (std::is_same_v<T, float>) {
      for (std::size_t r = 0; r < rows; ++r) row_max[r] = fast::max_n(cols, logits + r * cols);
    } else {
      for (std::size_t r = 0; r < rows; ++r) {
        float mx = -std::numeric_limits<float>::infinity();
        for (std::size_t c = 0; c < cols; ++c) mx = std::max(mx, float(logits[r * cols + c]));
        row_max[r] = mx;
      }
    }
  });
}
/** sumexp[r] = sum of exp(logit - row_max[r]) over this block; target_logit[r] = the target's logit if this block owns it, else 0. */
template <class T>
void vocab_parallel_sumexp(std::size_t rows, std::size_t cols, std::size_t col_offset, const T* logits,
                           const std::int32_t* targets, const float* row_max, float* sumexp, float* target_logit) {
  detail::vectorized<T>([&] {
    for (std::size_t r = 0; r < rows; ++r) {
      const T* lr = logits + r * cols;
      float s = 0;
      if constexpr (std::is_same_v<T, float>) {
        const float mx = row_max[r];
        s = fast::sum_n(
            cols, [mx](float v) { return fast::fast_exp(v - mx); }, lr);
      } else {
        for (std::size_t c = 0; c < cols; ++c) s += std::exp(float(lr[c]) - row_max[r]);
      }
      sumexp[r] = s;
      const std::int64_t t = std::int64_t(targets[r]) - std::int64_t(col_offset);
      target_logit[r] = (t >= 0 && t < std::int64_t(cols)) ? float(lr[std::size_t(t)]) : 0.0f;
    }
  });
}
/** dlogits of this block: scale * (softmax - onehot(target)) / rows, the softmax from the global statistics. */
template <class T>
void vocab_parallel_backward(std::size_t rows, std::size_t cols, std::size_t col_offset, const T* logits,
                             const std::int32_t* targets, const float* row_max, const float* sumexp, T* dlogits,
                             float scale = 1.0f) {
  detail::vectorized<T>([&] {
    const float s = scale / float(rows);
    for (std::size_t r = 0; r < rows; ++r) {
      const float inv = 1.0f / sumexp[r];
      const std::int64_t t = std::int64_t(targets[r]) - std::int64_t(col_offset);
      if constexpr (std::is_same_v<T, float>) {
        const float mx = row_max[r], k = s * inv;
        float* dr = dlogits + r * cols;
        fast::map_n(
            cols, dr, [mx, k](float v) { return k * fast::fast_exp(v - mx); }, logits + r * cols);
        if (t >= 0 && t < std::int64_t(cols)) dr[std::size_t(t)] -= s;
      } else {
        for (std::size_t c = 0; c < cols; ++c) {
          const float p = std::exp(float(logits[r * cols + c]) - row_max[r]) * inv;
          dlogits[r * cols + c] = T(s * (p - (std::int64_t(c) == t ? 1.0f : 0.0f)));
        }
      }
    }
  });
}

}  // namespace mpar::host
