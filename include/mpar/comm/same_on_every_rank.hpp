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
#include <algorithm>
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
/** The 64-bit FNV-1a hash of `s`: communicated as std::uint64_t, exactly. */
[[nodiscard]] inline std::uint64_t setting_hash(std::string_view s) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

/** `v` reduced over `world` by maximum and by minimum: they are equal exactly when every rank holds the same. */
template <class Comm>
std::pair<Buffer<std::uint64_t>, Buffer<std::uint64_t>> max_and_min(Comm& world, const Buffer<std::uint64_t>& v) {
  Buffer<std::uint64_t> hi(v.size()), lo(v.size());
  std::copy(v.begin(), v.end(), hi.begin());
  std::copy(v.begin(), v.end(), lo.begin());
  world.all_reduce(std::span<std::uint64_t>(hi), ReduceOp::max);
  world.all_reduce(std::span<std::uint64_t>(lo), ReduceOp::min);
  return {std::move(hi), std::move(lo)};
}
}  // namespace detail

/**
 * @brief Collective over `world`: throws `config_error` on every rank when the ranks were given different
 * `settings` (the same list of names on every rank, built by the same code), naming each setting that differs
 * and this rank's value of it; `who` starts the message. The number of settings, then the settings' 64-bit
 * hashes, each reduced by maximum and by minimum over std::uint64_t (all-reduces of fixed size): `Comm` needs
 * only `rank()`, `size()` and `all_reduce` of std::uint64_t in the thread's memory resource, which the host reads
 * (any `communicator` over host memory, or a `HostMessageCommunicator` with host memory installed, as
 * `GptTrainer` does).
 */
template <class Comm>
  requires requires(Comm& c, std::span<std::uint64_t> d) {
    c.all_reduce(d, ReduceOp::max);
    { c.rank() } -> std::convertible_to<int>;
    { c.size() } -> std::convertible_to<int>;
  }
void require_same_on_every_rank(Comm& world, const std::vector<RankSetting>& settings, std::string_view who) {
  if (world.size() == 1) return;
  // The list's length first: a program whose ranks build different lists cannot reduce them element by element.
  // In the thread's memory resource, as every communicated buffer (host-readable here: see `Comm` above).
  const std::size_t n = settings.size();
  const auto [count_hi, count_lo] = detail::max_and_min(world, Buffer<std::uint64_t>{std::uint64_t(n)});
  require(count_hi[0] == count_lo[0], who, ": rank ", world.rank(), " checks ", n,
          " settings but another rank a different number: every rank must run the same program");
  Buffer<std::uint64_t> h(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = detail::setting_hash(settings[i].name + '\0' + settings[i].value);
  const auto [hi, lo] = detail::max_and_min(world, h);
  std::string differ;
  for (std::size_t i = 0; i < n; ++i)
    if (hi[i] != lo[i])
      differ += detail::cat(differ.empty() ? "" : ", ", settings[i].name, " (", settings[i].value, " on rank ",
                            world.rank(), ")");
  if (!differ.empty())
    throw config_error(
        detail::cat(who, ": the ranks were started with different settings: ", differ,
                    "; every rank must get the same options and the same data (under mpirun: one command line for all "
                    "ranks, and identical data files on every node)"));
}

}  // namespace mpar
