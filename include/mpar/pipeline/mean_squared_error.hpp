#pragma once
/**
 * @file `mean_squared_error(targets)`: the regression loss as the executor's `LossFn`, so a program training its own
 * model hands the executor its targets instead of writing the loss's gradient by hand.
 */
#include <cstddef>
#include <span>

#include "mpar/core/error.hpp"
#include "mpar/core/layout.hpp"
#include "mpar/nn/activation.hpp"
#include "mpar/pipeline/loss_fn.hpp"

namespace mpar::pipeline {

/**
 * @brief The mean squared error of the last stage's replicated output against `targets[mb]`, as the executor's loss:
 * L = Σ (y - t)² / n over the micro-batch's n elements, and dL/dy = 2 (y - t) / n (the executor then scales it by
 * 1/M, so the gradients are those of the mean over the step's micro-batches). Reads and writes host memory (stages
 * over `HostBackend`). `targets` is viewed, not copied: it must outlive the returned function. A micro-batch without
 * a target, or one of another shape, throws naming both.
 */
[[nodiscard]] inline LossFn<Replicate> mean_squared_error(std::span<const nn::Activation> targets) {
  return [targets](const nn::Act<Replicate>& y, int mb, nn::Act<Replicate>& dy) {
    require(mb >= 0 && std::size_t(mb) < targets.size(), "pipeline::mean_squared_error: micro-batch ", mb,
            " has no target (", targets.size(), " given)");
    const nn::Activation& t = targets[std::size_t(mb)];
    require(t.shape() == y.tensor().shape(), "pipeline::mean_squared_error: micro-batch ", mb, "'s output is ",
            y.extent(0), "x", y.extent(1), " but its target ", t.extent(0), "x", t.extent(1));
    const double n = double(y.size());
    double loss = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
      const double d = double(y.data()[i]) - double(t.data()[i]);
      loss += d * d;
      dy.tensor().data()[i] = float(2 * d / n);
    }
    return loss / n;
  };
}

}  // namespace mpar::pipeline
