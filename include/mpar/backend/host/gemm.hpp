#pragma once
/**
 * @file Host GEMM: oneDNN's matmul (MPAR_HOST_GEMM=onednn), CBLAS (=cblas) or a portable blocked kernel,
 * as chosen at configure time; double always goes to CBLAS when it was found.
 *
 * Row-major, C = alpha * op(A) * op(B) + beta * C, with op() transposing on request. A and B are float,
 * double, or 16-bit (bf16, f16) with an fp32 C: the products of 16-bit operands are exact in fp32 and
 * are accumulated in fp32, as on the GPU's tensor cores. Each rank runs its GEMMs single-threaded (see
 * `host_backend.hpp` and `onednn_gemm.hpp`), so several ranks on one machine do not oversubscribe it.
 */
#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "mpar/backend/host/bf16_gemm_kernel.hpp"
#include "mpar/backend/host/detail/host_gemm_types.hpp"
#include "mpar/backend/types.hpp"  // Trans
#include "mpar/core/dtype.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/tensor.hpp"

#if defined(MPAR_HAVE_CBLAS)
#include <cblas.h>
#endif
#if defined(MPAR_HAVE_ONEDNN)
#include "mpar/backend/host/onednn_gemm.hpp"
#elif defined(MPAR_HAVE_CBLAS)
// With CBLAS alone the avx512_bf16 kernel is the bf16 default (about twice widening to fp32 for cblas_sgemm), so
// it is part of every program. With oneDNN, or with no BLAS at all (the portable loops, and the bare umbrella
// header whose compile cost CI budgets), a program that wants it includes this header itself: its intrinsics
// cost about 0.4-0.6 s of compile time per translation unit (bf16_gemm_kernel.hpp).
#include "mpar/backend/host/avx512_bf16_gemm.hpp"
#endif

namespace mpar {

namespace detail {

/** Portable kernel: i-k-j loop order over 64x64 tiles so the inner loop streams rows of B and C. */
template <class T>
void gemm_fallback(Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a,
                   std::size_t lda, const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc) {
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
  auto A = [&](std::size_t i, std::size_t p) { return ta == Trans::no ? a[i * lda + p] : a[p * lda + i]; };
  auto B = [&](std::size_t p, std::size_t j) { return tb == Trans::no ? b[p * ldb + j] : b[j * ldb + p]; };
  constexpr std::size_t tile = 64;
  for (std::size_t i0 = 0; i0 < m; i0 += tile)
    for (std::size_t p0 = 0; p0 < k; p0 += tile)
      for (std::size_t j0 = 0; j0 < n; j0 += tile) {
        const std::size_t i1 = std::min(m, i0 + tile), p1 = std::min(k, p0 + tile), j1 = std::min(n, j0 + tile);
        for (std::size_t i = i0; i < i1; ++i)
          for (std::size_t p = p0; p < p1; ++p) {
            const T av = alpha * A(i, p);
            if (tb == Trans::no) {
              const T* brow = b + p * ldb;
              T* crow = c + i * ldc;
              for (std::size_t j = j0; j < j1; ++j) crow[j] += av * brow[j];
            } else {
              for (std::size_t j = j0; j < j1; ++j) c[i * ldc + j] += av * B(p, j);
            }
          }
      }
}

/** Copies a stored `[rows, cols]` 16-bit block (leading dimension ld) into dense fp32 (exact). */
template <class T>
void widen(std::size_t rows, std::size_t cols, const T* src, std::size_t ld, std::vector<float>& dst) {
  dst.resize(rows * cols);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) dst[r * cols + c] = float(src[r * ld + c]);
}

/** Throws naming the sizes unless every row-major operand's leading dimension holds its stored row. */
inline void require_leading_dims(Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, std::size_t lda,
                                 std::size_t ldb, std::size_t ldc) {
  const std::size_t a_cols = ta == Trans::no ? k : m, b_cols = tb == Trans::no ? n : k;
  require(lda >= a_cols && ldb >= b_cols && ldc >= n, "host gemm: leading dimensions lda=", lda, " ldb=", ldb,
          " ldc=", ldc, " are too small for m=", m, " n=", n, " k=", k, " (row-major: ld >= the stored row length)");
}

/** Same-type float/double GEMM on the configured library. */
template <class T>
void gemm_same_type(Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a,
                    std::size_t lda, const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc) {
#if defined(MPAR_HAVE_ONEDNN)
  if constexpr (std::is_same_v<T, float>)
    if (host::onednn::gemm<float>(ta == Trans::yes, tb == Trans::yes, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
      return;
#endif
#if defined(MPAR_HAVE_CBLAS)
  const auto cta = ta == Trans::no ? CblasNoTrans : CblasTrans;
  const auto ctb = tb == Trans::no ? CblasNoTrans : CblasTrans;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, cta, ctb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
  else
    cblas_dgemm(CblasRowMajor, cta, ctb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
#else
  gemm_fallback(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

}  // namespace detail

/** @brief Which library computes float and 16-bit host GEMMs in this build ("oneDNN", "CBLAS" or "portable"). */
inline constexpr const char* host_gemm_library =
#if defined(MPAR_HAVE_ONEDNN)
    "oneDNN";
#elif defined(MPAR_HAVE_CBLAS)
    "CBLAS";
#else
    "portable";
#endif

/**
 * @brief Row-major GEMM on raw pointers: `C[m x n] = alpha * op(A)[m x k] * op(B)[k x n] + beta * C`.
 * Leading dimensions are in elements; `beta == 0` overwrites C without reading it.
 *
 * 16-bit A and B (bf16, f16) with a float C multiply exactly and accumulate in fp32: bf16 through mpar's
 * own `vdpbf16ps` kernel where `host::bf16_gemm_kernel()` picks it (a CPU with avx512_bf16 in a build whose
 * library has no bf16 kernels, or when forced; see `bf16_gemm_kernel.hpp`), otherwise through oneDNN's
 * 16-bit kernels where the CPU has them (AMX, AVX-512 bf16 / fp16), otherwise by widening the operands to
 * fp32 (exact) and running the fp32 GEMM, which gives the same numbers up to summation order.
 */
template <class TIn, class TOut = TIn>
  requires detail::host_gemm_types<TIn, TOut>
void gemm(Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, TOut alpha, const TIn* a, std::size_t lda,
          const TIn* b, std::size_t ldb, TOut beta, TOut* c, std::size_t ldc) {
  if (m == 0 || n == 0) return;
  const std::size_t a_cols = ta == Trans::no ? k : m, b_cols = tb == Trans::no ? n : k;
  detail::require_leading_dims(ta, tb, m, n, k, lda, ldb, ldc);
  if (k == 0) {  // C = beta C; libraries differ on empty products, so this is done here
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) c[i * ldc + j] = beta == TOut(0) ? TOut(0) : beta * c[i * ldc + j];
    return;
  }
  if constexpr (std::is_same_v<TIn, TOut>) {
    detail::gemm_same_type(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    if constexpr (std::is_same_v<TIn, bf16>)
      if (host::bf16_gemm_kernel() == host::Bf16GemmKernel::avx512_bf16) {
        host::detail::avx512_bf16_gemm_entry(ta == Trans::yes, tb == Trans::yes, m, n, k, alpha, a, lda, b, ldb, beta,
                                             c, ldc, nullptr);
        return;
      }
#if defined(MPAR_HAVE_ONEDNN)
    if (host::onednn::gemm<TIn>(ta == Trans::yes, tb == Trans::yes, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc))
      return;
#endif
    // Per-thread scratch, so repeated calls allocate nothing once the largest shape was seen.
    thread_local std::vector<float> wa, wb;
    detail::widen(ta == Trans::no ? m : k, a_cols, a, lda, wa);
    detail::widen(tb == Trans::no ? k : n, b_cols, b, ldb, wb);
    detail::gemm_same_type<float>(ta, tb, m, n, k, alpha, wa.data(), a_cols, wb.data(), b_cols, beta, c, ldc);
  }
}

/**
 * @brief GEMM on rank-2 views: `C = alpha * op(A) * op(B) + beta * C`. Views must have unit stride in their
 * last dimension; a size mismatch throws naming all three shapes.
 */
template <class T>
void matmul(TensorView<const T, 2> a, Trans ta, TensorView<const T, 2> b, Trans tb, TensorView<T, 2> c, T alpha = T(1),
            T beta = T(0)) {
  const std::size_t m = ta == Trans::no ? a.extent(0) : a.extent(1);
  const std::size_t k = ta == Trans::no ? a.extent(1) : a.extent(0);
  const std::size_t kb = tb == Trans::no ? b.extent(0) : b.extent(1);
  const std::size_t n = tb == Trans::no ? b.extent(1) : b.extent(0);
  require(k == kb && c.extent(0) == m && c.extent(1) == n, "matmul: op(A) is ", m, "x", k, ", op(B) is ", kb, "x", n,
          ", C is ", c.extent(0), "x", c.extent(1), "; inner sizes and C's shape must agree");
  require(a.stride(1) == 1 && b.stride(1) == 1 && c.stride(1) == 1,
          "matmul: operands need unit stride in their last dimension");
  gemm<T>(ta, tb, m, n, k, alpha, a.data(), std::size_t(a.stride(0)), b.data(), std::size_t(b.stride(0)), beta,
          c.data(), std::size_t(c.stride(0)));
}

}  // namespace mpar
