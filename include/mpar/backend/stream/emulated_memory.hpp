#pragma once
/**
 * @file The rank memory of the stream-emulating backends: fresh allocations filled with NaN, frees
 * in stream order, and (discrete form) memory the host cannot touch.
 *
 * - **NaN fill.** A device allocation holds garbage; code that forgets to zero a buffer it then
 *   accumulates into works on the host by luck (a fresh `std::vector` is zeroed). Every allocation
 *   here is filled with the byte 0xFF, a NaN in float, double, bf16 and f16 (and -1 in an int32), so
 *   the result of a missing zeroing is NaN, which every equivalence test sees.
 * - **Stream-ordered free.** A host thread may drop a buffer right after issuing an operation on it
 *   (a temporary): the operation has not run yet. So a block goes back to the pool only when the
 *   stream of the rank that allocated it reaches the free (an `OnError::always` operation), like
 *   `cudaFreeAsync`; a block is never handed out while an issued operation may still use it (nor, freed
 *   during a stream capture, while the captured graph may be replayed: backend/stream/stream_graph.hpp). Freed
 *   on a thread whose rank stream is gone, it is released at once (its stream ran everything).
 * - **Discrete memory** (`DiscreteMemoryResource`): rank memory is a `memfd` mapped twice. The
 *   address the host gets (in the `Buffer`, the tensor, every pointer the layers pass around) lies
 *   in a `PROT_NONE` mapping; the backend's operations translate each pointer argument to the other,
 *   readable mapping of the same pages before running. Any host read or write of rank memory outside
 *   a backend operation faults (SIGSEGV) — the CPU model of a GPU's separate memory, where such a
 *   read would be a page fault or garbage.
 */
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "mpar/backend/stream/stream.hpp"
#include "mpar/core/caching_memory_resource.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/memory_resource.hpp"

namespace mpar::stream {

/**
 * @brief The part both emulated memories share: NaN fill and the stream-ordered free. A subclass
 * provides the raw blocks and the address through which operations reach them.
 */
class EmulatedRankMemory : public MemoryResource {
 public:
  /** Initial values of a fresh block: written through the operations' mapping, before any operation uses it. */
  void write_initial(void* dst, const void* src, std::size_t bytes) final {
    std::memcpy(operation_address(dst), src, bytes);
    initial_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  /**
   * Bytes written from the host into this memory by `write_initial` so far, over all ranks: what a device
   * would upload. Tests compare it before and after constructing a model (parameters are written by the
   * backend's `init_values` instead).
   */
  [[nodiscard]] std::uint64_t initial_bytes_written() const { return initial_bytes_.load(std::memory_order_relaxed); }
  [[nodiscard]] void* allocate(std::size_t bytes) final {
    const std::size_t n = bytes ? bytes : 1;
    void* p = raw_allocate(n);
    std::memset(operation_address(p), 0xFF, n);  // NaN in every floating type (see the file comment)
    if (const std::shared_ptr<Stream>& owner = thread_stream_slot()) {
      std::lock_guard lock(m_);
      owners_[p] = owner;
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes) noexcept final {
    if (p == nullptr) return;
    const std::size_t n = bytes ? bytes : 1;
    std::shared_ptr<Stream> owner;
    {
      std::lock_guard lock(m_);
      if (auto it = owners_.find(p); it != owners_.end()) {
        owner = it->second.lock();
        owners_.erase(it);
      }
    }
    if (owner) {
      try {
        owner->enqueue_free([this, p, n] { raw_deallocate(p, n); });  // kept with a capture under way
        return;
      } catch (...) {
        // the stream is stopping: it has run everything, so the block is free now
      }
    }
    raw_deallocate(p, n);
  }

  /** The address through which a backend operation reads and writes the block holding `p`; null if `p` is not ours. */
  [[nodiscard]] virtual void* operation_address(const void* p) const = 0;

 protected:
  virtual void* raw_allocate(std::size_t bytes) = 0;
  virtual void raw_deallocate(void* p, std::size_t bytes) noexcept = 0;

 private:
  std::mutex m_;
  std::unordered_map<void*, std::weak_ptr<Stream>> owners_;
  std::atomic<std::uint64_t> initial_bytes_{0};
};

/** @brief Ordinary host memory (one address for host and operations), NaN-filled and freed in stream order. */
class SharedMemoryResource final : public EmulatedRankMemory {
 public:
  [[nodiscard]] void* operation_address(const void* p) const override { return const_cast<void*>(p); }
  [[nodiscard]] const char* name() const noexcept override { return "stream-emulated"; }

 protected:
  void* raw_allocate(std::size_t bytes) override { return ::operator new(bytes, std::align_val_t(64)); }
  void raw_deallocate(void* p, std::size_t) noexcept override { ::operator delete(p, std::align_val_t(64)); }
};

/**
 * @brief Rank memory the host cannot touch (see the file comment): chunks of a `memfd`, each mapped
 * `PROT_NONE` (the address handed out) and read-write (the address operations use). Blocks come from
 * size classes (those of CachingMemoryResource, multiples of 512 bytes, so 64-byte aligned) reused
 * after their stream-ordered free; chunks are kept for the life of the process.
 */
class DiscreteMemoryResource final : public EmulatedRankMemory {
 public:
  /** Address space reserved per chunk; pages cost memory only once an operation touches them. */
  static constexpr std::size_t chunk_bytes = std::size_t(256) << 20;

  [[nodiscard]] void* operation_address(const void* p) const override {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard lock(m_);
    auto it = chunks_.upper_bound(a);
    if (it == chunks_.begin()) return nullptr;
    --it;
    if (a >= it->first + it->second.size) return nullptr;
    return it->second.operations + (a - it->first);
  }
  [[nodiscard]] const char* name() const noexcept override { return "stream-emulated-discrete"; }

 protected:
  void* raw_allocate(std::size_t bytes) override {
    const std::size_t cls = CachingMemoryResource::size_class(bytes);
    std::lock_guard lock(m_);
    if (auto it = free_.find(cls); it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      return p;
    }
    if (current_ == nullptr || current_->size - current_->used < cls) current_ = &new_chunk(std::max(cls, chunk_bytes));
    void* p = current_->host + current_->used;
    current_->used += cls;
    return p;
  }
  void raw_deallocate(void* p, std::size_t bytes) noexcept override {
    std::lock_guard lock(m_);
    try {
      free_[CachingMemoryResource::size_class(bytes)].push_back(p);
    } catch (const std::bad_alloc&) {
      // no room to remember the block: it stays allocated (emulation memory, never returned anyway)
    }
  }

 private:
  struct Chunk {
    char* host = nullptr;        // PROT_NONE: the address the host is given
    char* operations = nullptr;  // read-write view of the same pages
    std::size_t size = 0, used = 0;
  };

  Chunk& new_chunk(std::size_t bytes) {
    const std::size_t page = std::size_t(::sysconf(_SC_PAGESIZE));
    bytes = (bytes + page - 1) / page * page;
    const int fd = ::memfd_create("mpar-rank-memory", MFD_CLOEXEC);
    require(fd >= 0, "DiscreteMemoryResource: memfd_create failed: ", std::strerror(errno));
    if (::ftruncate(fd, off_t(bytes)) != 0) {
      const int e = errno;
      ::close(fd);
      throw config_error(
          mpar::detail::cat("DiscreteMemoryResource: ftruncate to ", bytes, " bytes failed: ", std::strerror(e)));
    }
    void* ops = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    void* host = ops == MAP_FAILED ? MAP_FAILED : ::mmap(nullptr, bytes, PROT_NONE, MAP_SHARED, fd, 0);
    const int e = errno;
    ::close(fd);  // the mappings keep the memory
    if (ops == MAP_FAILED || host == MAP_FAILED) {
      if (ops != MAP_FAILED) ::munmap(ops, bytes);
      throw std::bad_alloc();
    }
    (void)e;
    Chunk c{static_cast<char*>(host), static_cast<char*>(ops), bytes, 0};
    return chunks_[reinterpret_cast<std::uintptr_t>(host)] = c;
  }

  mutable std::mutex m_;
  std::map<std::uintptr_t, Chunk> chunks_;  // by the host (PROT_NONE) base address
  Chunk* current_ = nullptr;                // the chunk new blocks are cut from
  std::map<std::size_t, std::vector<void*>> free_;
};

/** The process's emulated rank memory, shared by every rank (it locks). Never destroyed: buffers in static objects may be freed after it. */
[[nodiscard]] inline SharedMemoryResource& shared_memory_resource() {
  static auto* r = new SharedMemoryResource;
  return *r;
}
/** The process's discrete rank memory (see DiscreteMemoryResource). Never destroyed. */
[[nodiscard]] inline DiscreteMemoryResource& discrete_memory_resource() {
  static auto* r = new DiscreteMemoryResource;
  return *r;
}

}  // namespace mpar::stream
