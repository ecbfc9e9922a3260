#pragma once
/**
 * @file Stage partitions for the planner: the even split, and the cost-balanced one — Piper's outer level, a
 * dynamic program over the cost model's per-block stage times with the embedding and the output head weighted
 * in (`pipeline::Partition::balanced`), stages without blocks allowed, and where that does not fit, the same
 * within each stage's memory (`stage_layer_limits`). Which is faster the pipeline simulator decides (search.hpp).
 */
#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "mpar/pipeline/partition.hpp"
#include "mpar/plan/cost_model.hpp"
#include "mpar/plan/memory_model.hpp"
#include "mpar/plan/parallel_config.hpp"
#include "mpar/plan/topology.hpp"

namespace mpar::plan {

/** Blocks per global stage of `c` as the executor would run it: `c.stage_layers`, or the even split. */
[[nodiscard]] inline std::vector<std::size_t> stage_layout(const GptModel& m, const ParallelConfig& c) {
  if (!c.stage_layers.empty()) {
    check_stage_layers(m, c);
    return c.stage_layers;
  }
  return std::vector<std::size_t>(c.stages(), layers_per_chunk(m, c));
}

/**
 * The split of `cm`'s blocks over `c`'s pp * V global stages that minimises the busiest stage's forward and
 * backward seconds per micro-batch, with the embedding's work on stage 0 and the final norm, logits and loss on
 * the last stage. A stage may be left without blocks when the head alone outweighs a fair share. `max_layers`
 * (per stage, `stage_layer_limits`) bounds what each stage may hold; empty: no bound.
 */
[[nodiscard]] inline std::vector<std::size_t> balanced_stage_layers(const CostModel& cm, const ParallelConfig& c,
                                                                    const GroupPlacement& g,
                                                                    std::vector<std::size_t> max_layers = {}) {
  const GptModel& m = cm.model();
  const auto seconds = [](const ChunkCosts& x) { return x.forward + x.backward(); };
  const double dense = seconds(cm.layer_costs(c, g)), moe = m.experts > 0 ? seconds(cm.layer_costs(c, g, true)) : 0;
  std::vector<double> blocks(m.layers);
  for (std::size_t b = 0; b < m.layers; ++b) blocks[b] = m.is_moe_layer(b) ? moe : dense;
  const pipeline::StageBalance ends{seconds(cm.embedding_costs(c, g)), seconds(cm.head_costs(c, g)),
                                    pipeline::EmptyStages::allowed, std::move(max_layers)};
  return pipeline::Partition::balanced(blocks, c.stages(), ends).sizes();
}

/**
 * The most blocks each pipeline rank of `c` can hold within `budget` bytes, from the memory model with the
 * rank's peak in-flight activation sets `peaks[rank]` (the verifier's): the embedding's states and 1F1B's
 * longer warm-up weigh on the first rank, the logits on the last. Empty where the model does not separate
 * them: V > 1 (a rank holds several stages) or experts (what a block costs depends on where it sits).
 */
[[nodiscard]] inline std::vector<std::size_t> stage_layer_limits(const GptModel& m, const ParallelConfig& c,
                                                                 const Precision& p, std::span<const double> peaks,
                                                                 double budget, const MemoryOptions& o = {}) {
  if (c.virtual_stages != 1 || c.pp < 2 || m.experts > 0) return {};
  std::vector<std::size_t> limits(c.pp);
  ParallelConfig probe = c;
  for (std::size_t r = 0; r < c.pp; ++r) {
    // Rank r's memory depends on its own blocks only: give it k, spread the rest over the others.
    const auto fits = [&](std::size_t k) {
      probe.stage_layers.assign(c.pp, 0);
      probe.stage_layers[r] = k;
      for (std::size_t i = 0, other = 0; i < c.pp; ++i)
        if (i != r) probe.stage_layers[i] = (m.layers - k) / (c.pp - 1) + (other++ < (m.layers - k) % (c.pp - 1));
      return rank_memory(m, probe, p, r, peaks[r], o).total() <= budget;
    };
    if (!fits(0)) return std::vector<std::size_t>(c.pp, 0);
    // The largest k that fits, bracketed by galloping from the previous rank's limit (neighbouring ranks' limits
    // differ by a block or two, so this takes a few probes where a bisection over all blocks takes log2 of them),
    // then bisected in [lo, hi]; `fits` is monotone in k, so any start is correct.
    std::size_t lo = 0, hi = m.layers;
    const std::size_t guess = r > 0 ? std::min(limits[r - 1], m.layers) : 0;
    if (fits(guess)) {
      lo = guess;
      for (std::size_t step = 1; lo < hi; step *= 2) {
        const std::size_t next = std::min(hi, lo + step);
        if (!fits(next)) {
          hi = next - 1;
          break;
        }
        lo = next;
      }
    } else {
      hi = guess - 1;  // guess > 0: fits(0) holds
      for (std::size_t step = 1; lo < hi; step *= 2) {
        const std::size_t next = hi >= step ? hi - step : 0;
        if (fits(next)) {
          lo = next;
          break;
        }
        hi = next - 1;  // next > 0: fits(0) holds
      }
    }
    while (lo < hi) {
      const std::size_t mid = (lo + hi + 1) / 2;
      if (fits(mid))
        lo = mid;
      else
        hi = mid - 1;
    }
    limits[r] = lo;
  }
  return limits;
}

}  // namespace mpar::plan
