#pragma once
/**
 * @file The executor's untyped calls of a pipeline part (internal): raw boundary buffers in and out.
 */
#include <utility>

#include "mpar/nn/activation.hpp"
#include "mpar/pipeline/detail/has_loss_layout.hpp"
#include "mpar/pipeline/detail/split_backward_part.hpp"
#include "mpar/pipeline/loss_fn.hpp"
#include "mpar/pipeline/pipeline_part.hpp"

namespace mpar::pipeline {

namespace detail {
/**
 * The executor's untyped entries (internal): raw boundary buffers in and out. Each states the layout the
 * stage declares for that boundary, calls the stage's typed API and gives the storage back to be sent.
 * `last`: the stage is the pipeline's last, whose output goes to the loss.
 */
template <pipeline_part S>
Boundary forward(S& s, Boundary& x, int mb, bool last) {
  // The storage moves into the typed input and back into `x` after the call: no copy.
  nn::Act<input_layout_t<S>> in(std::move(x));
  Boundary y = [&] {
    if constexpr (detail::has_loss_layout<S>) {
      if (last) return s.forward_to_loss(in, mb).tensor();
    }
    return s.forward(in, mb).tensor();
  }();
  x = std::move(in).tensor();
  return y;
}
/** Calls `f` with the output gradient `dy` in the layout the stage's output has at this boundary. */
template <pipeline_part S, class F>
Boundary with_output_gradient(Boundary dy, bool last, F&& f) {
  if constexpr (detail::has_loss_layout<S>) {
    if (last) return std::forward<F>(f)(nn::Act<nn::grad_layout_t<loss_layout_t<S>>>(std::move(dy))).tensor();
  }
  return std::forward<F>(f)(nn::Act<nn::grad_layout_t<output_layout_t<S>>>(std::move(dy))).tensor();
}
template <pipeline_part S>
Boundary backward(S& s, Boundary dy, int mb, bool last) {
  return with_output_gradient<S>(std::move(dy), last, [&](const auto& g) { return s.backward(g, mb); });
}
template <detail::split_backward_part S>
Boundary backward_input(S& s, Boundary dy, int mb, bool last) {
  return with_output_gradient<S>(std::move(dy), last, [&](const auto& g) { return s.backward_input(g, mb); });
}
/** The loss on the last stage's output, typed in `loss_layout_t<S>`; returns its value and writes dL/dy. */
template <pipeline_part S>
double loss(const LossFn<loss_layout_t<S>>& fn, Boundary y, int mb, Boundary& dy) {
  using L = loss_layout_t<S>;
  nn::Act<L> yt(std::move(y));
  nn::Act<nn::grad_layout_t<L>> dyt(Boundary(yt.shape(), uninitialized));  // the loss function replaces it whole
  const double l = fn(yt, mb, dyt);
  dy = std::move(dyt).tensor();
  return l;
}
}  // namespace detail

}  // namespace mpar::pipeline
