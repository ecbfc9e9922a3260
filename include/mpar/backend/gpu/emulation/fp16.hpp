#pragma once
/**
 * @file CUDA's 16-bit float types and their conversions under the emulation (cuda_bf16.h, cuda_fp16.h): the bits
 * of `__nv_bfloat16` and `__half`, converted by mpar's host types (round to nearest even), which is what the
 * device's `_rn` conversions do.
 */
#include <cstdint>

#include "mpar/core/dtype.hpp"

struct __nv_bfloat16 {
  std::uint16_t bits;
};
struct __half {
  std::uint16_t bits;
};

inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) { return {b}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 v) { return v.bits; }
inline float __bfloat162float(__nv_bfloat16 v) { return float(::mpar::bf16::from_bits(v.bits)); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {::mpar::bf16(f).bits}; }

inline __half __ushort_as_half(unsigned short b) { return {b}; }
inline unsigned short __half_as_ushort(__half v) { return v.bits; }
inline float __half2float(__half v) { return float(::mpar::f16::from_bits(v.bits)); }
inline __half __float2half_rn(float f) { return {::mpar::f16(f).bits}; }
