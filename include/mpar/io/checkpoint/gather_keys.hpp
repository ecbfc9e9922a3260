#pragma once
/**
 * @file `detail::all_gather_keys`: every rank's list of 64-bit keys, of any length, on every rank — how a checkpoint
 * finds the blocks another rank writes and a resume the names no rank loads.
 * Part of `mpar/io/checkpoint.hpp` (docs/checkpoints.md).
 */
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "mpar/core/memory_resource.hpp"

namespace mpar::io::detail {

/**
 * Collective over `comm`: returns each rank's `mine`, by rank. Two all-gathers — the counts, then the keys padded
 * to the longest list — in buffers of the thread's memory resource (rank memory for a device communicator).
 */
template <class C>
std::vector<std::vector<std::uint64_t>> all_gather_keys(C& comm, std::span<const std::uint64_t> mine) {
  const auto p = static_cast<std::size_t>(comm.size());
  Buffer<std::uint64_t> count{std::uint64_t(mine.size())}, counts(p);
  comm.all_gather(std::span<const std::uint64_t>(count), std::span<std::uint64_t>(counts));
  std::size_t most = 0;
  for (std::uint64_t c : counts) most = std::max(most, std::size_t(c));
  std::vector<std::vector<std::uint64_t>> out(p);
  if (most == 0) return out;
  Buffer<std::uint64_t> padded(most, 0), all(most * p);
  std::copy(mine.begin(), mine.end(), padded.begin());
  comm.all_gather(std::span<const std::uint64_t>(padded), std::span<std::uint64_t>(all));
  for (std::size_t r = 0; r < p; ++r)
    out[r].assign(all.begin() + std::ptrdiff_t(r * most), all.begin() + std::ptrdiff_t(r * most + counts[r]));
  return out;
}

}  // namespace mpar::io::detail
