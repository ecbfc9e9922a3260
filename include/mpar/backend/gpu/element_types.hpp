#pragma once
/**
 * @file mpar's element types on the device: conversions to and from float, and their CUDA data-type tags.
 *
 * mpar::bf16 and mpar::f16 are 16-bit storage structs with the same bit layout as __nv_bfloat16 and
 * __half, so device buffers of either are interchangeable; these helpers convert with the same
 * round-to-nearest-even rule as the host types, so host and device agree bit-for-bit.
 */
#include <type_traits>

#include "mpar/backend/gpu/runtime.hpp"  // cuda_bf16.h, cuda_fp16.h, library_types.h (or their emulation)
#include "mpar/core/dtype.hpp"

namespace mpar::gpu {

static_assert(sizeof(bf16) == sizeof(__nv_bfloat16) && sizeof(f16) == sizeof(__half),
              "mpar::bf16/f16 must have the layout of CUDA's 16-bit types");

/** Widens an element to its compute type (float for 16-bit types). */
__host__ __device__ inline float to_compute(float v) { return v; }
__host__ __device__ inline double to_compute(double v) { return v; }
__host__ __device__ inline float to_compute(bf16 v) { return __bfloat162float(__ushort_as_bfloat16(v.bits)); }
__host__ __device__ inline float to_compute(f16 v) { return __half2float(__ushort_as_half(v.bits)); }

/** Narrows a compute value to element type `T`, rounding to nearest even as the host types do. */
template <class T>
__host__ __device__ inline T from_compute(compute_type_t<T> v) {
  if constexpr (std::is_same_v<T, bf16>)
    return bf16::from_bits(__bfloat16_as_ushort(__float2bfloat16_rn(v)));
  else if constexpr (std::is_same_v<T, f16>)
    return f16::from_bits(__half_as_ushort(__float2half_rn(v)));
  else
    return v;
}

/** @brief The cudaDataType_t of an element type, used by cuBLAS and cuBLASLt descriptors. */
template <class T>
inline constexpr cudaDataType_t cuda_data_type_v = std::is_same_v<T, float>    ? CUDA_R_32F
                                                   : std::is_same_v<T, double> ? CUDA_R_64F
                                                   : std::is_same_v<T, bf16>   ? CUDA_R_16BF
                                                                               : CUDA_R_16F;

}  // namespace mpar::gpu
