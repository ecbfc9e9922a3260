#pragma once
/**
 * @file `VocabParallelCrossEntropy`: the mean token cross-entropy of vocab-sharded logits
 * `[tokens, vocab / TP]` (`Shard<1, tensor>`, the output of a ColumnParallel LM head) without ever
 * gathering the full logits.
 *
 * Forward: the row maxima are all-reduced (max), then the sums of exp(logit - max) and the target
 * logits (a rank contributes the target logit only when the target is in its vocabulary slice) in one
 * all-reduce (sum) of 2·tokens values. loss = mean(log(sum) + max - target_logit).
 * Backward is local: dlogits = (softmax - onehot(target)) / tokens on this rank's columns.
 */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "mpar/comm/communicator.hpp"
#include "mpar/nn/layer.hpp"

namespace mpar::nn {

/** @brief Cross-entropy over vocab-sharded logits; `vocab` is the global vocabulary size. */
template <communicator C>
class VocabParallelCrossEntropy {
 public:
  using input_layout = FeatureShard;

  VocabParallelCrossEntropy(C& tp, std::size_t vocab)
      : comm_(&tp), vocab_(vocab), p_(std::size_t(tp.size())), rank_(std::size_t(tp.rank())) {
    require(vocab_ % p_ == 0, "VocabParallelCrossEntropy (tensor rank ", rank_, "): vocabulary ", vocab_,
            " is not divisible by the tensor-parallel size ", p_);
    offset_ = rank_ * (vocab_ / p_);
  }

  /** The mean loss (the same on every tensor rank). */
  float forward(const Activation& logits, std::span<const std::int32_t> targets, int mb = 0) {
    const std::size_t t = logits.extent(0), vl = logits.extent(1);
    require(vl * p_ == vocab_ && targets.size() == t, "VocabParallelCrossEntropy (tensor rank ", rank_, "): logits ", t,
            "x", vl, " with ", targets.size(), " targets; expected ", t, "x", vocab_ / p_);
    std::vector<float> mx(t, -std::numeric_limits<float>::infinity());
    for (std::size_t i = 0; i < t; ++i)
      for (std::size_t j = 0; j < vl; ++j) mx[i] = std::max(mx[i], logits.data()[i * vl + j]);
    if (p_ > 1) comm_->all_reduce(std::span<float>(mx), ReduceOp::max);
    auto& c = cache_.put(mb);
    c.probs = Activation(logits.shape());
    std::vector<float> sums(2 * t, 0.0f);  // [sum exp | target logit]
    for (std::size_t i = 0; i < t; ++i) {
      require(targets[i] >= 0 && std::size_t(targets[i]) < vocab_, "VocabParallelCrossEntropy: target ", targets[i],
              " of token ", i, " is outside the vocabulary of ", vocab_);
      for (std::size_t j = 0; j < vl; ++j) sums[i] += (c.probs.data()[i * vl + j] = std::exp(logits.data()[i * vl + j] - mx[i]));
      const auto tg = std::size_t(targets[i]);
      if (tg >= offset_ && tg < offset_ + vl) sums[t + i] = logits.data()[i * vl + (tg - offset_)];
    }
    if (p_ > 1) comm_->all_reduce(std::span<float>(sums), ReduceOp::sum);
    double loss = 0;
    for (std::size_t i = 0; i < t; ++i) {
      const float inv = 1.0f / sums[i];
      for (std::size_t j = 0; j < vl; ++j) c.probs.data()[i * vl + j] *= inv;
      loss += double(std::log(sums[i]) + mx[i] - sums[t + i]);
    }
    c.targets.assign(targets.begin(), targets.end());
    return float(loss / double(t));
  }

  /** Gradient of `scale * loss` with respect to this rank's logits. */
  Activation backward(int mb = 0, float scale = 1.0f) {
    auto c = cache_.take(mb, "VocabParallelCrossEntropy");
    const std::size_t t = c.probs.extent(0), vl = c.probs.extent(1);
    const float s = scale / float(t);
    Activation d(c.probs.shape());
    for (std::size_t i = 0; i < t; ++i) {
      const auto tg = std::size_t(c.targets[i]);
      for (std::size_t j = 0; j < vl; ++j) {
        const bool is_target = tg == offset_ + j;
        d.data()[i * vl + j] = s * (c.probs.data()[i * vl + j] - (is_target ? 1.0f : 0.0f));
      }
    }
    return d;
  }
  void drop(int mb) { cache_.drop(mb); }

 private:
  struct Cache {
    Activation probs;
    std::vector<std::int32_t> targets;
  };
  C* comm_;
  std::size_t vocab_, p_, rank_, offset_ = 0;
  MicroBatchCache<Cache> cache_;
};

}  // namespace mpar::nn
