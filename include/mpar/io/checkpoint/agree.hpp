#pragma once
/**
 * @file How a checkpoint phase's failure becomes every rank's: `detail::agree` (one all-gather of a flag),
 * `detail::capture` and the check of a block's shape and size.
 * Part of `mpar/io/checkpoint.hpp` (docs/checkpoints.md).
 */
#include <cstdint>
#include <exception>
#include <span>
#include <string>

#include "mpar/core/memory_resource.hpp"
#include "mpar/io/box.hpp"
#include "mpar/io/io_error.hpp"

namespace mpar::io {

namespace detail {

/**
 * Makes the outcome of a phase collective: every rank learns whether any rank failed, so all of
 * them throw together instead of some waiting forever in the next collective. The failing rank
 * rethrows its own exception (naming file and tensor); the others name the failed ranks.
 */
template <class C>
void agree(C& comm, std::exception_ptr local, const std::string& what) {
  const int p = comm.size();
  // Communicated buffers live in rank memory (a device communicator reads only that).
  Buffer<std::int32_t> mine(1, local ? 1 : 0), all(static_cast<std::size_t>(p), 0);
  comm.all_gather(std::span<const std::int32_t>(mine), std::span<std::int32_t>(all));
  if (local) std::rethrow_exception(local);
  std::string failed;
  for (int r = 0; r < p; ++r)
    if (all[std::size_t(r)] != 0) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  if (!failed.empty())
    throw peer_checkpoint_error(
        mpar::detail::cat(what, " failed on rank(s) ", failed, " of group '", comm.name(), "'; see their errors"));
}

template <class F>
std::exception_ptr capture(F&& f) {
  try {
    f();
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

inline void check_block(const auto& b, const char* op) {
  check(!b.name.empty(), op, ": a block has an empty name");
  check(box_within(b.box, b.global_shape), op, ": block of tensor '", b.name, "' has box ", box_string(b.box),
        " outside its global shape ", shape_string(b.global_shape));
  check(b.data.size() == volume(b.box), op, ": block of tensor '", b.name, "' has box ", box_string(b.box), " (",
        volume(b.box), " elements) but ", b.data.size(), " values");
}

}  // namespace detail

}  // namespace mpar::io
