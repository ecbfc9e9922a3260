#pragma once
/**
 * @file The `has_loss_layout` concept: a pipeline part that returns another layout to the loss than to the
 * next part.
 */

namespace mpar::pipeline::detail {

/** @brief Whether a stage returns a different layout to the loss than to the next stage (`S::loss_layout`). */
template <class S>
concept has_loss_layout = requires {
  typename S::loss_layout;
};

}  // namespace mpar::pipeline::detail
