#pragma once
/** @file A one-dimensional parameter with given values and gradient, for the optimizer tests. */
#include <string>
#include <utility>
#include <vector>

#include "mpar/nn/parameter.hpp"

namespace mpar::testing {

/** The whole parameter on this rank: replicated, or (`sharded`) this rank's shard over the tensor axis. */
inline nn::Parameter vector_parameter(std::string name, const std::vector<float>& value, const std::vector<float>& grad,
                                      bool sharded = false) {
  nn::Parameter p;
  p.name = std::move(name);
  p.global_shape = {value.size()};
  p.local_box = {Block{0, value.size()}};
  p.layout = sharded ? "Shard<0, tensor>" : "Replicate";
  p.sharded_over_tensor = sharded;
  p.value.assign(value.begin(), value.end());
  p.grad.assign(grad.begin(), grad.end());
  return p;
}

}  // namespace mpar::testing
