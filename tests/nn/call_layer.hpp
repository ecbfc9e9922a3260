#pragma once
// The one place where the reference tests call a layer: forward, backward and the split B / W steps on
// plain [tokens, features] activations. When the layers' activation types change, only this file changes.
#include <mpar/nn.hpp>

namespace mpar::testing {

template <class Layer>
nn::Activation forward(Layer& layer, const nn::Activation& x, int mb = 0) {
  return layer.forward(x, mb);
}
template <class Layer>
nn::Activation backward(Layer& layer, const nn::Activation& dy, int mb = 0) {
  return layer.backward(dy, mb);
}
/** B: the input gradient (a layer whose backward does not split runs its whole backward here). */
template <class Layer>
nn::Activation backward_input(Layer& layer, const nn::Activation& dy, int mb = 0) {
  if constexpr (requires { layer.backward_input(dy, mb); }) return layer.backward_input(dy, mb);
  else return layer.backward(dy, mb);
}
/** W: the weight gradients (nothing for a layer whose backward does not split). */
template <class Layer>
void backward_weight(Layer& layer, int mb = 0) {
  if constexpr (requires { layer.backward_weight(mb); }) layer.backward_weight(mb);
}

}  // namespace mpar::testing
