#pragma once
/**
 * @file Host kernels that move rows by index: what routing tokens to experts needs (MoE dispatch
 * and combine). They are the reference of the backends' row operations (see the `backend` concept).
 *
 * Rows are `d` floats wide; `index[i]` names a row of the indexed side. Every loop runs in `i`
 * order, so where several rows add into one (a token routed to k experts) the sum is taken in
 * routing order. A negative index names no row (an empty slot of a capacity-bounded exchange, see
 * `moe_slots`): `gather_rows` writes a zero row, the scatters skip it, and the scatter backward writes a
 * zero row and a zero dot.
 */
#include <cstddef>
#include <cstdint>

namespace mpar::host {

/** @brief `dst[i, :] = src[index[i], :]` for `i < rows` (zero where `index[i] < 0`). */
inline void gather_rows(std::size_t rows, std::size_t d, const std::int32_t* index, const float* src, float* dst) {
  for (std::size_t i = 0; i < rows; ++i) {
    if (index[i] < 0) {
      for (std::size_t c = 0; c < d; ++c) dst[i * d + c] = 0.0f;
      continue;
    }
    const float* s = src + std::size_t(index[i]) * d;
    for (std::size_t c = 0; c < d; ++c) dst[i * d + c] = s[c];
  }
}

/** @brief `dst[index[i], :] = src[i, :]` for `i < rows` (the indices are distinct; negative ones skipped). */
inline void scatter_rows(std::size_t rows, std::size_t d, const std::int32_t* index, const float* src, float* dst) {
  for (std::size_t i = 0; i < rows; ++i) {
    if (index[i] < 0) continue;
    float* t = dst + std::size_t(index[i]) * d;
    for (std::size_t c = 0; c < d; ++c) t[c] = src[i * d + c];
  }
}

/**
 * @brief `dst[index[i], :] += weight[i] * src[i, :]` for `i < rows`, in `i` order (`weight` null: weight 1;
 * negative indices skipped).
 */
inline void scatter_add_rows(std::size_t rows, std::size_t d, const std::int32_t* index, const float* weight,
                             const float* src, float* dst) {
  for (std::size_t i = 0; i < rows; ++i) {
    if (index[i] < 0) continue;
    float* t = dst + std::size_t(index[i]) * d;
    if (weight) {
      const float w = weight[i];
      for (std::size_t c = 0; c < d; ++c) t[c] += w * src[i * d + c];
    } else {
      for (std::size_t c = 0; c < d; ++c) t[c] += src[i * d + c];
    }
  }
}

/**
 * @brief The backward of a weighted `scatter_add_rows` (the MoE combine): `dsrc[i, :] = weight[i] *
 * dy[index[i], :]` and `dot[i] = <dy[index[i], :], src[i, :]>` (the gradient of `weight[i]`), the dot
 * product accumulated in float in column order; a negative index gives a zero row and a zero dot.
 */
inline void scatter_add_rows_backward(std::size_t rows, std::size_t d, const std::int32_t* index, const float* weight,
                                      const float* dy, const float* src, float* dsrc, float* dot) {
  for (std::size_t i = 0; i < rows; ++i) {
    if (index[i] < 0) {
      for (std::size_t c = 0; c < d; ++c) dsrc[i * d + c] = 0.0f;
      dot[i] = 0.0f;
      continue;
    }
    const float* g = dy + std::size_t(index[i]) * d;
    const float w = weight[i];
    float s = 0.0f;
    for (std::size_t c = 0; c < d; ++c) {
      dsrc[i * d + c] = w * g[c];
      s += g[c] * src[i * d + c];
    }
    dot[i] = s;
  }
}

}  // namespace mpar::host
