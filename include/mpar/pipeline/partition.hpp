#pragma once
/**
 * @file Partitioning a model's N layers into pipeline stages: even, user-given (uneven) and
 * cost-balanced splits. Every layer is covered exactly once — by construction (a partition is a
 * list of stage sizes, each at least 1 unless empty stages are asked for, summing to N) and checked:
 * at compile time for StaticPartition, at construction otherwise. A dropped or doubled layer cannot
 * happen silently.
 */
#include <algorithm>
#include <array>
#include <cstddef>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "mpar/core/error.hpp"

namespace mpar::pipeline {

/**
 * @brief Whether a stage may hold no layer. A stage next to a heavy embedding or output head can be best
 * left with none; mpar's pipeline executor and trainer run only partitions without empty stages.
 */
enum class EmptyStages { refused, allowed };

/** @brief What `Partition::balanced` weighs besides the layers: work fixed to the first and last stage. */
struct StageBalance {
  double first_stage_cost = 0;  ///< e.g. the embedding, on stage 0 whatever its layers
  double last_stage_cost = 0;   ///< e.g. the final norm, logits and loss, on the last stage
  EmptyStages empty_stages = EmptyStages::refused;
  /// Per stage, the most layers it may hold (what fits its memory, say); empty: no limit.
  std::vector<std::size_t> max_layers;
};

/** @brief A contiguous split of `layers()` layers into `stages()` stages; stage s holds [begin(s), end(s)). */
class Partition {
 public:
  /**
   * @brief From stage sizes; throws config_error unless they sum to `layers` and every size is at least 1
   * (or 0 too, with `EmptyStages::allowed`).
   */
  Partition(std::size_t layers, std::vector<std::size_t> sizes, EmptyStages empty = EmptyStages::refused)
      : layers_(layers), sizes_(std::move(sizes)) {
    require(!sizes_.empty(), "Partition: at least one stage is needed");
    std::size_t sum = 0;
    for (std::size_t s = 0; s < sizes_.size(); ++s) {
      require(sizes_[s] >= 1 || empty == EmptyStages::allowed, "Partition: stage ", s,
              " has no layer; every stage needs at least one (", sizes_.size(), " stages for ", layers, " layers)");
      sum += sizes_[s];
    }
    require(sum == layers, "Partition: the stage sizes cover ", sum, " layers but the model has ", layers,
            sum < layers ? " (layers would be dropped)" : " (layers would be doubled)");
    begin_.resize(sizes_.size() + 1, 0);
    std::partial_sum(sizes_.begin(), sizes_.end(), begin_.begin() + 1);
  }

  /** @brief N layers over S stages as evenly as possible (the first N % S stages get one more). */
  [[nodiscard]] static Partition even(std::size_t layers, std::size_t stages) {
    check_counts(layers, stages);
    std::vector<std::size_t> sizes(stages, layers / stages);
    for (std::size_t s = 0; s < layers % stages; ++s) ++sizes[s];
    return {layers, sizes};
  }

  /**
   * @brief The contiguous split into `stages` stages that minimises the most expensive stage
   * (the pipeline's bottleneck), by dynamic programming over prefix sums. `balance` adds work fixed to the
   * first and the last stage (the embedding, the output head) and may allow stages without layers.
   *
   * The best bottleneck of the first i layers over s stages is min over the last cut j of
   * max(best[s-1][j], cost(j, i)): the first term grows with j, the second shrinks, so the best j is where
   * they cross, and that crossing only moves right as i grows. One sweep per stage: O(S · N).
   */
  [[nodiscard]] static Partition balanced(const std::vector<double>& layer_costs, std::size_t stages,
                                          const StageBalance& balance = {}) {
    const std::size_t n = layer_costs.size();
    const bool empty = balance.empty_stages == EmptyStages::allowed;
    if (empty)
      require(stages >= 1, "Partition: at least one stage is needed");
    else
      check_counts(n, stages);
    require(balance.first_stage_cost >= 0 && balance.last_stage_cost >= 0,
            "Partition::balanced: the first and last stage's own costs must not be negative");
    std::vector<double> pre(n + 1, 0);
    for (std::size_t i = 0; i < n; ++i) {
      require(layer_costs[i] >= 0, "Partition::balanced: layer ", i, " has a negative cost");
      pre[i + 1] = pre[i] + layer_costs[i];
    }
    const std::size_t least = empty ? 0 : 1;  // layers per stage at least
    const double inf = std::numeric_limits<double>::infinity();
    // best[s][i]: the smallest bottleneck splitting the first i layers into s stages; cut[s][i] its last cut.
    std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, inf));
    std::vector<std::vector<std::size_t>> cut(stages + 1, std::vector<std::size_t>(n + 1, 0));
    const double last_own = balance.last_stage_cost;
    const auto& caps = balance.max_layers;
    require(caps.empty() || caps.size() == stages, "Partition::balanced: ", caps.size(), " per-stage layer limits for ",
            stages, " stages");
    const auto cap = [&](std::size_t s) { return caps.empty() ? n : caps[s]; };  // s: 0-based stage
    for (std::size_t i = least; i + (stages - 1) * least <= n && i <= cap(0); ++i)
      best[1][i] = balance.first_stage_cost + pre[i] + (stages == 1 ? last_own : 0.0);
    for (std::size_t s = 2; s <= stages; ++s) {
      const double own = s == stages ? last_own : 0.0;
      const std::size_t j_lo = (s - 1) * least;
      std::size_t j = j_lo;  // the crossing: the first cut whose prefix is no cheaper than the stage after it
      for (std::size_t i = s * least; i + (stages - s) * least <= n; ++i) {
        // Cuts from j_min on keep this stage within its limit; j_min, like the crossing, only moves right.
        const std::size_t j_min = std::max(j_lo, i > cap(s - 1) ? i - cap(s - 1) : 0), j_hi = i - least;
        if (j_min > j_hi) continue;
        j = std::max(j, j_min);
        const auto stage = [&](std::size_t k) { return pre[i] - pre[k] + own; };
        while (j <= j_hi && best[s - 1][j] < stage(j)) ++j;
        // Candidates: the crossing itself (bounded by the prefix) and the cut before it (bounded by this stage).
        if (j <= j_hi) best[s][i] = best[s - 1][j], cut[s][i] = j;
        if (j > j_min && std::max(best[s - 1][j - 1], stage(j - 1)) <= best[s][i])
          best[s][i] = std::max(best[s - 1][j - 1], stage(j - 1)), cut[s][i] = j - 1;
      }
    }
    require(best[stages][n] < inf, "Partition::balanced: no split of ", n, " layers over ", stages,
            " stages keeps every stage within its layer limit; more stages or larger limits are needed");
    std::vector<std::size_t> sizes(stages);
    for (std::size_t s = stages, i = n; s > 0; --s) {
      const std::size_t from = s == 1 ? 0 : cut[s][i];
      sizes[s - 1] = i - from;
      i = from;
    }
    return {n, sizes, balance.empty_stages};
  }

  [[nodiscard]] std::size_t layers() const { return layers_; }
  [[nodiscard]] std::size_t stages() const { return sizes_.size(); }
  [[nodiscard]] std::size_t size(std::size_t s) const { return sizes_.at(s); }
  [[nodiscard]] std::size_t begin(std::size_t s) const { return begin_.at(s); }
  [[nodiscard]] std::size_t end(std::size_t s) const { return begin_.at(s + 1); }
  [[nodiscard]] const std::vector<std::size_t>& sizes() const { return sizes_; }
  /** @brief The stage holding `layer`. */
  [[nodiscard]] std::size_t stage_of(std::size_t layer) const {
    require(layer < layers_, "Partition::stage_of: layer ", layer, " beyond the model's ", layers_, " layers");
    return std::size_t(std::upper_bound(begin_.begin(), begin_.end(), layer) - begin_.begin()) - 1;
  }

 private:
  static void check_counts(std::size_t layers, std::size_t stages) {
    require(stages >= 1, "Partition: at least one stage is needed");
    require(stages <= layers, "Partition: more stages (", stages, " = P·V) than layers (", layers,
            "); use fewer pipeline ranks or chunks, or split layers finer");
  }
  std::size_t layers_;
  std::vector<std::size_t> sizes_;
  std::vector<std::size_t> begin_;
};

/**
 * @brief A compile-time partition of N layers into stages of the given sizes: a size of 0 or a sum
 * other than N is a compile error that names the totals.
 */
template <std::size_t N, std::size_t... Sizes>
struct StaticPartition {
  static_assert(sizeof...(Sizes) >= 1, "StaticPartition: at least one stage is needed");
  static_assert(((Sizes >= 1) && ...), "StaticPartition: every stage needs at least one layer (a size is 0)");
  static constexpr std::size_t covered = (Sizes + ... + 0);
  static_assert(covered == N,
                "StaticPartition: the stage sizes must cover exactly the N layers of the model: "
                "a smaller sum drops layers, a larger one doubles them");
  static constexpr std::size_t stages = sizeof...(Sizes);
  static constexpr std::array<std::size_t, stages> sizes{Sizes...};
  static constexpr std::array<std::size_t, stages + 1> begin = [] {
    std::array<std::size_t, stages + 1> b{};
    for (std::size_t s = 0; s < stages; ++s) b[s + 1] = b[s] + sizes[s];
    return b;
  }();
  [[nodiscard]] static Partition runtime() { return {N, {Sizes...}}; }
};

}  // namespace mpar::pipeline
