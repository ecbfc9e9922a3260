#pragma once
/**
 * @file Branch-free float exp and tanh that the compiler can vectorize, and the blocking
 * helper the host kernels use to get them vectorized at -O2.
 *
 * Why not std::exp / std::tanh: glibc's tanhf (through expm1f) is a scalar call per element with
 * branches on the argument's range; it dominated the CPU profile of GPT training (GeLU). The
 * functions here are straight-line arithmetic on one float (no calls, no branches: range checks are
 * selects), so a loop over them becomes SIMD code.
 *
 * Why the blocking: g++ 12 at -O2 vectorizes only with the "very cheap" cost model, which refuses
 * loops that need a scalar epilogue or a run-time aliasing check. `map_n`, `sum_n` and `max_n` therefore
 * run the element function over fixed-size local arrays (kBlock elements, the last block padded), so the
 * inner loops have a constant trip count and no aliasing, and are vectorized at -O2 as well as -O3.
 * Range checks inside the functions are `select`s on bit masks: a plain `?:` lets GCC's jump threading
 * split the loop body into paths, which blocks the vectorizer.
 *
 * Why `with_isa` (isa.hpp): the same loops compiled for AVX2 or AVX-512 run 8 or 16 floats wide; the
 * kernels (exp_n, tanh_n here, GeLU / softmax / layer norm / cross-entropy in kernels.hpp) pick the
 * CPU's best level at run time, so the library needs no `-march`.
 *
 * Accuracy (tests/backend/fast_math_test.cpp sweeps every range, on every level the CPU supports):
 * fast_exp is within 2 ulp of the correctly rounded exp for normal results, flushes to 0 below
 * exp(-103.97) and returns +inf above 88.72 (as std::exp); fast_tanh is within 3 ulp and exactly +-1
 * once saturated. NaN propagates.
 */
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>

#include "mpar/backend/host/isa.hpp"

namespace mpar::host::fast {

/** Elements per block of `map_n`, `map_sum_n`, `sum_n` and `max_n` (a multiple of every float SIMD width up to 512 bits). */
inline constexpr std::size_t kBlock = 16;

/** `c ? a : b` as bit operations on a mask, so the compiler keeps it a vector select (see fast_exp). */
[[nodiscard]] inline float select(bool c, float a, float b) {
  const std::uint32_t m = 0u - std::uint32_t(c);
  return std::bit_cast<float>((std::bit_cast<std::uint32_t>(a) & m) | (std::bit_cast<std::uint32_t>(b) & ~m));
}

/**
 * e^x for float, branch-free. Range reduction x = n ln2 + r with |r| <= ln2/2 (ln2 split in a high
 * part with trailing zero bits, so n * ln2_hi is exact), a degree-7 Taylor polynomial of e^r (truncation
 * below 6e-9 relative), and the scale 2^n applied as two exponent-field factors so that results near
 * overflow and in the subnormal range are still rounded once.
 */
[[nodiscard]] inline float fast_exp(float x) {
  // Clamp keeps n within [-150, 129]: beyond the upper bound the result is +inf anyway, below the lower
  // one it rounds to 0. Written as selects (not std::min/max) so that NaN passes through unchanged.
  x = select(x > 89.0f, 89.0f, x);
  x = select(x < -104.0f, -104.0f, x);
  // Round x / ln2 to the nearest integer by adding 1.5 * 2^23 (the sum's low mantissa bits are n).
  constexpr float shifter = 12582912.0f;
  const float t = x * 1.44269504088896341f + shifter;
  const float nf = t - shifter;
  const std::int32_t n = std::bit_cast<std::int32_t>(t) - std::bit_cast<std::int32_t>(shifter);
  const float r = (x - nf * 0.693145751953125f) - nf * 1.42860682030941723212e-6f;
  // e^r = 1 + r + r^2/2! + ... + r^7/7! (Horner).
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n = 2^n1 * 2^n2 with both halves in the normal exponent range.
  const std::int32_t n1 = n >> 1;
  const std::int32_t n2 = n - n1;
  const float s1 = std::bit_cast<float>((n1 + 127) << 23);
  const float s2 = std::bit_cast<float>((n2 + 127) << 23);
  return p * s1 * s2;
}

/**
 * tanh(x) for float, branch-free. For |x| >= 0.4, tanh|x| = 1 - 2 / (e^{2|x|} + 1) (saturating to 1
 * when the exponential overflows); below that the subtraction would cancel, so the odd Taylor series of
 * tanh up to x^15 is used instead (truncation below 5e-9 relative there). Sign restored at the end.
 */
[[nodiscard]] inline float fast_tanh(float x) {
  const float a = std::bit_cast<float>(std::bit_cast<std::uint32_t>(x) & 0x7fffffffu);
  const float big = 1.0f - 2.0f / (fast_exp(2.0f * a) + 1.0f);
  const float z = a * a;
  float q = -929569.0f / 638512875.0f;
  q = q * z + 21844.0f / 6081075.0f;
  q = q * z - 1382.0f / 155925.0f;
  q = q * z + 62.0f / 2835.0f;
  q = q * z - 17.0f / 315.0f;
  q = q * z + 2.0f / 15.0f;
  q = q * z - 1.0f / 3.0f;
  const float small = a + a * z * q;
  const float m = select(a < 0.4f, small, big);
  // Sign of x back onto |tanh x| (also keeps -0.0 and NaN as they are).
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(m) | (std::bit_cast<std::uint32_t>(x) & 0x80000000u));
}

namespace detail {
// One block of map_n: the inputs are copied into local arrays, so the loop over `f` has a constant trip
// count and provably no aliasing with the output. A full block copies a constant kBlock elements (plain
// vector moves); only the last, partial block is zero-padded and copied element by element.
template <bool Full, class F, class... In, std::size_t... K>
inline void map_block(std::size_t i, std::size_t m, float* y, F& f, std::index_sequence<K...>, const In*... x) {
  float in[sizeof...(In)][kBlock];
  if constexpr (Full) {
    (
        (void)[&] {
          for (std::size_t j = 0; j < kBlock; ++j) in[K][j] = float(x[i + j]);
        }(),
        ...);
  } else {
    (
        (void)[&] {
          for (std::size_t j = 0; j < kBlock; ++j) in[K][j] = j < m ? float(x[i + j]) : 0.0f;
        }(),
        ...);
  }
  float out[kBlock];
  for (std::size_t j = 0; j < kBlock; ++j) out[j] = f(in[K][j]...);
  for (std::size_t j = 0; j < (Full ? kBlock : m); ++j) y[i + j] = out[j];
}
}  // namespace detail

/**
 * y[i] = f(x0[i], x1[i], ...) for i < n, computed in blocks of kBlock through local arrays, so the
 * per-block loop over `f` (which must be inlinable, branch-free float arithmetic) is vectorized. The
 * inputs are read as float; y may alias any input (each block is read before it is written).
 */
template <class F, class... In>
inline void map_n(std::size_t n, float* y, F f, const In*... x) {
  std::size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) detail::map_block<true>(i, kBlock, y, f, std::index_sequence_for<In...>{}, x...);
  if (i < n) detail::map_block<false>(i, n - i, y, f, std::index_sequence_for<In...>{}, x...);
}

/**
 * Sum over i < n of f(x0[i], x1[i], ...), with kBlock partial sums (vectorized, and more accurate than
 * one running sum). Nothing is written to memory, so the inputs are read in place.
 */
template <class F, class... In>
[[nodiscard]] inline float sum_n(std::size_t n, F f, const In*... x) {
  float acc[kBlock] = {};
  std::size_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (std::size_t j = 0; j < kBlock; ++j) acc[j] += f(float(x[i + j])...);
  for (std::size_t j = 0; i + j < n; ++j) acc[j] += f(float(x[i + j])...);
  // Pairwise combination of the partial sums.
  for (std::size_t w = kBlock / 2; w > 0; w /= 2)
    for (std::size_t j = 0; j < w; ++j) acc[j] += acc[j + w];
  return acc[0];
}

/**
 * y[i] = f(x[i]) for i < n like map_n, and returns the sum of the y[i] (kBlock partial sums): the
 * exponentials of a softmax row and their sum in one pass.
 */
template <class F>
[[nodiscard]] inline float map_sum_n(std::size_t n, float* y, F f, const float* x) {
  float acc[kBlock] = {};
  auto add = [&acc](std::size_t i, std::size_t m, const float* out) {
    (void)i;
    for (std::size_t j = 0; j < m; ++j) acc[j] += out[j];
  };
  std::size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    float in[kBlock], out[kBlock];
    for (std::size_t j = 0; j < kBlock; ++j) in[j] = x[i + j];
    for (std::size_t j = 0; j < kBlock; ++j) out[j] = f(in[j]);
    for (std::size_t j = 0; j < kBlock; ++j) y[i + j] = out[j];
    add(i, kBlock, out);
  }
  if (i < n) {
    const std::size_t m = n - i;
    float in[kBlock], out[kBlock];
    for (std::size_t j = 0; j < kBlock; ++j) in[j] = j < m ? x[i + j] : 0.0f;
    for (std::size_t j = 0; j < kBlock; ++j) out[j] = f(in[j]);
    for (std::size_t j = 0; j < m; ++j) y[i + j] = out[j];
    add(i, m, out);
  }
  for (std::size_t w = kBlock / 2; w > 0; w /= 2)
    for (std::size_t j = 0; j < w; ++j) acc[j] += acc[j + w];
  return acc[0];
}

/** max over i < n of x[i] (-inf for n = 0), with kBlock partial maxima. */
[[nodiscard]] inline float max_n(std::size_t n, const float* x) {
  constexpr float ninf = -std::numeric_limits<float>::infinity();
  float acc[kBlock];
  for (std::size_t j = 0; j < kBlock; ++j) acc[j] = ninf;
  std::size_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (std::size_t j = 0; j < kBlock; ++j) acc[j] = select(acc[j] < x[i + j], x[i + j], acc[j]);
  for (std::size_t j = 0; i + j < n; ++j) acc[j] = select(acc[j] < x[i + j], x[i + j], acc[j]);
  for (std::size_t w = kBlock / 2; w > 0; w /= 2)
    for (std::size_t j = 0; j < w; ++j) acc[j] = select(acc[j] < acc[j + w], acc[j + w], acc[j]);
  return acc[0];
}

/** y[i] = fast_exp(x[i]) for n elements (y may alias x), on the thread's instruction-set level. */
inline void exp_n(std::size_t n, const float* x, float* y) {
  with_isa([&] {
    map_n(
        n, y, [](float v) { return fast_exp(v); }, x);
  });
}

/** y[i] = fast_tanh(x[i]) for n elements (y may alias x), on the thread's instruction-set level. */
inline void tanh_n(std::size_t n, const float* x, float* y) {
  with_isa([&] {
    map_n(
        n, y, [](float v) { return fast_tanh(v); }, x);
  });
}

}  // namespace mpar::host::fast
