#pragma once
/**
 * @file The default way to run a pipeline: P ranks as threads of this process, one Executor each.
 *
 * ```
 * auto stats = run_pipeline_threads(make_programs<ZBH1>({4, 8}),
 *     [](int rank, int chunk, int stage) { return MyStage(stage); },   // one object per (rank, chunk)
 *     inputs, loss, 3);                                                 // 3 steps
 * SimResult measured = summarise_measured(stats.back());                // the last step, all ranks
 *                                                    // (mpar/pipeline/summarise_measured.hpp)
 * ```
 */
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/comm/threads.hpp"
#include "mpar/pipeline/executor.hpp"

namespace mpar::pipeline {

/**
 * @brief Runs `steps` steps of `programs` on P threads over the threads communicator. `make_stage(rank,
 * chunk, global_stage)` builds each chunk on its own thread. Returns `stats[step][rank]`. A rank
 * that throws makes every rank fail (rank_failure names it).
 */
template <class MakeStage, class Stage = std::remove_cvref_t<std::invoke_result_t<MakeStage&, int, int, int>>>
[[nodiscard]] auto run_pipeline_threads(const Programs& programs, MakeStage&& make_stage,
                                        const std::vector<nn::Act<input_layout_t<Stage>>>& inputs,
                                        const LossFn<loss_layout_t<Stage>>& loss, int steps = 1,
                                        const OptimizerFn& optimizer = {}, const ExecutorOptions& options = {}) {
  static_assert(pipeline_part<Stage>,
                "run_pipeline_threads: make_stage(rank, chunk, stage) must return a pipeline_part "
                "(typed forward(Act<In>, mb), backward(Act<grad of Out>, mb), parameters())");
  require(steps >= 1, "run_pipeline_threads: steps must be at least 1, got ", steps);
  const int P = programs.config.stages, V = programs.config.chunks;
  std::vector<std::vector<StepStats>> stats(static_cast<std::size_t>(steps),
                                            std::vector<StepStats>(static_cast<std::size_t>(P)));
  std::mutex mu;
  run_threads(P, [&](ThreadsCommunicator& comm) {
    HostBackend::init_rank();
    const int r = comm.rank();
    std::vector<Stage> chunks;
    chunks.reserve(std::size_t(V));
    for (int c = 0; c < V; ++c) chunks.push_back(make_stage(r, c, global_stage(programs.config, r, c)));
    std::vector<Stage*> ptrs;
    for (auto& c : chunks) ptrs.push_back(&c);
    Executor<Stage, ThreadsCommunicator> ex(comm, programs, ptrs, options);
    for (int s = 0; s < steps; ++s) {
      StepStats st = ex.step(inputs, loss, optimizer);
      std::lock_guard l(mu);
      stats[std::size_t(s)][std::size_t(r)] = std::move(st);
    }
  });
  return stats;
}

}  // namespace mpar::pipeline
