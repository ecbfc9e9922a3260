#pragma once
/**
 * @file Host GEMM: CBLAS (OpenBLAS) when available, a portable blocked kernel otherwise.
 *
 * Row-major, C = alpha * op(A) * op(B) + beta * C, with op() transposing on request. Each rank runs
 * its GEMMs single-threaded (see `host_backend.hpp`), so several ranks on one machine do not
 * oversubscribe its cores.
 */
#include <algorithm>
#include <cstddef>
#include <vector>

#include "mpar/core/dtype.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/tensor.hpp"

#if defined(MPAR_HAVE_CBLAS)
#include <cblas.h>
#endif

namespace mpar {

/** @brief Whether a GEMM operand is used as stored or transposed. */
enum class Trans { no, yes };

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

}  // namespace detail

/**
 * @brief Row-major GEMM on raw pointers: `C[m x n] = alpha * op(A)[m x k] * op(B)[k x n] + beta * C`.
 * Leading dimensions are in elements. float and double go to CBLAS when it was found at configure time.
 */
template <class T>
  requires(std::is_same_v<T, float> || std::is_same_v<T, double>)
void gemm(Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a, std::size_t lda,
          const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc) {
  if (m == 0 || n == 0) return;
#if defined(MPAR_HAVE_CBLAS)
  const auto cta = ta == Trans::no ? CblasNoTrans : CblasTrans;
  const auto ctb = tb == Trans::no ? CblasNoTrans : CblasTrans;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, cta, ctb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
  else
    cblas_dgemm(CblasRowMajor, cta, ctb, int(m), int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
#else
  detail::gemm_fallback(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

/**
 * @brief GEMM on rank-2 views: `C = alpha * op(A) * op(B) + beta * C`. Views must have unit stride in their
 * last dimension; a size mismatch throws naming all three shapes.
 */
template <class T>
void matmul(TensorView<const T, 2> a, Trans ta, TensorView<const T, 2> b, Trans tb, TensorView<T, 2> c,
            T alpha = T(1), T beta = T(0)) {
  const std::size_t m = ta == Trans::no ? a.extent(0) : a.extent(1);
  const std::size_t k = ta == Trans::no ? a.extent(1) : a.extent(0);
  const std::size_t kb = tb == Trans::no ? b.extent(0) : b.extent(1);
  const std::size_t n = tb == Trans::no ? b.extent(1) : b.extent(0);
  require(k == kb && c.extent(0) == m && c.extent(1) == n, "matmul: op(A) is ", m, "x", k, ", op(B) is ", kb, "x", n,
          ", C is ", c.extent(0), "x", c.extent(1), "; inner sizes and C's shape must agree");
  require(a.stride(1) == 1 && b.stride(1) == 1 && c.stride(1) == 1,
          "matmul: operands need unit stride in their last dimension");
  gemm<T>(ta, tb, m, n, k, alpha, a.data(), std::size_t(a.stride(0)), b.data(), std::size_t(b.stride(0)), beta, c.data(),
          std::size_t(c.stride(0)));
}

}  // namespace mpar
