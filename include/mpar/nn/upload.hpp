#pragma once
/**
 * @file `upload<B>(dst, values)`: a micro-batch's host values (token ids, targets) into fresh rank memory,
 * without a host wait.
 *
 * `write_initial` uploads and, on a device, waits for the upload (the source may change once it returns):
 * one host synchronisation per call, two per micro-batch for the ids and the targets, which a step's budget
 * of two cannot afford. Here, on a backend whose operations return at once, the values go through pinned
 * staging with `copy_from_host_async`; the staging buffer stays with an event recorded after the copy and is
 * reused once the stream has passed it (`event_done`, no wait) — after a step's statistics wait all of them
 * have. On HostBackend it is `write_initial` (a memcpy).
 */
#include <algorithm>
#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "mpar/backend/backend.hpp"
#include "mpar/backend/rank_transfer.hpp"
#include "mpar/core/memory_resource.hpp"

namespace mpar::nn {

namespace detail {
/** Pinned staging of type T on the calling rank, each buffer with the event after its last copy. */
template <backend B, class T>
class UploadStaging {
 public:
  /** A staging buffer of at least `n` elements whose previous copy the stream has passed (allocated if none is). */
  typename B::template pinned_buffer<T>& take(std::size_t n, typename B::event_type*& done) {
    for (auto& s : slots_)
      if (s->buffer.size() >= n && (!s->used || B::event_done(s->done))) {
        s->used = true;
        done = &s->done;
        return s->buffer;
      }
    slots_.push_back(std::make_unique<Slot>(n));
    slots_.back()->used = true;
    done = &slots_.back()->done;
    return slots_.back()->buffer;
  }
  ~UploadStaging() {
    for (auto& s : slots_)  // at the rank's end: a copy still queued must not read freed staging
      if (s->used && !B::event_done(s->done)) B::wait_event(s->done);
  }

 private:
  struct Slot {
    explicit Slot(std::size_t n) : buffer(n) {}
    typename B::template pinned_buffer<T> buffer;
    typename B::event_type done;
    bool used = false;
  };
  std::vector<std::unique_ptr<Slot>> slots_;
};
}  // namespace detail

/** Writes `values` into `dst` (fresh rank memory of the same size) on the rank's stream; no host wait. */
template <backend B, class T, class A>
void upload(std::vector<T, A>& dst, std::span<const T> values) {
  if constexpr (mpar::host_reads_rank_memory<B>) {
    write_initial(dst, values);
  } else {
    if (dst.empty()) return;
    thread_local detail::UploadStaging<B, T> staging;
    typename B::event_type* done = nullptr;
    auto& buffer = staging.take(dst.size(), done);
    std::copy_n(values.begin(), dst.size(), buffer.data());
    B::template copy_from_host_async<T>(dst.size(), buffer.data(), dst.data());
    B::record_event(*done);
  }
}

}  // namespace mpar::nn
