#pragma once
/**
 * @file Where tensors and parameters live: a per-thread memory resource, the allocator that draws
 * from it, and `Buffer<T>`, the storage of `Tensor` and `nn::Parameter`.
 *
 * Why per thread: a rank is a thread (or a process), and a backend decides for its rank where the
 * rank's tensors live — ordinary host memory for the host backend, CUDA managed memory for the CUDA
 * backend (see backend/gpu/managed_resource.hpp) — by installing a resource in `init_rank()`. The
 * layers allocate their tensors as before and never name the memory kind, so one layer template
 * serves both backends. The choice is made once per allocation, never per element or per kernel.
 *
 * An allocator remembers the resource it was created with, so a buffer is always freed by the
 * resource that allocated it, whichever thread frees it; copies of a buffer take the copying
 * thread's current resource (`select_on_container_copy_construction`).
 */
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace mpar {

/** @brief Tag: allocate without initialising the elements (a kernel writes them all before anything reads them). */
struct uninitialized_t {
  explicit uninitialized_t() = default;
};
inline constexpr uninitialized_t uninitialized{};

/**
 * @brief A source of raw memory for tensors: `allocate(bytes)` returns memory aligned for any
 * element type, `deallocate(p, bytes)` returns it. Memory of every resource must be readable and
 * writable by host code (the optimizers, communicators and checkpoints run on the host).
 */
class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  [[nodiscard]] virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* p, std::size_t bytes) noexcept = 0;
  [[nodiscard]] virtual const char* name() const noexcept = 0;
  /**
   * Copies `bytes` of host memory into `dst`, memory of this resource that no queued operation uses yet
   * (a fresh allocation receiving values only the host knows, e.g. the vocabulary mask; a parameter's are
   * computed in place by the backend's `init_values`), and returns when done. Host memory copies directly; a
   * device resource uploads (and waits), the discrete-memory check writes through the mapping its operations
   * use, so initial values need no backend and no host access of rank memory.
   */
  virtual void write_initial(void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
};

/** Writes `values` into `dst` (fresh, same size) through `dst`'s memory resource (see `MemoryResource::write_initial`). */
template <class T, class V>
void write_initial(std::vector<T, V>& dst, std::span<const T> values) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (!dst.empty()) dst.get_allocator().resource().write_initial(dst.data(), values.data(), dst.size() * sizeof(T));
}

/** @brief Ordinary host memory through the global `operator new` (so allocation tracking sees it). */
class HostMemoryResource final : public MemoryResource {
 public:
  [[nodiscard]] void* allocate(std::size_t bytes) override { return ::operator new(bytes); }
  void deallocate(void* p, std::size_t) noexcept override { ::operator delete(p); }
  [[nodiscard]] const char* name() const noexcept override { return "host"; }
};

namespace detail {
inline HostMemoryResource& host_memory_resource() {
  static HostMemoryResource r;
  return r;
}
inline MemoryResource*& thread_memory_resource() {
  thread_local MemoryResource* r = &host_memory_resource();
  return r;
}
}  // namespace detail

/** @brief The calling thread's resource: where the tensors it creates now will live (host memory by default). */
[[nodiscard]] inline MemoryResource& current_memory_resource() { return *detail::thread_memory_resource(); }
/** @brief Makes `r` the calling thread's resource (it must outlive every buffer allocated from it); returns the previous one. */
inline MemoryResource& set_current_memory_resource(MemoryResource& r) {
  MemoryResource& old = *detail::thread_memory_resource();
  detail::thread_memory_resource() = &r;
  return old;
}

/** @brief Installs a resource for the calling thread for the lifetime of this object. */
class ScopedMemoryResource {
 public:
  explicit ScopedMemoryResource(MemoryResource& r) : previous_(&set_current_memory_resource(r)) {}
  ~ScopedMemoryResource() { set_current_memory_resource(*previous_); }
  ScopedMemoryResource(const ScopedMemoryResource&) = delete;
  ScopedMemoryResource& operator=(const ScopedMemoryResource&) = delete;

 private:
  MemoryResource* previous_;
};

// --- What is being allocated, for the message of an allocation that fails ---

namespace detail {
inline const std::string*& allocation_label() {
  thread_local const std::string* label = nullptr;
  return label;
}
}  // namespace detail

/**
 * @brief Names what the calling thread allocates while this object lives (e.g. "parameter 'block0.attn.qkv.weight'
 * [64, 3, 64]"), so an allocation that fails meanwhile says what it was for. Nests: the innermost label wins.
 */
class AllocationLabel {
 public:
  explicit AllocationLabel(std::string what) : what_(std::move(what)), previous_(detail::allocation_label()) {
    detail::allocation_label() = &what_;
  }
  ~AllocationLabel() { detail::allocation_label() = previous_; }
  AllocationLabel(const AllocationLabel&) = delete;
  AllocationLabel& operator=(const AllocationLabel&) = delete;

 private:
  std::string what_;
  const std::string* previous_;
};

/**
 * @brief A failed allocation of a tensor or parameter buffer: a `std::bad_alloc` (so existing handlers
 * still catch it) whose message names what was being allocated (the innermost `AllocationLabel`), the
 * size and the memory resource.
 */
class allocation_error : public std::bad_alloc {
 public:
  allocation_error(std::size_t bytes, std::size_t elements, const char* resource, const std::string* label) {
    char size[96];
    std::snprintf(size, sizeof size, "%zu bytes (%.3g GiB, %zu elements)", bytes, double(bytes) / double(1ull << 30),
                  elements);
    what_ = "cannot allocate " + (label ? *label : std::string("a tensor buffer")) + ": " + size + " of " + resource +
            " memory";
  }
  [[nodiscard]] const char* what() const noexcept override { return what_.c_str(); }

 private:
  std::string what_;
};

/**
 * @brief A standard allocator over a MemoryResource (the thread's current one by default). It
 * propagates on copy, move and swap, so moving a buffer never copies and a buffer is always freed
 * by the resource that allocated it.
 *
 * An allocator made with `uninitialized` default-initialises the elements a container creates
 * without a value (`resize(n)`), which for the element types of mpar writes nothing: rank memory of
 * a device (or of the discrete-memory check, backend/stream/) is never touched by the host. A copy
 * of such a buffer is an ordinary one again (`select_on_container_copy_construction`).
 */
template <class T>
class ResourceAllocator {
 public:
  using value_type = T;
  using propagate_on_container_copy_assignment = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;
  using propagate_on_container_swap = std::true_type;

  ResourceAllocator() noexcept : resource_(&current_memory_resource()) {}
  explicit ResourceAllocator(MemoryResource& r) noexcept : resource_(&r) {}
  ResourceAllocator(MemoryResource& r, uninitialized_t) noexcept : resource_(&r), default_init_(true) {}
  template <class U>
  ResourceAllocator(const ResourceAllocator<U>& o) noexcept
      : resource_(&o.resource()), default_init_(o.default_init()) {}

  [[nodiscard]] T* allocate(std::size_t n) {
    try {
      return static_cast<T*>(resource_->allocate(n * sizeof(T)));
    } catch (const allocation_error&) {
      throw;
    } catch (const std::bad_alloc&) {
      throw allocation_error(n * sizeof(T), n, resource_->name(), detail::allocation_label());
    }
  }
  void deallocate(T* p, std::size_t n) noexcept { resource_->deallocate(p, n * sizeof(T)); }
  /** A copied container takes the copying thread's resource, not the source's. */
  [[nodiscard]] ResourceAllocator select_on_container_copy_construction() const { return ResourceAllocator(); }
  [[nodiscard]] MemoryResource& resource() const noexcept { return *resource_; }
  /** Whether elements created without a value are left uninitialised (see the class comment). */
  [[nodiscard]] bool default_init() const noexcept { return default_init_; }

  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0) {
      if (default_init_) {
        // Trivially copyable elements (float, bf16, int32...) are implicit-lifetime types: the
        // allocation already holds them, so nothing is stored. Others are default-initialised.
        if constexpr (!(std::is_trivially_copyable_v<U> && std::is_trivially_destructible_v<U>))
          ::new (static_cast<void*>(p)) U;
        return;
      }
    }
    std::construct_at(p, std::forward<Args>(args)...);
  }

  template <class U>
  friend bool operator==(const ResourceAllocator& a, const ResourceAllocator<U>& b) noexcept {
    return &a.resource() == &b.resource();
  }

 private:
  MemoryResource* resource_;
  bool default_init_ = false;
};

/** @brief Contiguous storage of tensors and parameters, allocated from the thread's memory resource. */
template <class T>
using Buffer = std::vector<T, ResourceAllocator<T>>;

/**
 * @brief `n` elements from `r` (the thread's resource by default) that are never written by the host:
 * rank memory a device operation overwrites entirely. Reading them before an operation wrote them
 * is reading garbage (the stream-emulating backend fills them with NaN to show it).
 */
template <class T>
  requires std::is_trivially_copyable_v<T>
[[nodiscard]] Buffer<T> uninitialized_buffer(std::size_t n, MemoryResource& r = current_memory_resource()) {
  Buffer<T> b{ResourceAllocator<T>(r, uninitialized)};
  b.resize(n);
  return b;
}

}  // namespace mpar
