#pragma once
/**
 * @file `add`: the residual connection of typed activations. Both operands must have the same layout:
 * Replicate + Replicate, a shard + the same shard, or Partial + Partial (the sum of two sums of
 * addends is a sum of addends). Replicate + Partial is refused at compile time: every rank would add
 * its replicated term to its own addend, so the reduction would count it TP times.
 */
#include <type_traits>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/nn/activation.hpp"

namespace mpar::nn {

namespace detail {
template <class A, class B>
constexpr bool check_residual() {
  if constexpr (std::is_same_v<A, B>) {
    return true;
  } else if constexpr (A::is_partial || B::is_partial) {
    static_assert(std::is_same_v<A, B>,
                  "mpar::nn::add: a residual adds a Partial<sum, tensor> tensor to a tensor of another layout (see A "
                  "and B above); the non-Partial term would be counted once per rank when the addends are reduced. "
                  "Fix: reduce the Partial one first (RowReduce::all_reduce on the RowParallel that returns it, or "
                  "ReduceToReplicate::forward)");
    return false;
  } else {
    static_assert(
        std::is_same_v<A, B>,
        "mpar::nn::add: a residual adds two tensors of different layouts (see A and B above), so their local "
        "blocks are different parts of the global tensor. Fix: redistribute one of them to the other's "
        "layout first (nn/redistributions.hpp), e.g. the sequence-parallel block keeps both Shard<0, tensor>");
    return false;
  }
}
}  // namespace detail

/** @brief `a + b` elementwise on backend `Bk` (the result has their common layout); a refused pair does not compile. */
template <backend Bk = HostBackend, class A, class B>
[[nodiscard]] auto add(Act<A> a, const Act<B>& b) {
  if constexpr (detail::check_residual<A, B>()) {
    require(a.shape() == b.shape(), "nn::add: the residual's operands have different shapes");
    Bk::run(ops::add{.n = a.size(), .x = a.data(), .z = b.data(), .y = a.data()});
    return a;
  } else {
    return a;  // the refusal above is the one message; this keeps the caller's code free of a second
  }
}

}  // namespace mpar::nn
