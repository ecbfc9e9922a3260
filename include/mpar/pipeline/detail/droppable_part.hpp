#pragma once
/**
 * @file The `droppable_part` concept: a pipeline part that frees a micro-batch's saved activations.
 */
#include "mpar/nn/detail/droppable_module.hpp"
#include "mpar/pipeline/pipeline_part.hpp"

namespace mpar::pipeline::detail {

/** @brief A stage that can free a micro-batch's saved activations (`nn::droppable_module`), which recomputation needs. */
template <class S>
concept droppable_part = pipeline_part<S> && mpar::nn::detail::droppable_module<S>;

}  // namespace mpar::pipeline::detail
