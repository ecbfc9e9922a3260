#pragma once
/**
 * @file fp32 ↔ bf16 conversion of whole buffers on the host, vectorized for the CPU's instruction set.
 *
 * Why: under mixed precision every step rounds each weight to bf16 (the optimizer's `begin_compute`, the
 * linear layers' 16-bit weight) and widens it back, and `nn::Autocast` rounds every GEMM's activation
 * operand; the element-at-a-time `mpar::convert` loop (a branch per element for NaN) was 6 % of a bf16
 * training step's samples. The loops here are branch-free integer code over blocks of constant length,
 * run through `with_isa` (isa.hpp), so the compiler vectorizes them for AVX-512, AVX2 or the baseline.
 *
 * Why not `vcvtneps2bf16` (AVX-512-BF16): it treats subnormal inputs as zero, so it would differ from
 * `bf16::from_float` (and from the CUDA backend's conversion) on subnormals. The integer form below *is*
 * `bf16::from_float` — round to nearest even by adding 0x7fff plus the kept part's lowest bit, NaN made
 * quiet by setting bit 6 of the kept part — so every level gives the same bits as the scalar rule, and the
 * conversion is bound by memory, not by arithmetic, either way.
 */
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "mpar/backend/host/isa.hpp"
#include "mpar/core/dtype.hpp"

namespace mpar::host {

namespace detail {
/** Elements per block of the conversion loops: a whole number of 512-bit vectors of either width. */
inline constexpr std::size_t kConvertBlock = 64;

/** `bf16::from_float` on the float's bits, with the NaN test as a mask instead of a branch. */
[[nodiscard]] inline std::uint16_t bf16_bits_of(std::uint32_t u) {
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (u >> 16) | 0x0040u;
  const std::uint32_t nan_mask = 0u - std::uint32_t((u & 0x7fffffffu) > 0x7f800000u);
  return std::uint16_t((quiet_nan & nan_mask) | (rounded & ~nan_mask));
}
}  // namespace detail

/**
 * dst[i] = bf16(src[i]) for i < n: round to nearest even, overflow to infinity, NaN kept (quiet), subnormals
 * rounded like every other value — bit for bit `bf16::from_float`. The ranges must not overlap.
 */
inline void convert_to_bf16(std::size_t n, const float* src, bf16* dst) {
  with_isa([&] {
    constexpr std::size_t kB = detail::kConvertBlock;
    std::size_t i = 0;
    // Local arrays of constant length: the loop between the copies has no aliasing to check and no epilogue,
    // which is what GCC's cheap vectorization cost model (at -O2) needs.
    for (; i + kB <= n; i += kB) {
      std::uint32_t in[kB];
      std::uint16_t out[kB];
      std::memcpy(in, src + i, sizeof in);
      for (std::size_t j = 0; j < kB; ++j) out[j] = detail::bf16_bits_of(in[j]);
      std::memcpy(static_cast<void*>(dst + i), out, sizeof out);
    }
    for (; i < n; ++i) dst[i] = bf16::from_bits(detail::bf16_bits_of(std::bit_cast<std::uint32_t>(src[i])));
  });
}

/** dst[i] = float(src[i]) for i < n: exact (a bf16 is the upper half of a float). The ranges must not overlap. */
inline void convert_from_bf16(std::size_t n, const bf16* src, float* dst) {
  with_isa([&] {
    constexpr std::size_t kB = detail::kConvertBlock;
    std::size_t i = 0;
    for (; i + kB <= n; i += kB) {
      std::uint16_t in[kB];
      std::uint32_t out[kB];
      std::memcpy(in, static_cast<const void*>(src + i), sizeof in);
      for (std::size_t j = 0; j < kB; ++j) out[j] = std::uint32_t(in[j]) << 16;
      std::memcpy(dst + i, out, sizeof out);
    }
    for (; i < n; ++i) dst[i] = std::bit_cast<float>(std::uint32_t(src[i].bits) << 16);
  });
}

}  // namespace mpar::host
