#pragma once
/**
 * @file The GEMM operations (`ops::gemm`, `ops::gemm_strided_batched`, `ops::gemm_bias_gelu`), class templates over
 * their element types, with their host reference (oneDNN, CBLAS or the portable loops, as the build chose). See
 * backend/ops/operation.hpp.
 *
 * A call names its element types and arguments:
 * `B::run(ops::gemm<bf16, float>{.ta = Trans::no, .tb = Trans::yes, .m = m, .n = n, .k = k, .a = x, .lda = k, ...})`
 * (explicitly: deducing them from designated initialisers needs aggregate deduction, which Clang lacks before 17);
 * `alpha` and `beta` default to BLAS's 1 and 0.
 */
#include <cstddef>
#include <type_traits>

#include "mpar/backend/host/buffer_ops.hpp"      // host::gemm_strided_batched
#include "mpar/backend/host/gemm.hpp"            // mpar::gemm, host_gemm_types
#include "mpar/backend/host/gemm_bias_gelu.hpp"  // host::gemm_bias_gelu
#include "mpar/backend/types.hpp"                // Trans, BatchStrides, BatchExtents

namespace mpar::ops {

/** The scalar type of a GEMM over `In`: double for double operands, float otherwise (fp32 accumulation). */
template <class In>
using gemm_scalar = std::conditional_t<std::is_same_v<In, double>, double, float>;

/**
 * Row-major `c = alpha op(a) op(b) + beta c`, op(a) `[m, k]`, op(b) `[k, n]`: A, B and C of one type, or 16-bit A
 * and B with an fp32 C (the mixed-precision product, accumulated in fp32). `c` must not alias `a` or `b`.
 */
template <class In, class Out = In>
struct gemm {
  /** Same-type and mixed products are told apart in counts and errors. */
  static constexpr const char* name = std::is_same_v<In, Out> ? "gemm" : "gemm_mixed";
  Trans ta = Trans::no, tb = Trans::no;
  std::size_t m = 0, n = 0, k = 0;
  gemm_scalar<In> alpha = 1;
  const In* a = nullptr;
  std::size_t lda = 0;
  const In* b = nullptr;
  std::size_t ldb = 0;
  gemm_scalar<In> beta = 0;
  Out* c = nullptr;
  std::size_t ldc = 0;
  template <class F>
  void each_operand(F&& f) {
    f(a), f(b), f(c);
  }
};

/**
 * `batch.outer x batch.inner` GEMMs as `gemm`'s, entry (i, j) of operand X at `x + i * stride_x.outer + j *
 * stride_x.inner`: attention's (sequence, head) pairs in one operation; a one-level batch is `{0, stride}` and
 * `{1, count}`.
 */
template <class In, class Out = In>
struct gemm_strided_batched {
  static constexpr const char* name = "gemm_strided_batched";
  Trans ta = Trans::no, tb = Trans::no;
  std::size_t m = 0, n = 0, k = 0;
  gemm_scalar<In> alpha = 1;
  const In* a = nullptr;
  std::size_t lda = 0;
  BatchStrides stride_a{};
  const In* b = nullptr;
  std::size_t ldb = 0;
  BatchStrides stride_b{};
  gemm_scalar<In> beta = 0;
  Out* c = nullptr;
  std::size_t ldc = 0;
  BatchStrides stride_c{};
  BatchExtents batch{};
  template <class F>
  void each_operand(F&& f) {
    f(a), f(b), f(c);
  }
};

/**
 * The MLP's first projection with its epilogue: `pre[m, n] = a[m, k] w[k, n] + bias[n]`, `y = gelu(pre)` (tanh
 * form); `a` and `w` fp32 or both 16-bit (fp32 accumulation); `pre` and `y` dense. `pre` is kept for GeLU's backward.
 */
template <class In>
struct gemm_bias_gelu {
  static constexpr const char* name = "gemm_bias_gelu";
  std::size_t m = 0, n = 0, k = 0;
  const In* a = nullptr;
  std::size_t lda = 0;
  const In* w = nullptr;
  std::size_t ldw = 0;
  const float* bias = nullptr;
  float* pre = nullptr;
  float* y = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(a), f(w), f(bias), f(pre), f(y);
  }
};

template <class In, class Out>
  requires mpar::detail::host_gemm_types<In, Out>
void host_reference(const gemm<In, Out>& op) {
  mpar::gemm<In, Out>(op.ta, op.tb, op.m, op.n, op.k, op.alpha, op.a, op.lda, op.b, op.ldb, op.beta, op.c, op.ldc);
}

template <class In, class Out>
  requires mpar::detail::host_gemm_types<In, Out>
void host_reference(const gemm_strided_batched<In, Out>& op) {
  host::gemm_strided_batched<In, Out>(op.ta, op.tb, op.m, op.n, op.k, op.alpha, op.a, op.lda, op.stride_a, op.b, op.ldb,
                                      op.stride_b, op.beta, op.c, op.ldc, op.stride_c, op.batch);
}

template <class In>
  requires mpar::detail::host_gemm_types<In, float>
void host_reference(const gemm_bias_gelu<In>& op) {
  host::gemm_bias_gelu<In>(op.m, op.n, op.k, op.a, op.lda, op.w, op.ldw, op.bias, op.pre, op.y);
}

}  // namespace mpar::ops
