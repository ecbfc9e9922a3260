// Stage partitions in the planner: the cost-balanced split (the embedding and the head weighted in, stages
// without blocks allowed) against every split, against the even one on a large vocabulary, and in mpar-plan.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "mpar/plan.hpp"

using namespace mpar::plan;
using mpar::pipeline::EmptyStages;
using mpar::pipeline::Partition;
using mpar::pipeline::StageBalance;

namespace {

/** The busiest stage of `sizes` over `costs`, with the first and the last stage's own work. */
double bottleneck(const std::vector<double>& costs, const std::vector<std::size_t>& sizes, const StageBalance& b) {
  double worst = 0;
  std::size_t layer = 0;
  for (std::size_t s = 0; s < sizes.size(); ++s) {
    double stage = (s == 0 ? b.first_stage_cost : 0.0) + (s + 1 == sizes.size() ? b.last_stage_cost : 0.0);
    for (std::size_t i = 0; i < sizes[s]; ++i) stage += costs[layer++];
    worst = std::max(worst, stage);
  }
  return worst;
}

/**
 * The smallest bottleneck over every split of the layers into `stages` (each at least `least` layers, at most
 * `b.max_layers`); 1e300 when none keeps within the limits.
 */
double best_by_enumeration(const std::vector<double>& costs, std::size_t stages, const StageBalance& b,
                           std::size_t least) {
  double best = 1e300;
  std::vector<std::size_t> sizes;
  const auto within = [&](std::size_t stage, std::size_t n) {
    return b.max_layers.empty() || n <= b.max_layers[stage];
  };
  const std::function<void(std::size_t)> place = [&](std::size_t left) {
    if (sizes.size() + 1 == stages) {
      if (left < least || !within(sizes.size(), left)) return;
      sizes.push_back(left);
      best = std::min(best, bottleneck(costs, sizes, b));
      sizes.pop_back();
      return;
    }
    for (std::size_t n = least; n <= left && within(sizes.size(), n); ++n) {
      sizes.push_back(n);
      place(left - n);
      sizes.pop_back();
    }
  };
  place(costs.size());
  return best;
}

/** A 32-block, 7.5 B-parameter model with a 256 K vocabulary (Gemma's) on 64 A100s, pp = 8. */
Problem large_vocabulary(std::size_t vocab) {
  return Problem{GptModel{32, 4096, 32, 4096, vocab}, a100_selene(64), 256};
}

}  // namespace

TEST_CASE("Partition::balanced with the ends weighted in finds the smallest bottleneck of every split",
          "[plan][partition]") {
  std::mt19937 rng(46);
  for (int trial = 0; trial < 600; ++trial) {
    const std::size_t n = 1 + rng() % 8, stages = 1 + rng() % 4;
    const bool empty = trial % 2 == 0;
    if (!empty && stages > n) continue;
    std::vector<double> costs(n);
    for (double& c : costs) c = double(rng() % 5) * (rng() % 3 ? 1.0 : 0.5);
    StageBalance b{double(rng() % 4) * 0.7, double(rng() % 7) * 1.3,
                   empty ? EmptyStages::allowed : EmptyStages::refused};
    if (trial % 3 == 0)  // per-stage limits (what fits each stage's memory)
      for (std::size_t s = 0; s < stages; ++s) b.max_layers.push_back(rng() % 5);
    INFO(n << " layers, " << stages << " stages, empty stages " << (empty ? "allowed" : "refused") << ", "
           << b.max_layers.size() << " limits");
    const double reference = best_by_enumeration(costs, stages, b, empty ? 0 : 1);
    if (reference == 1e300) {
      CHECK_THROWS_WITH(Partition::balanced(costs, stages, b), Catch::Contains("within its layer limit"));
      continue;
    }
    const Partition p = Partition::balanced(costs, stages, b);
    REQUIRE(p.stages() == stages);
    REQUIRE(p.layers() == n);
    for (std::size_t s = 0; s < stages; ++s) {
      CHECK(p.size(s) >= (empty ? 0 : 1));
      if (!b.max_layers.empty()) CHECK(p.size(s) <= b.max_layers[s]);
    }
    CHECK(bottleneck(costs, p.sizes(), b) == Approx(reference));
  }
  // A head worth more than a fair share of the layers gets a stage to itself.
  const Partition head = Partition::balanced(std::vector<double>(4, 1.0), 3, {0.1, 5.0, EmptyStages::allowed});
  CHECK(head.sizes() == std::vector<std::size_t>{2, 2, 0});
  CHECK(head.begin(2) == 4);
  CHECK(head.end(2) == 4);
  // Without asking for them, a stage without layers is still refused.
  CHECK_THROWS_WITH(Partition(7, {7, 0}), Catch::Contains("stage 1 has no layer"));
  CHECK(Partition(7, {7, 0}, EmptyStages::allowed).size(1) == 0);
}

TEST_CASE("a stage's work, parameters and memory follow an uneven layout, a stage without blocks included",
          "[plan][partition]") {
  const Problem p = large_vocabulary(256000);
  const CostModel cm(p.model, p.cluster);
  ParallelConfig c;
  c.tp = 2, c.pp = 4, c.dp = 8, c.microbatches = 8;
  c.stage_layers = {9, 10, 13, 0};
  const GroupPlacement g = place(c, 8, Placement::tensor_innermost);
  const ChunkCosts layer = cm.layer_costs(c, g), head = cm.head_costs(c, g), last = cm.chunk_costs(c, 3, 0, g);
  CHECK(last.forward == Approx(head.forward));  // the head alone
  CHECK(last.backward() == Approx(head.backward()));
  CHECK(cm.chunk_costs(c, 2, 0, g).forward == Approx(13 * layer.forward));
  CHECK(cm.chunk_costs(c, 0, 0, g).forward == Approx(9 * layer.forward + cm.embedding_costs(c, g).forward));
  CHECK(first_chunk_layer(p.model, c, 2, 0) == 19);
  const double h = 4096, per_layer = (12 * h * h + 7 * h) / 2 + 6 * h;
  CHECK(rank_parameters(p.model, c, 3) == Approx(256000 * h / 2 + 2 * h));  // the tied head copy and the final norm
  CHECK(rank_parameters(p.model, c, 2) == Approx(13 * per_layer));
  // The last rank keeps no block activations: less memory than the same rank with 8 blocks.
  ParallelConfig even = c;
  even.stage_layers.clear();
  CHECK(rank_memory(p.model, c, Precision::mixed_adam(), 3, 1).activations <
        rank_memory(p.model, even, Precision::mixed_adam(), 3, 1).activations);
  c.stage_layers = {9, 10, 13};
  CHECK_THROWS_WITH(cm.chunk_costs(c, 0, 0, g),
                    Catch::Contains("3 stages holding 32 blocks") && Catch::Contains("pp*v = 4*1 stages"));
}

TEST_CASE("large vocabularies: the chosen partition lightens the head's stage and beats the even split",
          "[plan][partition][search]") {
  for (std::size_t vocab : {131072u, 256000u}) {
    const Problem p = large_vocabulary(vocab);
    const CostModel cm(p.model, p.cluster);
    SearchSpace s;
    s.pp = 8;
    const Plan plan = search(p, cm, s);
    REQUIRE(!plan.best.empty());
    const Candidate& best = plan.best.front();
    INFO("vocabulary " << vocab << ": " << best.config << ", " << best.step_seconds << " s");
    CHECK(plan.balanced > 0);
    REQUIRE(best.config.stage_layers.size() == 8);
    CHECK(best.stage_layers == best.config.stage_layers);
    std::size_t sum = 0;
    for (std::size_t n : best.stage_layers) sum += n;
    CHECK(sum == 32);
    CHECK(best.stage_layers.back() < 4);    // fewer blocks next to the head than the even 32 / 8
    CHECK(best.stage_layers.front() <= 4);  // and never more next to the embedding
    // The same configuration split evenly is slower, and so is the best plan of an even-only search.
    ParallelConfig even = best.config;
    even.stage_layers.clear();
    ActivationPeaks peaks;
    CHECK(best.step_seconds < evaluate(cm, even, peaks).step_seconds);
    s.balance_stages = false;
    const Plan even_only = search(p, cm, s);
    REQUIRE(!even_only.best.empty());
    CHECK(even_only.balanced == 0);
    for (const Candidate& c : even_only.best) CHECK(c.config.stage_layers.empty());
    CHECK(best.step_seconds < even_only.best.front().step_seconds);
  }
}

TEST_CASE("a uniform model with a tiny vocabulary keeps the even split", "[plan][partition][search]") {
  Problem p = large_vocabulary(1000);
  p.model.seq = 2048;
  const CostModel cm(p.model, p.cluster);
  for (std::size_t tp : {1, 2, 8})
    for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
      ParallelConfig c;
      c.tp = tp, c.pp = 8, c.dp = 8 / tp, c.recompute = r;
      CHECK(balanced_stage_layers(cm, c, place(c, 8, Placement::tensor_innermost)) == std::vector<std::size_t>(8, 4));
    }
  SearchSpace s;
  s.pp = 8;
  const Plan plan = search(p, cm, s);
  REQUIRE(!plan.best.empty());
  // (Configurations whose even split does not fit memory are still tried within each stage's memory limit.)
  for (const Candidate& c : plan.best) {
    CHECK(c.config.stage_layers.empty());
    CHECK(c.stage_layers == std::vector<std::size_t>(c.config.stages(), 32 / c.config.stages()));
  }
}

TEST_CASE("mpar-plan prints the layers per stage and how many configurations it considered and simulated",
          "[plan][partition][cli]") {
  const std::vector<std::string> args = {"--layers",
                                         "32",
                                         "--hidden",
                                         "4096",
                                         "--heads",
                                         "32",
                                         "--seq",
                                         "4096",
                                         "--vocab",
                                         "256000",
                                         "--global-batch",
                                         "256",
                                         "--gpus",
                                         "64",
                                         "--gpus-per-node",
                                         "8",
                                         "--gpu-mem-gib",
                                         "80",
                                         "--peak-tflops",
                                         "312",
                                         "--intra-node-gbps",
                                         "300",
                                         "--inter-node-gbps",
                                         "200",
                                         "--pp",
                                         "8",
                                         "--top",
                                         "3"};
  std::ostringstream out, err;
  REQUIRE(run_cli(args, out, err) == 0);
  const std::string table = out.str();
  const Problem p = large_vocabulary(256000);
  SearchSpace s;
  s.pp = 8;
  SearchOptions o;
  o.top_k = 3;
  const Plan plan = search(p, CostModel(p.model, p.cluster), s, o);
  CHECK_THAT(table, Catch::Contains("searched " + std::to_string(plan.considered) + " configurations (" +
                                    std::to_string(plan.balanced) +
                                    " of them also with a cost-balanced stage "
                                    "partition), simulated " +
                                    std::to_string(plan.simulated) + " pipelines"));
  const std::vector<std::size_t>& layout = plan.best.front().stage_layers;
  CHECK_THAT(table, Catch::Contains("layers per stage " + mpar::plan::detail::layout(layout, " ") + " (cost-balanced"));

  std::ostringstream even_out, even_err;
  std::vector<std::string> even_args = args;
  even_args.insert(even_args.end(), {"--partition", "even"});
  REQUIRE(run_cli(even_args, even_out, even_err) == 0);
  // Whatever the even-only best is (its pp x v chunks of 32 / (pp v) blocks), it says so and no more.
  CHECK_THAT(even_out.str(), Catch::Matches("[\\s\\S]*layers per stage [0-9]+x[0-9]+ \\(even;[\\s\\S]*") &&
                                 !Catch::Contains("cost-balanced"));
  std::ostringstream bad_out, bad_err;
  even_args.back() = "uneven";
  CHECK(run_cli(even_args, bad_out, bad_err) == 1);
  CHECK_THAT(bad_err.str(), Catch::Contains("--partition 'uneven' is not known; use balanced or even"));
}

TEST_CASE("memory-bound: where no even or time-balanced split fits, each stage's memory limit shapes the layout",
          "[plan][partition][search]") {
  // 1F1B keeps P - r micro-batches in flight on rank r: the first rank is the fullest.
  Problem p{GptModel{32, 4096, 32, 4096, 51200}, a100_selene(64), 256};
  SearchSpace s;
  s.tp = 2, s.pp = 8, s.microbatch_size = 1, s.schedule = ScheduleKind::one_f_one_b, s.recompute = Recompute::none;
  s.zero1 = true, s.zero2 = false, s.zero3 = false, s.sequence_parallel = true;
  const CostModel cm(p.model, p.cluster);
  s.balance_stages = false;
  const Plan roomy = search(p, cm, s);
  REQUIRE(roomy.best.size() == 1);
  const Candidate even = roomy.best.front();
  REQUIRE(even.memory.pipeline_rank == 0);
  // One GiB less than the even split needs.
  p.cluster.memory_bytes = (even.memory.total() - gib) / SearchOptions{}.usable_memory_fraction;
  const double budget = even.memory.total() - gib;
  CHECK(search(p, cm, s).best.empty());
  s.balance_stages = true;
  const Plan plan = search(p, cm, s);
  REQUIRE(plan.best.size() == 1);
  const Candidate& best = plan.best.front();
  INFO(best.config << ": " << best.memory.total() / gib << " GiB");
  CHECK(best.stage_layers.front() < 4);  // the fullest rank gives up a block
  CHECK(best.memory.total() <= budget * (1 + 1e-12));
  CHECK(best.step_seconds > even.step_seconds);  // the price of fitting: a slower bottleneck
  // The limits are the largest block counts whose rank memory fits.
  ActivationPeaks peaks;
  const std::vector<double>& inflight = peaks(best.config);
  ParallelConfig c = best.config;
  c.stage_layers.clear();
  const std::vector<std::size_t> limits =
      stage_layer_limits(p.model, c, cm.precision(), inflight, budget, SearchOptions{}.memory);
  REQUIRE(limits.size() == 8);
  for (std::size_t r = 0; r < 8; ++r) {
    CHECK(best.stage_layers[r] <= limits[r]);
    for (std::size_t k : {limits[r], limits[r] + 1}) {
      ParallelConfig probe = c;
      probe.stage_layers.assign(8, 0);
      probe.stage_layers[r] = k;
      probe.stage_layers[r == 0 ? 1 : 0] = 32 - k;
      const double need = rank_memory(p.model, probe, cm.precision(), r, inflight[r]).total();
      CHECK((need <= budget) == (k == limits[r]));
    }
  }
  CHECK(limits[0] < limits[7]);
}
