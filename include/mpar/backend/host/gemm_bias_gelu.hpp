#pragma once
/**
 * @file The first projection of an MLP with its epilogue: `pre = A W + bias`, `y = gelu(pre)` (tanh form),
 * as one host operation. `pre` is an output too: GeLU's backward needs the pre-activation.
 *
 * With oneDNN (MPAR_HOST_GEMM=onednn) the bias is the matmul's bias operand, which the kernel adds to the
 * fp32 accumulator before it writes `pre` (no pass of its own over the product), and GeLU then reads `pre`
 * once and writes `y`. The unfused layer chain (GEMM, bias layer, GeLU layer) makes four passes over the
 * `[m, n]` activation besides the GEMM's write: the bias addition (read and write), GeLU's copy of its input
 * (read and write), GeLU itself; this makes one (read `pre`, write `y`).
 *
 * Why not oneDNN's `eltwise_gelu_tanh` post-op: a primitive writes one destination, and with the GeLU
 * post-op that is `y`; the pre-activation the backward needs would then have to be recomputed by a second
 * GEMM of the same size in the backward pass, which costs far more than the pass it saves.
 *
 * With bf16 operands on a CPU where `bf16_gemm_kernel()` is avx512_bf16 (see `bf16_gemm_kernel.hpp`) the
 * bias is likewise added by that kernel as it stores the fp32 tile.
 *
 * Numerics: the bias is added in fp32 to the fp32 accumulator, which is the same single rounding as adding
 * it to the stored product, and GeLU is `host::gelu_forward`; without oneDNN (CBLAS, portable) or where
 * oneDNN has no kernel for the types, the operation is the unfused composition `gemm`, `bias_add_forward`,
 * `gelu_forward`.
 */
#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "mpar/backend/host/gemm.hpp"
#include "mpar/backend/host/kernels.hpp"
#include "mpar/core/error.hpp"

namespace mpar::host {

/**
 * @brief Row-major `pre[m, n] = a[m, k] w[k, n] + bias[n]` (bias broadcast over the rows), `y = gelu(pre)`;
 * `a` and `w` fp32, or both bf16/f16 (products accumulated in fp32); `pre` and `y` dense (`ld = n`).
 */
template <class TIn>
  requires mpar::detail::host_gemm_types<TIn, float>
void gemm_bias_gelu(std::size_t m, std::size_t n, std::size_t k, const TIn* a, std::size_t lda, const TIn* w,
                    std::size_t ldw, const float* bias, float* pre, float* y) {
  if (m == 0 || n == 0) return;
  require(bias != nullptr, "gemm_bias_gelu: the bias is required (", m, "x", n, "x", k,
          "); without one, use gemm and gelu_forward");
  require(lda >= k && ldw >= n, "gemm_bias_gelu: leading dimensions lda=", lda, " ldw=", ldw,
          " are too small for m=", m, " n=", n, " k=", k);
  // Row blocks whose `pre` and `y` together fit in a core's L2 cache (about 1 MiB, at least 64 rows): GeLU reads
  // each block's `pre` right after the GEMM wrote it, from cache, instead of from memory after the whole
  // product. The products are the same (each row's dot products do not depend on the rows around it).
  const std::size_t block_rows = std::max<std::size_t>(64, (std::size_t(1) << 17) / n);
  for (std::size_t r = 0; r < m; r += block_rows) {
    const std::size_t rows = std::min(block_rows, m - r);
    const TIn* a_r = a + r * lda;
    float* pre_r = pre + r * n;
    bool fused = false;
    if constexpr (std::is_same_v<TIn, bf16>)
      if (bf16_gemm_kernel() == Bf16GemmKernel::avx512_bf16) {
        detail::avx512_bf16_gemm_entry(false, false, rows, n, k, 1.0f, a_r, lda, w, ldw, 0.0f, pre_r, n,
                                       bias);  // on the store
        fused = true;
      }
#if defined(MPAR_HAVE_ONEDNN)
    if (k > 0 && !fused)
      fused = onednn::gemm_bias<TIn>(false, false, rows, n, k, 1.0f, a_r, lda, w, ldw, 0.0f, bias, pre_r, n);
#endif
    if (!fused) {
      mpar::gemm<TIn, float>(Trans::no, Trans::no, rows, n, k, 1.0f, a_r, lda, w, ldw, 0.0f, pre_r, n);
      bias_add_forward(rows, n, bias, pre_r);
    }
    gelu_forward(rows * n, static_cast<const float*>(pre_r), y + r * n);
  }
}

/** @brief Whether `gemm_bias_gelu` adds the bias inside the GEMM in this build (oneDNN) or after it. */
inline constexpr bool gemm_bias_fused =
#if defined(MPAR_HAVE_ONEDNN)
    true;
#else
    false;
#endif

}  // namespace mpar::host
