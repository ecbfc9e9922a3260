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

/** The smallest bottleneck over every split of the layers into `stages` (each at least `least` layers). */
double best_by_enumeration(const std::vector<double>& costs, std::size_t stages, const StageBalance& b,
                           std::size_t least) {
  double best = 1e300;
  std::vector<std::size_t> sizes;
  const std::function<void(std::size_t)> place = [&](std::size_t left) {
    if (sizes.size() + 1 == stages) {
      if (left < least) return;
      sizes.push_back(left);
      best = std::min(best, bottleneck(costs, sizes, b));
      sizes.pop_back();
      return;
    }
    for (std::size_t n = least; n <= left; ++n) {
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
  for (int trial = 0; trial < 400; ++trial) {
    const std::size_t n = 1 + rng() % 8, stages = 1 + rng() % 4;
    const bool empty = trial % 2 == 0;
    if (!empty && stages > n) continue;
    std::vector<double> costs(n);
    for (double& c : costs) c = double(rng() % 5) * (rng() % 3 ? 1.0 : 0.5);
    const StageBalance b{double(rng() % 4) * 0.7, double(rng() % 7) * 1.3,
                         empty ? EmptyStages::allowed : EmptyStages::refused};
    const Partition p = Partition::balanced(costs, stages, b);
    INFO(n << " layers, " << stages << " stages, empty stages " << (empty ? "allowed" : "refused"));
    REQUIRE(p.stages() == stages);
    REQUIRE(p.layers() == n);
    if (!empty)
      for (std::size_t s : p.sizes()) CHECK(s >= 1);
    CHECK(bottleneck(costs, p.sizes(), b) == Approx(best_by_enumeration(costs, stages, b, empty ? 0 : 1)));
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
  CHECK(plan.balanced == 0);
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
  CHECK_THAT(table, Catch::Contains("mpar's trainer runs even splits only so far"));

  std::ostringstream even_out, even_err;
  std::vector<std::string> even_args = args;
  even_args.insert(even_args.end(), {"--partition", "even"});
  REQUIRE(run_cli(even_args, even_out, even_err) == 0);
  CHECK_THAT(even_out.str(), Catch::Contains("layers per stage 4x8 (even") && !Catch::Contains("cost-balanced") &&
                                 !Catch::Contains("trainer runs even"));
  std::ostringstream bad_out, bad_err;
  even_args.back() = "uneven";
  CHECK(run_cli(even_args, bad_out, bad_err) == 1);
  CHECK_THAT(bad_err.str(), Catch::Contains("--partition 'uneven' is not known; use balanced or even"));
}
