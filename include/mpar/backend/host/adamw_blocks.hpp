#pragma once
/**
 * @file The AdamW update (`host::adamw_update`, optimizer_kernels.hpp) a vector at a time — 16 floats with
 * AVX-512, 8 with AVX2, 4 with the SSE2 every x86-64 has — rounding every operation exactly as the scalar
 * loop does.
 *
 * Why: mpar is compiled without `-march`, so the scalar loop runs one element at a time through two
 * divisions, a square root and a third division (and `std::sqrt` keeps errno semantics, which also keeps
 * the compiler from vectorizing it); in a bf16 training step of the GPT benchmark it was 7–8 % of the
 * samples, more than any other non-GEMM kernel. With vectors it is bound by memory instead.
 *
 * Why explicit vectors and a barrier instead of `with_isa`: the update must equal the scalar loop — and the
 * CUDA kernel, which rounds each product and sum on its own (`__fmul_rn`, `__fadd_rn`) — bit for bit, and
 * GCC contracts a product feeding a sum into one FMA (one rounding instead of two) whenever the target has
 * FMA. `unfused` hides each product from that rewrite (an empty asm that claims to change the register), so
 * every multiply, add, divide and square root is its own IEEE-rounded operation, in the scalar order.
 *
 * Why GCC vector types and one line of asm instead of <immintrin.h>: this header is part of the umbrella,
 * and <immintrin.h> alone costs a quarter of the standard library's parse time (bench/compile_cost). The
 * arithmetic operators on a vector type are the level's instructions; the square root, which has no
 * operator, is `sqrtps` / `vsqrtps` (correctly rounded, as `std::sqrt`).
 *
 * One body serves the three levels: `adamw_blocks_body` is inlined into a function with the level's
 * `target` attribute, where its vector operations become that level's instructions.
 */
#include <cstddef>
#include <cstring>

#include "mpar/backend/host/isa.hpp"

namespace mpar::host::vectorized {

#if MPAR_HOST_MULTIVERSION
/** Four, eight and sixteen floats in one SSE, AVX or AVX-512 register. */
typedef float Floats4 __attribute__((vector_size(16)));
typedef float Floats8 __attribute__((vector_size(32)));
typedef float Floats16 __attribute__((vector_size(64)));

/** One AdamW update's operands and scalars, as `adamw_update` passes them (`one_minus_*` computed once). */
struct AdamwOperands {
  std::size_t n;
  float* w;
  const float* g;
  float* m;
  float* v;
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, lr, decay, bias_correction1, bias_correction2, grad_scale;
};

/**
 * The first `n - n % lanes` elements of the scalar AdamW update, `lanes` the floats in `V` (same expression
 * order: `g' = g s; m = b1 m + (1-b1) g'; v = b2 v + ((1-b2) g') g'; w = w decay - (lr (m / c1)) / (sqrt(v / c2)
 * + eps)`); returns how many it updated. Only inlined, into the level's function below: its vector locals are
 * that level's registers.
 */
template <class V>
[[gnu::always_inline]] inline std::size_t adamw_blocks_body(const AdamwOperands& a) {
  // No helper functions: a function taking or returning `V` outside the level's target changes the ABI
  // (-Wpsabi), and a lambda is not inlined at -O0; the body alone is inlined into the level's function.
  constexpr std::size_t lanes = sizeof(V) / sizeof(float);
  V s, b1, c1, b2, c2, e, rate, keep, bc1, bc2;
  for (std::size_t lane = 0; lane < lanes; ++lane) {
    s[lane] = a.grad_scale, b1[lane] = a.beta1, c1[lane] = a.one_minus_beta1, b2[lane] = a.beta2;
    c2[lane] = a.one_minus_beta2, e[lane] = a.eps, rate[lane] = a.lr, keep[lane] = a.decay;
    bc1[lane] = a.bias_correction1, bc2[lane] = a.bias_correction2;
  }
  std::size_t i = 0;
  for (; i + lanes <= a.n; i += lanes) {
    V gi, mi, vi, wi;  // unaligned loads and stores: one (v)movups each
    std::memcpy(&gi, a.g + i, sizeof gi);
    std::memcpy(&mi, a.m + i, sizeof mi);
    std::memcpy(&vi, a.v + i, sizeof vi);
    std::memcpy(&wi, a.w + i, sizeof wi);
    gi = gi * s;
    // Each product passes an empty asm that claims to change it: opaque to the compiler, it is not fused
    // with the sum it feeds into an FMA.
    V m1 = b1 * mi, m2 = c1 * gi, v1 = b2 * vi, v2 = c2 * gi;
    __asm__("" : "+v"(m1), "+v"(m2), "+v"(v1), "+v"(v2));
    v2 = v2 * gi;
    __asm__("" : "+v"(v2));
    mi = m1 + m2;
    vi = v1 + v2;
    const V mhat = mi / bc1, vhat = vi / bc2;
    V root, scaled = rate * mhat, kept = wi * keep;
    __asm__("" : "+v"(scaled), "+v"(kept));
    if constexpr (lanes == 4)
      __asm__("sqrtps %1, %0" : "=x"(root) : "x"(vhat));
    else
      __asm__("vsqrtps %1, %0" : "=v"(root) : "v"(vhat));
    wi = kept - scaled / (root + e);
    std::memcpy(a.m + i, &mi, sizeof mi);
    std::memcpy(a.v + i, &vi, sizeof vi);
    std::memcpy(a.w + i, &wi, sizeof wi);
  }
  return i;
}

/** `adamw_blocks_body` 16 floats at a time (AVX-512). */
[[gnu::target("avx512f")]] inline std::size_t adamw_blocks_avx512(const AdamwOperands& a) {
  return adamw_blocks_body<Floats16>(a);
}
/** `adamw_blocks_body` 8 floats at a time (AVX2 machines have FMA, which `unfused` keeps out). */
[[gnu::target("avx2,fma")]] inline std::size_t adamw_blocks_avx2(const AdamwOperands& a) {
  return adamw_blocks_body<Floats8>(a);
}
/** `adamw_blocks_body` 4 floats at a time (SSE2, every x86-64). */
inline std::size_t adamw_blocks_baseline(const AdamwOperands& a) { return adamw_blocks_body<Floats4>(a); }

/** The first `n - n % lanes` elements at the calling thread's level (`active_isa`); returns how many. */
inline std::size_t adamw_update_blocks(const AdamwOperands& a) {
  switch (active_isa()) {
    case Isa::avx512:
      return adamw_blocks_avx512(a);
    case Isa::avx2:
      return adamw_blocks_avx2(a);
    case Isa::baseline:
      break;
  }
  return adamw_blocks_baseline(a);
}
#endif

}  // namespace mpar::host::vectorized
