#pragma once
/** @file Element types: float, double and the 16-bit storage types bf16 and f16. */
#include <bit>
#include <concepts>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

#include "mpar/core/detail/element_type.hpp"
#include "mpar/core/detail/half_precision.hpp"

namespace mpar {

/**
 * @brief bfloat16 storage: the upper 16 bits of an IEEE float. Compute converts to float.
 *
 * Conversion from float rounds to nearest, ties to even; NaN stays NaN (quiet).
 */
struct bf16 {
  std::uint16_t bits = 0;

  constexpr bf16() = default;
  constexpr explicit bf16(float f) : bits(from_float(f)) {}
  [[nodiscard]] static constexpr bf16 from_bits(std::uint16_t b) {
    bf16 r;
    r.bits = b;
    return r;
  }
  [[nodiscard]] constexpr operator float() const { return std::bit_cast<float>(std::uint32_t(bits) << 16); }

  [[nodiscard]] static constexpr std::uint16_t from_float(float f) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x0040u);  // NaN: keep it quiet
    const std::uint32_t lsb = (u >> 16) & 1u;
    return std::uint16_t((u + 0x7fffu + lsb) >> 16);  // round to nearest even; overflow becomes inf
  }
  friend constexpr bool operator==(bf16 a, bf16 b) { return a.bits == b.bits; }
};

/**
 * @brief IEEE binary16 storage. Compute converts to float.
 *
 * Conversion from float rounds to nearest, ties to even, with subnormals, overflow to
 * infinity and NaN preserved.
 */
struct f16 {
  std::uint16_t bits = 0;

  constexpr f16() = default;
  constexpr explicit f16(float f) : bits(from_float(f)) {}
  [[nodiscard]] static constexpr f16 from_bits(std::uint16_t b) {
    f16 r;
    r.bits = b;
    return r;
  }
  [[nodiscard]] constexpr operator float() const { return to_float(bits); }

  [[nodiscard]] static constexpr std::uint16_t from_float(float f) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
    const std::uint32_t sign = (u >> 16) & 0x8000u;
    const std::uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return std::uint16_t(sign | 0x7e00u);   // NaN
    if (a >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
    if (a < 0x38800000u) {                                       // below 2^-14: subnormal or zero
      if (a < 0x33000000u) return std::uint16_t(sign);           // below half the smallest subnormal
      const std::uint32_t mant = (a & 0x7fffffu) | 0x800000u;
      // value = mant * 2^(exp-150); in units of the smallest subnormal 2^-24 that is mant >> (126 - exp)
      const int shift = 126 - int(a >> 23);
      const std::uint32_t q = mant >> shift;
      const std::uint32_t rem = mant & ((1u << shift) - 1u);
      const std::uint32_t half = 1u << (shift - 1);
      std::uint32_t r = q;
      if (rem > half || (rem == half && (q & 1u))) ++r;
      return std::uint16_t(sign | r);
    }
    // normal: rebias exponent 127 -> 15 and round the 13 dropped mantissa bits to nearest even
    std::uint32_t r = a - 0x38000000u;
    r = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
    return std::uint16_t(sign | r);
  }

  [[nodiscard]] static constexpr float to_float(std::uint16_t h) {
    const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu;
    std::uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
      if (mant == 0) return std::bit_cast<float>(sign);
      int e = -1;  // normalise the subnormal
      do {
        mant <<= 1;
        ++e;
      } while ((mant & 0x400u) == 0);
      return std::bit_cast<float>(sign | std::uint32_t(112 - e) << 23 | (mant & 0x3ffu) << 13);
    }
    return std::bit_cast<float>(sign | (exp + 112) << 23 | mant << 13);
  }
  friend constexpr bool operator==(f16 a, f16 b) { return a.bits == b.bits; }
};

inline std::ostream& operator<<(std::ostream& os, bf16 v) { return os << float(v); }
inline std::ostream& operator<<(std::ostream& os, f16 v) { return os << float(v); }

/** @brief The type arithmetic on `T` is carried out in: float for 16-bit types, `T` otherwise. */
template <detail::element_type T>
using compute_type_t = std::conditional_t<detail::half_precision<T>, float, T>;

/** @brief A short, stable name used in error messages and checkpoint manifests. */
template <detail::element_type T>
inline constexpr std::string_view dtype_name_v = std::is_same_v<T, float>    ? "f32"
                                                 : std::is_same_v<T, double> ? "f64"
                                                 : std::is_same_v<T, bf16>   ? "bf16"
                                                                             : "f16";

/** @brief Converts between element types through float/double (round-to-nearest-even into 16 bits). */
template <detail::element_type To, detail::element_type From>
[[nodiscard]] constexpr To convert(From v) {
  if constexpr (std::is_same_v<To, From>)
    return v;
  else if constexpr (detail::half_precision<To>)
    return To(float(v));
  else
    return static_cast<To>(static_cast<compute_type_t<From>>(v));
}

}  // namespace mpar
