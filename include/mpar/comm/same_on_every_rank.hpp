#pragma once
/**
 * @file `require_same_on_every_rank`: a collective check that every rank of a communicator was given the same
 * settings, before any collective whose sizes depend on them.
 *
 * Why: under `mpirun` each process parses its own command line and reads its own files. Ranks started with
 * different model sizes, layouts, step counts or data (an MPMD command line, a node whose copy of the data
 * differs) otherwise run collectives of different sizes or different counts: MPI truncation errors, heap
 * corruption, a hang after the shorter run's last step, or a checkpoint whose parts belong to different
 * models. Comparing is cheap and its own collectives have one fixed size, so ranks that disagree cannot
 * desynchronise the check itself.
 */
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mpar/comm/communicator.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/memory_resource.hpp"

namespace mpar {

/** @brief One setting every rank must agree on: its name as the user gives it (e.g. "--layers") and its value. */
struct RankSetting {
  std::string name, value;
};

namespace detail {
/** A 52-bit FNV-1a hash of `s`: exact as a double, so a max-reduction over doubles compares it. */
[[nodiscard]] inline double setting_hash(std::string_view s) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return double(h >> 12);
}
}  // namespace detail

/**
 * @brief Collective over `world`: throws `config_error` on every rank when the ranks were given different
 * `settings` (the same list of names on every rank, built by the same code), naming each setting that differs
 * and this rank's value of it; `who` starts the message. Two all-reduces of fixed size (the number of settings,
 * then the settings' hashes with their negations, by maximum): `Comm` needs only `rank()`, `size()` and
 * `all_reduce` of doubles in the thread's memory resource, which the host reads (any `communicator` over host
 * memory, or a `HostMessageCommunicator` with host memory installed, as `GptTrainer` does).
 */
template <class Comm>
  requires requires(Comm& c, std::span<double> d) {
    c.all_reduce(d, ReduceOp::max);
    { c.rank() } -> std::convertible_to<int>;
    { c.size() } -> std::convertible_to<int>;
  }
void require_same_on_every_rank(Comm& world, const std::vector<RankSetting>& settings, std::string_view who) {
  if (world.size() == 1) return;
  // The list's length first: a program whose ranks build different lists cannot reduce them element by element.
  // In the thread's memory resource, as every communicated buffer (host-readable here: see `Comm` above).
  Buffer<double> count{double(settings.size()), -double(settings.size())};
  world.all_reduce(std::span<double>(count), ReduceOp::max);
  require(count[0] == -count[1], who, ": rank ", world.rank(), " checks ", settings.size(),
          " settings but another rank a different number: every rank must run the same program");
  const std::size_t n = settings.size();
  Buffer<double> h(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    h[i] = detail::setting_hash(settings[i].name + '\0' + settings[i].value);
    h[n + i] = -h[i];
  }
  world.all_reduce(std::span<double>(h), ReduceOp::max);  // h[i] the largest, -h[n + i] the smallest
  std::string differ;
  for (std::size_t i = 0; i < n; ++i)
    if (h[i] != -h[n + i])
      differ += mpar::detail::cat(differ.empty() ? "" : ", ", settings[i].name, " (", settings[i].value, " on rank ",
                                  world.rank(), ")");
  if (!differ.empty())
    throw config_error(mpar::detail::cat(
        who, ": the ranks were started with different settings: ", differ,
        "; every rank must get the same options and the same data (under mpirun: one command line for all "
        "ranks, and identical data files on every node)"));
}

}  // namespace mpar
