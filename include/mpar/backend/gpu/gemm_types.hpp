#pragma once
/**
 * @file The `gpu::gemm_types` concept: the GEMM operand types the device supports.
 */
#include <type_traits>

#include "mpar/core/element_type.hpp"
#include "mpar/core/half_precision.hpp"

namespace mpar::gpu {

/** @brief GEMM input/output types the device supports: same-type float/double, or 16-bit inputs with 16-bit or fp32 output. */
template <class TIn, class TOut>
concept gemm_types = (std::is_same_v<TIn, TOut> && element_type<TIn>) ||
                     (half_precision<TIn> && std::is_same_v<TOut, float>);

}  // namespace mpar::gpu
