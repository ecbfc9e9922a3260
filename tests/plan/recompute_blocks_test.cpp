// Recomputation per block inside a pipeline stage (Galvatron's inner level): the memory and cost models count
// each block in its own mode, the search chooses per rank how many blocks recompute fully, selectively and not
// at all, mpar-plan prints it and writes it in the plan file train_gpt reads.
#include <catch2/catch.hpp>

#include <algorithm>
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

/** `c` with every stage recomputing `r`, spelled out block by block (`n` blocks a stage). */
ParallelConfig spelled_per_block(ParallelConfig c, Recompute r, std::size_t n) {
  c.recompute = r;
  c.recompute_stages.assign(c.stages(), r);
  c.recompute_blocks.assign(c.stages(), std::vector<Recompute>(n, r));
  return c;
}

ParallelConfig blocks_uniform(ParallelConfig c, Recompute r) {
  c.recompute = r;
  c.recompute_stages.clear();
  c.recompute_blocks.clear();
  return c;
}

/** The shared memory-bound case (memory_bound_case.hpp), its partition even, every stage balanced the same. */
Problem blocks_bound_problem() { return memory_bound_case::problem(); }
SearchSpace blocks_bound_space() {
  SearchSpace s = memory_bound_case::space();
  s.balance_stages = false;
  return s;
}
ParallelConfig blocks_bound_config() { return memory_bound_case::config(); }
double blocks_bound_budget() { return memory_bound_case::budget(); }
std::vector<std::string> blocks_bound_args(double gpu_mem_gib) {
  std::vector<std::string> a = memory_bound_case::args(gpu_mem_gib);
  a.insert(a.end(), {"--partition", "even"});
  return a;
}

std::string blocks_temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("mpar_blocks_" + std::to_string(::getpid()) + "_" + name)).string();
}

/** How many blocks of global stage `s` recompute `mode`. */
std::size_t count_mode(const ParallelConfig& c, std::size_t s, std::size_t n, Recompute mode) {
  std::size_t k = 0;
  for (std::size_t b = 0; b < n; ++b) k += c.block_recompute_of(s, b) == mode;
  return k;
}

}  // namespace

TEST_CASE("per-block lists alike in a stage are today's per-stage numbers, to the bit",
          "[plan][recompute_blocks][memory][cost]") {
  using enum nn::Recompute;
  const GptModel m{16, 2048, 16, 2048, 51200};
  const CostModel cm(m, a100_selene(64));
  const Precision prec = Precision::mixed_adam();
  for (std::size_t v : {1, 2})
    for (bool sp : {false, true})
      for (Recompute r : {none, selective, full}) {
        ParallelConfig c;
        c.tp = 2, c.pp = 4, c.dp = 8, c.microbatches = 8, c.virtual_stages = v, c.sequence_parallel = sp;
        c.schedule = v == 1 ? ScheduleKind::one_f_one_b : ScheduleKind::interleaved;
        const ParallelConfig today = blocks_uniform(c, r), spelled = spelled_per_block(c, r, 16 / c.stages());
        INFO("v=" << v << " sp=" << sp << " " << recompute_name(r));
        CHECK(!spelled.mixed_recompute());
        CHECK(spelled.recompute_layout() == recompute_name(r));
        ActivationPeaks peaks;
        const GroupPlacement g = place(c, 8, Placement::tensor_innermost);
        for (std::size_t rank = 0; rank < c.pp; ++rank) {
          CHECK(rank_memory(m, spelled, prec, rank, peaks(c)[rank]).total() ==
                rank_memory(m, today, prec, rank, peaks(c)[rank]).total());
          CHECK(rank_memory(m, spelled, prec, rank, peaks(c)[rank], MemoryOptions::megatron()).total() ==
                rank_memory(m, today, prec, rank, peaks(c)[rank], MemoryOptions::megatron()).total());
          for (std::size_t ch = 0; ch < v; ++ch) {
            const ChunkCosts a = cm.chunk_costs(spelled, rank, ch, g), b = cm.chunk_costs(today, rank, ch, g);
            CHECK(a.forward == b.forward);
            CHECK(a.backward_input == b.backward_input);
            CHECK(a.backward_weight == b.backward_weight);
          }
        }
        const Candidate u = evaluate(cm, today, peaks), w = evaluate(cm, spelled, peaks);
        CHECK(u.step_seconds == w.step_seconds);
        CHECK(u.memory.total() == w.memory.total());
        CHECK(u.tflops_per_gpu == w.tflops_per_gpu);
      }
}

TEST_CASE("a stage whose blocks differ counts each block in its own mode", "[plan][recompute_blocks][memory][cost]") {
  using enum nn::Recompute;
  const GptModel m{16, 2048, 16, 2048, 51200};
  const CostModel cm(m, a100_selene(64));
  const Precision prec = Precision::mixed_adam();
  ParallelConfig c;
  c.tp = 2, c.pp = 4, c.dp = 8, c.microbatches = 8, c.schedule = ScheduleKind::one_f_one_b;
  const GroupPlacement g = place(c, 8, Placement::tensor_innermost);
  ActivationPeaks peaks;
  const std::vector<double>& inflight = peaks(c);
  // Rank 1 (stage 1, neither the embedding nor the head): one block selective, the last full, two none.
  ParallelConfig mixed = c;
  mixed.recompute = full;
  mixed.recompute_stages = {none, full, none, none};
  mixed.recompute_blocks = {{}, {none, selective, none, full}, {}, {}};
  REQUIRE(mixed.mixed_recompute());
  CHECK(mixed.mixed_block_recompute());
  CHECK(mixed.recompute_layout() == "none,none:selective:none:full,none,none");
  // Time: the blocks' own costs, from the per-layer model.
  const ChunkCosts lf = cm.layer_costs(c, g, false, full), ls = cm.layer_costs(c, g, false, selective),
                   ln = cm.layer_costs(c, g, false, none);
  const ChunkCosts got = cm.chunk_costs(mixed, 1, 0, g);
  CHECK(got.forward == Approx(lf.forward + ls.forward + 2 * ln.forward).epsilon(1e-12));
  CHECK(got.backward_input == Approx(lf.backward_input + ls.backward_input + 2 * ln.backward_input).epsilon(1e-12));
  CHECK(got.backward_weight == Approx(4 * ln.backward_weight).epsilon(1e-12));
  // Memory: each block keeps what its mode keeps per micro-batch in flight (the full one its input). The backward
  // runs the blocks last first and rebuilds each alone (the full block its activations, the selective one its
  // probabilities) while the blocks before it still hold theirs: the stage is never rebuilt whole.
  const auto layer = [&](Recompute r) { return layer_activation_bytes(m, 1, 2, false, r, prec); };
  const double probabilities = layer(none) - layer(selective);
  double stored = 0, backward = 0;
  for (Recompute r : mixed.recompute_blocks[1]) {
    stored += layer(r);
    backward = std::max(backward, stored + (r == full ? layer(none) : r == selective ? probabilities : 0.0));
  }
  CHECK(backward > stored);  // the full block's rebuild reaches above what the forward left
  const double kept_none = rank_memory(m, blocks_uniform(c, none), prec, 1, inflight[1]).activations;
  const double want = kept_none + inflight[1] * (stored - 4 * layer(none)) + (backward - stored);
  CHECK(rank_memory(m, mixed, prec, 1, inflight[1]).activations == Approx(want).epsilon(1e-12));
  // The other ranks are untouched.
  for (std::size_t r : {0, 2, 3})
    CHECK(rank_memory(m, mixed, prec, r, inflight[r]).total() ==
          rank_memory(m, blocks_uniform(c, none), prec, r, inflight[r]).total());
  // Hardware FLOPs: one block's extra forward and one block's attention core again.
  const double batch = 64, base = m.model_flops(batch);
  const double full_extra = (iteration_flops(m, batch, full) - base) / 16,
               selective_extra = (iteration_flops(m, batch, selective) - base) / 16;
  CHECK(iteration_flops(m, mixed, batch) == Approx(base + full_extra + selective_extra).epsilon(1e-12));

  // Lists that do not match the stage are refused, naming the counts.
  ParallelConfig short_list = mixed;
  short_list.recompute_blocks[1] = {full, none};
  CHECK_THROWS_WITH(
      rank_memory(m, short_list, prec, 1, 1.0),
      Catch::Contains("the recomputation per block of stage 1 has 2 modes, but the stage holds 4 blocks"));
  CHECK_THROWS_WITH(cm.chunk_costs(short_list, 1, 0, g), Catch::Contains("give one mode per block"));
  ParallelConfig wrong_most = mixed;
  wrong_most.recompute_stages[1] = selective;
  CHECK_THROWS_WITH(rank_memory(m, wrong_most, prec, 1, 1.0),
                    Catch::Contains("the blocks of stage 1 recompute at most full, but the stage is set to selective"));
  ParallelConfig three_stages = mixed;
  three_stages.recompute_blocks.pop_back();
  CHECK_THROWS_WITH(rank_memory(m, three_stages, prec, 0, 1.0),
                    Catch::Contains("the recomputation per block names 3 stages, but pp*v = 4*1"));
}

TEST_CASE("ample memory: with per-block mixing the search recomputes nothing and finds today's best plan",
          "[plan][recompute_blocks][search]") {
  using enum nn::Recompute;
  const Problem p{GptModel{24, 2304, 24, 2048, 51200}, a100_selene(32), 512};
  const CostModel cm(p.model, p.cluster);
  SearchSpace stages_only;
  stages_only.mix_block_recompute = false;
  const Plan before = search(p, cm, stages_only), plan = search(p, cm);
  REQUIRE(!before.best.empty());
  REQUIRE(!plan.best.empty());
  const Candidate &a = before.best.front(), &b = plan.best.front();
  INFO(a.config << " / " << b.config);
  CHECK(b.config.recompute == none);
  CHECK(!b.config.mixed_recompute());
  CHECK(std::abs(b.step_seconds - a.step_seconds) <= 1e-9 * a.step_seconds);
  CHECK(b.memory.total() == a.memory.total());
  // Per-block mixes were formed (where the even split does not fit without recomputation) and lost.
  CHECK(plan.mixed_blocks > 0);
  CHECK(plan.considered == before.considered + plan.mixed_blocks);
}

TEST_CASE("memory-bound: per-block counts are never slower than the per-stage plans and recompute the fewest blocks",
          "[plan][recompute_blocks][search]") {
  using enum nn::Recompute;
  Problem p = blocks_bound_problem();
  const double budget = blocks_bound_budget();
  p.cluster.memory_bytes = budget / SearchOptions{}.usable_memory_fraction;
  const CostModel cm(p.model, p.cluster);
  SearchSpace stages_only = blocks_bound_space();
  stages_only.mix_block_recompute = false;
  const Plan per_stage = search(p, cm, stages_only), plan = search(p, cm, blocks_bound_space());
  REQUIRE(!per_stage.best.empty());
  REQUIRE(!plan.best.empty());
  const Candidate& best = plan.best.front();
  INFO(best.config << ": " << best.step_seconds << " s; best per stage " << per_stage.best.front().config << ": "
                   << per_stage.best.front().step_seconds << " s");
  CHECK(plan.mixed_blocks >= 1);
  CHECK(plan.considered == per_stage.considered + plan.mixed_blocks);
  CHECK(best.step_seconds <= per_stage.best.front().step_seconds);
  CHECK(best.config.mixed_block_recompute());

  // The mix itself: every rank fits, and no mix with a block less recomputed (one full block selective, one full
  // or one selective block not recomputed) does; those would be faster, so the counts are the fastest that fit.
  const ParallelConfig c = blocks_bound_config();
  ActivationPeaks peaks;
  const auto mix = per_block_recompute(p.model, blocks_uniform(c, full), cm,
                                       place(c, p.cluster.gpus_per_node, Placement::tensor_innermost), peaks, budget);
  REQUIRE(mix.has_value());
  const std::vector<double>& inflight = peaks(c);
  const std::size_t n = 4;
  std::size_t recomputing = 0;
  for (std::size_t r = 0; r < c.pp; ++r) {
    const std::size_t f = count_mode(*mix, r, n, full), s = count_mode(*mix, r, n, selective);
    recomputing += f + s;
    INFO("rank " << r << ": " << f << " full, " << s << " selective of " << n);
    const auto need = [&](std::size_t nf, std::size_t ns) {
      ParallelConfig k = *mix;
      std::vector<Recompute> b(n, none);
      for (std::size_t i = 0; i < nf + ns; ++i) b[i] = i < nf ? full : selective;
      k.recompute_blocks[r] = b;
      k.recompute_stages[r] = *std::max_element(b.begin(), b.end());
      return rank_memory(p.model, k, cm.precision(), r, inflight[r]).total();
    };
    CHECK(need(f, s) <= budget);
    if (s > 0) CHECK(need(f, s - 1) > budget);
    if (f > 0) CHECK(need(f - 1, s) > budget);
    if (f > 0) CHECK(need(f - 1, s + 1) > budget);
  }
  // The first rank recomputes some blocks, the last none; fewer blocks recompute than in the per-rank mix.
  CHECK(count_mode(*mix, 0, n, none) < n);
  CHECK(count_mode(*mix, 7, n, none) == n);
  const auto per_rank = per_rank_recompute(p.model, blocks_uniform(c, full), cm.precision(), peaks, budget);
  REQUIRE(per_rank.has_value());
  std::size_t per_rank_recomputing = 0;
  for (std::size_t r = 0; r < c.pp; ++r) per_rank_recomputing += per_rank->recompute_of(r) == none ? 0 : n;
  CHECK(recomputing < per_rank_recomputing);

  // Without room for even one block's saving the mix is not formed; a dense model only.
  CHECK(!per_block_recompute(p.model, blocks_uniform(c, full), cm,
                             place(c, p.cluster.gpus_per_node, Placement::tensor_innermost), peaks, 1.0)
             .has_value());
  GptModel moe = p.model;
  moe.experts = 8;
  CHECK(!per_block_recompute(moe, blocks_uniform(c, full), cm,
                             place(c, p.cluster.gpus_per_node, Placement::tensor_innermost), peaks, budget)
             .has_value());
}

TEST_CASE("mpar-plan prints and writes the recomputation per block, and the plan file reads it back",
          "[plan][recompute_blocks][cli][plan_file]") {
  using enum nn::Recompute;
  const double mem_gib = blocks_bound_budget() / SearchOptions{}.usable_memory_fraction / gib;
  const std::vector<std::string> args = blocks_bound_args(mem_gib);
  const CliOptions o = parse_cli(args);
  const Plan plan = search(o.problem, CostModel(o.problem.model, o.problem.cluster), o.space, o.search);
  REQUIRE(!plan.best.empty());
  const ParallelConfig& best = plan.best.front().config;
  REQUIRE(best.mixed_block_recompute());
  const std::string modes = best.recompute_layout();
  CHECK_THAT(modes, Catch::Contains(":"));

  const std::string f = blocks_temp_path("blocks.json");
  std::vector<std::string> write = args;
  write.insert(write.end(), {"--write-plan", f});
  std::ostringstream out, err;
  REQUIRE(run_cli(write, out, err) == 0);
  INFO(out.str());
  CHECK_THAT(out.str(), Catch::Contains("  recompute per stage " + modes + " (per block inside a stage") &&
                            Catch::Contains(" per block inside the stages)") &&
                            Catch::Contains(" recompute=" + modes + " zero1 sp"));
  const TrainingPlan written = read_training_plan(f);
  std::filesystem::remove(f);
  REQUIRE(written.recompute_blocks.size() == 8);
  for (std::size_t s = 0; s < 8; ++s) {
    CHECK(written.recompute_stages[s] == best.recompute_of(s));
    for (std::size_t b = 0; b < written.recompute_blocks[s].size(); ++b)
      CHECK(written.recompute_blocks[s][b] == best.block_recompute_of(s, b));
  }
  CHECK_THAT(written.to_json(), Catch::Contains("\"version\": 3") && Catch::Contains("\"recompute_blocks\": [["));
  const TrainingPlan again = TrainingPlan::from_json(written.to_json());
  CHECK(again.recompute_blocks == written.recompute_blocks);
  CHECK(again.to_json() == written.to_json());

  // --json carries the lists too; --recompute-mix stages turns the per-block mix off.
  std::vector<std::string> json = args;
  json.push_back("--json");
  std::ostringstream jout, jerr;
  REQUIRE(run_cli(json, jout, jerr) == 0);
  CHECK_THAT(jout.str(), Catch::Contains("\"recompute\":\"mixed\"") && Catch::Contains(",\"recompute_blocks\":[["));
  std::vector<std::string> stages = args;
  stages.insert(stages.end(), {"--recompute-mix", "stages"});
  const CliOptions so = parse_cli(stages);
  CHECK(so.space.mix_recompute);
  CHECK(!so.space.mix_block_recompute);
  std::vector<std::string> bad = args;
  bad.insert(bad.end(), {"--recompute-mix", "layers"});
  CHECK_THROWS_WITH(parse_cli(bad),
                    Catch::Contains("--recompute-mix 'layers' is not known; use blocks, stages or off"));
}

TEST_CASE("plan files: per-block lists round-trip, per-stage files stay version 2, bad lists are refused",
          "[plan][recompute_blocks][plan_file]") {
  using enum nn::Recompute;
  TrainingPlan p;
  p.layers = 5, p.hidden = 32, p.heads = 4, p.seq = 16, p.vocab = 65, p.global_batch = 8;
  p.tp = 2, p.pp = 2, p.v = 1, p.dp = 1, p.microbatches = 4;
  p.stage_layers = {2, 3};
  p.recompute_stages = {full, selective};
  // Without per-block lists the file is the per-stage one, byte for byte as before.
  const std::string per_stage = p.to_json();
  CHECK_THAT(per_stage, Catch::Contains("\"version\": 2") && !Catch::Contains("recompute_blocks"));
  CHECK(TrainingPlan::from_json(per_stage).recompute_blocks.empty());

  p.recompute_blocks = {{full, none}, {}};
  const std::string text = p.to_json();
  CHECK_THAT(text, Catch::Contains("\"version\": 3") &&
                       Catch::EndsWith("\"recompute_stages\": [\"full\", \"selective\"],\n"
                                       "  \"recompute_blocks\": [[\"full\", \"none\"], []]\n}\n"));
  const TrainingPlan q = TrainingPlan::from_json(text);
  CHECK(q.recompute_blocks == p.recompute_blocks);
  CHECK(q.to_json() == text);

  const auto refused = [](const std::string& doc, const std::string& what) {
    INFO(doc);
    CHECK_THROWS_WITH(TrainingPlan::from_json(doc), Catch::Contains(what));
  };
  const auto edited_text = [&](const std::string& from, const std::string& to, const std::string* source = nullptr) {
    std::string t = source ? *source : text;
    const auto at = t.find(from);
    REQUIRE(at != std::string::npos);
    return t.replace(at, from.size(), to);
  };
  refused(edited_text("[[\"full\", \"none\"], []]", "[[\"full\", \"none\", \"none\"], []]"),
          "\"recompute_blocks\" of stage 0 has 3 modes, but the stage holds 2 blocks (\"stage_layers\"); give one "
          "mode per block");
  refused(edited_text("[[\"full\", \"none\"], []]", "[[\"full\", \"none\"]]"),
          "\"recompute_blocks\" has 1 entries, but pp x v = 2 stages");
  refused(edited_text("[[\"full\", \"none\"], []]", "[[\"full\", \"some\"], []]"),
          "\"recompute_blocks\" holds 'some'; its entries are \"none\", \"selective\" or \"full\"");
  refused(edited_text("[[\"full\", \"none\"], []]", "[[\"selective\", \"none\"], []]"),
          "the blocks of stage 0 recompute at most selective (\"recompute_blocks\"), but \"recompute_stages\" says "
          "full");
  refused(edited_text("[[\"full\", \"none\"], []]", "[\"full\", []]"),
          "\"recompute_blocks\" holds a string; it holds one list of modes per stage");
  // Version 2 knows no per-block lists; version 3 needs them.
  refused(edited_text("\"version\": 3", "\"version\": 2"),
          "the key \"recompute_blocks\" is not part of a training plan");
  refused(edited_text("\"version\": 2", "\"version\": 3", &per_stage), "the key \"recompute_blocks\" is missing");
}

namespace {

/**
 * The shared memory-bound case with a 128 K vocabulary on 28 GiB GPUs: the head makes the last stage the slowest,
 * so the cost-balanced partition differs from the even one, and no layout fits without recomputation.
 */
Problem large_vocabulary_bound_problem() {
  Problem p = blocks_bound_problem();
  p.model.vocab = 131072;
  p.cluster.memory_bytes = 28 * gib;
  return p;
}
std::vector<std::string> large_vocabulary_bound_args() {
  std::vector<std::string> a = memory_bound_case::args(28);
  *(std::find(a.begin(), a.end(), "--vocab") + 1) = "131072";
  return a;
}

}  // namespace

TEST_CASE(
    "memory-bound, large vocabulary: the cost-balanced partition recomputes per block, no slower than the "
    "even split or one mode per stage",
    "[plan][recompute_blocks][partition][search]") {
  const Problem p = large_vocabulary_bound_problem();
  const CostModel cm(p.model, p.cluster);
  const SearchSpace space = memory_bound_case::space();
  SearchSpace none = space, even = space, per_stage = space;
  none.recompute = Recompute::none;
  even.balance_stages = false;
  per_stage.mix_block_recompute = false;
  CHECK(search(p, cm, none).best.empty());  // only recomputation fits
  const Plan plan = search(p, cm, space), even_plan = search(p, cm, even), per_stage_plan = search(p, cm, per_stage);
  REQUIRE(!plan.best.empty());
  REQUIRE(!even_plan.best.empty());
  REQUIRE(!per_stage_plan.best.empty());
  const Candidate& best = plan.best.front();
  INFO(best.config << ": " << best.step_seconds << " s; even split " << even_plan.best.front().config << ": "
                   << even_plan.best.front().step_seconds << " s; one mode per stage "
                   << per_stage_plan.best.front().config << ": " << per_stage_plan.best.front().step_seconds << " s");
  CHECK(!best.config.stage_layers.empty());
  CHECK(best.stage_layers != std::vector<std::size_t>(8, 4));
  CHECK(best.config.mixed_block_recompute());
  CHECK(best.step_seconds <= even_plan.best.front().step_seconds);
  CHECK(best.step_seconds <= per_stage_plan.best.front().step_seconds);
  // The balanced partitions' mixes are formed besides the even split's, and counted as considered.
  CHECK(plan.mixed_blocks > even_plan.mixed_blocks);
  CHECK(plan.mixed > even_plan.mixed);
  CHECK(plan.considered == per_stage_plan.considered + plan.mixed_blocks);
}

TEST_CASE(
    "per-block recomputation on an uneven partition: one mode per block of each stage, the fastest counts "
    "that fit, a stage without blocks included",
    "[plan][recompute_blocks][partition]") {
  using enum nn::Recompute;
  const Problem p = large_vocabulary_bound_problem();
  const CostModel cm(p.model, p.cluster);
  const ParallelConfig c = blocks_uniform(blocks_bound_config(), full);
  const GroupPlacement g = place(c, p.cluster.gpus_per_node, Placement::tensor_innermost);
  ActivationPeaks peaks;
  const std::vector<double>& inflight = peaks(c);
  ParallelConfig balanced = c, headless = c;
  balanced.stage_layers = balanced_stage_layers(cm, c, g);
  REQUIRE(balanced.stage_layers != std::vector<std::size_t>(8, 4));
  headless.stage_layers = {5, 5, 5, 5, 4, 4, 4, 0};  // the head's stage holds no block: nothing to choose there
  // 28 GiB GPUs, and 15 GiB ones, where the first rank also recomputes some blocks fully.
  for (const double budget : {28 * gib * 0.95, 15 * gib * 0.95})
    for (const ParallelConfig& layout : {balanced, headless}) {
      INFO("blocks per stage " << mpar::plan::detail::layout(layout.stage_layers, ",") << ", " << budget / gib
                               << " GiB");
      const auto mix = per_block_recompute(p.model, layout, cm, g, peaks, budget);
      REQUIRE(mix.has_value());
      CHECK(mix->stage_layers == layout.stage_layers);
      REQUIRE(mix->recompute_blocks.size() == 8);
      CHECK(evaluate(cm, *mix, peaks).memory.total() <= budget);
      for (std::size_t r = 0; r < c.pp; ++r) {
        const std::size_t n = layout.stage_layers[r];
        const std::vector<Recompute>& list = mix->recompute_blocks[r];
        CHECK((list.empty() || list.size() == n));  // empty: every block as the stage
        const std::size_t f = count_mode(*mix, r, n, full), s = count_mode(*mix, r, n, selective);
        INFO("rank " << r << ": " << f << " full, " << s << " selective of " << n);
        if (n == 0) CHECK(mix->recompute_of(r) == none);
        // The rank with (nf, ns) blocks recomputing fully and selectively; the other ranks' lists do not matter.
        const auto need = [&](std::size_t nf, std::size_t ns) {
          ParallelConfig k = *mix;
          std::vector<Recompute> b(n, none);
          for (std::size_t i = 0; i < nf + ns; ++i) b[i] = i < nf ? full : selective;
          k.recompute_blocks[r] = b;
          k.recompute_stages[r] = b.empty() ? none : *std::max_element(b.begin(), b.end());
          return rank_memory(p.model, k, cm.precision(), r, inflight[r]).total();
        };
        CHECK(need(f, s) <= budget);
        // Minimal: one block less recomputed no longer fits (and would be faster).
        if (s > 0) CHECK(need(f, s - 1) > budget);
        if (f > 0) CHECK(need(f - 1, s) > budget);
        if (f > 0) CHECK(need(f - 1, s + 1) > budget);
      }
    }
}

TEST_CASE("mpar-plan writes a cost-balanced partition with per-block lists, one mode per block of each stage",
          "[plan][recompute_blocks][partition][cli][plan_file]") {
  const std::vector<std::string> args = large_vocabulary_bound_args();
  const CliOptions o = parse_cli(args);
  const Plan plan = search(o.problem, CostModel(o.problem.model, o.problem.cluster), o.space, o.search);
  REQUIRE(!plan.best.empty());
  const ParallelConfig& best = plan.best.front().config;
  REQUIRE(!best.stage_layers.empty());
  REQUIRE(best.mixed_block_recompute());

  const std::string f = blocks_temp_path("balanced_blocks.json");
  std::vector<std::string> write = args;
  write.insert(write.end(), {"--write-plan", f});
  std::ostringstream out, err;
  REQUIRE(run_cli(write, out, err) == 0);
  INFO(out.str());
  CHECK_THAT(out.str(), Catch::Contains("layers per stage " + mpar::plan::detail::layout(best.stage_layers, " ") +
                                        " (cost-balanced") &&
                            Catch::Contains("  recompute per stage " + best.recompute_layout() + " (per block"));
  const TrainingPlan written = read_training_plan(f);
  std::filesystem::remove(f);
  CHECK(written.stage_layers == best.stage_layers);
  REQUIRE(written.recompute_blocks.size() == 8);
  for (std::size_t s = 0; s < 8; ++s) {
    const std::vector<Recompute>& list = written.recompute_blocks[s];
    CHECK((list.empty() || list.size() == written.stage_layers[s]));
    CHECK(written.recompute_stages[s] == best.recompute_of(s));
    for (std::size_t b = 0; b < list.size(); ++b) CHECK(list[b] == best.block_recompute_of(s, b));
  }
}
