// Recomputation per pipeline stage: the memory and cost models take a mode per stage, the search forms the
// per-rank mix (each rank the least recomputation its memory allows), mpar-plan prints it and writes it in the
// plan file train_gpt reads.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <iomanip>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "mpar/plan.hpp"

#include "memory_bound_case.hpp"

using namespace mpar;
using namespace mpar::plan;

namespace {

ParallelConfig uniform_recompute(ParallelConfig c, Recompute r) {
  c.recompute = r;
  c.recompute_stages.clear();
  return c;
}

Problem bound_problem() { return memory_bound_case::problem(); }
SearchSpace bound_space() {
  SearchSpace s = memory_bound_case::space();
  s.mix_block_recompute = false;  // the per-rank mix alone (per block: tests/plan/recompute_blocks_test.cpp)
  return s;
}
double bound_budget() { return memory_bound_case::budget(); }
std::vector<std::string> bound_args(double gpu_mem_gib) {
  std::vector<std::string> a = memory_bound_case::args(gpu_mem_gib);
  a.insert(a.end(), {"--recompute-mix", "stages"});
  return a;
}

std::string mix_temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("mpar_mix_" + std::to_string(::getpid()) + "_" + name)).string();
}

}  // namespace

TEST_CASE("a rank's memory and action costs follow its own stage's recomputation, whatever the others do",
          "[plan][recompute_mix][memory][cost]") {
  using enum nn::Recompute;
  const GptModel m{16, 2048, 16, 2048, 51200};
  const CostModel cm(m, a100_selene(64));
  const Precision prec = Precision::mixed_adam();
  for (std::size_t v : {1, 2}) {
    ParallelConfig c;
    c.tp = 2, c.pp = 4, c.dp = 8, c.microbatches = 8, c.virtual_stages = v, c.sequence_parallel = true;
    c.schedule = v == 1 ? ScheduleKind::one_f_one_b : ScheduleKind::interleaved;
    const std::vector<Recompute> by_rank = {full, selective, none, none};
    ParallelConfig mixed = c;
    mixed.recompute = full;
    for (std::size_t s = 0; s < c.stages(); ++s) mixed.recompute_stages.push_back(by_rank[s % c.pp]);
    REQUIRE(mixed.mixed_recompute());
    ActivationPeaks peaks;
    const std::vector<double>& inflight = peaks(c);
    const GroupPlacement g = place(c, 8, Placement::tensor_innermost);
    for (std::size_t r = 0; r < c.pp; ++r) {
      INFO("v=" << v << " rank " << r << " recomputes " << recompute_name(by_rank[r]));
      const ParallelConfig alike = uniform_recompute(c, by_rank[r]);
      CHECK(rank_memory(m, mixed, prec, r, inflight[r]).total() == rank_memory(m, alike, prec, r, inflight[r]).total());
      for (std::size_t ch = 0; ch < v; ++ch) {
        const ChunkCosts a = cm.chunk_costs(mixed, r, ch, g), b = cm.chunk_costs(alike, r, ch, g);
        CHECK(a.forward == b.forward);
        CHECK(a.backward_input == b.backward_input);
        CHECK(a.backward_weight == b.backward_weight);
      }
    }
    // The modes differ in what they keep and what they redo: on the first rank, with the most in flight, full <
    // selective < none in memory, the reverse in time. (On the last, with one set in flight, rebuilding a whole
    // chunk costs more than keeping it.)
    CHECK(rank_memory(m, uniform_recompute(c, full), prec, 0, inflight[0]).total() <
          rank_memory(m, uniform_recompute(c, selective), prec, 0, inflight[0]).total());
    CHECK(rank_memory(m, uniform_recompute(c, selective), prec, 0, inflight[0]).total() <
          rank_memory(m, uniform_recompute(c, none), prec, 0, inflight[0]).total());
    CHECK(cm.chunk_costs(mixed, 0, 0, g).backward_input > cm.chunk_costs(mixed, 2, 0, g).backward_input);
    // Hardware FLOPs: a quarter of the blocks pays full recomputation's extra forward, a quarter selective's.
    const double batch = 64, base = m.model_flops(batch);
    const double full_extra = iteration_flops(m, batch, full) - base,
                 selective_extra = iteration_flops(m, batch, selective) - base;
    CHECK(iteration_flops(m, mixed, batch) == Approx(base + full_extra / 4 + selective_extra / 4).epsilon(1e-12));
    // The same mode spelled out per stage is the uniform configuration, to the bit.
    ParallelConfig spelled = uniform_recompute(c, selective);
    spelled.recompute_stages.assign(c.stages(), selective);
    CHECK(!spelled.mixed_recompute());
    ActivationPeaks peaks2;
    const Candidate u = evaluate(cm, uniform_recompute(c, selective), peaks2), w = evaluate(cm, spelled, peaks2);
    CHECK(u.step_seconds == w.step_seconds);
    CHECK(u.memory.total() == w.memory.total());
    CHECK(u.tflops_per_gpu == w.tflops_per_gpu);
    // Printed in stage order, a run of three or more once with its length.
    CHECK(mixed.recompute_layout() ==
          (v == 1 ? "full,selective,none,none" : "full,selective,none,none,full,selective,none,none"));
    mixed.recompute_stages.assign(c.stages(), none);
    mixed.recompute_stages.front() = selective;
    CHECK(mixed.recompute_layout() == (v == 1 ? "selective,none*3" : "selective,none*7"));
    // A per-stage list of the wrong length is refused, naming the counts.
    ParallelConfig bad = c;
    bad.recompute_stages = {full, none};
    CHECK_THROWS_WITH(rank_memory(m, bad, prec, 0, 1.0), Catch::Contains("the recomputation per stage has 2 entries") &&
                                                             Catch::Contains("give one mode per stage"));
  }
}

TEST_CASE("ample memory: the search recomputes nothing and finds today's best plan", "[plan][recompute_mix][search]") {
  using enum nn::Recompute;
  const Problem p{GptModel{24, 2304, 24, 2048, 51200}, a100_selene(32), 512};
  const CostModel cm(p.model, p.cluster);
  SearchSpace uniform_only;
  uniform_only.mix_recompute = false;
  const Plan before = search(p, cm, uniform_only), plan = search(p, cm);
  REQUIRE(!before.best.empty());
  REQUIRE(!plan.best.empty());
  const Candidate &a = before.best.front(), &b = plan.best.front();
  INFO(a.config << " / " << b.config);
  CHECK(b.config.recompute == none);
  CHECK(!b.config.mixed_recompute());
  CHECK(std::abs(b.step_seconds - a.step_seconds) <= 1e-9 * a.step_seconds);
  CHECK(b.memory.total() == a.memory.total());
  CHECK(plan.considered == before.considered + plan.mixed);
}

TEST_CASE("memory-bound: the first ranks recompute, the last do not, faster than any one setting for all",
          "[plan][recompute_mix][search]") {
  using enum nn::Recompute;
  Problem p = bound_problem();
  const double budget = bound_budget();
  p.cluster.memory_bytes = budget / SearchOptions{}.usable_memory_fraction;
  const CostModel cm(p.model, p.cluster);
  // No recomputation does not fit (the first rank); full recomputation does.
  SearchSpace s = bound_space();
  s.balance_stages = false;
  s.recompute = none;
  CHECK(search(p, cm, s).best.empty());
  s.recompute = full;
  REQUIRE(!search(p, cm, s).best.empty());

  SearchSpace uniform_only = bound_space();
  uniform_only.mix_recompute = false;
  const Plan uniform_plan = search(p, cm, uniform_only), plan = search(p, cm, bound_space());
  REQUIRE(!uniform_plan.best.empty());
  REQUIRE(!plan.best.empty());
  const Candidate& best = plan.best.front();
  const Candidate& best_uniform = uniform_plan.best.front();
  INFO(best.config << ": " << best.step_seconds << " s; best uniform " << best_uniform.config << ": "
                   << best_uniform.step_seconds << " s");
  CHECK(plan.mixed >= 1);
  CHECK(plan.considered == uniform_plan.considered + plan.mixed);
  REQUIRE(best.config.mixed_recompute());
  CHECK(!best_uniform.config.mixed_recompute());
  CHECK(best.config.recompute_of(0) > best.config.recompute_of(7));
  CHECK(best.config.recompute_of(7) == none);
  CHECK(best.step_seconds < best_uniform.step_seconds);
  // Every rank fits, and recomputes the least that does: one step less does not fit.
  ActivationPeaks peaks;
  const std::vector<double>& inflight = peaks(best.config);
  CHECK(best.memory.total() <= budget);
  for (std::size_t r = 0; r < 8; ++r) {
    const Recompute mode = best.config.recompute_of(r);
    INFO("rank " << r << " recomputes " << recompute_name(mode));
    CHECK(rank_memory(p.model, best.config, cm.precision(), r, inflight[r]).total() <= budget);
    if (mode != none) {
      const ParallelConfig less = uniform_recompute(best.config, Recompute(int(mode) - 1));
      CHECK(rank_memory(p.model, less, cm.precision(), r, inflight[r]).total() > budget);
    }
  }
  // A fixed --recompute means one setting for every stage: no mix is formed.
  SearchSpace fixed = bound_space();
  fixed.recompute = selective;
  CHECK(search(p, cm, fixed).mixed == 0);
}

TEST_CASE("mpar-plan prints and writes the recomputation per stage, and the plan file reads it back",
          "[plan][recompute_mix][cli][plan_file]") {
  using enum nn::Recompute;
  const double mem_gib = bound_budget() / SearchOptions{}.usable_memory_fraction / gib;
  const std::vector<std::string> args = bound_args(mem_gib);
  const CliOptions o = parse_cli(args);
  const Plan plan = search(o.problem, CostModel(o.problem.model, o.problem.cluster), o.space, o.search);
  REQUIRE(!plan.best.empty());
  const ParallelConfig& best = plan.best.front().config;
  REQUIRE(best.mixed_recompute());
  const std::string modes = best.recompute_layout();

  const std::string f = mix_temp_path("mixed.json");
  std::vector<std::string> write = args;
  write.insert(write.end(), {"--write-plan", f});
  std::ostringstream out, err;
  REQUIRE(run_cli(write, out, err) == 0);
  INFO(out.str());
  CHECK_THAT(out.str(), Catch::Contains("  recompute per stage " + modes + " (") &&
                            Catch::Contains(" configurations recompute per pipeline rank") &&
                            Catch::Contains("  1f1b               1  mixed      1     yes ") &&
                            Catch::Contains(" recompute=" + modes + " zero1 sp"));
  // The file train_gpt --plan reads (plan::read_training_plan) holds the modes stage by stage.
  const TrainingPlan written = read_training_plan(f);
  std::filesystem::remove(f);
  REQUIRE(written.recompute_stages.size() == 8);
  for (std::size_t s = 0; s < 8; ++s) CHECK(written.recompute_stages[s] == best.recompute_of(s));
  CHECK(written.recompute_stages.front() != written.recompute_stages.back());
  const TrainingPlan again = TrainingPlan::from_json(written.to_json());
  CHECK(again.recompute_stages == written.recompute_stages);
  CHECK(again.to_json() == written.to_json());

  // --json carries them too.
  std::vector<std::string> json = args;
  json.push_back("--json");
  std::ostringstream jout, jerr;
  REQUIRE(run_cli(json, jout, jerr) == 0);
  std::string listed;
  for (std::size_t s = 0; s < 8; ++s)
    listed += (s ? ",\"" : "\"") + std::string(recompute_name(best.recompute_of(s))) + "\"";
  CHECK_THAT(jout.str(), Catch::StartsWith("{\"rank\":1,") &&
                             Catch::Contains("\"recompute\":\"mixed\",\"recompute_stages\":[" + listed + "]"));
}
