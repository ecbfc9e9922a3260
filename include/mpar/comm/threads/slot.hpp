#pragma once
/**
 * @file Slot: what a rank publishes for the collective in flight, read by its peers between two barriers.
 */
#include <cstddef>
#include <memory>
#include <string>

#include "mpar/comm/detail/collective_check.hpp"

namespace mpar::detail {

/** What a rank publishes for the collective in flight; read by peers between two barriers. */
struct Slot {
  Fingerprint fp;
  const void* src = nullptr;
  void* dst = nullptr;
  std::size_t src_count = 0, dst_count = 0;
  const std::size_t* counts_a = nullptr;  // all_to_all_v send counts
  const std::size_t* counts_b = nullptr;  // all_to_all_v recv counts
  int color = 0, key = 0;
  // split: the new group, published by the lowest rank of each color (a BasicThreadsGroup, which holds the
  // slots and so is declared after them; its communicator casts it back)
  std::shared_ptr<void> new_group;
  std::string error;  // this rank's own argument error, reported by every rank
};

}  // namespace mpar::detail
