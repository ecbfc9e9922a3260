#pragma once
/**
 * @file Replaces the global allocation functions so `observe::AllocationCounter`s see every heap
 * allocation. Include in exactly ONE translation unit of a program (its main file): it defines the
 * replaceable `operator new` / `operator delete` of the C++ standard ([replacement.functions]).
 *
 * Each block carries a 16-byte header with the owning counter and the size; over-aligned requests
 * (align_val_t) keep the library's own functions and are not counted.
 */
#include <cstdio>
#include <cstdlib>
#include <new>

#include "mpar/observe/allocations.hpp"

namespace mpar::observe::detail {
struct alignas(16) AllocationHeader {
  AllocationCounter* owner;
  std::size_t size;
};
static_assert(sizeof(AllocationHeader) == 16, "the header must keep the default new alignment");

/** Set during static initialisation of the program that includes this header. */
inline const bool tracking_installed = (allocation_tracking_installed.store(true), true);

inline void* tracked_alloc(std::size_t n) noexcept {
  auto* h = static_cast<AllocationHeader*>(std::malloc(n + sizeof(AllocationHeader)));
  if (h == nullptr) return nullptr;
  h->owner = tracked_counter;
  h->size = n;
  if (AllocationCounter* c = h->owner) {
    const std::int64_t now = c->live.fetch_add(std::int64_t(n), std::memory_order_relaxed) + std::int64_t(n);
    std::int64_t seen = c->peak.load(std::memory_order_relaxed);
    while (now > seen && !c->peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {}
  }
  return h + 1;
}
inline void tracked_free(void* p) noexcept {
  if (p == nullptr) return;
  auto* h = static_cast<AllocationHeader*>(p) - 1;
  if (h->owner) h->owner->live.fetch_sub(std::int64_t(h->size), std::memory_order_relaxed);
  std::free(h);
}
/** The `std::bad_alloc` of a failed tracked allocation: its message says how many bytes were asked for. */
class allocation_failure : public std::bad_alloc {
 public:
  explicit allocation_failure(std::size_t n) {
    std::snprintf(what_, sizeof what_, "an allocation of %zu bytes (%.3g GiB) failed", n,
                  double(n) / double(1ull << 30));
  }
  [[nodiscard]] const char* what() const noexcept override { return what_; }

 private:
  char what_[96];
};
inline void* tracked_new(std::size_t n) {
  if (void* p = tracked_alloc(n == 0 ? 1 : n)) return p;
  throw allocation_failure(n);
}
}  // namespace mpar::observe::detail

void* operator new(std::size_t n) { return mpar::observe::detail::tracked_new(n); }
void* operator new[](std::size_t n) { return mpar::observe::detail::tracked_new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return mpar::observe::detail::tracked_alloc(n == 0 ? 1 : n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return mpar::observe::detail::tracked_alloc(n == 0 ? 1 : n);
}
void operator delete(void* p) noexcept { mpar::observe::detail::tracked_free(p); }
void operator delete[](void* p) noexcept { mpar::observe::detail::tracked_free(p); }
void operator delete(void* p, std::size_t) noexcept { mpar::observe::detail::tracked_free(p); }
void operator delete[](void* p, std::size_t) noexcept { mpar::observe::detail::tracked_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { mpar::observe::detail::tracked_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { mpar::observe::detail::tracked_free(p); }
