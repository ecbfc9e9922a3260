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
 * The integer form below *is* `bf16::from_float` — round to nearest even by adding 0x7fff plus the kept
 * part's lowest bit, NaN made quiet by setting bit 6 of the kept part — so every level gives the same bits as
 * the scalar rule. On a CPU with AVX-512-BF16, `vcvtne2ps2bf16` rounds 32 floats in one instruction, about
 * twice the integer form's rate on data in cache; it treats subnormal inputs as zero, so a block of 32 holding
 * a subnormal (or a NaN, to keep the rule's NaN bits by construction) takes the integer form instead: the same
 * bits on every CPU, and the CUDA backend's.
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

#if MPAR_HOST_MULTIVERSION
/**
 * `convert_to_bf16` over whole blocks of 32 by `vcvtne2ps2bf16`; a block holding a NaN or a subnormal, whose
 * bits the instruction would not give as `bf16::from_float` does, by the integer rule. Returns how many
 * elements it converted (the caller converts the remaining `n % 32`). Needs `cpu_has_avx512_bf16()`.
 *
 * Why GCC vector types and two lines of asm instead of <immintrin.h>: this header is part of the umbrella,
 * and <immintrin.h> alone costs about 0.4 s of every translation unit's compile time (bench/compile_cost).
 */
[[gnu::target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")]] inline std::size_t convert_to_bf16_vcvt(
    std::size_t n, const float* src, bf16* dst) {
  using Floats = float __attribute__((vector_size(64)));
  using Halves = std::uint16_t __attribute__((vector_size(64)));
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    Floats lo, hi;
    std::memcpy(&lo, src + i, sizeof lo);
    std::memcpy(&hi, src + i + 16, sizeof hi);
    // vfpclassps 0xa1: signalling NaN (0x80), denormal (0x20), quiet NaN (0x01), in either half.
    unsigned char special;
    asm("vfpclassps $0xa1, %[lo], %%k1\n\t"
        "vfpclassps $0xa1, %[hi], %%k2\n\t"
        "kortestw %%k1, %%k2\n\t"
        "setnz %[special]"
        : [special] "=q"(special)
        : [lo] "v"(lo), [hi] "v"(hi)
        : "k1", "k2", "cc");
    if (special == 0) {
      Halves out;  // elements 0-15 from lo, 16-31 from hi
      asm("vcvtne2ps2bf16 %[lo], %[hi], %[out]" : [out] "=v"(out) : [lo] "v"(lo), [hi] "v"(hi));
      std::memcpy(static_cast<void*>(dst + i), &out, sizeof out);
    } else {
      for (std::size_t j = i; j < i + 32; ++j)
        dst[j] = bf16::from_bits(bf16_bits_of(std::bit_cast<std::uint32_t>(src[j])));
    }
  }
  return i;
}
#endif
}  // namespace detail

/**
 * dst[i] = bf16(src[i]) for i < n: round to nearest even, overflow to infinity, NaN kept (quiet), subnormals
 * rounded like every other value — bit for bit `bf16::from_float`. The ranges must not overlap.
 */
inline void convert_to_bf16(std::size_t n, const float* src, bf16* dst) {
  std::size_t done = 0;
#if MPAR_HOST_MULTIVERSION
  if (active_isa() == Isa::avx512 && cpu_has_avx512_bf16()) done = detail::convert_to_bf16_vcvt(n, src, dst);
#endif
  with_isa([&] {
    constexpr std::size_t kB = detail::kConvertBlock;
    std::size_t i = done;
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
