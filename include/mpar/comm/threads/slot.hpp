#pragma once
/**
 * @file Slot: what a rank publishes for the collective in flight, read by its peers between two barriers.
 */
#include <cstddef>
#include <memory>
#include <string>

#include "mpar/comm/detail/collective_check.hpp"

namespace mpar::detail {

class ThreadsGroup;

/** What a rank publishes for the collective in flight; read by peers between two barriers. */
struct Slot {
  Fingerprint fp;
  const void* src = nullptr;
  void* dst = nullptr;
  std::size_t src_count = 0, dst_count = 0;
  const std::size_t* counts_a = nullptr;  // all_to_all_v send counts
  const std::size_t* counts_b = nullptr;  // all_to_all_v recv counts
  int color = 0, key = 0;
  std::shared_ptr<ThreadsGroup> new_group;  // split: published by the lowest rank of each color
  std::string error;                        // this rank's own argument error, reported by every rank
};

}  // namespace mpar::detail
