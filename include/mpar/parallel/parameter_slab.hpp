#pragma once
/**
 * @file The common part of the parameter and gradient arenas: one block of rank memory carved into one slice per
 * parameter (as many floats as its value), in the order given, each handed to a new `Buffer<float>` of that
 * parameter through the block's memory resource.
 *
 * The arenas differ only in which buffer of a parameter they bind (`value` or `grad`) and in what they write into
 * a slice first; the offsets, the checks of the order, the block's allocation and the hand-out in order are here.
 */
#include <atomic>
#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mpar/core/error.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/nn/parameter.hpp"

namespace mpar::parallel::detail {

/**
 * The memory resource of an arena's slices. It owns the block (allocated from `upstream`, the rank's
 * resource) and lives while anything allocated through it does: the arena holds one reference and every
 * outstanding allocation one more, so a parameter that outlives the arena (or the reverse) is safe in
 * either destruction order. An allocation of the size of the slice announced by `expect` gets that slice;
 * any other (a buffer re-sized or copied through this allocator) comes from `upstream`.
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

/**
 * One slice of `p->value.size()` floats per parameter of `order`, consecutive in that order, in one allocation
 * from `upstream`; `bind` then makes each slice the memory of one buffer of its parameter.
 */
class ParameterSlab {
 public:
  ParameterSlab() = default;
  /** `owner` names the arena in errors (`GradientArena`), `label` in the allocation's label (`gradient arena`). */
  ParameterSlab(std::vector<nn::Parameter*> order, MemoryResource& upstream, std::string_view owner,
                std::string_view label)
      : params_(std::move(order)) {
    for (std::size_t k = 0; k < params_.size(); ++k) {
      require(params_[k] != nullptr, owner, ": parameter ", k, " is null");
      require(offset_.emplace(params_[k], size_).second, owner, ": parameter ", params_[k]->name, " is listed twice");
      size_ += params_[k]->value.size();
    }
    const AllocationLabel allocation(std::string(label) + " (" + std::to_string(params_.size()) + " parameters, " +
                                     std::to_string(size_) + " floats)");
    resource_ = new ArenaResource(upstream, size_ * sizeof(float));
  }
  ParameterSlab(const ParameterSlab&) = delete;
  ParameterSlab& operator=(const ParameterSlab&) = delete;
  ~ParameterSlab() {
    if (resource_) resource_->drop();
  }

  /**
   * Replaces each parameter's buffer `member` by its slice, in order; `fill(parameter, slice)` first writes the
   * slice of a parameter with a non-empty value (while `member` still holds the old buffer). The old buffers'
   * memory goes back to their own resources.
   */
  template <class Fill>
  void bind(Buffer<float> nn::Parameter::*member, Fill fill) {
    float* base = data();
    for (auto* p : params_) {
      const std::size_t n = p->value.size();
      if (n != 0) resource_->expect(base + offset_.at(p), n * sizeof(float));
      Buffer<float> slice = uninitialized_buffer<float>(n, *resource_);
      if (n != 0) fill(*p, slice.data());
      p->*member = std::move(slice);
    }
    resource_->expect(nullptr, 0);
  }

  [[nodiscard]] float* data() const { return resource_ ? static_cast<float*>(resource_->base()) : nullptr; }
  [[nodiscard]] std::size_t size() const { return size_; }
  [[nodiscard]] const std::vector<nn::Parameter*>& params() const { return params_; }
  /** The offset of `p`'s slice, or nullptr when `p` is not in the slab. */
  [[nodiscard]] const std::size_t* offset(const nn::Parameter& p) const {
    const auto it = offset_.find(&p);
    return it == offset_.end() ? nullptr : &it->second;
  }

 private:
  std::vector<nn::Parameter*> params_;
  std::unordered_map<const nn::Parameter*, std::size_t> offset_;
  std::size_t size_ = 0;
  ArenaResource* resource_ = nullptr;
};

}  // namespace mpar::parallel::detail
