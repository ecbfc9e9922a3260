#pragma once
/**
 * @file The `host_gemm_types` concept: the operand types of the host GEMM.
 */
#include <type_traits>

#include "mpar/core/detail/half_precision.hpp"

namespace mpar::detail {

/** @brief Operand types of the host GEMM: A, B, C all float or all double, or bf16/f16 A and B with a float C. */
template <class TIn, class TOut>
concept host_gemm_types = (std::is_same_v<TIn, TOut> && (std::is_same_v<TIn, float> || std::is_same_v<TIn, double>)) ||
                          (detail::half_precision<TIn> && std::is_same_v<TOut, float>);

}  // namespace mpar::detail
