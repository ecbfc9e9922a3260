#pragma once
/**
 * @file Stage partitions for the planner: the even split, and the cost-balanced one — Piper's outer level, a
 * dynamic program over the cost model's per-block stage times with the embedding and the output head weighted
 * in (`pipeline::Partition::balanced`), stages without blocks allowed. Which of the two is faster the pipeline
 * simulator decides (search.hpp).
 */
#include <cstddef>
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
 * the last stage. A stage may be left without blocks when the head alone outweighs a fair share.
 */
[[nodiscard]] inline std::vector<std::size_t> balanced_stage_layers(const CostModel& cm, const ParallelConfig& c,
                                                                    const GroupPlacement& g) {
  const GptModel& m = cm.model();
  const auto seconds = [](const ChunkCosts& x) { return x.forward + x.backward(); };
  const double dense = seconds(cm.layer_costs(c, g)), moe = m.experts > 0 ? seconds(cm.layer_costs(c, g, true)) : 0;
  std::vector<double> blocks(m.layers);
  for (std::size_t b = 0; b < m.layers; ++b) blocks[b] = m.is_moe_layer(b) ? moe : dense;
  const pipeline::StageBalance ends{seconds(cm.embedding_costs(c, g)), seconds(cm.head_costs(c, g)),
                                    pipeline::EmptyStages::allowed};
  return pipeline::Partition::balanced(blocks, c.stages(), ends).sizes();
}

}  // namespace mpar::plan
