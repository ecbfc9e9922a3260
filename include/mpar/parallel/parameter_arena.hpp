#pragma once
/**
 * @file A rank's parameter values as views into one contiguous allocation, in the layout of its gradient arena,
 * so that the optimizer updates all of them with one backend call over a flat range (weights, gradients and
 * moments then lie at the same offsets of their arenas).
 *
 * Each parameter keeps its `value` member (a `Buffer<float>` the user reads and writes, that checkpoints load
 * into); the arena only decides where that buffer's memory lies, through the slab both arenas share
 * (parallel/parameter_slab.hpp). A value later replaced by a buffer of another size (ZeRO-3 releases values) leaves the arena;
 * the optimizer then falls back to one update per parameter (see `optim::AdamW`).
 */
#include <cstddef>
#include <utility>
#include <vector>

#include "mpar/backend/backend.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/nn/parameter.hpp"
#include "mpar/parallel/parameter_slab.hpp"

namespace mpar::parallel {

/**
 * @brief The values of `params` as consecutive slices of one allocation of rank memory, in the order given.
 *
 * Pass the gradient arena's order (the backward's), so that value `k` and gradient `k` lie at the same offset
 * of their arenas. Binding copies each parameter's current value into its slice (backend `B::copy`, once).
 */
template <backend B>
class ParameterArena {
 public:
  ParameterArena() = default;
  explicit ParameterArena(std::vector<nn::Parameter*> order, MemoryResource& upstream = current_memory_resource())
      : slab_(std::move(order), upstream, "ParameterArena", "parameter arena") {
    slab_.bind(&nn::Parameter::value, [](const nn::Parameter& p, float* slice) {
      B::run(ops::copy<float>{.n = p.value.size(), .src = p.value.data(), .dst = slice});
    });
  }

  [[nodiscard]] float* data() const { return slab_.data(); }
  [[nodiscard]] std::size_t size() const { return slab_.size(); }
  /** The parameters in arena order. */
  [[nodiscard]] const std::vector<nn::Parameter*>& params() const { return slab_.params(); }

 private:
  detail::ParameterSlab slab_;
};

}  // namespace mpar::parallel
