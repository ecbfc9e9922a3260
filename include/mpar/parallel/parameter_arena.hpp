#pragma once
/**
 * @file A rank's parameter values as views into one contiguous allocation, in the layout of its gradient arena,
 * so that the optimizer updates all of them with one backend call over a flat range (weights, gradients and
 * moments then lie at the same offsets of their arenas).
 *
 * Each parameter keeps its `value` member (a `Buffer<float>` the user reads and writes, that checkpoints load
 * into); the arena only decides where that buffer's memory lies, through the memory resource of
 * `GradientArena`. A value later replaced by a buffer of another size (ZeRO-3 releases values) leaves the arena;
 * the optimizer then falls back to one update per parameter (see `optim::AdamW`).
 */
#include <cstddef>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mpar/backend/backend.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/nn/parameter.hpp"
#include "mpar/parallel/gradient_arena.hpp"

namespace mpar::parallel {

/**
 * @brief The values of `params` as consecutive slices of one allocation of rank memory, in the order given.
 *
 * Pass the gradient arena's order (the backward's), so that value `k` and gradient `k` lie at the same offset
 * of their arenas. Binding copies each parameter's current value into its slice (backend `B::copy`, once).
 */
template <backend B>
class ParameterArena {
 public:
  ParameterArena() = default;
  explicit ParameterArena(std::vector<nn::Parameter*> order, MemoryResource& upstream = current_memory_resource())
      : params_(std::move(order)) {
    std::unordered_map<const nn::Parameter*, std::size_t> offset;
    for (std::size_t k = 0; k < params_.size(); ++k) {
      require(params_[k] != nullptr, "ParameterArena: parameter ", k, " is null");
      require(offset.emplace(params_[k], size_).second, "ParameterArena: parameter ", params_[k]->name,
              " is listed twice");
      size_ += params_[k]->value.size();
    }
    const AllocationLabel label("parameter arena (" + std::to_string(params_.size()) + " parameters, " +
                                std::to_string(size_) + " floats)");
    resource_ = new detail::ArenaResource(upstream, size_ * sizeof(float));
    auto* base = static_cast<float*>(resource_->base());
    for (auto* p : params_) {
      const std::size_t n = p->value.size(), at = offset.at(p);
      if (n != 0) resource_->expect(base + at, n * sizeof(float));
      Buffer<float> w = uninitialized_buffer<float>(n, *resource_);
      if (n != 0) B::copy(n, p->value.data(), w.data());
      p->value = std::move(w);  // the old value's memory goes back to its own resource
    }
    resource_->expect(nullptr, 0);
  }
  ParameterArena(const ParameterArena&) = delete;
  ParameterArena& operator=(const ParameterArena&) = delete;
  ~ParameterArena() {
    if (resource_) resource_->drop();
  }

  [[nodiscard]] float* data() const { return resource_ ? static_cast<float*>(resource_->base()) : nullptr; }
  [[nodiscard]] std::size_t size() const { return size_; }
  /** The parameters in arena order. */
  [[nodiscard]] const std::vector<nn::Parameter*>& params() const { return params_; }

 private:
  std::vector<nn::Parameter*> params_;
  std::size_t size_ = 0;
  detail::ArenaResource* resource_ = nullptr;
};

}  // namespace mpar::parallel
