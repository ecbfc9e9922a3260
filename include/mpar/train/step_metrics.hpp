#pragma once
/**
 * @file `StepMetrics`: the numbers a training step reports, the same on every rank — averaged or maximised over the
 * world once per step, some measured by the host, some accumulated in rank memory by the step's own operations
 * (docs/training.md, "The trainer's components").
 */
#include <algorithm>
#include <array>
#include <bitset>
#include <cstddef>
#include <optional>
#include <span>

#include "mpar/backend/backend.hpp"
#include "mpar/backend/host_staging.hpp"
#include "mpar/backend/rank_transfer.hpp"
#include "mpar/comm/detail/collective_communicator.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/layout.hpp"
#include "mpar/core/memory_resource.hpp"

namespace mpar::train {

/**
 * @brief `Averaged` slots averaged over the world, then `Maxed` slots maximised (the slowest rank's wall time). A slot
 * is the host's value given to `reduce`, or, once `accumulator(i)` has handed out its rank memory, what the step's
 * operations added there (MoE's dropped tokens: the passes add them without a host read; the host zeroes it with
 * `B::zero` when a step begins). The reduction runs in rank memory — one staged copy in, two all-reduces, one copy
 * out, one host wait — so it works over a communicator of device memory.
 */
template <backend B, std::size_t Averaged, std::size_t Maxed>
class StepMetrics {
 public:
  static constexpr std::size_t size = Averaged + Maxed;
  using Values = std::array<double, size>;

  /** Rank memory of slot `i`, into which the step's operations accumulate; from now on `reduce` reads it there. */
  double* accumulator(std::size_t i) {
    require(i < size, "StepMetrics::accumulator: slot ", i, " of ", size);
    in_rank_.set(i);
    return rank().data() + i;
  }

  /** `values` reduced over `world` (collective): host slots from `values`, accumulated slots from rank memory. */
  template <mpar::detail::collective_communicator C>
  void reduce(C& world, Values& values) {
    if (world.size() == 1 && in_rank_.none()) return;  // nothing to average, nothing to read
    double* const r = rank().data();
    write_host_slots(values, r);
    if constexpr (Averaged > 0) world.all_reduce(std::span<double>(r, Averaged), ReduceOp::avg);
    if constexpr (Maxed > 0) world.all_reduce(std::span<double>(r + Averaged, Maxed), ReduceOp::max);
    if constexpr (mpar::host_reads_rank_memory<B>)
      std::copy(r, r + size, values.begin());
    else
      staging_->read(r, std::span<double>(values));
  }

 private:
  Buffer<double>& rank() {
    if (rank_.empty()) rank_ = B::template allocate<double>(size);
    return rank_;
  }
  /** The host's slots into rank memory, each run of consecutive host slots as one copy. */
  void write_host_slots(const Values& values, double* r) {
    if constexpr (!mpar::host_reads_rank_memory<B>)
      if (!staging_) staging_.emplace(size);  // after init_rank: pinned for this rank's device
    for (std::size_t i = 0; i < size;) {
      if (in_rank_.test(i)) {
        ++i;
        continue;
      }
      std::size_t end = i;
      while (end < size && !in_rank_.test(end)) ++end;
      const std::span<const double> host(values.data() + i, end - i);
      if constexpr (mpar::host_reads_rank_memory<B>)
        std::copy(host.begin(), host.end(), r + i);
      else
        staging_->write(host, r + i);
      i = end;
    }
  }

  Buffer<double> rank_;  ///< kept between steps: the accumulated slots live here
  std::bitset<size> in_rank_;
  std::optional<mpar::HostStaging<B, double>> staging_;
};

}  // namespace mpar::train
