#pragma once
/**
 * @file The `onednn::matmul_types` concept: the operand types oneDNN's CPU matmul takes.
 */
#include <type_traits>

#include "mpar/core/dtype.hpp"

namespace mpar::host::onednn::detail {

/** @brief Operand types oneDNN's CPU matmul takes here: float x float -> float, bf16/f16 x same -> float. */
template <class TIn, class TOut>
concept matmul_types = std::is_same_v<TOut, float> &&
    (std::is_same_v<TIn, float> || std::is_same_v<TIn, bf16> || std::is_same_v<TIn, f16>);

}  // namespace mpar::host::onednn::detail
