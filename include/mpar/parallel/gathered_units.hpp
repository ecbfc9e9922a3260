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
#include <vector>

#include "mpar/nn/parameter.hpp"

namespace mpar::parallel {

/**
 * @brief Gathers and releases the parameter units of one stage through a ZeRO-3 optimizer `Zero`
 * (`ZeroAdamW` with stage 3: `buckets_of`, `gather_begin`, `gather_end`, `gather_release`).
 */
template <class Zero>
class GatheredUnits {
 public:
  GatheredUnits(Zero& zero, const std::vector<std::vector<nn::Parameter*>>& units) : zero_(&zero) {
    for (const auto& u : units) buckets_.push_back(zero.buckets_of(u));
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
    for (std::size_t b : buckets_[unit]) zero_->gather_end(b, /*for_compute=*/true);
  }

  /** Units whose gathers are launched and not yet released (at most two while a pass runs, none between). */
  [[nodiscard]] std::size_t live() const {
    std::size_t n = 0;
    for (bool i : issued_) n += i ? 1 : 0;
    return n;
  }

 private:
  void issue(std::size_t u) {
    if (issued_[u]) return;
    issued_[u] = true;
    for (std::size_t b : buckets_[u]) zero_->gather_begin(b);
  }
  void release(std::size_t u) {
    for (std::size_t b : buckets_[u]) zero_->gather_release(b);
    issued_[u] = false;
  }

  Zero* zero_;
  std::vector<std::vector<std::size_t>> buckets_;  ///< per unit, the buckets holding its parameters
  std::vector<bool> issued_;
};

}  // namespace mpar::parallel
