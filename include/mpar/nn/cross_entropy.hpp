#pragma once
/**
 * @file `VocabParallelCrossEntropy`: the mean token cross-entropy of vocab-sharded logits
 * `[tokens, vocab / TP]` (`Shard<1, tensor>`, the output of a ColumnParallel LM head) without ever
 * gathering the full logits.
 *
 * Forward: the row maxima are all-reduced (max), then the sums of exp(logit - max) and the target
 * logits (a rank contributes the target logit only when the target is in its vocabulary slice) in one
 * all-reduce (sum) of 2·tokens values. loss = mean(log(sum) + max - target_logit).
 * Backward is local: dlogits = (softmax - onehot(target)) / tokens on this rank's columns, the
 * softmax recomputed from the kept logits and the all-reduced statistics.
 */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/backend/rank_transfer.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/detail/fused_classifier_backend.hpp"
#include "mpar/nn/layer.hpp"
#include "mpar/nn/rank_tokens.hpp"
#include "mpar/nn/upload.hpp"

namespace mpar::nn {

/** @brief Cross-entropy over vocab-sharded logits on backend `B`; `vocab` is the global vocabulary size. */
template <communicator C, backend B = HostBackend>
class VocabParallelCrossEntropy {
 public:
  using input_layout = FeatureShard;

  VocabParallelCrossEntropy(C& tp, std::size_t vocab)
      : comm_(&tp), vocab_(vocab), p_(std::size_t(tp.size())), rank_(std::size_t(tp.rank())) {
    require(vocab_ % p_ == 0, "VocabParallelCrossEntropy (tensor rank ", rank_, "): vocabulary ", vocab_,
            " is not divisible by the tensor-parallel size ", p_);
    offset_ = rank_ * (vocab_ / p_);
  }

  /** Typed: the logits must be vocab-sharded, the output of a ColumnParallel head without gather_output. */
  template <class L>
  float forward(const Act<L>& logits, std::span<const std::int32_t> targets, int mb = 0) {
    static_assert(std::is_same_v<L, FeatureShard>,
                  "mpar::nn::VocabParallelCrossEntropy takes vocab-sharded logits (Shard<1, tensor>) but is fed "
                  "another layout (see L above). Fix: feed it the output of a ColumnParallel LM head without "
                  "gather_output (or the tied head of GptPipelinePart)");
    if constexpr (std::is_same_v<L, FeatureShard>)
      return do_forward(logits.tensor(), targets, mb);
    else
      return 0.0f;
  }
  /** A bare tensor states no layout, so the loss could not check it: refused, with the fix. */
  template <class T>
    requires(!detail::is_act_v<T>)
  float forward(const T&, std::span<const std::int32_t>, int = 0) {
    static_assert(detail::always_false_v<T>,
                  "mpar::nn::VocabParallelCrossEntropy takes typed logits Act<Shard<1, tensor>>, not a bare "
                  "Tensor<float, 2>. Fix: feed it the output of a ColumnParallel LM head (already typed), or state the "
                  "layout once: loss.forward(Act<FeatureShard>(logits), targets)");
    return 0.0f;
  }
  /**
   * As `forward`, without bringing the loss to the host: `*acc += scale * loss` in rank memory (`B::accumulate`),
   * so a training step reads its losses once, with its other statistics, instead of once per micro-batch.
   */
  template <class L>
  void forward_into(const Act<L>& logits, std::span<const std::int32_t> targets, int mb, double* acc, double scale) {
    static_assert(std::is_same_v<L, FeatureShard>,
                  "mpar::nn::VocabParallelCrossEntropy takes vocab-sharded logits (Shard<1, tensor>) but is fed "
                  "another layout (see L above). Fix: feed it the output of a ColumnParallel LM head without "
                  "gather_output (or the tied head of GptPipelinePart)");
    if constexpr (std::is_same_v<L, FeatureShard>)
      B::run(ops::accumulate{.n = 1, .x = loss_in_rank(logits.tensor(), targets, mb), .scale = scale, .acc = acc});
  }
  /**
   * As `forward_into`, with the targets already in rank memory (`RankTokens`: not checked here, the caller checked
   * them before writing them and keeps them until the backward of `mb`): no upload, nothing the host decides per
   * call, so a captured step replays it with whatever targets the memory holds then.
   */
  void forward_into(const Act<FeatureShard>& logits, RankTokens targets, int mb, double* acc, double scale) {
    const std::size_t t = logits.extent(0);
    require(targets.size == t, "VocabParallelCrossEntropy (tensor rank ", rank_, "): logits of ", t, " tokens with ",
            targets.size, " targets in rank memory");
    auto& c = cache_.put(mb);
    c.target_ids = targets;
    B::run(ops::accumulate{.n = 1, .x = loss_of(logits.tensor(), c), .scale = scale, .acc = acc});
  }
  /** Typed gradient of `scale * loss` with respect to this rank's (vocab-sharded) logits. */
  Act<FeatureShard> logits_gradient(int mb = 0, float scale = 1.0f) {
    return Act<FeatureShard>(do_backward(mb, scale));
  }
  void drop(int mb) { cache_.drop(mb); }

 private:
  /** The mean loss (the same on every tensor rank). */
  float do_forward(const Activation& logits, std::span<const std::int32_t> targets, int mb) {
    const float* loss = loss_in_rank(logits, targets, mb);
    note_host_access(sizeof(float));  // the host reads the loss
    // On a backend whose operations return at once, through the stream-ordered copy and an event wait.
    return mpar::read_from_rank<B>(loss);
  }
  /** The mean loss into rank memory (one float of the micro-batch's cached statistics); returns where it is. */
  const float* loss_in_rank(const Activation& logits, std::span<const std::int32_t> targets, int mb) {
    const std::size_t t = logits.extent(0), vl = logits.extent(1);
    require(vl * p_ == vocab_ && targets.size() == t, "VocabParallelCrossEntropy (tensor rank ", rank_, "): logits ", t,
            "x", vl, " with ", targets.size(), " targets; expected ", t, "x", vocab_ / p_);
    for (std::size_t i = 0; i < t; ++i)
      require(targets[i] >= 0 && std::size_t(targets[i]) < vocab_, "VocabParallelCrossEntropy: target ", targets[i],
              " of token ", i, " is outside the vocabulary of ", vocab_);
    auto& c = cache_.put(mb);
    c.targets = uninitialized_buffer<std::int32_t>(t);
    upload<B>(c.targets, targets);  // into the rank's memory (a stream-ordered upload on a device, no wait)
    note_host_access(t * sizeof(std::int32_t));  // the targets copied in
    c.target_ids = {c.targets.data(), t};
    return loss_of(logits, c);
  }
  struct Cache;
  /** The mean loss of `logits` against the targets of micro-batch cache `c`, into rank memory; returns where it is. */
  const float* loss_of(const Activation& logits, Cache& c) {
    const std::size_t t = logits.extent(0), vl = logits.extent(1);
    require(vl * p_ == vocab_, "VocabParallelCrossEntropy (tensor rank ", rank_, "): logits ", t, "x", vl,
            "; expected ", t, "x", vocab_ / p_);
    const std::int32_t* targets = c.target_ids.data;
    if constexpr (detail::fused_classifier_backend<B>) {
      if (p_ == 1) {  // the whole vocabulary here: loss and gradient in one pass, no statistics to all-reduce
        c.fused = true;
        c.logits = Activation(logits.shape(), uninitialized);  // holds dlogits of the unscaled loss
        c.stats = uninitialized_buffer<float>(t + 1);          // [row loss | mean loss]
        B::run(ops::fused_classifier{.rows = t,
                                     .vocab = vl,
                                     .ld = vl,
                                     .logits = logits.data(),
                                     .targets = targets,
                                     .dlogits = c.logits.data(),
                                     .row_loss = c.stats.data(),
                                     .loss = c.stats.data() + t,
                                     .grad_scale = 1.0f});
        return c.stats.data() + t;
      }
    }
    c.logits = backend_copy<B>(logits);
    // [row max | sum exp | target logit] per token, then the loss: all written by the kernels.
    c.stats = uninitialized_buffer<float>(3 * t + 1);
    float* mx = c.stats.data();
    float* sums = mx + t;
    B::run(ops::vocab_parallel_max{.rows = t, .cols = vl, .logits = logits.data(), .row_max = mx});
    if (p_ > 1) comm_->all_reduce(std::span<float>(mx, t), ReduceOp::max);
    B::run(ops::vocab_parallel_sumexp{.rows = t,
                                      .cols = vl,
                                      .col_offset = offset_,
                                      .logits = logits.data(),
                                      .targets = targets,
                                      .row_max = mx,
                                      .sumexp = sums,
                                      .target_logit = sums + t});
    if (p_ > 1) comm_->all_reduce(std::span<float>(sums, 2 * t), ReduceOp::sum);
    B::run(ops::vocab_parallel_loss{
        .rows = t, .row_max = mx, .sumexp = sums, .target_logit = sums + t, .loss = sums + 2 * t});
    return sums + 2 * t;
  }

  /** Gradient of `scale * loss` with respect to this rank's logits. */
  Activation do_backward(int mb, float scale) {
    auto c = cache_.take(mb, "VocabParallelCrossEntropy");
    const std::size_t t = c.logits.extent(0), vl = c.logits.extent(1);
    if (c.fused) {  // the forward computed the gradient of the loss itself: only the scale is left
      if (scale != 1.0f) B::run(ops::scale{.n = c.logits.size(), .factor = scale, .x = c.logits.data()});
      return std::move(c.logits);
    }
    Activation d(c.logits.shape(), uninitialized);
    B::run(ops::vocab_parallel_backward{.rows = t,
                                        .cols = vl,
                                        .col_offset = offset_,
                                        .logits = c.logits.data(),
                                        .targets = c.target_ids.data,
                                        .row_max = c.stats.data(),
                                        .sumexp = c.stats.data() + t,
                                        .dlogits = d.data(),
                                        .scale = scale});
    return d;
  }

  /**
   * What backward needs: the logits and the all-reduced row statistics (the softmax is recomputed from
   * them); or, after the fused classifier (`fused`), the gradient itself in `logits`.
   */
  struct Cache {
    Activation logits;
    Buffer<std::int32_t> targets;  ///< host targets uploaded by `forward`; empty for targets in rank memory
    RankTokens target_ids;         ///< where the kernels read the targets: `targets`, or the caller's rank memory
    Buffer<float> stats;
    bool fused = false;
  };
  C* comm_;
  std::size_t vocab_, p_, rank_, offset_ = 0;
  MicroBatchCache<Cache> cache_;
};

}  // namespace mpar::nn
