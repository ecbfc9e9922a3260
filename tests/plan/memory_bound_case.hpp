#pragma once
// The memory-bound planning case the recomputation tests share (tests/plan/recompute_mix_test.cpp, per stage;
// recompute_blocks_test.cpp, per block): blocks of hidden 4096 at sequence 4096 over 64 A100s, tp 2 x pp 8 x dp 4,
// 1F1B, ZeRO-1 and SP fixed, and a GPU one GiB short of what the first rank (8 micro-batches in flight) needs
// without recomputation, while the last rank (one in flight) still fits without it.
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include "mpar/plan.hpp"

namespace memory_bound_case {

using namespace mpar::plan;

inline Problem problem() { return Problem{GptModel{32, 4096, 32, 4096, 51200}, a100_selene(64), 256}; }
inline SearchSpace space() {
  SearchSpace s;
  s.tp = 2, s.pp = 8, s.microbatch_size = 1, s.schedule = ScheduleKind::one_f_one_b;
  s.zero1 = true, s.zero2 = false, s.zero3 = false, s.sequence_parallel = true;
  return s;
}
inline ParallelConfig config() {
  ParallelConfig c;
  c.tp = 2, c.pp = 8, c.dp = 4, c.microbatch_size = 1, c.microbatches = 64;
  c.schedule = ScheduleKind::one_f_one_b, c.zero = ZeroStage::optimizer_states, c.sequence_parallel = true;
  return c;
}
/** Usable bytes one GiB short of what the first rank needs without recomputation. */
inline double budget() {
  const ParallelConfig c = config();
  ActivationPeaks peaks;
  return rank_memory(problem().model, c, Precision::mixed_adam(), 0, peaks(c)[0]).total() - gib;
}
/** mpar-plan's arguments for this case at `gpu_mem_gib`. */
inline std::vector<std::string> args(double gpu_mem_gib) {
  std::ostringstream mem;
  mem << std::setprecision(17) << gpu_mem_gib;
  return {"--layers",
          "32",
          "--hidden",
          "4096",
          "--heads",
          "32",
          "--seq",
          "4096",
          "--vocab",
          "51200",
          "--global-batch",
          "256",
          "--gpus",
          "64",
          "--gpus-per-node",
          "8",
          "--gpu-mem-gib",
          mem.str(),
          "--peak-tflops",
          "312",
          "--intra-node-gbps",
          "300",
          "--inter-node-gbps",
          "200",
          "--tp",
          "2",
          "--pp",
          "8",
          "--microbatch-size",
          "1",
          "--schedule",
          "1f1b",
          "--zero1",
          "on",
          "--zero2",
          "off",
          "--zero3",
          "off",
          "--sequence-parallel",
          "on",
          "--top",
          "3"};
}

}  // namespace memory_bound_case
