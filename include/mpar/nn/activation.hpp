#pragma once
/**
 * @file Activations and their layouts on the tensor axis, and the per-micro-batch activation cache.
 *
 * Representation (documented in docs/tensor-parallel.md): an activation is a row-major
 * `Tensor<float, 2>` of shape `[tokens, features]` with `tokens = batch * seq`, token `t = b * seq + s`.
 * Attention reads batch and sequence from that order (it is constructed with `seq`); heads are
 * contiguous column blocks `[head * head_dim, (head + 1) * head_dim)` of the feature dimension.
 *
 * On the tensor axis an activation is in one of four layouts:
 * - `Replicate`: every tensor rank holds all `[tokens, features]`;
 * - `FeatureShard` = `Shard<1, axis::tensor>`: each rank holds a block of the features (columns);
 * - `TokenShard` = `Shard<0, axis::tensor>`: each rank holds a block of the tokens (sequence
 *   parallelism; the flattened token order, so for batch 1 this is exactly a sequence shard);
 * - `TensorPartial` = `Partial<ReduceOp::sum, axis::tensor>`: each rank holds a full-size addend.
 */
#include <cstddef>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "mpar/backend/backend.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/layout.hpp"
#include "mpar/core/tensor.hpp"

namespace mpar::nn {

/** @brief An activation or its gradient: `[tokens, features]`, row-major, fp32. */
using Activation = Tensor<float, 2>;

/** @brief Features split over the tensor axis (the output of a column-parallel layer). */
using FeatureShard = Shard<1, axis::tensor>;
/** @brief Tokens split over the tensor axis (sequence parallelism). */
using TokenShard = Shard<0, axis::tensor>;
/** @brief Full-size addends whose sum over the tensor axis is the value (a row-parallel layer before its reduction). */
using TensorPartial = Partial<ReduceOp::sum, axis::tensor>;

/** @brief Marks a layer that needs no communicator (single-rank or replicated work only). */
struct NoComm {};

/**
 * @brief Per-micro-batch activation caches of one layer, so a pipeline can keep several micro-batches
 * in flight: `forward(x, mb)` stores, `backward(dy, mb)` takes (and frees), `drop(mb)` frees early.
 */
template <class Cache>
class MicroBatchCache {
 public:
  Cache& put(int mb) { return slots_[mb] = Cache{}; }
  [[nodiscard]] Cache take(int mb, std::string_view layer) {
    auto it = slots_.find(mb);
    require(it != slots_.end(), layer, ": backward for micro-batch ", mb,
            " has no saved activations (no forward for it, or they were dropped; recompute first)");
    Cache c = std::move(it->second);
    slots_.erase(it);
    return c;
  }
  [[nodiscard]] const Cache& peek(int mb, std::string_view layer) const {
    auto it = slots_.find(mb);
    require(it != slots_.end(), layer, ": no saved activations for micro-batch ", mb);
    return it->second;
  }
  [[nodiscard]] bool contains(int mb) const { return slots_.count(mb) != 0; }
  void drop(int mb) { slots_.erase(mb); }
  [[nodiscard]] std::size_t in_flight() const { return slots_.size(); }

 private:
  std::map<int, Cache> slots_;
};

namespace detail {
/** Column sums of a `[rows, cols]` matrix accumulated into `acc` (bias gradients), on backend `B`. */
template <backend B>
void add_column_sums(const Activation& dy, std::span<float> acc) {
  require(acc.size() == dy.extent(1), "bias gradient: ", acc.size(), " entries for ", dy.extent(1), " columns");
  B::bias_add_backward(dy.extent(0), dy.extent(1), dy.data(), acc.data());
}
/** `y[r, :] += v` for every row (bias addition), on backend `B`. */
template <backend B>
void add_row_vector(Activation& y, std::span<const float> v) {
  require(v.size() == y.extent(1), "bias: ", v.size(), " entries for ", y.extent(1), " columns");
  B::bias_add_forward(y.extent(0), y.extent(1), v.data(), y.data());
}
}  // namespace detail

}  // namespace mpar::nn
