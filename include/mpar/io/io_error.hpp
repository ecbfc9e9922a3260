#pragma once
/** @file The error every checkpoint operation throws: it names the file and, where one is involved, the tensor. */
#include <stdexcept>
#include <string>
#include <utility>

#include "mpar/core/error.hpp"

namespace mpar::io {

/**
 * @brief A checkpoint could not be written or read: a missing, truncated or corrupted file, a
 * manifest that does not match the model, or an I/O failure. The message names the file and the
 * tensor; nothing is ever loaded silently after one of these.
 */
class checkpoint_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/**
 * @brief The checkpoint_error of a rank whose own part succeeded while another rank's failed: it names
 * the failed ranks, whose own errors say what went wrong (and are reported first by run_threads).
 */
class peer_checkpoint_error : public checkpoint_error, public peer_failure_report {
 public:
  using checkpoint_error::checkpoint_error;
};

namespace detail {
/** Throws checkpoint_error with the concatenated message unless `ok`. */
template <class... Parts>
void check(bool ok, Parts&&... parts) {
  if (!ok) throw checkpoint_error(mpar::detail::cat(std::forward<Parts>(parts)...));
}
}  // namespace detail

}  // namespace mpar::io
