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
#include <atomic>
#include <cstddef>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mpar/backend/backend.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/nn/parameter.hpp"

namespace mpar::parallel {

namespace detail {

/**
 * The memory resource of an arena's slices. It owns the block (allocated from `upstream`, the rank's
 * resource) and lives while anything allocated through it does: the arena holds one reference and every
 * outstanding allocation one more, so a parameter that outlives the arena (or the reverse) is safe in
 * either destruction order. An allocation of the size of the slice announced by `expect` gets that slice;
 * any other (a gradient re-sized or copied through this allocator) comes from `upstream`.
 */
class ArenaResource final : public MemoryResource {
 public:
  ArenaResource(MemoryResource& upstream, std::size_t bytes)
      : upstream_(&upstream), bytes_(bytes), base_(bytes ? upstream.allocate(bytes) : nullptr) {}
  ArenaResource(const ArenaResource&) = delete;
  ArenaResource& operator=(const ArenaResource&) = delete;

  [[nodiscard]] void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    if (expected_ != nullptr && bytes == expected_bytes_)
      p = std::exchange(expected_, nullptr);
    else
      p = upstream_->allocate(bytes);
    refs_.fetch_add(1, std::memory_order_relaxed);
    return p;
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    if (!inside(p)) upstream_->deallocate(p, bytes);
    drop();
  }
  [[nodiscard]] const char* name() const noexcept override { return upstream_->name(); }
  void write_initial(void* dst, const void* src, std::size_t bytes) override {
    upstream_->write_initial(dst, src, bytes);
  }

  /** The next allocation of exactly `bytes` gets `p` (a slice of the block). */
  void expect(void* p, std::size_t bytes) {
    expected_ = p;
    expected_bytes_ = bytes;
  }
  [[nodiscard]] void* base() const { return base_; }
  /** The arena's reference: the resource deletes itself once this and every allocation are gone. */
  void drop() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

 private:
  ~ArenaResource() override {
    if (base_) upstream_->deallocate(base_, bytes_);
  }
  [[nodiscard]] bool inside(const void* p) const {
    const auto* c = static_cast<const char*>(p);
    const auto* b = static_cast<const char*>(base_);
    return base_ != nullptr && c >= b && c < b + bytes_;
  }

  MemoryResource* upstream_;
  std::size_t bytes_;
  void* base_;
  void* expected_ = nullptr;
  std::size_t expected_bytes_ = 0;
  std::atomic<std::size_t> refs_{1};
};

}  // namespace detail

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
      : params_(std::move(order)) {
    for (std::size_t k = 0; k < params_.size(); ++k) {
      require(params_[k] != nullptr, "GradientArena: parameter ", k, " is null");
      require(offset_.emplace(params_[k], size_).second, "GradientArena: parameter ", params_[k]->name,
              " is listed twice");
      size_ += params_[k]->value.size();
    }
    const AllocationLabel label("gradient arena (" + std::to_string(params_.size()) + " parameters, " +
                                std::to_string(size_) + " floats)");
    resource_ = new detail::ArenaResource(upstream, size_ * sizeof(float));
    auto* base = static_cast<float*>(resource_->base());
    for (auto* p : params_) {
      const std::size_t n = p->value.size(), at = offset_.at(p);
      if (n != 0) resource_->expect(base + at, n * sizeof(float));
      Buffer<float> g = uninitialized_buffer<float>(n, *resource_);
      if (n != 0) {
        if (p->grad.size() == n)
          B::copy(n, p->grad.data(), g.data());
        else
          B::zero(n, g.data());
      }
      p->grad = std::move(g);  // the old gradient's memory goes back to its own resource
    }
    resource_->expect(nullptr, 0);
  }
  GradientArena(const GradientArena&) = delete;
  GradientArena& operator=(const GradientArena&) = delete;
  ~GradientArena() {
    if (resource_) resource_->drop();
  }

  /** Zeroes every gradient of the arena with one backend operation. */
  void zero() {
    if (size_ != 0) B::zero(size_, data());
  }
  /** Whether `p`'s gradient is (still) its slice of the arena. */
  [[nodiscard]] bool holds(const nn::Parameter& p) const {
    const auto it = offset_.find(&p);
    if (it == offset_.end() || p.grad.size() != p.value.size()) return false;
    return p.grad.empty() || p.grad.data() == data() + it->second;
  }
  /** Whether every parameter's gradient is still its slice (nothing replaced a gradient since binding). */
  [[nodiscard]] bool intact() const {
    for (const auto* p : params_)
      if (!holds(*p)) return false;
    return true;
  }
  [[nodiscard]] float* data() const { return resource_ ? static_cast<float*>(resource_->base()) : nullptr; }
  [[nodiscard]] std::size_t size() const { return size_; }
  [[nodiscard]] std::span<float> span() const { return {data(), size_}; }
  /** The parameters in arena order. */
  [[nodiscard]] const std::vector<nn::Parameter*>& params() const { return params_; }

 private:
  std::vector<nn::Parameter*> params_;
  std::unordered_map<const nn::Parameter*, std::size_t> offset_;
  std::size_t size_ = 0;
  detail::ArenaResource* resource_ = nullptr;
};

}  // namespace mpar::parallel
