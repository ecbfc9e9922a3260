#pragma once
/**
 * @file CachingMemoryResource: keeps freed blocks and hands them out again, so a training loop that
 * allocates the same activation shapes every step stops calling its upstream resource after the
 * first step.
 *
 * Why: a rank's upstream resource can be expensive per call. CUDA's `cudaMallocManaged`/`cudaFree`
 * take milliseconds and `cudaFree` waits for the whole device, which would put a device-wide
 * synchronisation into every freed activation. Deep-learning frameworks cache device memory for the
 * same reason (PyTorch's caching allocator). Blocks are binned by size class: multiples of 512 bytes
 * up to 1 MiB, above that eight classes per power of two (at most 12.5 % rounding), and a request is
 * served only from its own class (no splitting, so no fragmentation bookkeeping; a step's shapes
 * repeat, so exact classes hit).
 */
#include <algorithm>
#include <bit>
#include <cstddef>
#include <limits>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "mpar/core/memory_resource.hpp"

namespace mpar {

/** @brief What a CachingMemoryResource holds, in bytes of size-class blocks, and how often it hit. */
struct CacheStats {
  std::size_t in_use = 0;                ///< handed out and not returned
  std::size_t cached = 0;                ///< returned and kept for reuse
  std::size_t peak_in_use = 0;           ///< the most in_use ever was
  std::size_t upstream_allocations = 0;  ///< calls that reached the upstream resource
  std::size_t hits = 0;                  ///< allocations served from the cache
};

/**
 * @brief A MemoryResource in front of `upstream` that keeps freed blocks by size class. Thread-safe
 * (a buffer may be freed on another thread than the one that allocated it). `max_cached` bounds the
 * bytes kept: a returned block beyond it goes back upstream. When the upstream allocation fails, the
 * cache is released and the allocation retried once. Must outlive every buffer allocated from it;
 * cached blocks go back upstream in `release()` and at destruction.
 */
class CachingMemoryResource final : public MemoryResource {
 public:
  explicit CachingMemoryResource(MemoryResource& upstream,
                                 std::size_t max_cached = std::numeric_limits<std::size_t>::max())
      : upstream_(&upstream), max_cached_(max_cached), name_(std::string("caching(") + upstream.name() + ")") {}
  ~CachingMemoryResource() override { release(); }
  void write_initial(void* dst, const void* src, std::size_t bytes) override {
    upstream_->write_initial(dst, src, bytes);
  }
  CachingMemoryResource(const CachingMemoryResource&) = delete;
  CachingMemoryResource& operator=(const CachingMemoryResource&) = delete;

  /** The size class a request of `bytes` is served from (see the file comment). */
  [[nodiscard]] static constexpr std::size_t size_class(std::size_t bytes) {
    constexpr std::size_t small_step = 512, small_limit = std::size_t(1) << 20;
    if (bytes <= small_limit) return std::max<std::size_t>(1, (bytes + small_step - 1) / small_step) * small_step;
    const std::size_t octave = std::bit_floor(bytes - 1);  // bytes lies in (octave, 2 octave]
    const std::size_t step = octave / 8;
    return (bytes + step - 1) / step * step;
  }

  [[nodiscard]] void* allocate(std::size_t bytes) override {
    const std::size_t cls = size_class(bytes);
    {
      std::lock_guard lock(mu_);
      auto it = free_.find(cls);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        stats_.cached -= cls;
        ++stats_.hits;
        note_in_use(cls);
        return p;
      }
      ++stats_.upstream_allocations;
    }
    void* p = nullptr;
    try {
      p = upstream_->allocate(cls);
    } catch (const std::exception&) {
      release();  // the cache may hold what the upstream lacks: give it back and try once more
      p = upstream_->allocate(cls);
    }
    std::lock_guard lock(mu_);
    note_in_use(cls);
    return p;
  }

  void deallocate(void* p, std::size_t bytes) noexcept override {
    if (p == nullptr) return;
    const std::size_t cls = size_class(bytes);
    {
      std::lock_guard lock(mu_);
      stats_.in_use -= cls;
      if (stats_.cached + cls <= max_cached_) {
        try {
          free_[cls].push_back(p);
          stats_.cached += cls;
          return;
        } catch (const std::bad_alloc&) {
          // no room to remember the block: return it upstream below
        }
      }
    }
    upstream_->deallocate(p, cls);
  }

  /** Returns every cached block to the upstream resource. */
  void release() noexcept {
    std::map<std::size_t, std::vector<void*>> blocks;
    {
      std::lock_guard lock(mu_);
      blocks.swap(free_);
      stats_.cached = 0;
    }
    for (auto& [cls, ptrs] : blocks)
      for (void* p : ptrs) upstream_->deallocate(p, cls);
  }

  [[nodiscard]] CacheStats stats() const {
    std::lock_guard lock(mu_);
    return stats_;
  }
  [[nodiscard]] MemoryResource& upstream() const noexcept { return *upstream_; }
  [[nodiscard]] const char* name() const noexcept override { return name_.c_str(); }

 private:
  void note_in_use(std::size_t cls) {
    stats_.in_use += cls;
    stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  }

  MemoryResource* upstream_;
  std::size_t max_cached_;
  std::string name_;
  mutable std::mutex mu_;
  std::map<std::size_t, std::vector<void*>> free_;
  CacheStats stats_;
};

}  // namespace mpar
