#pragma once
/**
 * @file The `gpu::gemm_types` concept: the GEMM operand types the device supports.
 */
#include <type_traits>

#include "mpar/core/detail/element_type.hpp"
#include "mpar/core/detail/half_precision.hpp"

namespace mpar::gpu::detail {

/** @brief GEMM input/output types the device supports: same-type float/double, or 16-bit inputs with 16-bit or fp32 output. */
template <class TIn, class TOut>
concept gemm_types = (std::is_same_v<TIn, TOut> && mpar::detail::element_type<TIn>) ||
                     (mpar::detail::half_precision<TIn> && std::is_same_v<TOut, float>);

}  // namespace mpar::gpu::detail
