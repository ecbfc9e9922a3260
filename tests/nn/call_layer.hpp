#pragma once
// The one place where the reference tests call a layer: forward, backward and the split B / W steps on
// plain [tokens, features] activations. Each call goes through the layer's typed API: the input is stated
// in the layer's declared layout (`default_input`), the output gradient in the gradient layout of its output.
#include <mpar/nn.hpp>

namespace mpar::testing {

/** The layout a layer takes, and the layout of the gradient of what it returns. */
template <class Layer>
using input_layout_t = typename Layer::default_input;
template <class Layer>
using output_grad_layout_t = nn::grad_layout_t<typename Layer::template output_layout<input_layout_t<Layer>>>;

template <class Layer>
nn::Activation forward(Layer& layer, const nn::Activation& x, int mb = 0) {
  return layer.forward(nn::Act<input_layout_t<Layer>>(x), mb).tensor();
}
template <class Layer>
nn::Activation backward(Layer& layer, const nn::Activation& dy, int mb = 0) {
  return layer.backward(nn::Act<output_grad_layout_t<Layer>>(dy), mb).tensor();
}
/** B: the input gradient (a layer whose backward does not split runs its whole backward here). */
template <class Layer>
nn::Activation backward_input(Layer& layer, const nn::Activation& dy, int mb = 0) {
  const nn::Act<output_grad_layout_t<Layer>> g(dy);
  if constexpr (requires { layer.backward_input(g, mb); })
    return layer.backward_input(g, mb).tensor();
  else
    return layer.backward(g, mb).tensor();
}
/** W: the weight gradients (nothing for a layer whose backward does not split). */
template <class Layer>
void backward_weight(Layer& layer, int mb = 0) {
  if constexpr (requires { layer.backward_weight(mb); }) layer.backward_weight(mb);
}

}  // namespace mpar::testing
