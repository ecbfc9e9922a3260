#pragma once
/**
 * @file `WeightLag`: PipeDream-2BW's second weight version, the trainer component that makes a step's passes run on
 * the weights before the previous update (docs/pipeline.md, "PipeDream-2BW").
 */
#include <cstddef>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "mpar/backend/backend.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/nn/parameter.hpp"

namespace mpar::train {

/**
 * @brief Keeps W(t-1) beside W(t) for a set of parameters: `swap_in_previous()` before step t's passes puts W(t-1)
 * in place, `restore_and_keep()` after them puts W(t) back and copies it as the next step's W(t-1), so step t's
 * update applies g(W(t-1)) to W(t). Before the first `restore_and_keep()` (and after `forget()`) there is no older
 * version and the passes run on the current weights: lag 0.
 *
 * The copy is an operation of backend `B` on the rank's stream, ordered after the update that wrote the weights: a
 * host copy would read them before a stream-ordered backend had run that update. Each version buffer is allocated
 * once and overwritten whole.
 *
 * Inside passes under bf16 (a program that updates between passes, `keep_current` and `swap`) a parameter's 16-bit
 * compute copy is versioned too: `keep_current` copies it beside the fp32 values, and `swap` exchanges the
 * parameter's `bf16_copy` with it, so the GEMMs of a micro-batch on the older version read its rounding. An older
 * version kept outside passes (no compute copy then) is rounded at its first swap, its values widened from the
 * rounding as the passes' values are (`gemm_operand_only` weights keep their fp32 values: nothing reads them so).
 */
template <backend B>
class WeightLag {
 public:
  /** `params` may list a parameter twice (a stage sharing one with another): it is versioned once. */
  explicit WeightLag(const std::vector<nn::Parameter*>& params) {
    // Swapping a parameter twice would undo the swap.
    std::set<const nn::Parameter*> seen;
    for (auto* p : params)
      if (seen.insert(p).second) versioned_.push_back(p);
  }

  /** Puts W(t-1) in place of the current weights; returns whether there was one (false: lag 0 this step). */
  bool swap_in_previous() {
    if (previous_.empty()) return false;
    swap_all();
    return true;
  }
  /** After the passes: the current weights back in place (if `swapped`), and a copy of them kept as W(t-1). */
  void restore_and_keep(bool swapped) {
    if (swapped) swap_all();
    keep_current();
  }
  /** Whether an older version is kept (false before the first step and after `forget()`). */
  [[nodiscard]] bool has_previous() const { return !previous_.empty(); }
  /**
   * Exchanges the current weights and the older version in place (a program that updates between passes), with
   * their bf16 compute copies where the parameter has one (see the class comment); calls come in pairs.
   */
  void swap() {
    swap_all();
    prev_bf16_.resize(versioned_.size());
    bf16_saved_.resize(versioned_.size());
    for (std::size_t k = 0; k < versioned_.size(); ++k) {
      nn::Parameter& p = *versioned_[k];
      if (!swapped_) {  // the older version goes in: p.value is now the older values
        if (p.bf16_copy.empty()) continue;
        if (prev_bf16_[k].size() != p.value.size()) round_older(k);
        bf16_saved_[k] = p.bf16_copy;
        p.bf16_copy = std::span<const bf16>(prev_bf16_[k].data(), prev_bf16_[k].size());
      } else if (!bf16_saved_[k].empty()) {
        p.bf16_copy = std::exchange(bf16_saved_[k], {});
      }
    }
    swapped_ = !swapped_;
  }
  /**
   * A copy of the current weights becomes the older version (before an update inside a program), with their bf16
   * compute copies where they have them.
   */
  void keep_current() {
    previous_.resize(versioned_.size());
    prev_bf16_.resize(versioned_.size());
    for (std::size_t k = 0; k < versioned_.size(); ++k) {
      const nn::Parameter& p = *versioned_[k];
      const auto& now = p.value;
      if (previous_[k].size() != now.size()) previous_[k] = uninitialized_buffer<float>(now.size());
      B::run(ops::copy<float>{.n = now.size(), .src = now.data(), .dst = previous_[k].data()});
      if (p.bf16_copy.empty()) {
        prev_bf16_[k] = {};  // outside passes: rounded at its first swap
        continue;
      }
      if (prev_bf16_[k].size() != p.bf16_copy.size()) prev_bf16_[k] = uninitialized_buffer<bf16>(p.bf16_copy.size());
      B::run(ops::copy<bf16>{.n = p.bf16_copy.size(), .src = p.bf16_copy.data(), .dst = prev_bf16_[k].data()});
    }
  }
  /** Drops the older version (after loading weights: the next step's passes run on them, lag 0). */
  void forget() {
    previous_.clear();
    prev_bf16_.clear();
  }
  /** The versioned parameters, each once. */
  [[nodiscard]] const std::vector<nn::Parameter*>& versioned() const { return versioned_; }
  /** The older version of `versioned()[k]` (empty without one): a checkpoint saves it and a resume loads it. */
  [[nodiscard]] std::span<float> previous(std::size_t k) {
    return previous_.empty() ? std::span<float>() : std::span<float>(previous_[k].data(), previous_[k].size());
  }
  /** Buffers for an older version, shaped like the current one, for a resume to load into (values unset). */
  void allocate_previous() {
    prev_bf16_.clear();  // the loaded values are rounded at their first swap under bf16
    previous_.resize(versioned_.size());
    for (std::size_t k = 0; k < versioned_.size(); ++k)
      if (previous_[k].size() != versioned_[k]->value.size())
        previous_[k] = uninitialized_buffer<float>(versioned_[k]->value.size());
  }
  /** Bytes of the older version held now (one more fp32 copy of the parameters after the first step, and its bf16
   * compute copies where a program without a flush keeps them). */
  [[nodiscard]] std::size_t bytes() const {
    std::size_t n = 0;
    for (const auto& v : previous_) n += v.size() * sizeof(float);
    for (const auto& v : prev_bf16_) n += v.size() * sizeof(bf16);
    return n;
  }

 private:
  /**
   * The older version of parameter `k` rounded to bf16 (kept outside passes, it has no compute copy yet), and its
   * values widened from that rounding, as the passes' values are, unless only GEMMs read the parameter (its values
   * are then the fp32 ones, as the current version's master is).
   */
  void round_older(std::size_t k) {
    const nn::Parameter& p = *versioned_[k];
    auto& older = p.value;  // swapped in: the older values
    prev_bf16_[k] = uninitialized_buffer<bf16>(older.size());
    B::run(ops::convert<float, bf16>{.n = older.size(), .src = older.data(), .dst = prev_bf16_[k].data()});
    if (!p.gemm_operand_only)
      B::run(ops::convert<bf16, float>{
          .n = older.size(), .src = prev_bf16_[k].data(), .dst = versioned_[k]->value.data()});
  }
  void swap_all() {
    for (std::size_t k = 0; k < versioned_.size(); ++k) std::swap(versioned_[k]->value, previous_[k]);
  }
  std::vector<nn::Parameter*> versioned_;
  std::vector<decltype(nn::Parameter::value)> previous_;
  std::vector<Buffer<bf16>> prev_bf16_;            ///< the older version's bf16 compute copies (empty: none)
  std::vector<std::span<const bf16>> bf16_saved_;  ///< the current compute copies while the older are swapped in
  bool swapped_ = false;                           ///< `swap` has put the older version in place
};

}  // namespace mpar::train
