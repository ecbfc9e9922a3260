#pragma once
/**
 * @file Device GEMM through cuBLAS and cuBLASLt with mpar's row-major interface.
 *
 * Row-major `C[m x n] = alpha * op(A) * op(B) + beta * C` is, read column-major, `C^T = op(B)^T op(A)^T`;
 * so every call swaps the operands and keeps the transpose flags, and no data is transposed.
 * 16-bit inputs (bf16, f16) run on tensor cores with fp32 accumulation; C may be 16-bit or fp32
 * (fp32 C is how gradients are accumulated in full precision). fp32 inputs stay true fp32.
 */
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "mpar/backend/gpu/context.hpp"
#include "mpar/backend/gpu/cuda_error.hpp"
#include "mpar/backend/gpu/detail/gemm_types.hpp"
#include "mpar/backend/gpu/element_types.hpp"
#include "mpar/backend/gpu/runtime.hpp"  // cuBLAS and cuBLASLt, or their emulation
#include "mpar/backend/host/gemm.hpp"    // mpar::Trans

namespace mpar::gpu {

/** The scalar type of alpha and beta: double for double GEMMs, float otherwise. */
template <class TIn>
using gemm_scalar_t = std::conditional_t<std::is_same_v<TIn, double>, double, float>;

namespace detail {
inline cublasOperation_t op_of(Trans t) { return t == Trans::no ? CUBLAS_OP_N : CUBLAS_OP_T; }
template <class TIn>
inline cublasComputeType_t compute_of() {
  return std::is_same_v<TIn, double> ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
}
inline void check_gemm_dims(const char* what, Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k,
                            std::size_t lda, std::size_t ldb, std::size_t ldc) {
  const std::size_t a_cols = ta == Trans::no ? k : m, b_cols = tb == Trans::no ? n : k;
  require(lda >= a_cols && ldb >= b_cols && ldc >= n, what, ": leading dimensions lda=", lda, " ldb=", ldb,
          " ldc=", ldc, " are too small for m=", m, " n=", n, " k=", k, " (row-major, ld >= the stored row length)");
  require(m <= std::size_t(INT32_MAX) && n <= std::size_t(INT32_MAX) && k <= std::size_t(INT32_MAX), what,
          ": sizes m=", m, " n=", n, " k=", k, " exceed cuBLAS's 32-bit limit");
}
}  // namespace detail

/**
 * @brief Row-major device GEMM on `stream` (the thread's compute stream by default):
 * `C = alpha * op(A) * op(B) + beta * C`; all pointers are device pointers, leading dimensions in elements.
 */
template <class TIn, class TOut = TIn>
void gemm(Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, gemm_scalar_t<TIn> alpha, const TIn* a,
          std::size_t lda, const TIn* b, std::size_t ldb, gemm_scalar_t<TIn> beta, TOut* c, std::size_t ldc,
          cudaStream_t stream = nullptr) {
  static_assert(detail::gemm_types<TIn, TOut>,
                "gpu::gemm: supported are A, B, C of one type (float, double, bf16, f16), or bf16/f16 A and B "
                "with a float C (fp32 accumulation); convert other operands first with gpu::convert");
  if (m == 0 || n == 0) return;
  detail::check_gemm_dims("gpu::gemm", ta, tb, m, n, k, lda, ldb, ldc);
  cublasHandle_t h = this_thread().blas(stream);
  check(cublasGemmEx(h, detail::op_of(tb), detail::op_of(ta), int(n), int(m), int(k), &alpha, b, cuda_data_type_v<TIn>,
                     int(ldb), a, cuda_data_type_v<TIn>, int(lda), &beta, c, cuda_data_type_v<TOut>, int(ldc),
                     detail::compute_of<TIn>(), CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
}

/**
 * @brief `batch` independent row-major GEMMs whose operands sit at fixed element strides
 * (attention's per-head products): `C_i = alpha * op(A_i) * op(B_i) + beta * C_i`.
 */
template <class TIn, class TOut = TIn>
void gemm_strided_batched(Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, gemm_scalar_t<TIn> alpha,
                          const TIn* a, std::size_t lda, std::int64_t stride_a, const TIn* b, std::size_t ldb,
                          std::int64_t stride_b, gemm_scalar_t<TIn> beta, TOut* c, std::size_t ldc,
                          std::int64_t stride_c, std::size_t batch, cudaStream_t stream = nullptr) {
  static_assert(
      detail::gemm_types<TIn, TOut>,
      "gpu::gemm_strided_batched: supported are A, B, C of one type (float, double, bf16, f16), or bf16/f16 A and B "
      "with a float C (fp32 accumulation); convert other operands first with gpu::convert");
  if (m == 0 || n == 0 || batch == 0) return;
  detail::check_gemm_dims("gpu::gemm_strided_batched", ta, tb, m, n, k, lda, ldb, ldc);
  check(cublasGemmStridedBatchedEx(this_thread().blas(stream), detail::op_of(tb), detail::op_of(ta), int(n), int(m),
                                   int(k), &alpha, b, cuda_data_type_v<TIn>, int(ldb), stride_b, a,
                                   cuda_data_type_v<TIn>, int(lda), stride_a, &beta, c, cuda_data_type_v<TOut>,
                                   int(ldc), stride_c, int(batch), detail::compute_of<TIn>(), CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx");
}

/** @brief What cuBLASLt applies to the product before storing C. */
enum class Epilogue {
  none,       ///< C = alpha op(A) op(B) + beta C
  bias,       ///< ... + bias[col]
  gelu_bias,  ///< gelu(... + bias[col]); with an `aux` buffer the pre-activation is stored there for backward
};

namespace detail {
/** Destroys cuBLASLt descriptors at scope exit, so an exception between create and use leaks nothing. */
struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  LtDescriptors() = default;
  LtDescriptors(const LtDescriptors&) = delete;
  LtDescriptors& operator=(const LtDescriptors&) = delete;
  ~LtDescriptors() {
    if (pref) (void)cublasLtMatmulPreferenceDestroy(pref);
    if (c) (void)cublasLtMatrixLayoutDestroy(c);
    if (b) (void)cublasLtMatrixLayoutDestroy(b);
    if (a) (void)cublasLtMatrixLayoutDestroy(a);
    if (op) (void)cublasLtMatmulDescDestroy(op);
  }
};
inline const char* epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::none:
      return "none";
    case Epilogue::bias:
      return "bias";
    case Epilogue::gelu_bias:
      return "gelu_bias";
  }
  return "?";
}
}  // namespace detail

/**
 * @brief Row-major GEMM through cuBLASLt with a fused epilogue: bias (length n, one per column of C)
 * and GeLU applied before C is written, saving a full read and write of C per fused op.
 *
 * `aux` (row-major `[m, n]`, leading dimension `ldaux`, a multiple of 8) receives the pre-GeLU values
 * for `Epilogue::gelu_bias` when not null. Throws cuda_error naming shapes, types and epilogue if
 * cuBLASLt has no kernel for the combination.
 */
template <class TIn, class TOut = TIn>
void gemm_lt(Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const TIn* a,
             std::size_t lda, const TIn* b, std::size_t ldb, float beta, TOut* c, std::size_t ldc,
             Epilogue epilogue = Epilogue::none, const TOut* bias = nullptr, TOut* aux = nullptr, std::size_t ldaux = 0,
             cudaStream_t stream = nullptr) {
  static_assert(detail::gemm_types<TIn, TOut> && !std::is_same_v<TIn, double>,
                "gpu::gemm_lt: cuBLASLt epilogues take float, bf16 or f16 A and B with C of the same type, or "
                "bf16/f16 A and B with a float C; use gpu::gemm for double");
  if (m == 0 || n == 0) return;
  detail::check_gemm_dims("gpu::gemm_lt", ta, tb, m, n, k, lda, ldb, ldc);
  require(epilogue == Epilogue::none || bias != nullptr, "gpu::gemm_lt: epilogue ", detail::epilogue_name(epilogue),
          " needs a bias pointer");
  require(aux == nullptr || (epilogue == Epilogue::gelu_bias && ldaux >= n && ldaux % 8 == 0),
          "gpu::gemm_lt: an aux buffer needs Epilogue::gelu_bias and ldaux >= n (", n, ") a multiple of 8, got ",
          ldaux);
  ThreadContext& ctx = this_thread();
  if (!stream) stream = ctx.stream();
  detail::LtDescriptors d;
  check(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  // Column-major view: the Lt "A" operand is our B and the Lt "B" operand is our A (see the file comment).
  const cublasOperation_t opa = detail::op_of(tb), opb = detail::op_of(ta);
  check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa), "Lt TRANSA");
  check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb), "Lt TRANSB");
  cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_DEFAULT;
  if (epilogue == Epilogue::bias) ep = CUBLASLT_EPILOGUE_BIAS;
  if (epilogue == Epilogue::gelu_bias) ep = aux ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
  check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep), "Lt EPILOGUE");
  if (bias) {
    const cudaDataType_t bt = cuda_data_type_v<TOut>;
    check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
          "Lt BIAS_POINTER");
    check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt),
          "Lt BIAS_DATA_TYPE");
  }
  if (aux) {
    const std::int64_t ld = std::int64_t(ldaux);
    check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux),
          "Lt EPILOGUE_AUX_POINTER");
    check(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld),
          "Lt EPILOGUE_AUX_LD");
  }
  const cudaDataType_t ti = cuda_data_type_v<TIn>, to = cuda_data_type_v<TOut>;
  check(cublasLtMatrixLayoutCreate(&d.a, ti, tb == Trans::no ? n : k, tb == Trans::no ? k : n, std::int64_t(ldb)),
        "cublasLtMatrixLayoutCreate(B)");
  check(cublasLtMatrixLayoutCreate(&d.b, ti, ta == Trans::no ? k : m, ta == Trans::no ? m : k, std::int64_t(lda)),
        "cublasLtMatrixLayoutCreate(A)");
  check(cublasLtMatrixLayoutCreate(&d.c, to, n, m, std::int64_t(ldc)), "cublasLtMatrixLayoutCreate(C)");
  check(cublasLtMatmulPreferenceCreate(&d.pref), "cublasLtMatmulPreferenceCreate");
  const std::size_t ws = ThreadContext::lt_workspace_bytes;
  check(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
        "Lt MAX_WORKSPACE_BYTES");
  cublasLtMatmulHeuristicResult_t heur{};
  int found = 0;
  const cublasStatus_t hs =
      cublasLtMatmulAlgoGetHeuristic(ctx.lt(), d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heur, &found);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0)
    throw cuda_error(mpar::detail::cat(
        "gpu::gemm_lt: cuBLASLt has no kernel for ", dtype_name_v<TIn>, " x ", dtype_name_v<TIn>, " -> ",
        dtype_name_v<TOut>, " m=", m, " n=", n, " k=", k, " ta=", ta == Trans::yes, " tb=", tb == Trans::yes,
        " epilogue=", detail::epilogue_name(epilogue), "; use Epilogue::none and a separate bias/GeLU kernel"));
  check(cublasLtMatmul(ctx.lt(), d.op, &alpha, b, d.a, a, d.b, &beta, c, d.c, c, d.c, &heur.algo, ctx.lt_workspace(),
                       ws, stream),
        "cublasLtMatmul");
}

}  // namespace mpar::gpu
