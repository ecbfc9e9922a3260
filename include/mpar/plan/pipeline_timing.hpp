#pragma once
/**
 * @file The planner's view of a pipeline schedule: it builds the same per-rank programs the executor
 * runs (mpar/pipeline/schedules.hpp), asks the verifier for the peak number of activations each rank
 * holds, and asks the simulator for the makespan with the cost model's per-action seconds. There is
 * no second schedule model here: bubbles, overlap and memory multipliers all come from the programs.
 */
#include <algorithm>
#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mpar/core/error.hpp"
#include "mpar/pipeline/action.hpp"
#include "mpar/pipeline/schedules.hpp"
#include "mpar/pipeline/simulator.hpp"
#include "mpar/pipeline/verifier.hpp"
#include "mpar/plan/cost_model.hpp"
#include "mpar/plan/parallel_config.hpp"

namespace mpar::plan {

/** The pipeline library's description of `c`'s pipeline (P, M, V; `steps` optimizer steps per program). */
[[nodiscard]] inline pipeline::ScheduleConfig schedule_config(const ParallelConfig& c, int steps = 1) {
  pipeline::ScheduleConfig s;
  s.stages = int(c.pp);
  s.microbatches = int(c.microbatches);
  s.chunks = int(c.virtual_stages);
  s.steps = steps;
  return s;
}

/** Empty when the pipeline library accepts `c`'s schedule shape, else its sentence saying what to change. */
[[nodiscard]] inline std::string schedule_problem(const ParallelConfig& c) {
  const pipeline::ScheduleConfig s = schedule_config(c);
  switch (c.schedule) {
    case ScheduleKind::gpipe:
      return pipeline::GPipe::check(s);
    case ScheduleKind::one_f_one_b:
      return pipeline::OneFOneB::check(s);
    case ScheduleKind::interleaved:
      return pipeline::Interleaved1F1B::check(s);
    case ScheduleKind::zb_h1:
      return pipeline::ZBH1::check(s);
    case ScheduleKind::zb_h2:
      return pipeline::ZBH2::check(s);
    case ScheduleKind::two_bw:
      return pipeline::PipeDream2BW::check(s);
  }
  return "unknown schedule";
}

/** The programs every pipeline rank runs for `c`. */
[[nodiscard]] inline pipeline::Programs programs_for(const ParallelConfig& c, int steps = 1) {
  return pipeline::make_programs(schedule_name(c.schedule), schedule_config(c, steps));
}

/**
 * @brief Peak in-flight activation sets per pipeline rank, from the verifier (for zero-bubble schedules
 * counted until each set's weight-gradient pass), cached by (schedule, P, M, V) because the search
 * asks for the same shapes under many cost assumptions.
 */
class ActivationPeaks {
 public:
  [[nodiscard]] const std::vector<double>& operator()(const ParallelConfig& c) {
    const auto key = std::make_tuple(c.schedule, c.pp, c.microbatches, c.virtual_stages);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    const pipeline::Programs prog = programs_for(c);
    const pipeline::VerifyReport rep = pipeline::verify(prog);
    require(rep.ok, "plan: the pipeline verifier rejects ", schedule_name(c.schedule), " with P=", c.pp,
            ", M=", c.microbatches, ", V=", c.virtual_stages, ": ", rep.error);
    std::vector<double> peaks(rep.peak_activations.begin(), rep.peak_activations.end());
    if (prog.split_backward) {
      // The verifier frees a set at backward-input; the weight-gradient pass still reads the stored
      // layer inputs, so for split schedules a set lives until its W. Same programs, counted to W.
      for (std::size_t r = 0; r < prog.ranks.size(); ++r) {
        int live = 0, peak = 0;
        for (const pipeline::Action& a : prog.ranks[r]) {
          if (a.op == pipeline::Op::forward) peak = std::max(peak, ++live);
          if (a.op == pipeline::Op::backward || a.op == pipeline::Op::backward_weight) --live;
        }
        peaks[r] = std::max(peaks[r], double(peak));
      }
    }
    return cache_.emplace(key, std::move(peaks)).first->second;
  }
  [[nodiscard]] std::size_t verified() const { return cache_.size(); }

 private:
  std::map<std::tuple<ScheduleKind, std::size_t, std::size_t, std::size_t>, std::vector<double>> cache_;
};

/** @brief Seconds per action for one pipeline: `chunk[rank][local chunk]`, the p2p delivery time and one optimizer step. */
struct StageCosts {
  std::vector<std::vector<ChunkCosts>> chunk;
  double p2p = 0, optimizer = 0;
};

/** @brief What the simulator predicts for one step of one pipeline. */
struct PipelineTiming {
  double makespan = 0;         ///< seconds per optimizer step, as GptTrainer runs it (2bw: several steps per program)
  double bubble_fraction = 0;  ///< idle share of the compute lanes (the simulator's bubble ratio)
  /// Idle slots per step summed over the ranks (`pipeline::idle_slots`: F one slot, B two): the count
  /// `models::StepReport::idle_slots` reports for the same programs.
  double idle_slots = 0;
  /** [rank][chunk]: start and end of the action that completes the chunk's gradients (its last backward or W). */
  std::vector<std::vector<std::pair<double, double>>> grads_ready;
  double grads_reference_end = 0;  ///< the end of the simulated timeline `grads_ready` refers to
  std::vector<int> peak_activations;
};

/** The simulator's cost table for `sc`: one entry per global stage s = chunk * P + rank. */
[[nodiscard]] inline pipeline::CostModel simulator_costs(const ParallelConfig& c, const StageCosts& sc) {
  pipeline::CostModel m;
  const std::size_t S = c.pp * c.virtual_stages;
  m.forward.assign(S, 0.0);
  m.backward_input.assign(S, 0.0);
  m.backward_weight.assign(S, 0.0);
  for (std::size_t r = 0; r < c.pp; ++r)
    for (std::size_t ch = 0; ch < c.virtual_stages; ++ch) {
      const std::size_t s = ch * c.pp + r;
      m.forward[s] = sc.chunk.at(r).at(ch).forward;
      m.backward_input[s] = sc.chunk[r][ch].backward_input;
      m.backward_weight[s] = sc.chunk[r][ch].backward_weight;
    }
  m.p2p_latency = sc.p2p;
  m.optimizer = sc.optimizer;
  return m;
}

/**
 * Replays `c`'s programs in the pipeline simulator with costs `sc` as the trainer runs them: the one-step program
 * per step for the synchronous schedules; for PipeDream-2BW a program of `PipeDream2BW::steps_per_program` steps
 * without a flush (what `train_gpt` runs), each update a barrier over the pipeline ranks (its norm and tied-weight
 * collectives), per step. The gradients' readiness (for the data-parallel overlap) comes from one step's program.
 */
[[nodiscard]] inline PipelineTiming time_pipeline(const ParallelConfig& c, const StageCosts& sc) {
  pipeline::CostModel costs = simulator_costs(c, sc);
  const pipeline::Programs prog = programs_for(c, 1);
  const pipeline::SimResult one = pipeline::simulate(prog, costs);
  PipelineTiming t;
  t.makespan = one.makespan;
  t.bubble_fraction = one.bubble_ratio;
  t.idle_slots = pipeline::idle_slots(prog);
  if (c.schedule == ScheduleKind::two_bw) {
    constexpr int steps = pipeline::PipeDream2BW::steps_per_program;
    const pipeline::Programs many = programs_for(c, steps);
    costs.synchronous_optimizer = true;
    const pipeline::SimResult run = pipeline::simulate(many, costs);
    t.makespan = run.makespan / steps;
    t.bubble_fraction = run.bubble_ratio;
    t.idle_slots = pipeline::idle_slots(many, true);
  }
  t.peak_activations = one.peak_activations;
  t.grads_reference_end = one.makespan;
  t.grads_ready.assign(c.pp, std::vector<std::pair<double, double>>(c.virtual_stages, {0.0, 0.0}));
  for (const auto& e : one.timeline.events) {
    if (e.lane != pipeline::Lane::compute) continue;
    if (e.action.op != pipeline::Op::backward && e.action.op != pipeline::Op::backward_weight) continue;
    auto& slot = t.grads_ready[std::size_t(e.rank)][std::size_t(e.action.chunk)];
    if (e.end > slot.second) slot = {e.start, e.end};
  }
  return t;
}

}  // namespace mpar::plan
