#pragma once
/**
 * @file `TiedAcrossStages`: one parameter held by the first and the last pipeline stage — GPT-2's token embedding and
 * its output head (Megatron's word embeddings shared across the pipeline) — kept one parameter by a gradient sum and a
 * value copy per step (docs/training.md, "The trainer's components").
 */
#include <optional>
#include <span>
#include <utility>

#include "mpar/comm/communicator.hpp"
#include "mpar/core/layout.hpp"
#include "mpar/nn/parameter.hpp"

namespace mpar::train {

/**
 * @brief This rank's end of a parameter two stages hold, and the group of the two ends (the first stage at group
 * rank 0). After the backward `sum_gradients()` gives both ends the sum of their gradients, so each end's optimizer
 * applies the same update; after the step `copy_first_to_last()` makes the last stage's values the first stage's
 * bit for bit (the updates agree, but a skipped or clipped step must not leave them drifting apart). A rank that
 * holds no end holds an empty tie, whose calls do nothing; both calls are collective over the pair only.
 */
template <communicator C>
class TiedAcrossStages {
 public:
  TiedAcrossStages() = default;
  /** `pair`: the two ends' group, the first stage's end at rank 0; `end`: this rank's end, which must outlive it. */
  TiedAcrossStages(C pair, nn::Parameter& end) : pair_(std::move(pair)), end_(&end) {}

  /** Whether this rank holds an end. */
  [[nodiscard]] bool holds() const { return end_ != nullptr; }
  /** This rank's end, or null. */
  [[nodiscard]] const nn::Parameter* parameter() const { return end_; }

  /** Both ends' gradients become their sum: the tied parameter's whole gradient. */
  void sum_gradients() {
    if (end_ != nullptr) pair_->all_reduce(std::span<float>(end_->grad), ReduceOp::sum);
  }
  /** The last stage's values become the first stage's. */
  void copy_first_to_last() {
    copy_first_to_last([](nn::Parameter&, auto&& copy) { copy(); });
  }
  /**
   * As above, with `with_full(parameter, copy)` calling `copy()` while this rank's end holds its full values (ZeRO-3
   * shards the first stage's end at rest: gather it around the copy, release it after).
   */
  template <class WithFull>
  void copy_first_to_last(WithFull&& with_full) {
    if (end_ == nullptr) return;
    std::forward<WithFull>(with_full)(*end_, [this] { pair_->broadcast(std::span<float>(end_->value), 0); });
  }

 private:
  std::optional<C> pair_;
  nn::Parameter* end_ = nullptr;
};

}  // namespace mpar::train
