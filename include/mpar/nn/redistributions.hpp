#pragma once
/**
 * @file Redistributions: the collectives of tensor parallelism as typed maps between activation
 * layouts, each defined once together with its backward dual (the pairs of Megatron-LM's
 * `mappings.py`). A layer that changes layout calls one of them forward and the same one backward,
 * so a forward collective can no longer be paired with the wrong backward one.
 *
 * | redistribution        | forward maps                 | collective     | backward maps (gradients)        | collective     |
 * |-----------------------|------------------------------|----------------|----------------------------------|----------------|
 * | `ReduceToReplicate`   | Partial -> Replicate         | all-reduce     | Replicate -> Replicate           | identity       |
 * | `CopyToTensorRegion`  | Replicate -> Replicate       | identity       | Partial -> Replicate             | all-reduce     |
 * | `ScatterFeatures`     | Replicate -> Shard<1>        | slice          | Shard<1> -> Replicate            | all-gather     |
 * | `GatherFeaturesOf`    | Shard<1> -> Replicate        | all-gather     | Replicate -> Shard<1>            | slice          |
 * | `ReduceScatterTokens` | Partial -> Shard<0>          | reduce-scatter | Shard<0> -> Replicate            | all-gather     |
 * | `GatherTokens`        | Shard<0> -> Replicate        | all-gather     | Partial -> Shard<0>              | reduce-scatter |
 * | `ScatterTokens`       | Replicate -> Shard<0>        | slice          | Shard<0> -> Replicate            | all-gather     |
 * | `GatherTokensReplicatedGrad` | Shard<0> -> Replicate | all-gather     | Replicate -> Shard<0>            | slice          |
 *
 * (`Shard<d>` is `Shard<d, axis::tensor>`, `Partial` is `Partial<sum, tensor>`.) The gradient of a
 * Partial value is replicated (`grad_layout_t`); the gradient of a replicated value that fed
 * rank-divergent work (a column-parallel matmul) is Partial until `CopyToTensorRegion`'s backward
 * all-reduces it. Every collective is a no-op on a one-rank group, so TP = 1 pays no communication.
 */
#include <cstddef>
#include <span>
#include <string_view>
#include <utility>

#include "mpar/backend/backend.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/nn/activation.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/detail/act_of.hpp"
#include "mpar/nn/redistribution.hpp"

namespace mpar::nn {

/** @brief Sum of the Partial addends: in place, returns the replicated tensor. */
template <communicator C>
void all_reduce_sum(C& comm, Activation& x) {
  if (comm.size() > 1) comm.all_reduce(x.span(), ReduceOp::sum);
}

/** @brief Token-sharded `[T/p, n]` -> replicated `[T, n]` (all-gather of row blocks). */
template <communicator C>
[[nodiscard]] Activation gather_tokens(C& comm, const Activation& x) {
  const std::size_t p = std::size_t(comm.size());
  if (p == 1) return x;
  Activation full({x.extent(0) * p, x.extent(1)}, uninitialized);  // the all-gather writes every row
  comm.all_gather(std::span<const float>(x.span()), full.span());
  return full;
}

/** @brief Partial `[T, n]` -> token-sharded sum `[T/p, n]` (reduce-scatter of row blocks). */
template <communicator C>
[[nodiscard]] Activation reduce_scatter_tokens(C& comm, const Activation& x, std::string_view who) {
  const std::size_t p = std::size_t(comm.size());
  if (p == 1) return x;
  require(x.extent(0) % p == 0, who, " (tensor rank ", comm.rank(), "): ", x.extent(0),
          " tokens cannot be split evenly over ", p, " tensor ranks for sequence parallelism");
  Activation part({x.extent(0) / p, x.extent(1)}, uninitialized);  // the reduce-scatter writes it whole
  comm.reduce_scatter(std::span<const float>(x.span()), part.span(), ReduceOp::sum);
  return part;
}

/**
 * @brief Feature-sharded `[T, n/p]` -> replicated `[T, n]`: an all-gather of the ranks' blocks, then each block copied
 * into its columns by backend `B` (one strided copy per rank, on the rank's stream: no host loop reads rank memory).
 */
template <backend B, communicator C>
[[nodiscard]] Activation gather_features(C& comm, const Activation& x) {
  const std::size_t p = std::size_t(comm.size());
  if (p == 1) return backend_copy<B>(x);
  const std::size_t t = x.extent(0), nl = x.extent(1);
  Activation stacked({p * t, nl}, uninitialized);  // the all-gather writes every row
  comm.all_gather(std::span<const float>(x.span()), stacked.span());
  Activation full({t, p * nl}, uninitialized);  // the copies write every column block
  for (std::size_t r = 0; r < p; ++r)
    B::run(ops::copy_2d<float>{.rows = t,
                               .cols = nl,
                               .src = stacked.data() + r * t * nl,
                               .src_ld = nl,
                               .dst = full.data() + r * nl,
                               .dst_ld = p * nl});
  return full;
}

/** @brief This rank's column block of a replicated `[T, n]`, copied by backend `B` (no communication). */
template <backend B>
[[nodiscard]] Activation local_features(const Activation& x, std::size_t p, std::size_t rank) {
  const std::size_t t = x.extent(0), n = x.extent(1), nl = n / p;
  require(n % p == 0, "local_features (tensor rank ", rank, "): ", n, " features cannot be split evenly over ", p,
          " tensor ranks; make the layer's width a multiple of the tensor-parallel size");
  Activation part({t, nl}, uninitialized);
  B::run(ops::copy_2d<float>{
      .rows = t, .cols = nl, .src = x.data() + rank * nl, .src_ld = n, .dst = part.data(), .dst_ld = nl});
  return part;
}

/** @brief This rank's row block of a replicated `[T, n]` in host memory (no communication; a host copy). */
[[nodiscard]] inline Activation local_tokens(const Activation& x, std::size_t p, std::size_t rank) {
  const std::size_t tl = x.extent(0) / p;
  return Activation(x.slice(0, rank * tl, (rank + 1) * tl));
}

/**
 * @brief This rank's row block of a replicated `[T, n]`, copied by backend `B` (rows are contiguous: one copy on
 * the rank's stream). `who` names the caller in the error when `T` does not split evenly.
 */
template <backend B, communicator C>
[[nodiscard]] Activation local_token_rows(C& comm, const Activation& x, std::string_view who) {
  const std::size_t p = std::size_t(comm.size()), t = x.extent(0);
  require(t % p == 0, who, " (tensor rank ", comm.rank(), "): ", t, " tokens cannot be split evenly over ", p,
          " tensor ranks for sequence parallelism; make the tokens per micro-batch (micro-batch size x seq) a "
          "multiple of ",
          p);
  Activation part({t / p, x.extent(1)}, uninitialized);
  if (part.size() != 0)
    B::run(ops::copy<float>{
        .n = part.size(), .src = x.data() + std::size_t(comm.rank()) * part.size(), .dst = part.data()});
  return part;
}

/**
 * Every redistribution below has the one signature the `redistribution` concept checks:
 *
 *     template <backend B, communicator C, class X> static Act<to> forward(C&, X&& x, std::string_view who = name);
 *     template <backend B, communicator C, class X> static Act<grad_from> backward(C&, X&& dy, std::string_view who);
 *
 * `X` is `Act<from>` (backward: `Act<grad_to>`), as an rvalue when the caller gives its tensor up (an in-place
 * collective then reuses it) or as an lvalue it keeps (read, or copied where the collective works in place). `B`
 * is the backend of the rank-side copies (a slice, the interleave of gathered columns); `who` names the caller in
 * the errors of a split that does not divide.
 */
/** @brief Partial -> Replicate: all-reduce forward; backward identity (Megatron's "g", reduce_from_tp_region). */
struct ReduceToReplicate {
  using from = TensorPartial;
  using to = Replicate;
  using grad_to = Replicate;
  using grad_from = grad_layout_t<TensorPartial>;
  static constexpr std::string_view name = "ReduceToReplicate", forward_collective = "all-reduce",
                                    backward_collective = "identity";
  template <backend B, communicator C, detail::act_of<from> X>
  static Act<Replicate> forward(C& comm, X&& x, std::string_view = name) {
    Act<TensorPartial> sum(std::forward<X>(x));
    all_reduce_sum(comm, sum.tensor());
    return Act<Replicate>(std::move(sum).tensor());
  }
  // d(Σ_r x_r)/dx_r = I: each rank's addend receives the replicated gradient unchanged.
  template <backend B, communicator C, detail::act_of<grad_to> X>
  static Act<Replicate> backward(C&, X&& dy, std::string_view = name) {
    return Act<Replicate>(std::forward<X>(dy));
  }
};

/**
 * @brief Replicate -> Replicate at the entry of rank-divergent work (a column-parallel matmul):
 * identity forward; backward all-reduces the Partial input gradient (Megatron's "f", copy_to_tp_region).
 */
struct CopyToTensorRegion {
  using from = Replicate;
  using to = Replicate;
  using grad_to = TensorPartial;
  using grad_from = Replicate;
  static constexpr std::string_view name = "CopyToTensorRegion", forward_collective = "identity",
                                    backward_collective = "all-reduce";
  template <backend B, communicator C, detail::act_of<from> X>
  static Act<Replicate> forward(C&, X&& x, std::string_view = name) {
    return Act<Replicate>(std::forward<X>(x));
  }
  template <backend B, communicator C, detail::act_of<grad_to> X>
  static Act<Replicate> backward(C& comm, X&& dx, std::string_view = name) {
    Act<TensorPartial> sum(std::forward<X>(dx));
    all_reduce_sum(comm, sum.tensor());
    return Act<Replicate>(std::move(sum).tensor());
  }
};

/** @brief Replicate -> Shard<1, tensor>: this rank's columns forward; backward all-gathers them (scatter_to_tp_region). */
struct ScatterFeatures {
  using from = Replicate;
  using to = FeatureShard;
  using grad_to = FeatureShard;
  using grad_from = Replicate;
  static constexpr std::string_view name = "ScatterFeatures", forward_collective = "slice",
                                    backward_collective = "all-gather";
  template <backend B, communicator C, detail::act_of<from> X>
  static Act<FeatureShard> forward(C& comm, X&& x, std::string_view = name) {
    return Act<FeatureShard>(local_features<B>(x.tensor(), std::size_t(comm.size()), std::size_t(comm.rank())));
  }
  template <backend B, communicator C, detail::act_of<grad_to> X>
  static Act<Replicate> backward(C& comm, X&& dy, std::string_view = name) {
    return Act<Replicate>(gather_features<B>(comm, dy.tensor()));
  }
};

/** @brief Shard<1, tensor> -> Replicate: all-gather forward; backward keeps this rank's columns (gather_from_tp_region). */
struct GatherFeaturesOf {
  using from = FeatureShard;
  using to = Replicate;
  using grad_to = Replicate;
  using grad_from = FeatureShard;
  static constexpr std::string_view name = "GatherFeatures", forward_collective = "all-gather",
                                    backward_collective = "slice";
  template <backend B, communicator C, detail::act_of<from> X>
  static Act<Replicate> forward(C& comm, X&& x, std::string_view = name) {
    return Act<Replicate>(gather_features<B>(comm, x.tensor()));
  }
  // The replicated gradient is the same on every rank: each keeps the columns of its shard.
  template <backend B, communicator C, detail::act_of<grad_to> X>
  static Act<FeatureShard> backward(C& comm, X&& dy, std::string_view = name) {
    return Act<FeatureShard>(local_features<B>(dy.tensor(), std::size_t(comm.size()), std::size_t(comm.rank())));
  }
};

/** @brief Partial -> Shard<0, tensor>: reduce-scatter of token blocks forward; backward all-gathers them (sequence parallelism). */
struct ReduceScatterTokens {
  using from = TensorPartial;
  using to = TokenShard;
  using grad_to = TokenShard;
  using grad_from = grad_layout_t<TensorPartial>;
  static constexpr std::string_view name = "ReduceScatterTokens", forward_collective = "reduce-scatter",
                                    backward_collective = "all-gather";
  template <backend B, communicator C, detail::act_of<from> X>
  static Act<TokenShard> forward(C& comm, X&& x, std::string_view who = name) {
    if (comm.size() == 1) return Act<TokenShard>(Act<TensorPartial>(std::forward<X>(x)).tensor());
    return Act<TokenShard>(reduce_scatter_tokens(comm, x.tensor(), who));
  }
  template <backend B, communicator C, detail::act_of<grad_to> X>
  static Act<Replicate> backward(C& comm, X&& dy, std::string_view = name) {
    if (comm.size() == 1) return Act<Replicate>(Act<TokenShard>(std::forward<X>(dy)).tensor());
    return Act<Replicate>(gather_tokens(comm, dy.tensor()));
  }
};

/** @brief Shard<0, tensor> -> Replicate: all-gather of token blocks forward; backward reduce-scatters the Partial gradient. */
struct GatherTokens {
  using from = TokenShard;
  using to = Replicate;
  using grad_to = TensorPartial;
  using grad_from = TokenShard;
  static constexpr std::string_view name = "GatherTokens", forward_collective = "all-gather",
                                    backward_collective = "reduce-scatter";
  template <backend B, communicator C, detail::act_of<from> X>
  static Act<Replicate> forward(C& comm, X&& x, std::string_view = name) {
    if (comm.size() == 1) return Act<Replicate>(Act<TokenShard>(std::forward<X>(x)).tensor());
    return Act<Replicate>(gather_tokens(comm, x.tensor()));
  }
  template <backend B, communicator C, detail::act_of<grad_to> X>
  static Act<TokenShard> backward(C& comm, X&& dx, std::string_view who = name) {
    if (comm.size() == 1) return Act<TokenShard>(Act<TensorPartial>(std::forward<X>(dx)).tensor());
    return Act<TokenShard>(reduce_scatter_tokens(comm, dx.tensor(), who));
  }
};

/**
 * @brief Replicate -> Shard<0, tensor>: this rank's block of tokens forward; backward all-gathers the token-sharded
 * gradient (Megatron's scatter_to_sequence_parallel_region). Where a replicated stream of hidden states enters
 * sequence-parallel work: after the embeddings, at a pipeline stage's input.
 */
struct ScatterTokens {
  using from = Replicate;
  using to = TokenShard;
  using grad_to = TokenShard;
  using grad_from = Replicate;
  static constexpr std::string_view name = "ScatterTokens", forward_collective = "slice",
                                    backward_collective = "all-gather";
  template <backend B, communicator C, detail::act_of<from> X>
  static Act<TokenShard> forward(C& comm, X&& x, std::string_view who = name) {
    return Act<TokenShard>(local_token_rows<B>(comm, x.tensor(), who));
  }
  template <backend B, communicator C, detail::act_of<grad_to> X>
  static Act<Replicate> backward(C& comm, X&& dy, std::string_view who = name) {
    // the same all-gather of the token blocks
    return ReduceScatterTokens::backward<B>(comm, std::forward<X>(dy), who);
  }
};

/**
 * @brief Shard<0, tensor> -> Replicate where the gradient comes back replicated (the same on every tensor rank,
 * as a pipeline stage's output gradient does): all-gather forward; backward keeps this rank's rows (Megatron's
 * gather_from_sequence_parallel_region with tensor_parallel_output_grad = false). `GatherTokens` is the form for
 * a consumer that splits its work over the ranks (a column-parallel matmul), whose gradient is Partial.
 */
struct GatherTokensReplicatedGrad {
  using from = TokenShard;
  using to = Replicate;
  using grad_to = Replicate;
  using grad_from = TokenShard;
  static constexpr std::string_view name = "GatherTokensReplicatedGrad", forward_collective = "all-gather",
                                    backward_collective = "slice";
  template <backend B, communicator C, detail::act_of<from> X>
  static Act<Replicate> forward(C& comm, X&& x, std::string_view who = name) {
    // the same all-gather; only the backward differs
    return GatherTokens::forward<B>(comm, std::forward<X>(x), who);
  }
  template <backend B, communicator C, detail::act_of<grad_to> X>
  static Act<TokenShard> backward(C& comm, X&& dy, std::string_view who = name) {
    return Act<TokenShard>(local_token_rows<B>(comm, dy.tensor(), who));
  }
};

}  // namespace mpar::nn
