#pragma once
/**
 * @file Partitioning a model's N layers into pipeline stages: even, user-given (uneven) and
 * cost-balanced splits. Every layer is covered exactly once — by construction (a partition is a
 * list of stage sizes, each at least 1, summing to N) and checked: at compile time for
 * StaticPartition, at construction otherwise. A dropped or doubled layer cannot happen silently.
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

/** @brief A contiguous split of `layers()` layers into `stages()` stages; stage s holds [begin(s), end(s)). */
class Partition {
 public:
  /** @brief From stage sizes; throws config_error unless every size is at least 1 and they sum to `layers`. */
  Partition(std::size_t layers, std::vector<std::size_t> sizes) : layers_(layers), sizes_(std::move(sizes)) {
    require(!sizes_.empty(), "Partition: at least one stage is needed");
    std::size_t sum = 0;
    for (std::size_t s = 0; s < sizes_.size(); ++s) {
      require(sizes_[s] >= 1, "Partition: stage ", s, " has no layer; every stage needs at least one (", sizes_.size(),
              " stages for ", layers, " layers)");
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
   * (the pipeline's bottleneck), by dynamic programming over prefix sums: O(S · N²).
   */
  [[nodiscard]] static Partition balanced(const std::vector<double>& layer_costs, std::size_t stages) {
    const std::size_t n = layer_costs.size();
    check_counts(n, stages);
    std::vector<double> pre(n + 1, 0);
    for (std::size_t i = 0; i < n; ++i) {
      require(layer_costs[i] >= 0, "Partition::balanced: layer ", i, " has a negative cost");
      pre[i + 1] = pre[i] + layer_costs[i];
    }
    const double inf = std::numeric_limits<double>::infinity();
    // best[s][i]: the smallest bottleneck splitting the first i layers into s stages; cut[s][i] its last cut.
    std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, inf));
    std::vector<std::vector<std::size_t>> cut(stages + 1, std::vector<std::size_t>(n + 1, 0));
    best[0][0] = 0;
    for (std::size_t s = 1; s <= stages; ++s)
      for (std::size_t i = s; i <= n - (stages - s); ++i)
        for (std::size_t j = s - 1; j < i; ++j) {
          const double v = std::max(best[s - 1][j], pre[i] - pre[j]);
          if (v < best[s][i]) best[s][i] = v, cut[s][i] = j;
        }
    std::vector<std::size_t> sizes(stages);
    for (std::size_t s = stages, i = n; s > 0; --s) {
      sizes[s - 1] = i - cut[s][i];
      i = cut[s][i];
    }
    return {n, sizes};
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
