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

/**
 * @brief The storage of an activation or its gradient: `[tokens, features]`, row-major, fp32, with no
 * layout in its type. It is what crosses a pipeline boundary and what a test fills; inside a stage
 * activations travel as `Act<L>`.
 */
using Activation = Tensor<float, 2>;

/** @brief Features split over the tensor axis (the output of a column-parallel layer). */
using FeatureShard = Shard<1, axis::tensor>;
/** @brief Tokens split over the tensor axis (sequence parallelism). */
using TokenShard = Shard<0, axis::tensor>;
/** @brief Full-size addends whose sum over the tensor axis is the value (a row-parallel layer before its reduction). */
using TensorPartial = Partial<ReduceOp::sum, axis::tensor>;

/**
 * @brief An activation whose layout on the tensor axis is part of its type: `Act<Replicate>`,
 * `Act<FeatureShard>`, `Act<TensorPartial>`, `Act<TokenShard>`, `Act<GridShard>`.
 *
 * It owns the same `Activation` storage (no extra bytes, no extra work: the layout is an empty tag
 * that exists only at compile time). Construction from a tensor is explicit (the caller states the
 * layout once, at the edge); there is no conversion between layouts: a layout changes only through
 * a layer or a redistribution (nn/redistributions.hpp), so a mis-wired composition does not compile.
 */
template <class L>
  requires is_layout_v<L>
class Act {
 public:
  using layout = L;

  Act() = default;
  /** States that `t` is laid out as `L` (a copy of an lvalue, a move of an rvalue). */
  explicit Act(Activation t) : t_(std::move(t)) {}

  [[nodiscard]] const Activation& tensor() const& { return t_; }
  [[nodiscard]] Activation& tensor() & { return t_; }
  /** Gives up the storage (e.g. to send it across a pipeline boundary). */
  [[nodiscard]] Activation tensor() && { return std::move(t_); }
  [[nodiscard]] std::size_t extent(std::size_t d) const { return t_.extent(d); }
  [[nodiscard]] const Shape<2>& shape() const { return t_.shape(); }
  [[nodiscard]] std::size_t size() const { return t_.size(); }
  [[nodiscard]] float* data() { return t_.data(); }
  [[nodiscard]] const float* data() const { return t_.data(); }

 private:
  Activation t_;
};

/**
 * @brief The layout of the gradient of an activation laid out as `L`, as a layer's backward receives
 * or returns it: the same layout, except that the gradient of a Partial value is replicated
 * (d(Σ_r x_r)/dx_r = I: every addend receives the whole gradient).
 */
template <class L>
using grad_layout_t = std::conditional_t<L::is_partial, Replicate, L>;

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
  B::run(ops::bias_add_backward{.rows = dy.extent(0), .cols = dy.extent(1), .dy = dy.data(), .dbias = acc.data()});
}
/** `y[r, :] += v` for every row (bias addition), on backend `B`. */
template <backend B>
void add_row_vector(Activation& y, std::span<const float> v) {
  require(v.size() == y.extent(1), "bias: ", v.size(), " entries for ", y.extent(1), " columns");
  B::run(ops::bias_add_forward{.rows = y.extent(0), .cols = y.extent(1), .bias = v.data(), .y = y.data()});
}
}  // namespace detail

}  // namespace mpar::nn
