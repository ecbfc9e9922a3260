#pragma once
/**
 * @file The `droppable_module` concept: a module that frees a micro-batch's saved activations on request.
 */

namespace mpar::nn::detail {

/** @brief A module that can free a micro-batch's saved activations early (`drop(mb)`), which recomputation needs. */
template <class M>
concept droppable_module = requires(M& m, int mb) {
  m.drop(mb);
};

}  // namespace mpar::nn::detail
