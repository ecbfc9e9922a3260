#pragma once
/**
 * @file A trainable parameter: this rank's block of a (possibly sharded) global tensor, its gradient,
 * and the facts optimizers, data parallelism, gradient clipping and checkpoints need about it.
 */
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/backend/detail/memory_backend.hpp"
#include "mpar/core/dtype.hpp"
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
  /**
   * The gradient was zeroed (`zero_grad`, the optimizer's gradient arena, ZeRO's fresh gradients) and no
   * layer has accumulated into it since, so the first accumulation may overwrite it instead of reading its
   * zeros back (`accumulation_beta`): what PyTorch's `zero_grad(set_to_none=True)` gives its first backward,
   * with the buffer kept. Code that writes `grad` directly after a zeroing, other than through a layer's
   * backward, sets it to false first; false is always correct, only slower.
   */
  bool grad_zeroed = false;

  /**
   * The passes read this parameter only as a GEMM's 16-bit operand under `Autocast`, or through an fp32 path
   * that widens the compute copy itself (the linear layers' weights set it). A mixed-precision optimizer's
   * `begin_compute` then leaves the fp32 master in `value` instead of widening the 16-bit copy into it: one
   * write and one read of every such weight fewer per step, and no scratch master. Code that reads `value`
   * between `begin_compute` and `end_compute` and expects the rounded weight must not set it.
   */
  bool gemm_operand_only = false;
  /**
   * Between a mixed-precision optimizer's `begin_compute` and `end_compute` (bf16 or f16): the 16-bit compute
   * copy, rounded from the master (rank memory the optimizer owns); `value` holds it widened, or the master
   * itself where `gemm_operand_only` is set. A GEMM takes it as its 16-bit weight
   * instead of rounding `value` once more: the same bits, since every 16-bit value is a float, and one pass
   * over the weight fewer per step. Empty otherwise; code that changes `value` while it is set clears it.
   */
  std::span<const bf16> bf16_copy;
  std::span<const f16> f16_copy;  ///< as `bf16_copy`, for f16 compute copies

  /** `bf16_copy` or `f16_copy`: the current 16-bit compute copy of type `T` (empty when there is none). */
  template <class T>
    requires std::is_same_v<T, bf16> || std::is_same_v<T, f16>
  [[nodiscard]] std::span<const T> compute_copy() const {
    if constexpr (std::is_same_v<T, bf16>)
      return bf16_copy;
    else
      return f16_copy;
  }

  /** Sets the current 16-bit compute copy (`bf16_copy` or `f16_copy` by `T`). */
  template <class T>
    requires std::is_same_v<T, bf16> || std::is_same_v<T, f16>
  void set_compute_copy(std::span<const T> copy) {
    if constexpr (std::is_same_v<T, bf16>)
      bf16_copy = copy;
    else
      f16_copy = copy;
  }
  /** No current 16-bit compute copy: a GEMM rounds `value` itself. */
  void clear_compute_copy() {
    bf16_copy = {};
    f16_copy = {};
  }

  [[nodiscard]] std::size_t local_size() const { return value.size(); }
  /**
   * The β of the next accumulation into `grad` (`grad = contribution + β grad`): 0 for the first one after
   * a zeroing (a GEMM then writes its product without reading C: a weight gradient of a micro-batch is a
   * GEMM whose C, the fp32 gradient, is as large as its weight), 1 for every later one. Marks the gradient
   * written.
   */
  [[nodiscard]] float accumulation_beta() { return std::exchange(grad_zeroed, false) ? 0.0f : 1.0f; }
  [[nodiscard]] std::size_t global_size() const {
    std::size_t n = 1;
    for (auto e : global_shape) n *= e;
    return n;
  }
  /** Zeroes the gradient on the host (a device trainer uses `B::zero` on `grad` instead). */
  void zero_grad() {
    grad.assign(value.size(), 0.0f);
    note_host_access(grad.size() * sizeof(float));
    grad_zeroed = true;
  }

  /**
   * Allocates the block in the rank's memory and fills it with the sharding-independent initial values by
   * backend `B`'s `init_values` (a kernel where the block lives), the gradient with `B::zero`: the host
   * computes and uploads nothing. Issued on the rank's stream like any operation.
   */
  template <mpar::detail::memory_backend B>
  void initialise(std::uint64_t seed, const InitSpec& spec) {
    const InitBlock block = allocate_block(seed, spec);
    B::run(ops::init_values<float>{.block = block, .x = value.data()});
    B::run(ops::zero<float>{.n = grad.size(), .x = grad.data()});
    grad_zeroed = true;
  }

  /**
   * Without a backend: the same values computed on the host and written once into the rank's memory through
   * its resource (`write_initial`; a device upload where the rank has one). For code that has no backend
   * (host-only tests and tools); a layer over a backend calls `initialise<B>`.
   */
  void initialise(std::uint64_t seed, const InitSpec& spec) {
    const InitBlock block = allocate_block(seed, spec);
    std::vector<float> init(value.size());
    host::init_values(block, init.data());
    write_initial(value, std::span<const float>(init));
    write_initial(grad, std::span<const float>(std::vector<float>(value.size(), 0.0f)));
    grad_zeroed = true;
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

 private:
  /** Allocates `value` and `grad` uninitialised in the rank's memory; the block they hold and how it is drawn. */
  InitBlock allocate_block(std::uint64_t seed, const InitSpec& spec) {
    // Checked before allocating: a block outside the parameter or of too many dimensions is named here.
    const InitBlock block = make_init_block(seed, id, global_shape, local_box, spec, name.c_str());
    std::string shape;  // names the block in the message of an allocation that fails
    for (const auto& b : local_box) shape += (shape.empty() ? "[" : ", ") + std::to_string(b.extent);
    const AllocationLabel label("parameter '" + name + "' (local block " + shape + "])");
    // The rank's memory first, so that a block too large fails there, named by the label above.
    value = uninitialized_buffer<float>(std::size_t(block.size()));
    grad = uninitialized_buffer<float>(std::size_t(block.size()));
    return block;
  }
};

/**
 * @brief Zeroes `p`'s gradient with backend `B`'s `zero` — a kernel on the rank's memory, not a host loop
 * (allocating the gradient uninitialised first if it has not its value's size).
 */
template <class B>
void zero_grad(Parameter& p) {
  if (p.grad.size() != p.value.size()) p.grad = uninitialized_buffer<float>(p.value.size());
  B::run(ops::zero<float>{.n = p.grad.size(), .x = p.grad.data()});
  p.grad_zeroed = true;
}

namespace detail {
/** A parameter's description without values: what `make_parameter` fills before initialising. */
template <std::size_t R>
[[nodiscard]] Parameter describe_parameter(std::string name, std::uint64_t id,
                                           const std::array<std::size_t, R>& global_shape, const Box<R>& box,
                                           std::string layout, bool sharded_over_tensor) {
  Parameter p;
  p.name = std::move(name);
  p.id = id;
  p.global_shape.assign(global_shape.begin(), global_shape.end());
  p.local_box.assign(box.begin(), box.end());
  p.layout = std::move(layout);
  p.sharded_over_tensor = sharded_over_tensor;
  return p;
}
}  // namespace detail

/**
 * @brief Creates and initialises a parameter of `global_shape` whose local block is `box` (from a
 * layout's `local_box`), so its values are those the same elements have in the unsharded parameter.
 */
template <std::size_t R>
[[nodiscard]] Parameter make_parameter(std::string name, std::uint64_t id,
                                       const std::array<std::size_t, R>& global_shape, const Box<R>& box,
                                       std::string layout, bool sharded_over_tensor, std::uint64_t seed,
                                       const InitSpec& spec) {
  Parameter p =
      detail::describe_parameter(std::move(name), id, global_shape, box, std::move(layout), sharded_over_tensor);
  p.initialise(seed, spec);
  return p;
}

/** `make_parameter` whose values backend `B` writes in the rank's memory (`Parameter::initialise<B>`). */
template <mpar::detail::memory_backend B, std::size_t R>
[[nodiscard]] Parameter make_parameter(std::string name, std::uint64_t id,
                                       const std::array<std::size_t, R>& global_shape, const Box<R>& box,
                                       std::string layout, bool sharded_over_tensor, std::uint64_t seed,
                                       const InitSpec& spec) {
  Parameter p =
      detail::describe_parameter(std::move(name), id, global_shape, box, std::move(layout), sharded_over_tensor);
  p.initialise<B>(seed, spec);
  return p;
}

}  // namespace mpar::nn
