#pragma once
/**
 * @file The AdamW update (`host::adamw_update`, optimizer_kernels.hpp) 16 floats at a time with AVX-512,
 * rounding every operation exactly as the scalar loop does.
 *
 * Why: mpar is compiled without `-march`, so the scalar loop runs one element at a time through two
 * divisions, a square root and a third division (and `std::sqrt` keeps errno semantics, which also keeps
 * the compiler from vectorizing it); in a bf16 training step of the GPT benchmark it was 7–8 % of the
 * samples, more than any other non-GEMM kernel. With 512-bit vectors it is bound by memory instead.
 *
 * Why intrinsics and a barrier instead of `with_isa`: the update must equal the scalar loop — and the CUDA
 * kernel, which rounds each product and sum on its own (`__fmul_rn`, `__fadd_rn`) — bit for bit, and
 * GCC contracts a product feeding a sum into one FMA (one rounding instead of two) whenever the target has
 * FMA. `unfused` hides each product from that rewrite (an empty asm that claims to change the register), so
 * every multiply, add, divide and square root is its own IEEE-rounded operation, in the scalar order.
 */
#include <cstddef>

#include "mpar/backend/host/isa.hpp"

#if MPAR_HOST_MULTIVERSION
#include <immintrin.h>
#endif

namespace mpar::host::avx512 {

#if MPAR_HOST_MULTIVERSION
/** `x` unchanged, but opaque to the compiler: a product passed through it is not fused into an FMA. */
[[gnu::target("avx512f"), gnu::always_inline]] inline __m512 unfused(__m512 x) {
  __asm__("" : "+v"(x));
  return x;
}

/**
 * The first `n - n % 16` elements of the scalar AdamW update (same arguments, same expression order:
 * `g' = g s; m = b1 m + (1-b1) g'; v = b2 v + ((1-b2) g') g'; w = w decay - (lr (m / c1)) / (sqrt(v / c2) + eps)`);
 * returns how many it updated. The caller updates the rest with the scalar loop.
 */
[[gnu::target("avx512f")]] inline std::size_t adamw_update_blocks(std::size_t n, float* w, const float* g, float* m,
                                                                  float* v, float beta1, float one_minus_beta1,
                                                                  float beta2, float one_minus_beta2, float eps,
                                                                  float lr, float decay, float bias_correction1,
                                                                  float bias_correction2, float grad_scale) {
  const __m512 s = _mm512_set1_ps(grad_scale), b1 = _mm512_set1_ps(beta1), c1 = _mm512_set1_ps(one_minus_beta1);
  const __m512 b2 = _mm512_set1_ps(beta2), c2 = _mm512_set1_ps(one_minus_beta2), e = _mm512_set1_ps(eps);
  const __m512 rate = _mm512_set1_ps(lr), keep = _mm512_set1_ps(decay);
  const __m512 bc1 = _mm512_set1_ps(bias_correction1), bc2 = _mm512_set1_ps(bias_correction2);
  std::size_t i = 0;
  // (The square root is the masked form with every lane on: GCC 12's plain `_mm512_sqrt_ps` warns about its own
  // undefined pass-through operand under -Wmaybe-uninitialized.)
  for (; i + 16 <= n; i += 16) {
    const __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(g + i), s);
    const __m512 mi = _mm512_add_ps(unfused(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i))), unfused(_mm512_mul_ps(c1, gi)));
    const __m512 vi = _mm512_add_ps(unfused(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i))),
                                    unfused(_mm512_mul_ps(_mm512_mul_ps(c2, gi), gi)));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    const __m512 mhat = _mm512_div_ps(mi, bc1), vhat = _mm512_div_ps(vi, bc2);
    const __m512 step =
        _mm512_div_ps(_mm512_mul_ps(rate, mhat), _mm512_add_ps(_mm512_mask_sqrt_ps(vhat, __mmask16(0xffff), vhat), e));
    _mm512_storeu_ps(w + i, _mm512_sub_ps(unfused(_mm512_mul_ps(_mm512_loadu_ps(w + i), keep)), step));
  }
  return i;
}
#endif

}  // namespace mpar::host::avx512
