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
 * Why explicit vectors and a barrier instead of `with_isa`: the update must equal the scalar loop — and the
 * CUDA kernel, which rounds each product and sum on its own (`__fmul_rn`, `__fadd_rn`) — bit for bit, and
 * GCC contracts a product feeding a sum into one FMA (one rounding instead of two) whenever the target has
 * FMA. `unfused` hides each product from that rewrite (an empty asm that claims to change the register), so
 * every multiply, add, divide and square root is its own IEEE-rounded operation, in the scalar order.
 *
 * Why GCC vector types and one line of asm instead of <immintrin.h>: this header is part of the umbrella,
 * and <immintrin.h> alone costs a quarter of the standard library's parse time (bench/compile_cost). The
 * arithmetic operators on a 16-float vector type are the AVX-512 instructions; the square root, which has
 * no operator, is `vsqrtps` (correctly rounded, as `std::sqrt`).
 */
#include <cstddef>
#include <cstring>

#include "mpar/backend/host/isa.hpp"

namespace mpar::host::avx512 {

#if MPAR_HOST_MULTIVERSION
/** Sixteen floats in one 512-bit register. */
typedef float Floats16 __attribute__((vector_size(64)));

[[gnu::target("avx512f"), gnu::always_inline]] inline Floats16 splat(float x) {
  Floats16 r;
  for (int lane = 0; lane < 16; ++lane) r[lane] = x;
  return r;
}
[[gnu::target("avx512f"), gnu::always_inline]] inline Floats16 load(const float* p) {
  Floats16 r;
  std::memcpy(&r, p, sizeof r);  // unaligned: one vmovups
  return r;
}
[[gnu::target("avx512f"), gnu::always_inline]] inline void store(float* p, Floats16 x) { std::memcpy(p, &x, sizeof x); }
/** `x` unchanged, but opaque to the compiler: a product passed through it is not fused into an FMA. */
[[gnu::target("avx512f"), gnu::always_inline]] inline Floats16 unfused(Floats16 x) {
  __asm__("" : "+v"(x));
  return x;
}
[[gnu::target("avx512f"), gnu::always_inline]] inline Floats16 square_root(Floats16 x) {
  Floats16 r;
  __asm__("vsqrtps %1, %0" : "=v"(r) : "v"(x));
  return r;
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
  const Floats16 s = splat(grad_scale), b1 = splat(beta1), c1 = splat(one_minus_beta1);
  const Floats16 b2 = splat(beta2), c2 = splat(one_minus_beta2), e = splat(eps);
  const Floats16 rate = splat(lr), keep = splat(decay);
  const Floats16 bc1 = splat(bias_correction1), bc2 = splat(bias_correction2);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const Floats16 gi = load(g + i) * s;
    const Floats16 mi = unfused(b1 * load(m + i)) + unfused(c1 * gi);
    const Floats16 vi = unfused(b2 * load(v + i)) + unfused(unfused(c2 * gi) * gi);
    store(m + i, mi);
    store(v + i, vi);
    const Floats16 mhat = mi / bc1, vhat = vi / bc2;
    const Floats16 step = unfused(rate * mhat) / (square_root(vhat) + e);
    store(w + i, unfused(load(w + i) * keep) - step);
  }
  return i;
}
#endif

}  // namespace mpar::host::avx512
