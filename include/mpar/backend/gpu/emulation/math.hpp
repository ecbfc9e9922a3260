#pragma once
/**
 * @file The device math intrinsics mpar's kernels call, under the emulation: `rsqrtf` and the explicitly rounded
 * `__fadd_rn`-family. The rounded forms keep each operation separately rounded on the host as on the device: the
 * empty asm makes the product opaque, so g++ cannot contract a multiply and an add into one FMA.
 */
#include <math.h>  // expf, logf, fmaxf, pow, sqrt, isfinite in the global namespace, as device code calls them

#include <cmath>

namespace mpar::gpu::emulation::detail {
inline float rounded(float v) {
#if defined(__x86_64__)
  asm("" : "+x"(v));
#else
  volatile float keep = v;
  v = keep;
#endif
  return v;
}
}  // namespace mpar::gpu::emulation::detail

inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __fadd_rn(float a, float b) { return ::mpar::gpu::emulation::detail::rounded(a + b); }
inline float __fsub_rn(float a, float b) { return ::mpar::gpu::emulation::detail::rounded(a - b); }
inline float __fmul_rn(float a, float b) { return ::mpar::gpu::emulation::detail::rounded(a * b); }
inline float __fdiv_rn(float a, float b) { return ::mpar::gpu::emulation::detail::rounded(a / b); }
inline float __fsqrt_rn(float a) { return ::mpar::gpu::emulation::detail::rounded(std::sqrt(a)); }
