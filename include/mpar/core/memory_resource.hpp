#pragma once
/**
 * @file Where tensors and parameters live: a per-thread memory resource, the allocator that draws
 * from it, and `Buffer<T>`, the storage of `Tensor` and `nn::Parameter`.
 *
 * Why per thread: a rank is a thread (or a process), and a backend decides for its rank where the
 * rank's tensors live — ordinary host memory for the host backend, CUDA managed memory for the CUDA
 * backend (see backend/cuda/managed_resource.hpp) — by installing a resource in `init_rank()`. The
 * layers allocate their tensors as before and never name the memory kind, so one layer template
 * serves both backends. The choice is made once per allocation, never per element or per kernel.
 *
 * An allocator remembers the resource it was created with, so a buffer is always freed by the
 * resource that allocated it, whichever thread frees it; copies of a buffer take the copying
 * thread's current resource (`select_on_container_copy_construction`).
 */
#include <cstddef>
#include <new>
#include <type_traits>
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
};

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

/**
 * @brief A standard allocator over a MemoryResource (the thread's current one by default). It
 * propagates on copy, move and swap, so moving a buffer never copies and a buffer is always freed
 * by the resource that allocated it.
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
  /** An allocator whose containers leave new elements uninitialised (see `construct`). */
  ResourceAllocator(MemoryResource& r, uninitialized_t) noexcept : resource_(&r), default_init_(true) {}
  template <class U>
  ResourceAllocator(const ResourceAllocator<U>& o) noexcept : resource_(&o.resource()), default_init_(o.default_initialises()) {}

  [[nodiscard]] T* allocate(std::size_t n) { return static_cast<T*>(resource_->allocate(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { resource_->deallocate(p, n * sizeof(T)); }
  /** A copied container takes the copying thread's resource, not the source's. */
  [[nodiscard]] ResourceAllocator select_on_container_copy_construction() const { return ResourceAllocator(); }
  [[nodiscard]] MemoryResource& resource() const noexcept { return *resource_; }
  [[nodiscard]] bool default_initialises() const noexcept { return default_init_; }

  /**
   * Constructs an element. Without arguments (`Buffer<T>(n)`, `resize(n)`) it value-initialises, as
   * std::allocator does, unless this allocator was made with `uninitialized`: then it
   * default-initialises, which leaves arithmetic elements unwritten — how a tensor that a kernel
   * overwrites whole is allocated without the host writing it first (on a device, touching it).
   */
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    if constexpr (sizeof...(A) == 0) {
      if (default_init_) ::new (static_cast<void*>(p)) U;
      else ::new (static_cast<void*>(p)) U();
    } else {
      ::new (static_cast<void*>(p)) U(static_cast<A&&>(a)...);
    }
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
 * @brief `n` elements from the thread's resource, not initialised (for a buffer a backend operation
 * overwrites whole before it is read); growing it later also leaves the new elements unwritten.
 */
template <class T>
[[nodiscard]] Buffer<T> uninitialized_buffer(std::size_t n) {
  return Buffer<T>(n, ResourceAllocator<T>(current_memory_resource(), uninitialized));
}

}  // namespace mpar
