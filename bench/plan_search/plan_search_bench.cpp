// The planner's search cost: CPU seconds of the README's 1 T-parameter, 3,072-GPU plan with cost-balanced stage
// partitions searched (ours) against the 2 s budget (baseline; the run fails above it), and with even splits
// only for reference. `--smoke`: the 32-block, 256 K-vocabulary model on 64 GPUs, once.
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "mpar/plan.hpp"

using namespace mpar::plan;

namespace {

/** CPU seconds (this process, every thread) of one search, and its plan. */
double cpu_seconds(const Problem& p, bool balance, Plan* out = nullptr) {
  SearchSpace s;
  s.balance_stages = balance;
  const std::clock_t t0 = std::clock();
  Plan plan = search(p, CostModel(p.model, p.cluster), s);
  const double t = double(std::clock() - t0) / CLOCKS_PER_SEC;
  if (out) *out = std::move(plan);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const bool smoke = mpar::bench::has_flag(argc, argv, "--smoke");
  const Problem p = smoke ? Problem{GptModel{32, 4096, 32, 4096, 256000}, a100_selene(64), 256}
                          : Problem{GptModel{128, 25600, 160, 2048, 51200}, a100_selene(3072), 3072};
  const int reps = smoke ? 1 : 5;
  Plan plan;
  cpu_seconds(p, true, &plan);  // warm-up, and the counts to report
  std::vector<double> ours, baseline;
  for (int r = 0; r < reps; ++r) {
    ours.push_back(cpu_seconds(p, true));
    baseline.push_back(cpu_seconds(p, false));
  }
  const double balanced = mpar::bench::median(ours), even = mpar::bench::median(baseline), budget = 2.0;
  std::printf("%s: considered %zu configurations (%zu also balanced), simulated %zu pipelines\n",
              smoke ? "32 blocks, 256 K vocabulary, 64 GPUs" : "1 T parameters, 3072 GPUs", plan.considered,
              plan.balanced, plan.simulated);
  mpar::bench::print_result_json(
      "plan_search", balanced, budget, "cpu_s", false,
      "\"even_only_cpu_s\": " + std::to_string(even) + ", \"considered\": " + std::to_string(plan.considered) +
          ", \"balanced\": " + std::to_string(plan.balanced) + ", \"simulated\": " + std::to_string(plan.simulated));
  if (!smoke && balanced > budget) {
    std::fprintf(stderr, "plan_search: %.2f s of CPU, over the %.0f s budget\n", balanced, budget);
    return 1;
  }
  return 0;
}
