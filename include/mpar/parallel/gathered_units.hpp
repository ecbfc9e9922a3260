#pragma once
/**
 * @file ZeRO-3's schedule of parameter gathers over the units a model's passes use whole (a transformer
 * block, the embeddings, the head): the hook a stage calls around each unit (`GptPipelinePart::on_unit_use`).
 *
 * Before a unit computes, its buckets' all-gathers are launched (unless a prefetch already did), then those
 * of the unit the pass uses next (the prefetch: asynchronous collectives, in flight while this unit
 * computes), and this unit's are waited for; right after, its gathered values are released. So at most the
 * unit in use and the next one are gathered at once, and the full weights never stay allocated between
 * uses. Every data rank runs the same passes, so every rank launches the same all-gathers in the same order.
 */
#include <cstddef>
#include <utility>
#include <vector>

#include "mpar/nn/parameter.hpp"

namespace mpar::parallel {

/**
 * @brief Gathers and releases the parameter units of one stage through ZeRO-3 optimizers `Zero` (`ZeroAdamW`
 * with stage 3: `buckets_of`, `gather_begin`, `gather_end`, `gather_release`): one, or with experts two (the
 * replicated parameters over data x expert ranks, the experts over the data ranks), a unit's buckets taken from
 * each in the same order on every rank.
 */
template <class Zero>
class GatheredUnits {
 public:
  GatheredUnits(Zero& zero, const std::vector<std::vector<nn::Parameter*>>& units)
      : GatheredUnits(std::vector<Zero*>{&zero}, units) {}
  GatheredUnits(std::vector<Zero*> zeros, const std::vector<std::vector<nn::Parameter*>>& units)
      : zeros_(std::move(zeros)) {
    for (const auto& u : units) {
      std::vector<ZeroBucket> of_unit;
      for (std::size_t z = 0; z < zeros_.size(); ++z)
        for (std::size_t b : zeros_[z]->buckets_of(u)) of_unit.push_back({z, b});
      buckets_.push_back(std::move(of_unit));
    }
    issued_.assign(units.size(), false);
  }

  /** The stage's hook: `begin` gathers `unit` (prefetching `next`, if a unit of this stage), else releases it. */
  void operator()(std::size_t unit, std::size_t next, bool begin) {
    if (!begin) {
      release(unit);
      return;
    }
    issue(unit);
    if (next < buckets_.size()) issue(next);
    for (auto [z, b] : buckets_[unit]) zeros_[z]->gather_end(b, /*for_compute=*/true);
  }

  /** Units whose gathers are launched and not yet released (at most two while a pass runs, none between). */
  [[nodiscard]] std::size_t live() const {
    std::size_t n = 0;
    for (bool i : issued_) n += i ? 1 : 0;
    return n;
  }

 private:
  struct ZeroBucket {
    std::size_t zero, bucket;  ///< which optimizer of `zeros_`, and its bucket
  };

  void issue(std::size_t u) {
    if (issued_[u]) return;
    issued_[u] = true;
    for (auto [z, b] : buckets_[u]) zeros_[z]->gather_begin(b);
  }
  void release(std::size_t u) {
    for (auto [z, b] : buckets_[u]) zeros_[z]->gather_release(b);
    issued_[u] = false;
  }

  std::vector<Zero*> zeros_;
  std::vector<std::vector<ZeroBucket>> buckets_;  ///< per unit, the buckets holding its parameters
  std::vector<bool> issued_;
};

}  // namespace mpar::parallel
