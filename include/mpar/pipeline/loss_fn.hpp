#pragma once
/**
 * @file `LossFn<L>`: the loss the last pipeline part's output goes to.
 */
#include <functional>

#include "mpar/nn/activation.hpp"

namespace mpar::pipeline {

/**
 * @brief The loss the last stage's output goes to: the mean loss of micro-batch `mb` from the typed output
 * `y` (layout `L`, the stage's `loss_layout_t`); it writes dL/dy, of y's shape, into `dy`.
 */
template <class L>
using LossFn = std::function<double(const nn::Act<L>& y, int mb, nn::Act<nn::grad_layout_t<L>>& dy)>;

}  // namespace mpar::pipeline
