#pragma once
/**
 * @file A rank's gradients as views into one contiguous allocation, laid out in the order the backward
 * produces them, so that zeroing them is one operation and every gradient bucket is a sub-range of it
 * (its collective runs in place, without copies into and out of a bucket buffer).
 *
 * Each parameter keeps its `grad` member (a `Buffer<float>`); the arena only decides where that buffer's
 * memory lies: it hands the planned slice of its block to the parameter's allocation. Everything that
 * reads or writes `p.grad` is unchanged. A parameter whose gradient is later replaced (ZeRO-2 releases
 * gradients, a test assigns one) simply leaves the arena; its new buffer is an ordinary allocation.
 */
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "mpar/backend/backend.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/nn/parameter.hpp"
#include "mpar/parallel/parameter_slab.hpp"

namespace mpar::parallel {

/**
 * @brief The gradients of `params` as consecutive slices of one allocation of rank memory, in the order given.
 *
 * Pass the order the backward produces gradients — the reverse of model order — so that the buckets of
 * `plan_buckets` (which take parameters last first) are contiguous sub-ranges: `GradBuckets` then reduces
 * each bucket in place (see buckets.hpp). Binding copies each parameter's current gradient into its slice
 * (backend `B::copy`, once); afterwards `zero()` zeroes all of them with one `B::zero`.
 */
template <backend B>
class GradientArena {
 public:
  GradientArena() = default;
  explicit GradientArena(std::vector<nn::Parameter*> order, MemoryResource& upstream = current_memory_resource())
      : slab_(std::move(order), upstream, "GradientArena", "gradient arena") {
    slab_.bind(&nn::Parameter::grad, [](const nn::Parameter& p, float* slice) {
      const std::size_t n = p.value.size();
      if (p.grad.size() == n)
        B::run(ops::copy<float>{.n = n, .src = p.grad.data(), .dst = slice});
      else
        B::run(ops::zero<float>{.n = n, .x = slice});
    });
  }

  /** Zeroes every gradient of the arena with one backend operation (those still its slices: `holds`). */
  void zero() {
    if (size() != 0) B::run(ops::zero<float>{.n = size(), .x = data()});
    for (auto* p : params())
      if (holds(*p)) p->grad_zeroed = true;
  }
  /** Whether `p`'s gradient is (still) its slice of the arena. */
  [[nodiscard]] bool holds(const nn::Parameter& p) const {
    const std::size_t* at = slab_.offset(p);
    if (at == nullptr || p.grad.size() != p.value.size()) return false;
    return p.grad.empty() || p.grad.data() == data() + *at;
  }
  /** Whether every parameter's gradient is still its slice (nothing replaced a gradient since binding). */
  [[nodiscard]] bool intact() const {
    for (const auto* p : params())
      if (!holds(*p)) return false;
    return true;
  }
  [[nodiscard]] float* data() const { return slab_.data(); }
  [[nodiscard]] std::size_t size() const { return slab_.size(); }
  [[nodiscard]] std::span<float> span() const { return {data(), size()}; }
  /** The parameters in arena order. */
  [[nodiscard]] const std::vector<nn::Parameter*>& params() const { return slab_.params(); }

 private:
  detail::ParameterSlab slab_;
};

}  // namespace mpar::parallel
