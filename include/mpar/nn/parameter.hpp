#pragma once
/**
 * @file A trainable parameter: this rank's block of a (possibly sharded) global tensor, its gradient,
 * and the facts optimizers, data parallelism, gradient clipping and checkpoints need about it.
 */
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mpar/core/host_access.hpp"
#include "mpar/core/init.hpp"
#include "mpar/core/layout.hpp"
#include "mpar/core/memory_resource.hpp"

namespace mpar::nn {

/**
 * @brief One parameter's local shard. Values are fp32 master weights; `grad` accumulates over
 * micro-batches until an optimizer step or `zero_grad()`.
 */
struct Parameter {
  std::string name;                       ///< unique within the model, e.g. "block3.mlp.fc1.weight"
  std::uint64_t id = 0;                   ///< the initialisation stream: values depend on (seed, id, global index)
  std::vector<std::size_t> global_shape;  ///< the unsharded shape
  std::vector<Block> local_box;           ///< this rank's block of every dimension
  std::string layout;                     ///< layout name, e.g. "Shard<1, tensor>" or "Replicate"
  bool sharded_over_tensor = false;       ///< false: every tensor rank holds an identical copy (count it once in norms)
  Buffer<float> value, grad;              ///< local block, row-major, in the rank's memory resource

  [[nodiscard]] std::size_t local_size() const { return value.size(); }
  [[nodiscard]] std::size_t global_size() const {
    std::size_t n = 1;
    for (auto e : global_shape) n *= e;
    return n;
  }
  /** Zeroes the gradient on the host (a device trainer uses `B::zero` on `grad` instead). */
  void zero_grad() {
    grad.assign(value.size(), 0.0f);
    note_host_access(grad.size() * sizeof(float));
  }

  /** Allocates the block and fills it with the sharding-independent initial values. */
  void initialise(std::uint64_t seed, const InitSpec& spec) {
    std::size_t n = 1;
    for (const auto& b : local_box) n *= b.extent;
    std::string shape;  // names the block in the message of an allocation that fails
    for (const auto& b : local_box) shape += (shape.empty() ? "[" : ", ") + std::to_string(b.extent);
    const AllocationLabel label("parameter '" + name + "' (local block " + shape + "])");
    // The rank's memory first, so that a block too large fails there, named by the label above.
    value = uninitialized_buffer<float>(n);
    grad = uninitialized_buffer<float>(n);
    // Computed on the host, then written once into the rank's memory (a device upload where the rank has one).
    std::vector<float> init(n);
    for (std::size_t k = 0; k < n; ++k) init[k] = float(init_value(seed, id, global_index(k), spec));
    write_initial(value, std::span<const float>(init));
    write_initial(grad, std::span<const float>(std::vector<float>(n, 0.0f)));
  }

  /** The row-major index, in the whole (global) tensor, of element `k` of this rank's block. */
  [[nodiscard]] std::size_t global_index(std::size_t k) const {
    std::size_t g = 0, stride = 1;
    for (std::size_t d = global_shape.size(); d-- > 0;) {
      g += (local_box[d].offset + k % local_box[d].extent) * stride;
      k /= local_box[d].extent;
      stride *= global_shape[d];
    }
    return g;
  }
};

/**
 * @brief Zeroes `p`'s gradient with backend `B`'s `zero` — a kernel on the rank's memory, not a host loop
 * (allocating the gradient uninitialised first if it has not its value's size).
 */
template <class B>
void zero_grad(Parameter& p) {
  if (p.grad.size() != p.value.size()) p.grad = uninitialized_buffer<float>(p.value.size());
  B::zero(p.grad.size(), p.grad.data());
}

/**
 * @brief Creates and initialises a parameter of `global_shape` whose local block is `box` (from a
 * layout's `local_box`), so its values are those the same elements have in the unsharded parameter.
 */
template <std::size_t R>
[[nodiscard]] Parameter make_parameter(std::string name, std::uint64_t id,
                                       const std::array<std::size_t, R>& global_shape, const Box<R>& box,
                                       std::string layout, bool sharded_over_tensor, std::uint64_t seed,
                                       const InitSpec& spec) {
  Parameter p;
  p.name = std::move(name);
  p.id = id;
  p.global_shape.assign(global_shape.begin(), global_shape.end());
  p.local_box.assign(box.begin(), box.end());
  p.layout = std::move(layout);
  p.sharded_over_tensor = sharded_over_tensor;
  p.initialise(seed, spec);
  return p;
}

}  // namespace mpar::nn
