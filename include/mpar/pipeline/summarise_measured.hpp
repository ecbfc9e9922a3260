#pragma once
/**
 * @file summarise_measured: the executor's measured step, summarised like a simulated one (makespan, idle per
 * rank, bubble ratio). Kept out of the executor so that a training program does not compile the simulator
 * (`mpar/pipeline/simulator.hpp`, which holds `SimResult`); a benchmark or a test that compares measured
 * against simulated steps includes this.
 */
#include <vector>

#include "mpar/core/error.hpp"
#include "mpar/pipeline/executor.hpp"
#include "mpar/pipeline/simulator.hpp"

namespace mpar::pipeline {

/**
 * @brief Merges every rank's measured timeline into one (threads share one clock; across processes,
 * clocks are only roughly aligned by the step's barrier) and summarises it like a simulation:
 * measured makespan, idle per rank and bubble ratio.
 */
[[nodiscard]] inline SimResult summarise_measured(const std::vector<StepStats>& ranks) {
  SimResult res;
  require(!ranks.empty(), "summarise_measured: no ranks");
  res.timeline.config = ranks.front().timeline.config;
  for (const auto& s : ranks)
    res.timeline.events.insert(res.timeline.events.end(), s.timeline.events.begin(), s.timeline.events.end());
  detail::summarise(res);
  return res;
}

}  // namespace mpar::pipeline
