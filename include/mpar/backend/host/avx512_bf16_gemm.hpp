#pragma once
/**
 * @file A packed bf16 x bf16 -> fp32 GEMM for CPUs with AVX-512-BF16 (`vdpbf16ps`).
 *
 * Why: `vdpbf16ps` does 32 bf16 multiply-adds per instruction, twice an fp32 FMA's 16, so a bf16 GEMM can
 * run at twice the fp32 rate. Builds whose GEMM library has no bf16 kernels (CBLAS, portable) otherwise widen
 * bf16 operands to fp32 and run at the fp32 rate or below. oneDNN 2.6 has such kernels (brgemm on
 * `vdpbf16ps`, AMX tiles where present); measured on an AMD Zen 4 without AMX it is slightly faster than this
 * kernel (5 % over a training step's GEMM shapes, docs/performance.md), so a oneDNN build keeps oneDNN.
 *
 * Layout (BLIS-style): for each block of KC rows of op(B) and NC of its columns, B is packed into panels of
 * 32 columns in which each 32-bit element holds a k pair `(B[2p][j], B[2p+1][j])`, the pairs of one k-pair
 * row lying side by side (two 512-bit loads per k pair). For each block of MC rows of op(A) inside it, A is
 * packed into panels of 8 rows whose k pairs `(A[i][2p], A[i][2p+1])` are 32-bit words, broadcast one row at
 * a time. The micro-kernel keeps an 8 x 32 fp32 tile in 16 zmm registers and does 16 `vdpbf16ps` per k pair.
 * An odd K pads its last pair with a zero (which adds exactly 0); edge tiles are packed with zero rows and
 * columns and stored with masks, so any M, N, K, transpose and leading dimension goes through one kernel.
 *
 * Numerics: every product of two bf16 values is exact in fp32; `vdpbf16ps` adds the pair's two products to
 * the accumulator one after the other, each addition rounded to nearest even, with denormal inputs and outputs
 * flushed to zero; so results agree with an fp32-accumulated reference up to summation order, except that
 * sums below 2^-126 in magnitude become 0.
 *
 * Choice: `bf16_gemm_kernel()` (bf16_gemm_kernel.hpp). Including this header puts the kernel into the program
 * (it registers its entry point); the umbrella header includes it only in builds without oneDNN.
 * Everything here is compiled with `target` attributes: the build sets no -march and the code only runs
 * after the CPU was asked.
 */
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string_view>

#include "mpar/backend/host/bf16_gemm_kernel.hpp"
#include "mpar/backend/host/isa.hpp"
#include "mpar/core/dtype.hpp"
#include "mpar/core/error.hpp"

#if MPAR_HOST_MULTIVERSION
#include <immintrin.h>
#endif

// Full unrolling of the 8-row loops keeps the accumulators in registers. nvcc's front end, which sees this header
// when a .cu file includes the host backend, does not know GCC's pragma (warning 1675), and its device passes never
// compile these host-only functions, so it gets nothing.
#if defined(__CUDACC__)
#define MPAR_BF16_GEMM_UNROLL_8
#else
#define MPAR_BF16_GEMM_UNROLL_8 _Pragma("GCC unroll 8")
#endif

namespace mpar::host {

namespace avx512_bf16 {

/// Register tile: 8 rows x 32 fp32 columns, 16 zmm accumulators.
inline constexpr std::size_t tile_rows = 8, tile_cols = 32;
/// Cache blocks: an MC x KC block of A (at most 384 KiB) stays in L2 while the KC x 32 panels of B (at most
/// 64 KiB each) stream through L1; a deep KC keeps C from being re-read and re-written once per 256 k (with
/// KC = 256 this kernel ran at 0.75-0.78 of oneDNN on 2048 x 256 x 1024 with a transposed B, at 1024 at 0.95). KC is even, so only
/// the last block of an odd K has a half pair.
inline constexpr std::size_t block_k = 1024, block_m = 192, block_n = 2048;

#if MPAR_HOST_MULTIVERSION
namespace detail {

/** A 64-byte aligned buffer of 32-bit words that only grows (per thread: packing allocates once per shape). */
class PackBuffer {
 public:
  std::uint32_t* get(std::size_t words) {
    if (words > capacity_) {
      // 64-byte alignment keeps every packed 32-column row of B within one cache line.
      storage_.reset(new std::uint32_t[words + 16]);
      capacity_ = words;
    }
    auto addr = reinterpret_cast<std::uintptr_t>(storage_.get());
    return reinterpret_cast<std::uint32_t*>((addr + 63) & ~std::uintptr_t(63));
  }

 private:
  std::unique_ptr<std::uint32_t[]> storage_;
  std::size_t capacity_ = 0;
};

/** The 32-bit word of a k pair: `lo` in the low half (the even k), as vdpbf16ps pairs its operands. */
inline std::uint32_t pair_word(std::uint16_t lo, std::uint16_t hi) {
  return std::uint32_t(lo) | std::uint32_t(hi) << 16;
}

/**
 * Packs rows [i0, i0 + rows) and k [p0, p0 + kc) of op(A) into panels of `tile_rows` rows, k pairs as words:
 * panel r holds `pairs * tile_rows` words, word (q, i) = (A[i][2q], A[i][2q+1]); missing rows and the odd
 * K's half pair are zero.
 */
[[gnu::target("avx512f,avx512bw,avx512vl,avx512dq")]] inline void pack_a(bool ta, const bf16* a, std::size_t lda,
                                                                         std::size_t i0, std::size_t rows,
                                                                         std::size_t p0, std::size_t kc,
                                                                         std::uint32_t* dst) {
  const std::size_t pairs = (kc + 1) / 2, full = kc / 2;
  for (std::size_t r0 = 0; r0 < rows; r0 += tile_rows, dst += pairs * tile_rows) {
    const std::size_t nr = std::min(tile_rows, rows - r0);
    if (ta) {
      // op(A)[row][p] = a[p * lda + row]: the panel's 8 rows are 8 adjacent elements of stored rows 2q and
      // 2q + 1, interleaved 16 bits at a time into 8 pair words.
      const __mmask8 mask = __mmask8((1u << nr) - 1u);
      for (std::size_t q = 0; q < pairs; ++q) {
        const bf16* even = a + (p0 + 2 * q) * lda + i0 + r0;
        const __m128i lo = _mm_maskz_loadu_epi16(mask, even);
        const __m128i hi = 2 * q + 1 < kc ? _mm_maskz_loadu_epi16(mask, even + lda) : _mm_setzero_si128();
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + q * tile_rows), _mm_unpacklo_epi16(lo, hi));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + q * tile_rows + 4), _mm_unpackhi_epi16(lo, hi));
      }
      continue;
    }
    for (std::size_t i = 0; i < tile_rows; ++i) {
      std::uint32_t* out = dst + i;
      if (i >= nr) {
        for (std::size_t q = 0; q < pairs; ++q) out[q * tile_rows] = 0;
        continue;
      }
      // A pair is two adjacent elements of the row: one unaligned 32-bit load.
      const bf16* src = a + (i0 + r0 + i) * lda + p0;
      for (std::size_t q = 0; q < full; ++q) std::memcpy(out + q * tile_rows, src + 2 * q, 4);
      if (pairs > full) out[full * tile_rows] = pair_word(src[2 * full].bits, 0);
    }
  }
}

/**
 * Packs k [p0, p0 + kc) and columns [j0, j0 + cols) of op(B) into panels of `tile_cols` columns: panel c holds
 * `pairs * tile_cols` words, word (q, j) = (B[2q][j], B[2q+1][j]); missing columns and the odd K's half pair
 * are zero. The untransposed case interleaves two rows 16 columns at a time.
 */
[[gnu::target("avx512f,avx512bw,avx512vl,avx512dq")]] inline void pack_b(bool tb, const bf16* b, std::size_t ldb,
                                                                         std::size_t p0, std::size_t kc, std::size_t j0,
                                                                         std::size_t cols, std::uint32_t* dst) {
  const std::size_t pairs = (kc + 1) / 2, full = kc / 2;
  for (std::size_t c0 = 0; c0 < cols; c0 += tile_cols, dst += pairs * tile_cols) {
    const std::size_t nc = std::min(tile_cols, cols - c0);
    if (!tb) {
      for (std::size_t q = 0; q < pairs; ++q) {
        const bf16* even = b + (p0 + 2 * q) * ldb + j0 + c0;
        const bf16* odd = 2 * q + 1 < kc ? even + ldb : nullptr;
        for (std::size_t h = 0; h < tile_cols; h += 16) {
          const std::size_t valid = nc > h ? std::min<std::size_t>(16, nc - h) : 0;
          const __mmask16 mask = __mmask16((1u << valid) - 1u);
          const __m512i lo = _mm512_maskz_cvtepu16_epi32(__mmask16(0xffff), _mm256_maskz_loadu_epi16(mask, even + h));
          const __m512i hi =
              odd ? _mm512_maskz_slli_epi32(
                        __mmask16(0xffff),
                        _mm512_maskz_cvtepu16_epi32(__mmask16(0xffff), _mm256_maskz_loadu_epi16(mask, odd + h)), 16)
                  : _mm512_setzero_si512();
          _mm512_store_si512(dst + q * tile_cols + h, _mm512_or_si512(lo, hi));
        }
      }
    } else {
      // op(B)[p][j] = b[j * ldb + p]: a pair is two adjacent elements of B's stored row j. Blocks of 16 pairs
      // (16 stored rows' 64 bytes into 16 packed rows' 128) keep what is written in L1 across the columns.
      constexpr std::size_t pair_block = 16;
      for (std::size_t q0 = 0; q0 < pairs; q0 += pair_block) {
        const std::size_t q1 = std::min(pairs, q0 + pair_block), q1_full = std::min(full, q1);
        for (std::size_t j = 0; j < tile_cols; ++j) {
          std::uint32_t* out = dst + j;
          if (j >= nc) {
            for (std::size_t q = q0; q < q1; ++q) out[q * tile_cols] = 0;
            continue;
          }
          const bf16* src = b + (j0 + c0 + j) * ldb + p0;
          for (std::size_t q = q0; q < q1_full; ++q) std::memcpy(out + q * tile_cols, src + 2 * q, 4);
          if (q1 > q1_full) out[full * tile_cols] = pair_word(src[2 * full].bits, 0);
        }
      }
    }
  }
}

/**
 * The 8 x 32 micro-kernel over `pairs` k pairs of packed panels; stores rows < `rows`, columns < `cols` of
 * `C = alpha * acc + (accumulate ? C : beta == 0 ? 0 : beta * C) + bias` (bias: fp32 per column, or null).
 */
template <std::size_t Halves>
[[gnu::target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")]] inline void micro_kernel(
    std::size_t pairs, const std::uint32_t* ap, const std::uint32_t* bp, float* c, std::size_t ldc, std::size_t rows,
    std::size_t cols, float alpha, float beta, const float* bias) {
  __m512 acc[tile_rows][2];
  MPAR_BF16_GEMM_UNROLL_8
  for (std::size_t i = 0; i < tile_rows; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (std::size_t q = 0; q < pairs; ++q, ap += tile_rows, bp += tile_cols) {
    const __m512i b0 = _mm512_load_si512(bp), b1 = Halves == 2 ? _mm512_load_si512(bp + 16) : b0;
    MPAR_BF16_GEMM_UNROLL_8
    for (std::size_t i = 0; i < tile_rows; ++i) {
      const __m512i ai = _mm512_set1_epi32(int(ap[i]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], (__m512bh)ai, (__m512bh)b0);
      if constexpr (Halves == 2) acc[i][1] = _mm512_dpbf16_ps(acc[i][1], (__m512bh)ai, (__m512bh)b1);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  __mmask16 mask[2];
  __m512 vbias[2];
  for (std::size_t h = 0; h < 2; ++h) {
    const std::size_t valid = h >= Halves ? 0 : cols > 16 * h ? std::min<std::size_t>(16, cols - 16 * h) : 0;
    mask[h] = __mmask16((1u << valid) - 1u);
    vbias[h] = bias ? _mm512_maskz_loadu_ps(mask[h], bias + 16 * h) : _mm512_setzero_ps();
  }
  MPAR_BF16_GEMM_UNROLL_8
  for (std::size_t i = 0; i < tile_rows; ++i) {
    if (i >= rows) break;
    float* row = c + i * ldc;
    for (std::size_t h = 0; h < Halves; ++h) {
      if (!mask[h]) continue;
      __m512 v = _mm512_fmadd_ps(acc[i][h], va, vbias[h]);
      // beta == 0 never reads C (it may hold NaN or be uninitialised).
      if (beta != 0.0f) v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask[h], row + 16 * h), vb, v);
      _mm512_mask_storeu_ps(row + 16 * h, mask[h], v);
    }
  }
}

/** Per-thread packing buffers (each rank's GEMMs run on its own thread). */
struct PackBuffers {
  PackBuffer a, b;
};
inline PackBuffers& this_thread_pack_buffers() {
  thread_local PackBuffers buffers;
  return buffers;
}

}  // namespace detail
#endif

/**
 * @brief Row-major `C[m x n] = alpha op(A) op(B) + beta C (+ bias)` with bf16 A, B and fp32 C, on the calling
 * thread. `bias` (n fp32 values added to every row, or null) lets the MLP's bias ride on the store.
 * `beta == 0` never reads C. The caller checks leading dimensions and the CPU (`cpu_has_avx512_bf16()`);
 * `k == 0` gives `C = beta C + bias`.
 */
inline void gemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const bf16* a,
                 std::size_t lda, const bf16* b, std::size_t ldb, float beta, float* c, std::size_t ldc,
                 const float* bias = nullptr) {
#if MPAR_HOST_MULTIVERSION
  if (m == 0 || n == 0) return;
  require(cpu_has_avx512_bf16(), "host bf16 GEMM (avx512_bf16): this CPU lacks avx512_bf16 (m=", m, " n=", n, " k=", k,
          "); use the library kernel (Bf16GemmKernel::library)");
  auto& buffers = detail::this_thread_pack_buffers();
  const std::size_t kc_max = std::min(block_k, k + (k & 1)), nc_max = std::min(block_n, n),
                    mc_max = std::min(block_m, m);
  const std::size_t round_n = (nc_max + tile_cols - 1) / tile_cols * tile_cols;
  const std::size_t round_m = (mc_max + tile_rows - 1) / tile_rows * tile_rows;
  std::uint32_t* bpack = buffers.b.get(std::max<std::size_t>(kc_max / 2, 1) * round_n);
  std::uint32_t* apack = buffers.a.get(std::max<std::size_t>(kc_max / 2, 1) * round_m);
  for (std::size_t j0 = 0; j0 < n; j0 += block_n) {
    const std::size_t nc = std::min(block_n, n - j0);
    // k == 0 still makes one pass, of zero pairs, so that C = beta C + bias is stored.
    for (std::size_t p0 = 0; p0 < std::max<std::size_t>(k, 1); p0 += block_k) {
      const std::size_t kc = std::min(block_k, k - std::min(k, p0)), pairs = (kc + 1) / 2;
      const bool first = p0 == 0;
      if (pairs) detail::pack_b(tb, b, ldb, p0, kc, j0, nc, bpack);
      for (std::size_t i0 = 0; i0 < m; i0 += block_m) {
        const std::size_t mc = std::min(block_m, m - i0);
        if (pairs) detail::pack_a(ta, a, lda, i0, mc, p0, kc, apack);
        for (std::size_t jr = 0; jr < nc; jr += tile_cols)
          for (std::size_t ir = 0; ir < mc; ir += tile_rows) {
            // A last panel of at most 16 columns (N = 80: 2 x 32 + 16) runs the half-width tile, whose
            // padding then costs no multiply-adds.
            auto* kernel = nc - jr <= 16 ? detail::micro_kernel<1> : detail::micro_kernel<2>;
            kernel(pairs, apack + ir * pairs, bpack + jr * pairs, c + (i0 + ir) * ldc + j0 + jr, ldc,
                   std::min(tile_rows, mc - ir), std::min(tile_cols, nc - jr), alpha, first ? beta : 1.0f,
                   first && bias ? bias + j0 + jr : nullptr);
          }
      }
    }
  }
#else
  (void)ta, (void)tb, (void)k, (void)alpha, (void)a, (void)lda, (void)b, (void)ldb, (void)beta, (void)c, (void)ldc,
      (void)bias;
  require(m == 0 || n == 0, "host bf16 GEMM (avx512_bf16): not built for this architecture (m=", m, " n=", n,
          "); use the library kernel");
#endif
}

}  // namespace avx512_bf16

#if MPAR_HOST_MULTIVERSION
namespace detail {
/// Registers the kernel with the run-time choice when the program starts (bf16_gemm_kernel.hpp).
inline const bool avx512_bf16_gemm_registered = (avx512_bf16_gemm_entry = &avx512_bf16::gemm, true);
}  // namespace detail
#endif

}  // namespace mpar::host

#undef MPAR_BF16_GEMM_UNROLL_8
