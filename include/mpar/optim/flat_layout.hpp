#pragma once
/**
 * @file Where an optimizer's per-parameter states lie in its one allocation: at the offsets of the parameters'
 * values when values and gradients each lie back to back in the same layout (a parameter and a gradient arena,
 * see parallel/parameter_arena.hpp), so that one backend call updates every parameter over a flat range; else
 * one after another in list order (one call per parameter).
 */
#include <algorithm>
#include <cstddef>
#include <functional>
#include <numeric>
#include <vector>

#include "mpar/nn/parameter.hpp"

namespace mpar::optim {

/** @brief The offsets of a list of parameters' states, and whether the parameters lie flat at those offsets. */
class FlatLayout {
 public:
  FlatLayout() = default;
  explicit FlatLayout(const std::vector<nn::Parameter*>& params) : offsets_(params.size()), sizes_(params.size()) {
    std::vector<std::size_t> order;  // the non-empty parameters, by the address of their values
    for (std::size_t i = 0; i < params.size(); ++i) {
      sizes_[i] = params[i]->value.size();
      if (sizes_[i] != 0) order.push_back(i);
    }
    std::ranges::sort(order, [&](std::size_t a, std::size_t b) {
      return std::less<const float*>{}(params[a]->value.data(), params[b]->value.data());
    });
    flat_ = !order.empty();
    for (std::size_t k = 0; k < order.size() && flat_; ++k) {
      const nn::Parameter& p = *params[order[k]];
      const nn::Parameter& first = *params[order[0]];
      const std::size_t at = k == 0 ? 0 : offsets_[order[k - 1]] + sizes_[order[k - 1]];
      flat_ = p.grad.size() == p.value.size() && p.value.data() == first.value.data() + at &&
              p.grad.data() == first.grad.data() + at;
      offsets_[order[k]] = at;
    }
    size_ = std::accumulate(sizes_.begin(), sizes_.end(), std::size_t(0));
    if (!flat_) {  // one after another in list order
      std::size_t at = 0;
      for (std::size_t i = 0; i < params.size(); ++i) {
        offsets_[i] = at;
        at += sizes_[i];
      }
    }
    order_ = std::move(order);
  }

  /** Whether the states lie at the values' offsets (the parameters were flat when the layout was made). */
  [[nodiscard]] bool flat() const { return flat_; }
  /** Floats of one state of all the parameters. */
  [[nodiscard]] std::size_t size() const { return size_; }
  [[nodiscard]] std::size_t offset(std::size_t i) const { return offsets_.at(i); }
  /** Floats of parameter `i`'s state (its size when the layout was made). */
  [[nodiscard]] std::size_t size_of(std::size_t i) const { return sizes_.at(i); }
  /** The non-empty parameters in the order of their offsets (flat layouts). */
  [[nodiscard]] const std::vector<std::size_t>& order() const { return order_; }

  /**
   * Whether `params` (the list the layout was made of) still lie flat: every value and gradient at its offset
   * from the first's (nothing re-allocated since). Host pointer arithmetic only; no rank memory is read.
   */
  [[nodiscard]] bool holds(const std::vector<nn::Parameter*>& params, float*& w, const float*& g) const {
    if (!flat_) return false;
    nn::Parameter& first = *params[order_.front()];
    if (first.value.size() != sizes_[order_.front()] || first.grad.size() != first.value.size()) return false;
    w = first.value.data();
    g = first.grad.data() - offsets_[order_.front()];
    w -= offsets_[order_.front()];
    for (std::size_t i = 0; i < params.size(); ++i) {
      const nn::Parameter& p = *params[i];
      if (p.value.size() != sizes_[i] || p.grad.size() != sizes_[i]) return false;
      if (sizes_[i] != 0 && (p.value.data() != w + offsets_[i] || p.grad.data() != g + offsets_[i])) return false;
    }
    return true;
  }

 private:
  std::vector<std::size_t> offsets_, sizes_, order_;
  std::size_t size_ = 0;
  bool flat_ = false;
};

}  // namespace mpar::optim
