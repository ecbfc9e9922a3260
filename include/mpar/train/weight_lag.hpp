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
  /** Exchanges the current weights and the older version in place (a program that updates between passes). */
  void swap() { swap_all(); }
  /** A copy of the current weights becomes the older version (before an update inside a program). */
  void keep_current() {
    previous_.resize(versioned_.size());
    for (std::size_t k = 0; k < versioned_.size(); ++k) {
      const auto& now = versioned_[k]->value;
      if (previous_[k].size() != now.size()) previous_[k] = uninitialized_buffer<float>(now.size());
      B::copy(now.size(), now.data(), previous_[k].data());
    }
  }
  /** Drops the older version (after loading weights: the next step's passes run on them, lag 0). */
  void forget() { previous_.clear(); }
  /** The versioned parameters, each once. */
  [[nodiscard]] const std::vector<nn::Parameter*>& versioned() const { return versioned_; }
  /** The older version of `versioned()[k]` (empty without one): a checkpoint saves it and a resume loads it. */
  [[nodiscard]] std::span<float> previous(std::size_t k) {
    return previous_.empty() ? std::span<float>() : std::span<float>(previous_[k].data(), previous_[k].size());
  }
  /** Buffers for an older version, shaped like the current one, for a resume to load into (values unset). */
  void allocate_previous() {
    previous_.resize(versioned_.size());
    for (std::size_t k = 0; k < versioned_.size(); ++k)
      if (previous_[k].size() != versioned_[k]->value.size())
        previous_[k] = uninitialized_buffer<float>(versioned_[k]->value.size());
  }
  /** Bytes of the older version held now (one more fp32 copy of the parameters after the first step). */
  [[nodiscard]] std::size_t bytes() const {
    std::size_t n = 0;
    for (const auto& v : previous_) n += v.size() * sizeof(float);
    return n;
  }

 private:
  void swap_all() {
    for (std::size_t k = 0; k < versioned_.size(); ++k) std::swap(versioned_[k]->value, previous_[k]);
  }
  std::vector<nn::Parameter*> versioned_;
  std::vector<decltype(nn::Parameter::value)> previous_;
};

}  // namespace mpar::train
