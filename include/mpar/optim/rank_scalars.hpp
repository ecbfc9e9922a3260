#pragma once
/**
 * @file The few places where the optimizer side moves values between the host and rank memory: the
 * per-step statistics coming back, and the scalars that start a step (a zeroed accumulator, a loss
 * scale chosen on the host). Everything else the optimizers compute stays in rank memory and is
 * produced and consumed by backend operations and communicators.
 *
 * Each is one function, so when the backend concept gains stream-ordered transfers (an asynchronous
 * copy to pinned host memory and an event, a device-side fill) each changes in one line. Today's
 * backends finish every operation before returning, so `B::synchronize()` followed by a plain copy
 * is exact.
 */
#include <algorithm>
#include <cstddef>

#include "mpar/backend/backend.hpp"

namespace mpar::optim {

/** @brief Copies `n` values of rank memory `src` to host memory `dst`, after the work that produced them. */
template <backend B, class T>
void copy_to_host(const T* src, T* dst, std::size_t n) {
  B::synchronize();
  std::copy_n(src, n, dst);
}

/** @brief Copies `n` host values `src` into rank memory `dst`, after the work that still reads it. */
template <backend B, class T>
void copy_to_rank(const T* src, T* dst, std::size_t n) {
  B::synchronize();
  std::copy_n(src, n, dst);
}

/** @brief Sets `n` values of rank memory to `T{}` (an accumulator before a step). */
template <backend B, class T>
void zero_in_rank(T* dst, std::size_t n) {
  B::synchronize();
  std::fill_n(dst, n, T{});
}

}  // namespace mpar::optim
