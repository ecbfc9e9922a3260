// Hybrid-parallel GPT training against the single-rank run: loss sequences, every trained parameter,
// ZeRO-1, clipping, mixed precision, resumption from a checkpoint saved with another layout.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <map>
#include <mpar/data/token_vector.hpp>
#include <mpar/models/gpt_trainer.hpp>
#include <mpar/mpar.hpp>

#include <mutex>
#include <set>
#include <string>
#include <vector>
#include "gpt_test_config.hpp"

using namespace mpar;
namespace fs = std::filesystem;

namespace {

const data::CharDataset& dataset() { return testing::gpt_dataset(); }

models::GptTrainConfig small(std::size_t tp, std::size_t pp, std::size_t dp, std::string schedule = "1f1b") {
  return testing::small_gpt(tp, pp, dp, std::move(schedule));
}

/** The same, trained with SGD: every parameter is then a linear function of its gradients (see below). */
models::GptTrainConfig small_sgd(std::size_t tp, std::size_t pp, std::size_t dp, std::string schedule = "1f1b") {
  auto c = small(tp, pp, dp, std::move(schedule));
  c.optimizer = parallel::UpdateRule::sgd;
  c.lr = 0.05;
  return c;
}

/** `small` under ZeRO stage `stage`, with 4 KiB buckets: several per step, so collectives overlap the backward. */
models::GptTrainConfig small_zero(std::size_t tp, std::size_t pp, std::size_t dp, int stage) {
  auto c = small(tp, pp, dp);
  c.zero = parallel::zero_stage_from_number(stage);
  c.bucket_bytes = 4096;
  return c;
}

/** NCCL's point-to-point semantics — in-order matching without tags, groups, rendezvous — over threads. */
using NcclLike = OrderedP2pCommunicator<ThreadsCommunicator>;

struct RunResult {
  std::vector<double> losses, norms, aux;
  std::vector<std::size_t> lags;   ///< StepReport::weight_lag of each step
  std::vector<double> idle_slots;  ///< StepReport::idle_slots of each step
  std::size_t dropped = 0;
  std::map<std::string, std::vector<float>> params;   ///< every parameter's full tensor, gathered from its shards
  std::map<std::string, std::vector<float>> initial;  ///< the same before the first step of this run
  /// Largest difference between two copies of one element (data-parallel replicas, tensor-parallel
  /// replicated parameters, the tied embedding copy on the last stage), relative to the tensor's largest value.
  double replica_mismatch = 0;
  std::string worst_replica;  ///< the parameter where it occurred
};

/**
 * Scatters a rank's parameter blocks into full tensors. An element held by several ranks (replicas) is
 * compared with the copy already written: `replica_mismatch` keeps the largest difference, so replicas
 * that drift apart fail the equivalence checks instead of the last writer winning.
 */
void gather_into(RunResult& res, std::map<std::string, std::vector<float>>& full, const nn::Parameter& p,
                 std::mutex& m) {
  std::lock_guard lock(m);
  auto& dst = full[p.name];
  if (dst.size() != p.global_size())
    dst.assign(p.global_size(), std::nanf(""));  // unwritten elements fail the comparison
  float scale = 1e-30f;
  for (float v : p.value) scale = std::max(scale, std::abs(v));
  for (std::size_t k = 0; k < p.value.size(); ++k) {
    const std::size_t g = p.global_index(k);
    if (!std::isnan(dst[g])) {
      const double diff = std::abs(double(dst[g]) - double(p.value[k])) / scale;
      if (diff > res.replica_mismatch) res.replica_mismatch = diff, res.worst_replica = p.name;
    }
    dst[g] = p.value[k];
  }
}

/**
 * Trains `c` on thread ranks over the threads communicator or, with `Comm = NcclLike`, over NCCL's point-to-point
 * semantics; `window` steps at a time through `train_steps` (2bw: one program without a flush).
 */
template <class Comm = ThreadsCommunicator>
RunResult run(const models::GptTrainConfig& c, std::size_t steps, const std::string& resume = "",
              const std::string& save_at_end = "", std::size_t window = 1) {
  RunResult res;
  std::mutex m;
  run_threads(int(c.world_size()), [&](ThreadsCommunicator& world) {
    Comm w(world);
    models::GptTrainer<Comm> t(w, c, dataset());
    if (!resume.empty()) t.resume(resume);
    // ZeRO-3 keeps the weights sharded between uses: with_full_parameters gathers them for the comparison.
    t.with_full_parameters([&] {
      for (auto* p : t.parameters()) gather_into(res, res.initial, *p, m);
    });
    while (t.step() < steps)
      for (const auto& r : t.train_steps(std::min(window, steps - t.step())))
        if (w.rank() == 0) {
          res.losses.push_back(r.loss);
          res.norms.push_back(r.grad_norm);
          res.aux.push_back(r.aux_loss);
          res.lags.push_back(r.weight_lag);
          res.idle_slots.push_back(r.idle_slots);
          res.dropped += r.dropped;
        }
    if (!save_at_end.empty()) t.save(save_at_end);
    t.with_full_parameters([&] {
      for (auto* p : t.parameters()) gather_into(res, res.params, *p, m);
    });
  });
  return res;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// fp32 tolerance: sums reduce in a different order under each layout, so bitwise equality is not
// expected; over 20 steps every loss stays within 2e-5 relative, every gradient norm within 1e-3 and,
// with SGD, every parameter's update theta_T - theta_0 within 2e-3 of the single-rank update
// (norm-relative to the update, not to the parameter, so a small but wrong update cannot hide behind a
// parameter of order 1; the largest seen is 3.3e-4, a layer-norm gain whose clipped updates are tiny). Parameters are compared after SGD because AdamW divides each
// gradient by its own running magnitude: for a parameter whose true gradient is zero (the attention key
// bias: softmax ignores a per-row constant) it turns rounding noise of order 1e-9 into full-size updates,
// which differ between summation orders. Copies of one element on different ranks (data-parallel
// replicas, tensor-parallel replicated parameters, the tied embedding) must agree within 1e-6 of the
// tensor's largest value, under every optimizer.
constexpr double loss_tol = 2e-5, update_tol = 2e-3, replica_tol = 1e-6;

void require_equivalent(const RunResult& got, const RunResult& ref, const std::string& what, bool compare_params) {
  INFO(what);
  INFO("worst replica: " << got.worst_replica);
  CHECK(got.replica_mismatch <= replica_tol);
  REQUIRE(got.losses.size() == ref.losses.size());
  for (std::size_t i = 0; i < ref.losses.size(); ++i) {
    INFO("step " << i);
    REQUIRE(got.losses[i] == Approx(ref.losses[i]).epsilon(loss_tol));
    REQUIRE(got.norms[i] == Approx(ref.norms[i]).epsilon(1e-3));
  }
  REQUIRE(got.params.size() == ref.params.size());
  if (!compare_params) return;
  for (const auto& [name, values] : ref.params) {
    INFO("parameter " << name);
    REQUIRE(got.params.count(name) == 1);
    // initialisation does not depend on the layout: both runs start from the same values, bit for bit
    REQUIRE(got.initial.at(name) == ref.initial.at(name));
    const std::vector<float>& theta0 = ref.initial.at(name);
    std::vector<float> got_update(values.size()), ref_update(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      got_update[i] = got.params.at(name)[i] - theta0[i];
      ref_update[i] = values[i] - theta0[i];
    }
    // training moved it (otherwise the comparison below would be void)
    REQUIRE(std::any_of(ref_update.begin(), ref_update.end(), [](float u) { return u != 0.0f; }));
    REQUIRE(rel_diff(got_update, ref_update) < update_tol);
  }
}

// bf16 autocast (the linear layers' GEMMs on bf16 operands, fp32 accumulation): a layout changes fp32
// summation orders (tensor-parallel partial sums, pipeline and data splits) by an ulp; where such a
// difference crosses a bf16 rounding boundary the next GEMM's operand moves by 2^-8 relative, and how the
// host GEMM rounds (oneDNN's bf16 kernels or the CBLAS path's widening) moves it too, so the agreement is
// looser than fp32's: losses within 1e-3 relative, gradient norms within 1e-2, and (SGD, as above) every
// parameter's update within 2e-2 norm-relative after 10 steps (`compare_updates`).
/**
 * Every parameter of `got` within `tol` (norm-relative) of the same run `ref` under another ZeRO stage: a stage
 * changes how long gradient or weight memory lives, not the arithmetic (only the grouping of the norm's partial
 * sums by buckets, which moves the clipping factor by rounding).
 */
void require_same_parameters(const RunResult& got, const RunResult& ref, const std::string& what, double tol) {
  REQUIRE(got.params.size() == ref.params.size());
  for (const auto& [name, values] : ref.params) {
    INFO(what << ", parameter " << name);
    REQUIRE(got.params.count(name) == 1);
    REQUIRE(rel_diff(got.params.at(name), values) <= tol);
  }
}

void require_bf16_equivalent(const RunResult& got, const RunResult& ref, const std::string& what,
                             bool compare_updates) {
  constexpr double bf16_loss_tol = 1e-3, bf16_norm_tol = 1e-2, bf16_update_tol = 2e-2;
  INFO(what);
  CHECK(got.replica_mismatch <= replica_tol);
  REQUIRE(got.losses.size() == ref.losses.size());
  for (std::size_t i = 0; i < ref.losses.size(); ++i) {
    INFO("step " << i);
    REQUIRE(got.losses[i] == Approx(ref.losses[i]).epsilon(bf16_loss_tol));
    REQUIRE(got.norms[i] == Approx(ref.norms[i]).epsilon(bf16_norm_tol));
  }
  REQUIRE(got.params.size() == ref.params.size());
  if (!compare_updates) return;
  double worst = 0;
  std::string worst_name;
  for (const auto& [name, values] : ref.params) {
    const std::vector<float>& theta0 = ref.initial.at(name);
    std::vector<float> got_update(values.size()), ref_update(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      got_update[i] = got.params.at(name)[i] - theta0[i];
      ref_update[i] = values[i] - theta0[i];
    }
    const double d = rel_diff(got_update, ref_update);
    if (d > worst) worst = d, worst_name = name;
  }
  INFO("largest update difference " << worst << " in " << worst_name);
  CHECK(worst < bf16_update_tol);
}

const RunResult& reference(std::size_t steps = 20) {
  static std::map<std::size_t, RunResult> cache;
  auto it = cache.find(steps);
  if (it == cache.end()) it = cache.emplace(steps, run(small(1, 1, 1), steps)).first;
  return it->second;
}
const RunResult& reference_sgd() {
  static const RunResult r = run(small_sgd(1, 1, 1), 20);
  return r;
}

/** `rest`, resumed from the checkpoint of step `from`, continues `full` to its end: the same losses. */
void require_continues(const RunResult& rest, const RunResult& full, std::size_t from) {
  REQUIRE(rest.losses.size() == full.losses.size() - from);
  for (std::size_t i = 0; i < rest.losses.size(); ++i) {
    INFO("step " << from + i);
    REQUIRE(rest.losses[i] == Approx(full.losses[from + i]).epsilon(loss_tol));
  }
}

/**
 * Under 16-bit weights a rounding can flip at a tie under another summation order, so a layout's run is compared
 * with its single-rank run by the losses only, within 2e-3.
 */
void require_16bit_losses_close(const RunResult& got, const RunResult& ref) {
  REQUIRE(got.losses.size() == ref.losses.size());
  for (std::size_t i = 0; i < ref.losses.size(); ++i) {
    INFO("step " << i);
    REQUIRE(got.losses[i] == Approx(ref.losses[i]).epsilon(2e-3));
  }
}

/**
 * A checkpoint saved at step 10 under ZeRO stage `stage` (tp=1 pp=2 dp=2, several buckets) resumes at ZeRO-1
 * (tp=2 dp=2) and at one rank, continuing the run that saved it; then `resumer`, at that stage, resumes a plain
 * checkpoint of `saver` and continues the single-rank run.
 */
void require_zero_checkpoint_resumes(int stage, const fs::path& dir, const models::GptTrainConfig& saver,
                                     models::GptTrainConfig resumer) {
  fs::remove_all(dir);
  const auto zero = small_zero(1, 2, 2, stage);
  const RunResult zero_full = run(zero, 20);
  (void)run(zero, 10, "", dir.string());
  auto z1 = small(2, 1, 2);
  z1.zero = parallel::ZeroStage::optimizer_states;
  for (const auto& [what, c] :
       {std::pair<std::string, models::GptTrainConfig>{"ZeRO-1 tp=2 dp=2", z1}, {"one rank", small(1, 1, 1)}}) {
    INFO("resumed at " << what);
    require_continues(run(c, 20, dir.string()), zero_full, 10);
  }
  fs::remove_all(dir);
  (void)run(saver, 10, "", dir.string());
  resumer.zero = parallel::zero_stage_from_number(stage);
  require_continues(run(resumer, 20, dir.string()), reference(), 10);
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("every (tp, pp, dp) layout reproduces the single-rank loss sequence and parameters", "[models][gpt]") {
  const RunResult& ref = reference_sgd();
  REQUIRE(ref.losses.back() < ref.losses.front());
  for (auto [tp, pp, dp] : {std::tuple<std::size_t, std::size_t, std::size_t>{2, 1, 1},
                            {1, 2, 1},
                            {1, 1, 2},
                            {2, 2, 1},
                            {2, 1, 2},
                            {1, 2, 2},
                            {2, 2, 2}})
    require_equivalent(run(small_sgd(tp, pp, dp), 20), ref,
                       "tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp), true);
  // The same sweep with AdamW: losses and gradient norms.
  for (auto [tp, pp, dp] : {std::tuple<std::size_t, std::size_t, std::size_t>{2, 1, 1}, {1, 2, 2}, {2, 2, 2}})
    require_equivalent(run(small(tp, pp, dp), 20), reference(),
                       "AdamW tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp),
                       false);
}

TEST_CASE("every synchronous pipeline schedule reproduces the single-rank run", "[models][gpt][pipeline]") {
  const RunResult& ref = reference_sgd();
  for (const char* s : {"gpipe", "zb_h1", "zb_h2"}) require_equivalent(run(small_sgd(2, 2, 1, s), 20), ref, s, true);
  auto inter = small_sgd(1, 2, 1, "interleaved_1f1b");
  inter.chunks = 2;
  require_equivalent(run(inter, 20), ref, "interleaved_1f1b, 2 chunks", true);
  auto recompute = small_sgd(1, 2, 2, "1f1b");
  recompute.recompute = true;
  require_equivalent(run(recompute, 20), ref, "1f1b with recomputation", true);
  // Split backward: W deferred past later micro-batches' B, with data-parallel buckets started by the last W
  // (on_gradients_final), and with recomputation before B.
  static_assert(mpar::pipeline::detail::split_backward_part<models::GptPipelinePart<ThreadsCommunicator>>);
  require_equivalent(run(small_sgd(2, 2, 2, "zb_h1"), 20), ref, "zb_h1, tp=2 pp=2 dp=2", true);
  auto zb_recompute = small_sgd(1, 2, 2, "zb_h2");
  zb_recompute.recompute = true;
  require_equivalent(run(zb_recompute, 20), ref, "zb_h2 with recomputation, dp=2", true);
}

/**
 * The single-rank run a drawn plan must reproduce: the same model, optimizer and micro-batch size (M x dp
 * micro-batches of the step's batch on one rank), even split, no recomputation.
 */
RunResult single_rank_of(const models::GptTrainConfig& plan, std::size_t steps) {
  models::GptTrainConfig one = plan;
  one.tp = one.pp = one.dp = 1;
  one.zero = parallel::ZeroStage::none;
  one.schedule = pipeline::ScheduleKind::one_f_one_b;
  one.chunks = 1;
  one.microbatches = plan.microbatches * int(plan.dp);
  one.stage_layers.clear();
  one.recompute_stages.clear(), one.recompute_blocks.clear();
  static std::map<std::string, RunResult> cache;
  const std::string key = std::to_string(one.model.layers) + std::string(parallel::name_of(one.optimizer)) +
                          std::to_string(one.microbatches);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, run(one, steps)).first;
  return it->second;
}

/** Drawn plans `first` to `last` (of 24, seed 46) each train 3 steps equal to the single rank. */
void require_drawn_plans_equal_single_rank(std::size_t first, std::size_t last) {
  const auto plans = testing::drawn_plans(24, 46);
  std::size_t uneven = 0, all_modes = 0, empty = 0, by_block = 0;
  for (std::size_t i = first; i < last; ++i) {
    const auto& [name, c] = plans[i];
    if (c.partition().sizes() != pipeline::Partition::even(c.model.layers, c.stages()).sizes()) ++uneven;
    if (std::ranges::count(c.stage_layers, std::size_t(0)) > 0) ++empty;
    const std::set<nn::Recompute> modes(c.recompute_stages.begin(), c.recompute_stages.end());
    if (modes.size() == 3) ++all_modes;
    for (std::size_t s = 0; s < c.stages(); ++s) by_block += c.mixed_blocks(s) ? 1 : 0;
    // SGD plans (no ZeRO): every parameter's update too; AdamW (ZeRO-1, -3): losses and gradient norms.
    require_equivalent(run(c, 3), single_rank_of(c, 3), name, parallel::stage_number(c.zero) == 0);
  }
  CHECK(uneven * 2 > last - first);  // most drawn partitions differ from the even split
  CHECK(all_modes >= 2);             // and some stages of one plan keep all, recompute selectively and fully
  CHECK(empty >= 2);                 // and some leave a stage without blocks
  CHECK(by_block >= 2);              // and some stages recompute block by block
}

TEST_CASE(
    "a pp = 2 plan whose stages recompute none, selectively and fully trains bit for bit as without recomputation, "
    "and equal to the single rank",
    "[models][gpt][pipeline][plans][selective]") {
  // 4 stages (2 chunks per pipeline rank) of 1, 2, 1 and 1 blocks, each rank holding a selective stage. What a
  // stage recomputes repeats the forward's arithmetic in the same order, so the same layout without any
  // recomputation gives the same bits; the single rank agrees within the layouts' tolerance.
  auto c = small_sgd(1, 2, 1, "interleaved_1f1b");
  c.chunks = 2, c.microbatches = 2, c.model.layers = 5, c.model.dropout = 0.1;
  c.stage_layers = {1, 2, 1, 1};
  c.recompute_stages = {nn::Recompute::selective, nn::Recompute::full, nn::Recompute::none, nn::Recompute::selective};
  auto kept = c;
  kept.recompute_stages.assign(4, nn::Recompute::none);
  const RunResult got = run(c, 3), want = run(kept, 3);
  CHECK(got.losses == want.losses);
  CHECK(got.norms == want.norms);
  CHECK(got.params == want.params);
  auto one = c;
  one.pp = 1, one.chunks = 1, one.schedule = pipeline::ScheduleKind::one_f_one_b;
  one.stage_layers.clear(), one.recompute_stages.clear();
  require_equivalent(got, run(one, 3), "pp=2 v=2 recompute selective,full,none,selective", true);
}

TEST_CASE(
    "a pp = 2 plan whose blocks recompute none, selectively and fully inside a stage trains bit for bit as without "
    "recomputation, and equal to the single rank",
    "[models][gpt][pipeline][plans][recompute_blocks]") {
  // Each stage mixes its blocks' modes (a full block keeps only its input and reruns its own forward, beside
  // blocks that keep everything or drop their probabilities): the recomputation repeats the forward's arithmetic
  // in the same order, so the same layout without recomputation gives the same bits, at tp 1 and tp 2, with and
  // without sequence parallelism.
  using enum nn::Recompute;
  struct Case {
    std::size_t tp;
    bool sp;
    std::vector<std::vector<nn::Recompute>> blocks;
  };
  const Case cases[] = {{1, false, {{full, none}, {selective, full}}},
                        {2, false, {{none, full}, {full, selective}}},
                        {2, true, {{full, selective}, {none, full}}}};
  for (const Case& k : cases) {
    auto c = small_sgd(k.tp, 2, 1);
    c.model.dropout = 0.1, c.model.sequence_parallel = k.sp;
    c.recompute_stages = {full, full};
    c.recompute_blocks = k.blocks;
    const std::string what = "tp=" + std::to_string(k.tp) + (k.sp ? " sp" : "") + " pp=2 recompute " +
                             models::GptTrainConfig::join_recompute(c.recompute_stages, c.recompute_blocks);
    INFO(what);
    REQUIRE(c.mixed_blocks(0));
    auto kept = c;
    kept.recompute_stages.clear(), kept.recompute_blocks.clear();
    const RunResult got = run(c, 3), want = run(kept, 3);
    CHECK(got.losses == want.losses);
    CHECK(got.norms == want.norms);
    CHECK(got.params == want.params);
    auto one = kept;
    one.tp = 1, one.pp = 1, one.model.sequence_parallel = false;
    require_equivalent(got, run(one, 3), what, true);
  }
  // A list that does not match its stage is refused, naming the counts and the fix.
  auto bad = small_sgd(1, 2, 1);
  bad.recompute_stages = {full, none};
  bad.recompute_blocks = {{full, none, none}, {}};
  REQUIRE_THROWS_WITH(bad.validate(bad.world_size()),
                      Catch::Contains("--recompute-stages gives stage 0 3 per-block mode(s) (full:none:none), but the "
                                      "stage holds 2 block(s); give one mode per block joined by ':'"));
  bad.recompute_blocks = {{selective, none}, {}};
  REQUIRE_THROWS_WITH(
      bad.validate(bad.world_size()),
      Catch::Contains("the blocks of stage 0 recompute at most selective, but the stage's mode is full"));
  bad.recompute_blocks = {{full, none}};
  REQUIRE_THROWS_WITH(bad.validate(bad.world_size()),
                      Catch::Contains("the per-block recomputation names 1 stage(s), but pp x chunks = 2 stages"));
}

TEST_CASE("drawn plans (uneven stages, per-stage recomputation, tp, pp, ZeRO, schedules) equal the single rank, I",
          "[models][gpt][pipeline][plans]") {
  require_drawn_plans_equal_single_rank(0, 12);
}

TEST_CASE("drawn plans (uneven stages, per-stage recomputation, tp, pp, ZeRO, schedules) equal the single rank, II",
          "[models][gpt][pipeline][plans]") {
  require_drawn_plans_equal_single_rank(12, 24);
}

TEST_CASE("stage partitions and per-stage recomputation that cannot run are refused, naming the sizes and the fix",
          "[models][gpt][pipeline][errors]") {
  auto expect = [](models::GptTrainConfig c, const std::string& text) {
    INFO(text);
    REQUIRE_THROWS_WITH(c.validate(c.world_size()), Catch::Contains(text));
  };
  auto c = small(1, 2, 1);  // 4 blocks over 2 stages
  c.stage_layers = {1, 2, 1};
  expect(c, "--stage-layers 1,2,1 gives 3 stage(s), but pp x chunks = 2 x 1 = 2 stages");
  c.stage_layers = {1, 2};
  expect(c, "--stage-layers 1,2 covers 3 block(s), but the model has --layers 4 (blocks would be dropped)");
  c.stage_layers = {3, 3};
  expect(c, "covers 6 block(s), but the model has --layers 4 (blocks would be doubled)");
  c.stage_layers = {0, 4};  // the first stage holds the embedding alone
  REQUIRE_NOTHROW(c.validate(2));
  c.stage_layers = {1, 3};
  REQUIRE_NOTHROW(c.validate(2));
  c.recompute_stages = {nn::Recompute::full};
  expect(c, "--recompute-stages gives 1 mode(s), but pp x chunks = 2 x 1 = 2 stages");
  c.recompute_stages = {nn::Recompute::full, nn::Recompute::selective};
  REQUIRE_NOTHROW(c.validate(2));
  c.recompute = true;
  expect(c, "--recompute and --recompute-stages both say which stages recompute; give one");
  // The trainer builds the given partition: the last stage holds blocks 1-3.
  auto u = small(1, 2, 1);
  u.stage_layers = {1, 3};
  u.recompute_stages = {nn::Recompute::none, nn::Recompute::full};
  std::mutex m;
  std::vector<std::size_t> blocks(2);
  run_threads(2, [&](ThreadsCommunicator& w) {
    models::GptTrainer<ThreadsCommunicator> t(w, u, dataset());
    std::set<std::string> held;  // "block2", ...: the blocks whose parameters this rank holds
    for (const auto* p : t.parameters())
      if (p->name.rfind("block", 0) == 0) held.insert(p->name.substr(0, p->name.find('.')));
    std::lock_guard lock(m);
    blocks[std::size_t(w.rank())] = held.size();
  });
  CHECK(blocks == std::vector<std::size_t>{1, 3});
}

/** `small_sgd` with the sequence split over `cp` context ranks (ring attention, zig-zag chunks). */
models::GptTrainConfig small_cp(std::size_t cp, std::size_t tp, std::size_t pp, std::size_t dp) {
  auto c = small_sgd(tp, pp, dp);
  c.cp = cp;
  return c;
}

TEST_CASE("context parallelism reproduces the single-rank run, alone and with tp, dp, pp and recomputation",
          "[models][gpt][context]") {
  const RunResult& ref = reference_sgd();
  require_equivalent(run(small_cp(2, 1, 1, 1), 20), ref, "cp=2", true);
  require_equivalent(run(small_cp(2, 2, 1, 1), 20), ref, "cp=2 tp=2", true);
  require_equivalent(run(small_cp(2, 1, 1, 2), 20), ref, "cp=2 dp=2", true);
  auto cp4 = small_cp(4, 1, 1, 1);  // seq 16 = 8 chunks of 2 tokens
  cp4.recompute = true;
  require_equivalent(run(cp4, 20), ref, "cp=4 recompute", true);
  require_equivalent(run(small_cp(2, 1, 2, 1), 20), ref, "cp=2 pp=2", true);
  // The ring's isend/irecv over NCCL's in-order point-to-point matching (no tags), with the pipeline's.
  require_equivalent(run<NcclLike>(small_cp(2, 2, 2, 1), 20), ref, "cp=2 tp=2 pp=2, NCCL semantics", true);
  // AdamW: losses and gradient norms.
  auto adamw = small(2, 1, 1);
  adamw.cp = 2;
  require_equivalent(run(adamw, 20), reference(), "AdamW cp=2 tp=2", false);
}

TEST_CASE("context parallelism with ZeRO shards over data x context; its checkpoints resume without cp and back",
          "[models][gpt][context][zero][checkpoint]") {
  // ZeRO-1, -2 and -3 over the dp x cp = 4 ranks of the gradient-reduction group: the AdamW run's losses and norms
  // (ZeRO-3 gathers each block's weights from all four around the ring block's passes).
  for (int stage : {1, 2, 3}) {
    auto z = small(1, 1, 2);
    z.cp = 2;
    z.zero = parallel::zero_stage_from_number(stage);
    require_equivalent(run(z, 20), reference(), "ZeRO-" + std::to_string(stage) + " cp=2 dp=2", false);
  }
  // A checkpoint of cp = 2 x tp = 2 (replicas on the context ranks saved once) resumes at one rank and at cp = 2.
  const fs::path dir = fs::temp_directory_path() / "mpar-test-gpt-resume-cp";
  fs::remove_all(dir);
  auto saved = small(2, 1, 1);
  saved.cp = 2;
  (void)run(saved, 10, "", dir.string());
  auto again = small(1, 1, 1);
  again.cp = 2;
  for (const auto& c : {small(1, 1, 1), again}) require_continues(run(c, 20, dir.string()), reference(), 10);
  fs::remove_all(dir);
}

/** The largest norm-relative difference between two runs' trained parameters. */
double largest_difference(const RunResult& a, const RunResult& b) {
  double d = 0;
  for (const auto& [name, values] : b.params) d = std::max(d, rel_diff(a.params.at(name), values));
  return d;
}

/** `small_sgd` with dropout 0.1 on the attention and MLP outputs of every block. */
models::GptTrainConfig small_dropout(std::size_t tp, std::size_t pp, std::size_t dp, std::string schedule = "1f1b") {
  auto c = small_sgd(tp, pp, dp, std::move(schedule));
  c.model.dropout = 0.1;
  return c;
}

TEST_CASE("with dropout every layout reproduces the single-rank run: the masks follow the tokens, not the ranks",
          "[models][gpt][dropout]") {
  const RunResult ref = run(small_dropout(1, 1, 1), 20);
  // Dropout is on: the trained parameters differ from the run without it by far more than the layouts below may
  // differ from the reference.
  REQUIRE(largest_difference(ref, reference_sgd()) > 10 * update_tol);
  REQUIRE(ref.losses.back() < ref.losses.front());
  // Data parallelism halves the micro-batches (4 sequences each at one rank, 2 at dp = 2), the pipeline and
  // recomputation rerun them in other orders, context parallelism holds zig-zag chunks of every sequence.
  for (auto [tp, pp, dp] :
       {std::tuple<std::size_t, std::size_t, std::size_t>{2, 1, 1}, {1, 2, 1}, {1, 1, 2}, {2, 2, 2}})
    require_equivalent(run(small_dropout(tp, pp, dp), 20), ref,
                       "dropout tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp),
                       true);
  auto inter = small_dropout(1, 2, 1, "interleaved_1f1b");
  inter.chunks = 2;
  require_equivalent(run(inter, 20), ref, "dropout interleaved_1f1b, 2 chunks", true);
  auto zb = small_dropout(1, 2, 2, "zb_h1");
  zb.recompute = true;
  require_equivalent(run(zb, 20), ref, "dropout zb_h1 with recomputation, dp=2", true);
  for (auto [cp, tp, dp] : {std::tuple<std::size_t, std::size_t, std::size_t>{2, 1, 1}, {2, 2, 1}, {2, 1, 2}}) {
    auto c = small_dropout(tp, 1, dp);
    c.cp = cp;
    require_equivalent(run(c, 20), ref,
                       "dropout cp=" + std::to_string(cp) + " tp=" + std::to_string(tp) + " dp=" + std::to_string(dp),
                       true);
  }
  auto cp4 = small_dropout(1, 1, 1);  // seq 16 = 8 chunks of 2 tokens
  cp4.cp = 4;
  cp4.recompute = true;
  require_equivalent(run(cp4, 20), ref, "dropout cp=4 recompute", true);
  auto cp_pp = small_dropout(1, 2, 1);
  cp_pp.cp = 2;
  require_equivalent(run(cp_pp, 20), ref, "dropout cp=2 pp=2", true);
}

/** `c` with sequence parallelism on. */
models::GptTrainConfig sequence_parallel(models::GptTrainConfig c) {
  c.model.sequence_parallel = true;
  return c;
}

TEST_CASE("sequence parallelism reproduces the single-rank run: with pp, dp, every schedule, recomputation and ZeRO",
          "[models][gpt][sequence]") {
  const RunResult& ref = reference_sgd();
  // tp = 4 splits each micro-batch's 4 x 16 tokens into blocks of 16; dp = 2 halves the micro-batches.
  for (auto [tp, pp, dp] :
       {std::tuple<std::size_t, std::size_t, std::size_t>{2, 1, 1}, {4, 1, 1}, {2, 2, 1}, {2, 1, 2}, {2, 2, 2}})
    require_equivalent(run(sequence_parallel(small_sgd(tp, pp, dp)), 20), ref,
                       "sp tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp), true);
  // Split backward (the blocks' W deferred) with recomputation; the interleaved schedule's chunks; the stage
  // boundaries' all-gathers over NCCL's in-order point-to-point semantics.
  auto zb = sequence_parallel(small_sgd(2, 2, 1, "zb_h1"));
  zb.recompute = true;
  require_equivalent(run(zb, 20), ref, "sp zb_h1 with recomputation", true);
  auto inter = sequence_parallel(small_sgd(2, 2, 1, "interleaved_1f1b"));
  inter.chunks = 2;
  require_equivalent(run(inter, 20), ref, "sp interleaved_1f1b, 2 chunks", true);
  require_equivalent(run<NcclLike>(sequence_parallel(small_sgd(2, 2, 1, "gpipe")), 20), ref, "sp gpipe, NCCL semantics",
                     true);
  // AdamW with ZeRO-3 (each block's weights gathered around its token-sharded passes): losses and gradient norms.
  auto z3 = sequence_parallel(small(2, 1, 2));
  z3.zero = parallel::ZeroStage::parameters;
  require_equivalent(run(z3, 20), reference(), "sp AdamW ZeRO-3 tp=2 dp=2", false);
}

TEST_CASE("sequence parallelism with dropout and under bf16 reproduces the single-rank run",
          "[models][gpt][sequence][dropout][precision]") {
  // Each tensor rank drops the elements of its block of rows that the single rank drops there.
  const RunResult dropout_ref = run(small_dropout(1, 1, 1), 20);
  for (auto [tp, pp] : {std::pair<std::size_t, std::size_t>{2, 1}, {4, 1}, {2, 2}})
    require_equivalent(run(sequence_parallel(small_dropout(tp, pp, 1)), 20), dropout_ref,
                       "sp dropout tp=" + std::to_string(tp) + " pp=" + std::to_string(pp), true);
  auto bf16 = [](models::GptTrainConfig c) {
    c.precision = parallel::Precision::bf16;
    return c;
  };
  const RunResult bf16_ref = run(bf16(small_sgd(1, 1, 1)), 10);
  require_bf16_equivalent(run(sequence_parallel(bf16(small_sgd(2, 2, 1))), 10), bf16_ref, "sp bf16 tp=2 pp=2", true);
}

TEST_CASE("a checkpoint saved under sequence parallelism resumes without it, and the other way round",
          "[models][gpt][sequence][checkpoint]") {
  const fs::path dir = fs::temp_directory_path() / "mpar-test-gpt-resume-sp";
  fs::remove_all(dir);
  (void)run(sequence_parallel(small(2, 1, 1)), 10, "", dir.string());
  require_continues(run(small(2, 1, 1), 20, dir.string()), reference(), 10);
  require_continues(run(small(1, 1, 1), 20, dir.string()), reference(), 10);
  fs::remove_all(dir);
  (void)run(small(1, 2, 1), 10, "", dir.string());
  require_continues(run(sequence_parallel(small(2, 2, 1)), 20, dir.string()), reference(), 10);
  fs::remove_all(dir);
}

TEST_CASE("sequence-parallel configurations that cannot run are refused, naming the fix",
          "[models][gpt][sequence][errors]") {
  auto expect = [](models::GptTrainConfig c, std::size_t world, const std::string& text) {
    INFO(text);
    REQUIRE_THROWS_WITH(c.validate(world), Catch::Contains(text));
  };
  auto odd = sequence_parallel(small(2, 1, 1));
  odd.model.seq = 15;
  expect(odd, 2, "--sequence-parallel splits each sequence's 15 tokens over --tp 2 ranks");
  auto cp = sequence_parallel(small_cp(2, 2, 1, 1));
  expect(cp, 4, "--sequence-parallel with --cp 2");
  auto moe = sequence_parallel(small(2, 1, 1));
  moe.model.experts = 4;
  expect(moe, 2, "the MoE blocks are not sequence-parallel; use --experts 0, or drop --sequence-parallel");
  // A stage built by hand is refused too, not only the trainer's configuration.
  models::GptConfig g = sequence_parallel(small(1, 1, 1)).model;
  g.experts = 4;
  run_threads(1, [&](ThreadsCommunicator& w) {
    REQUIRE_THROWS_WITH((models::GptPipelinePart<ThreadsCommunicator>(w, g, true, true, 0, g.layers)),
                        Catch::Contains("sequence parallelism with MoE blocks is not supported"));
  });
  // Hidden states whose rows do not split over the tensor ranks (a middle stage fed 15 rows) name the sizes and fix.
  const models::GptConfig h = sequence_parallel(small(2, 1, 1)).model;
  run_threads(2, [&](ThreadsCommunicator& w) {
    models::GptPipelinePart<ThreadsCommunicator> middle(w, h, false, false, 0, 2);
    const nn::Act<Replicate> x(nn::Activation({15, h.hidden}));
    REQUIRE_THROWS_WITH(middle.forward(x, 0), Catch::Contains("15 tokens cannot be split evenly over 2 tensor ranks") &&
                                                  Catch::Contains("multiple of 2"));
  });
}

TEST_CASE("context-parallel configurations that cannot run are refused, naming the fix",
          "[models][gpt][context][errors]") {
  auto expect = [](models::GptTrainConfig c, std::size_t world, const std::string& text) {
    INFO(text);
    REQUIRE_THROWS_WITH(c.validate(world), Catch::Contains(text));
  };
  expect(small_cp(2, 2, 1, 1), 2, "tp x cp x pp x dp = 2 x 2 x 1 x 1 = 4 ranks, but the job has 2");
  auto seq = small_cp(3, 1, 1, 1);  // 16 is not a multiple of 6
  expect(seq, 3, "--seq 16 is not divisible by 2 x --cp = 6");
  auto moe = small_cp(2, 1, 1, 1);
  moe.model.experts = 4;
  expect(moe, 2, "use --cp 1 or --experts 0");
}

TEST_CASE("over NCCL's point-to-point semantics on every axis, the layouts and schedules reproduce the single-rank run",
          "[models][gpt][pipeline][nccl-semantics]") {
  // The trainer sees an ordered_point_to_point communicator, builds its programs with the ordered
  // placement and exchanges each run of pipeline messages as one group with known sizes.
  const RunResult& ref = reference_sgd();
  require_equivalent(run<NcclLike>(small_sgd(2, 2, 2), 20), ref, "1f1b, tp=2 pp=2 dp=2, NCCL semantics", true);
  require_equivalent(run<NcclLike>(small_sgd(1, 2, 2, "zb_h2"), 20), ref, "zb_h2, pp=2 dp=2, NCCL semantics", true);
  auto inter = small_sgd(1, 2, 1, "interleaved_1f1b");
  inter.chunks = 2;
  require_equivalent(run<NcclLike>(inter, 20), ref, "interleaved_1f1b, 2 chunks, NCCL semantics", true);
}

/**
 * The 2bw reference, built by hand on the ordinary synchronous single-rank trainer (1f1b at one rank): before
 * each step's passes the test overwrites every weight with its own copy of the previous step's weights, and
 * afterwards writes the current ones back and copies them for the next step. So the passes of step t see
 * W(t-1) (W(0) at step 0, when there is no older version) and the update of step t applies their gradient to
 * W(t). The stash lives in this test (host vectors, copied, not swapped); the trainer's own 2bw code is not
 * run: the trainer's schedule here is 1f1b.
 */
RunResult run_delayed_reference(models::GptTrainConfig c, std::size_t steps) {
  REQUIRE(c.world_size() == 1);
  c.schedule = pipeline::ScheduleKind::one_f_one_b;
  RunResult res;
  std::mutex m;
  run_threads(1, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, c, dataset());
    std::vector<std::vector<float>> previous, current;
    auto& ps = t.parameters();
    t.on_passes(
        [&] {
          if (previous.empty()) return;  // step 0: W(-1) is W(0)
          current.assign(ps.size(), {});
          for (std::size_t k = 0; k < ps.size(); ++k) {
            current[k].assign(ps[k]->value.begin(), ps[k]->value.end());
            std::copy(previous[k].begin(), previous[k].end(), ps[k]->value.begin());
          }
        },
        [&] {
          if (!previous.empty())
            for (std::size_t k = 0; k < ps.size(); ++k)
              std::copy(current[k].begin(), current[k].end(), ps[k]->value.begin());
          previous.assign(ps.size(), {});
          for (std::size_t k = 0; k < ps.size(); ++k) previous[k].assign(ps[k]->value.begin(), ps[k]->value.end());
        });
    for (auto* p : t.parameters()) gather_into(res, res.initial, *p, m);
    while (t.step() < steps) {
      const auto r = t.train_step();
      res.losses.push_back(r.loss);
      res.norms.push_back(r.grad_norm);
      res.aux.push_back(r.aux_loss);
      res.lags.push_back(r.weight_lag);
    }
    for (auto* p : t.parameters()) gather_into(res, res.params, *p, m);
  });
  return res;
}

TEST_CASE("2bw trains to the delayed-update single-rank reference", "[models][gpt][pipeline][2bw]") {
  const RunResult ref = run_delayed_reference(small_sgd(1, 1, 1), 20);
  const RunResult& sync = reference_sgd();
  // The reference is the delayed run, not the synchronous one: step 0 computes on W(0) in both; step 1 computes
  // on W(0) again instead of W(1), so from there on the runs differ; the delayed one still learns.
  // The differences are far above the tolerances below, so a 2bw run without the lag would fail them.
  REQUIRE(ref.losses[0] == sync.losses[0]);
  REQUIRE(std::fabs(ref.losses[1] / sync.losses[1] - 1) > 10 * loss_tol);
  double largest = 0;
  for (const auto& [name, values] : ref.params) {
    std::vector<float> a(values.size()), b(values.size());
    for (std::size_t i = 0; i < values.size(); ++i)
      a[i] = values[i] - ref.initial.at(name)[i], b[i] = sync.params.at(name)[i] - sync.initial.at(name)[i];
    largest = std::max(largest, rel_diff(a, b));
  }
  REQUIRE(largest > 10 * update_tol);
  REQUIRE(ref.losses.back() < ref.losses.front());
  std::vector<std::size_t> lags(20, 1);
  lags[0] = 0;
  for (auto [tp, pp, dp] : {std::tuple<std::size_t, std::size_t, std::size_t>{1, 2, 1}, {2, 2, 1}, {1, 2, 2}}) {
    const RunResult got = run(small_sgd(tp, pp, dp, "2bw"), 20);
    require_equivalent(
        got, ref, "2bw tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp), true);
    CHECK(got.lags == lags);
    // Each step is one flushed program in 1F1B order: 1F1B's bubble, by hand 3 (pp - 1) idle slots on each of
    // the pp ranks (a forward one slot, a backward two), every step.
    CHECK(got.idle_slots == std::vector<double>(20, double(3 * (pp - 1) * pp)));
  }
  // AdamW (losses and norms), and NCCL's point-to-point semantics.
  const RunResult ref_adamw = run_delayed_reference(small(1, 1, 1), 20);
  require_equivalent(run(small(2, 2, 1, "2bw"), 20), ref_adamw, "AdamW 2bw tp=2 pp=2", false);
  auto zero = small(1, 2, 2, "2bw");
  zero.zero = parallel::ZeroStage::
      optimizer_states;  // the update all-gathers W(t+1) into the weights; W(t-1) was copied before it
  zero.recompute = true;
  require_equivalent(run(zero, 20), ref_adamw, "AdamW 2bw pp=2 dp=2, ZeRO-1, recomputation", false);
  require_equivalent(run<NcclLike>(small_sgd(2, 2, 1, "2bw"), 20), ref, "2bw tp=2 pp=2, NCCL semantics", true);
  // A synchronous schedule reports no lag.
  CHECK(sync.lags == std::vector<std::size_t>(20, 0));
}

/** Idle slots per step, summed over the pp ranks, of a flush-free 2bw program of `steps` steps (see below). */
double flush_free_idle_slots(std::size_t pp, std::size_t steps) {
  return double(3 * (pp - 1) * pp + 2 * (pp - 1) * pp * (steps - 1)) / double(steps);
}

TEST_CASE("2bw without a flush: several steps in one program train to the delayed-update reference",
          "[models][gpt][pipeline][2bw]") {
  // Windows of 4 steps (and a last one of 2): each a program in which every stage updates right after its last
  // backward of a step while the first stages run the next step's forwards, a micro-batch's backward on its
  // forward's version. Step 4, the first of the second window, continues the lag across the programs.
  const RunResult ref = run_delayed_reference(small_sgd(1, 1, 1), 10);
  std::vector<std::size_t> lags(10, 1);
  lags[0] = 0;
  for (auto [tp, pp, dp] : {std::tuple<std::size_t, std::size_t, std::size_t>{1, 2, 1}, {2, 2, 1}, {1, 2, 2}}) {
    const std::string what =
        "flush-free 2bw tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp);
    const RunResult got = run(small_sgd(tp, pp, dp, "2bw"), 10, "", "", 4);
    require_equivalent(got, ref, what, true);
    CHECK(got.lags == lags);
    // 1F1B's flush costs 3 (pp - 1) idle slots per rank every step (a forward one slot, a backward two). Here the
    // first step of a program pays that, and each later one 2 (pp - 1): the next step's warm-up forwards fill the
    // cool-down, but every update waits for the first stage's last backward (the norm, the tied embedding).
    REQUIRE(got.idle_slots.size() == 10);
    CHECK(got.idle_slots[0] == flush_free_idle_slots(pp, 4));
    CHECK(got.idle_slots[9] == flush_free_idle_slots(pp, 2));
  }
  // Four stages (M = 4 >= P), NCCL's point-to-point semantics (grouped exchanges, ordered placement) and ZeRO-1
  // with recomputation under AdamW.
  auto four = small_sgd(1, 4, 1, "2bw");
  four.microbatches = 4;
  auto four_ref = small_sgd(1, 1, 1);
  four_ref.microbatches = 4;
  const RunResult got_four = run(four, 10, "", "", 5);
  require_equivalent(got_four, run_delayed_reference(four_ref, 10), "flush-free 2bw pp=4", true);
  CHECK(got_four.idle_slots == std::vector<double>(10, flush_free_idle_slots(4, 5)));
  require_equivalent(run<NcclLike>(small_sgd(2, 2, 1, "2bw"), 10, "", "", 4), ref,
                     "flush-free 2bw tp=2 pp=2, NCCL semantics", true);
  auto zero = small(1, 2, 2, "2bw");
  zero.zero = parallel::ZeroStage::optimizer_states;
  zero.recompute = true;
  require_equivalent(run(zero, 10, "", "", 4), run_delayed_reference(small(1, 1, 1), 10),
                     "flush-free AdamW 2bw pp=2 dp=2, ZeRO-1, recomputation", false);
}

TEST_CASE("2bw without a flush keys dropout by each micro-batch's own step", "[models][gpt][pipeline][2bw][dropout]") {
  // Micro-batch ids run on across the program's steps; the masks must still be those of the step each belongs to.
  require_equivalent(run(small_dropout(1, 2, 1, "2bw"), 8, "", "", 4), run_delayed_reference(small_dropout(1, 1, 1), 8),
                     "flush-free 2bw pp=2 with dropout", true);
}

TEST_CASE("2bw under bf16: the passes round the previous version, the update applies to the fp32 masters",
          "[models][gpt][pipeline][2bw][precision]") {
  auto one = small(1, 1, 1);
  one.precision = parallel::Precision::bf16;
  const RunResult ref = run_delayed_reference(one, 10);
  auto par = small(2, 2, 1, "2bw");
  par.precision = parallel::Precision::bf16;
  require_bf16_equivalent(run(par, 10), ref, "bf16 2bw tp=2 pp=2", false);
  // Without a flush, each version's bf16 compute copies kept beside its fp32 values (a program starting with an
  // older version kept outside passes rounds it at its first use: 4 + 4 + 2 steps).
  require_bf16_equivalent(run(par, 10, "", "", 4), ref, "bf16 2bw tp=2 pp=2 without a flush", false);
}

TEST_CASE("a 2bw run resumes from its checkpoint where it stopped, the previous weight version included",
          "[models][gpt][2bw][checkpoint]") {
  const fs::path dir = fs::temp_directory_path() / "mpar-test-gpt-2bw-resume";
  fs::remove_all(dir);
  const RunResult ref = run_delayed_reference(small_sgd(1, 1, 1), 10);
  // Saved after 4 steps run as one program without a flush, resumed at another layout: the resumed run's first
  // step computes on the saved W(3), as the uninterrupted one does (lag 1), and steps 4-9 continue it.
  (void)run(small_sgd(1, 2, 1, "2bw"), 4, "", dir.string(), 4);
  const RunResult rest = run(small_sgd(2, 2, 1, "2bw"), 10, dir.string(), "", 3);
  require_continues(rest, ref, 4);
  CHECK(rest.lags == std::vector<std::size_t>(6, 1));
  const RunResult one = run(small_sgd(1, 1, 1, "2bw"), 10, dir.string());
  require_continues(one, ref, 4);
  // A checkpoint of a synchronous run holds no older version: the first step after the resume computes on the
  // loaded weights, and the resume says so. The other way round the older version is dropped, with a warning.
  fs::remove_all(dir);
  (void)run(small_sgd(1, 2, 1), 3, "", dir.string());
  std::vector<std::string> warnings;
  std::vector<std::size_t> lags;
  std::mutex m;
  run_threads(2, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, small_sgd(1, 2, 1, "2bw"), dataset());
    const auto res = t.resume(dir);
    const std::size_t first = t.train_step().weight_lag, second = t.train_step().weight_lag;
    std::lock_guard lock(m);
    if (world.rank() == 0) warnings = res.warnings, lags = {first, second};
  });
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains("no previous weight version") && Catch::Contains("lag 0"));
  CHECK(lags == std::vector<std::size_t>{0, 1});
  fs::remove_all(dir);
  (void)run(small_sgd(1, 2, 1, "2bw"), 3, "", dir.string());
  warnings.clear();
  run_threads(1, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, small_sgd(1, 1, 1), dataset());
    warnings = t.resume(dir).warnings;
  });
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Catch::Contains("previous weight version") && Catch::Contains("not used"));
  fs::remove_all(dir);
}

// Under mpirun every process parses its own command line and reads its own files; ranks given different
// settings would otherwise run collectives of different sizes (a truncation error, heap corruption, or a hang
// after the shorter run). The trainer compares first, on every rank, with collectives of one fixed size.
TEST_CASE("ranks given different settings or data are all refused before training, each naming the difference",
          "[models][gpt][errors]") {
  const auto c = small(1, 1, 2);
  auto refusals = [&](auto&& vary) {
    std::vector<std::string> errors(2);
    run_threads(2, [&](ThreadsCommunicator& world) {
      auto mine = c;
      std::vector<std::int32_t> ids = dataset().ids();
      if (world.rank() == 1) vary(mine, ids);
      const data::TokenVector text(std::move(ids), dataset().vocab_size(), c.model.seq, "text");
      try {
        models::GptTrainer<ThreadsCommunicator> t(world, mine, text);
        (void)t.train_step();
        errors[std::size_t(world.rank())] = "trained";
      } catch (const config_error& e) {
        errors[std::size_t(world.rank())] = e.what();
      }
    });
    return errors;
  };
  const auto layers_lr = refusals([&](models::GptTrainConfig& m, std::vector<std::int32_t>&) {
    m.model.layers += 2;
    m.lr *= 2;
    m.steps += 1;
  });
  for (const std::string& e : layers_lr) {
    INFO(e);
    CHECK_THAT(e, Catch::Contains("different settings") && Catch::Contains("--layers") && Catch::Contains("--lr") &&
                      Catch::Contains("--steps") && !Catch::Contains("--hidden"));
  }
  CHECK_THAT(layers_lr[1], Catch::Contains("--layers (" + std::to_string(c.model.layers + 2) + " on rank 1)"));
  // The same sizes, one token of the text changed on one rank.
  const auto text =
      refusals([](models::GptTrainConfig&, std::vector<std::int32_t>& ids) { ids[7] = (ids[7] + 1) % 5; });
  for (const std::string& e : text) {
    INFO(e);
    CHECK_THAT(e, Catch::Contains("--data (data.hash)") && !Catch::Contains("--layers"));
  }
  // Equal settings: trains.
  CHECK(refusals([](models::GptTrainConfig&, std::vector<std::int32_t>&) {}) ==
        std::vector<std::string>{"trained", "trained"});
}

TEST_CASE("ZeRO-1 equals plain data parallelism", "[models][gpt][zero]") {
  auto zero = small(1, 2, 2);
  zero.zero = parallel::ZeroStage::optimizer_states;
  zero.bucket_bytes = 4096;  // several buckets
  require_equivalent(run(zero, 20), run(small(1, 2, 2), 20), "ZeRO-1 vs DP (tp=1 pp=2 dp=2)", false);
  auto zero_tp = small(2, 1, 2);
  zero_tp.zero = parallel::ZeroStage::optimizer_states;
  require_equivalent(run(zero_tp, 20), reference(), "ZeRO-1 tp=2 dp=2 vs single rank", false);
}

TEST_CASE("ZeRO-2 reproduces the single-rank run and ZeRO-1's parameters, with tp and pp",
          "[models][gpt][zero][zero2]") {
  // dp = 2 alone, with tp = 2 and with pp = 2; several buckets, so reduce-scatters overlap the backward and
  // the bounded in-flight window (two reduce-scatters, then the oldest is waited for and freed) is exercised.
  for (auto [tp, pp] : {std::pair<std::size_t, std::size_t>{1, 1}, {2, 1}, {1, 2}}) {
    const auto z2 = small_zero(tp, pp, 2, 2);
    const std::string what = "ZeRO-2 tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=2";
    const RunResult got = run(z2, 20);
    require_equivalent(got, reference(), what + " vs single rank", false);
    // ZeRO-2 changes only how long gradient memory lives, not the arithmetic: every parameter is the one
    // ZeRO-1 computes in the same layout (itself checked against plain data parallelism above).
    auto z1 = z2;
    z1.zero = parallel::ZeroStage::optimizer_states;
    require_same_parameters(got, run(z1, 20), what + " vs ZeRO-1", 1e-7);
  }
}

TEST_CASE("ZeRO-2 under bf16 and f16 and with every step clipped agrees with the single-rank run",
          "[models][gpt][zero2][precision]") {
  for (const char* prec : {"bf16", "f16"}) {
    auto one = small(1, 1, 1);
    one.precision = parallel::parse_precision(prec);
    const RunResult ref = run(one, 10);
    auto z2 = small_zero(1, 1, 2, 2);
    z2.precision = parallel::parse_precision(prec);
    INFO(prec);
    require_16bit_losses_close(run(z2, 10), ref);
  }
  auto one = small(1, 1, 1);
  one.clip = 0.05;  // far below the observed norms: every step clips
  const RunResult ref = run(one, 10);
  for (double n : ref.norms) REQUIRE(n > 0.05);
  auto z2 = small(2, 1, 2);
  z2.clip = 0.05;
  z2.zero = parallel::ZeroStage::gradients;
  require_equivalent(run(z2, 10), ref, "clipped ZeRO-2 tp=2 dp=2", false);
}

namespace {
/** What each of the two data-parallel ranks holds after two steps at ZeRO stage `stage` (floats, or counts). */
struct Held {
  std::size_t parameters = 0, gradients = 0, states = 0;  ///< the trainer's memory report
  std::size_t local = 0;                                  ///< the values this rank's parameters have when gathered
  std::size_t non_empty_values = 0, non_empty_grads = 0;  ///< parameters whose value / gradient is not released
};
std::vector<Held> held_between_steps(int stage) {
  const auto c = small_zero(1, 1, 2, stage);
  std::vector<Held> out(2);
  run_threads(2, [&](ThreadsCommunicator& w) {
    models::GptTrainer<ThreadsCommunicator> t(w, c, dataset());
    for (int i = 0; i < 2; ++i) (void)t.train_step();
    Held h;
    const auto m = t.memory();
    h.parameters = m.parameters / sizeof(float);
    h.gradients = m.gradients / sizeof(float);
    h.states = m.optimizer_states / sizeof(float);
    for (const auto& [name, p] : t.named_parameters()) {
      h.non_empty_values += p->value.empty() ? 0 : 1;
      h.non_empty_grads += p->grad.empty() ? 0 : 1;
    }
    t.with_full_parameters([&] {
      for (const auto& [name, p] : t.named_parameters()) h.local += p->value.size();
    });
    out[std::size_t(w.rank())] = h;
  });
  return out;
}
}  // namespace

TEST_CASE(
    "ZeRO-2 holds only gradient shards between steps; ZeRO-1 holds full gradients (its buckets are ranges of them)",
    "[models][gpt][zero2][memory]") {
  const auto z1 = held_between_steps(1), z2 = held_between_steps(2);
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    const double n = double(z2[r].local);
    REQUIRE(z1[r].local == z2[r].local);
    // ZeRO-1: every parameter's gradient and this rank's shards: 1.5 N. The buckets are ranges of the gradient
    // arena, reduce-scattered in place, with no flat buffer of their own (it was 2.5 N with them).
    CHECK(double(z1[r].gradients) == Approx(1.5 * n).epsilon(0.01));
    // ZeRO-2: the shards only, N / dp (each bucket's block rounds up by at most one element).
    CHECK(z2[r].non_empty_grads == 0);
    CHECK(double(z2[r].gradients) == Approx(0.5 * n).epsilon(0.01));
    // Both shard the AdamW moments: 2 N / dp.
    CHECK(double(z2[r].states) == Approx(n).epsilon(0.01));
    CHECK(z1[r].states == z2[r].states);
  }
}

TEST_CASE("ZeRO-3 reproduces the single-rank run and ZeRO-2's parameters, with tp, pp and recomputation",
          "[models][gpt][zero][zero3]") {
  // Parameters sharded at rest, each unit (embeddings, a block, the head) gathered around its forward and its
  // backward with the next unit's gather in flight; several buckets (4096 bytes), none crossing a unit.
  struct Layout {
    std::size_t tp, pp;
    bool recompute;
  };
  for (const Layout l : {Layout{1, 1, false}, Layout{2, 1, false}, Layout{1, 2, false}, Layout{1, 2, true}}) {
    auto z3 = small_zero(l.tp, l.pp, 2, 3);
    z3.recompute = l.recompute;
    const std::string what = "ZeRO-3 tp=" + std::to_string(l.tp) + " pp=" + std::to_string(l.pp) + " dp=2" +
                             (l.recompute ? " recompute" : "");
    const RunResult got = run(z3, 20);
    require_equivalent(got, reference(), what + " vs single rank", false);
    // The arithmetic is ZeRO-2's: every parameter is the one ZeRO-2 computes in the same layout (itself checked
    // against ZeRO-1 and plain data parallelism above); only the gradient norm's partial sums are grouped by
    // other buckets, which moves the clipping factor by rounding.
    auto z2 = z3;
    z2.zero = parallel::ZeroStage::gradients;
    require_same_parameters(got, run(z2, 20), what + " vs ZeRO-2", 1e-6);
  }
}

TEST_CASE("ZeRO-3 under bf16 and f16 agrees with the single-rank run", "[models][gpt][zero3][precision]") {
  // The gathered weights are rounded to the 16-bit type as they arrive (the fp32 masters are the shards).
  for (const char* prec : {"bf16", "f16"}) {
    auto one = small(1, 1, 1);
    one.precision = parallel::parse_precision(prec);
    const RunResult ref = run(one, 10);
    auto z3 = small_zero(1, 2, 2, 3);
    z3.precision = parallel::parse_precision(prec);
    const RunResult got = run(z3, 10);
    INFO(prec);
    require_16bit_losses_close(got, ref);
    if (std::string(prec) == "bf16") require_bf16_equivalent(got, ref, "ZeRO-3 bf16 pp=2 dp=2 vs single rank", false);
    // The weights ZeRO-2 computes under the same precision and layout. The buckets differ (ZeRO-3's never cross
    // a unit), so the norm's partial sums and hence the clipping factor differ by rounding, which a 16-bit
    // rounding of the weights can amplify to a flipped ulp of the GEMM operands: 1.6e-3 is the largest seen.
    auto z2 = z3;
    z2.zero = parallel::ZeroStage::gradients;
    require_same_parameters(got, run(z2, 10), std::string(prec) + " ZeRO-3 vs ZeRO-2", 1e-2);
  }
}

TEST_CASE("ZeRO-3 holds 1/dp of the weights, gradients and states between steps", "[models][gpt][zero3][memory]") {
  const auto z2 = held_between_steps(2), z3 = held_between_steps(3);
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    const double n = double(z3[r].local);
    REQUIRE(z2[r].local == z3[r].local);
    // ZeRO-2 keeps every weight; ZeRO-3 only this rank's shards (each bucket's block rounds up by one element
    // at most), every full value released.
    CHECK(double(z2[r].parameters) == Approx(n).epsilon(0.01));
    CHECK(z3[r].non_empty_values == 0);
    CHECK(double(z3[r].parameters) == Approx(0.5 * n).epsilon(0.01));
    // Both keep the gradient shards only, and the moment shards: N / dp and 2 N / dp.
    CHECK(z3[r].non_empty_grads == 0);
    CHECK(double(z3[r].gradients) == Approx(0.5 * n).epsilon(0.01));
    CHECK(double(z3[r].states) == Approx(n).epsilon(0.01));
  }
}

TEST_CASE("gradient clipping equals single-rank clipping", "[models][gpt][clip]") {
  auto one = small_sgd(1, 1, 1);
  one.clip = 0.05;  // far below the observed norms: every step clips
  const RunResult ref = run(one, 10);
  for (double n : ref.norms) REQUIRE(n > 0.05);
  REQUIRE(std::fabs(ref.losses.back() - reference_sgd().losses[9]) > 1e-4);  // clipping changed the run
  for (auto [tp, pp, dp] : {std::tuple<std::size_t, std::size_t, std::size_t>{2, 2, 1}, {1, 2, 2}, {2, 1, 2}}) {
    auto c = small_sgd(tp, pp, dp);
    c.clip = 0.05;
    require_equivalent(run(c, 10), ref,
                       "clipped tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp),
                       true);
  }
}

TEST_CASE("mixed precision: bf16 and f16 layouts agree with their single-rank runs", "[models][gpt][precision]") {
  for (const char* prec : {"bf16", "f16"}) {
    auto one = small(1, 1, 1);
    one.precision = parallel::parse_precision(prec);
    const RunResult ref = run(one, 10);
    // 16-bit weights change the numbers, not the learning: the loss still falls.
    REQUIRE(ref.losses.back() < ref.losses.front());
    REQUIRE(std::fabs(ref.losses[3] - reference(10).losses[3]) > 0.0);
    auto par = small(2, 2, 1);
    par.precision = parallel::parse_precision(prec);
    require_16bit_losses_close(run(par, 10), ref);
  }
}

TEST_CASE("a run resumed from a checkpoint of another layout continues exactly", "[models][gpt][checkpoint]") {
  const fs::path dir = fs::temp_directory_path() / "mpar-test-gpt-resume";
  fs::remove_all(dir);
  const RunResult& full = reference();
  // Save at step 10 from (2, 2, 1), resume in (1, 1, 1), (1, 2, 2) and (2, 1, 2).
  (void)run(small(2, 2, 1), 10, "", dir.string());
  for (auto [tp, pp, dp] : {std::tuple<std::size_t, std::size_t, std::size_t>{1, 1, 1}, {1, 2, 2}, {2, 1, 2}})
    require_continues(run(small(tp, pp, dp), 20, dir.string()), full, 10);
  fs::remove_all(dir);
  // ZeRO-1 moments are saved as flat ranges of each parameter: a ZeRO-1 run resumes without ZeRO and back.
  auto zero = small(1, 2, 2);
  zero.zero = parallel::ZeroStage::optimizer_states;
  const RunResult zero_full = run(zero, 20);
  (void)run(zero, 10, "", dir.string());
  require_continues(run(small(2, 1, 1), 20, dir.string()), zero_full, 10);
  fs::remove_all(dir);
  (void)run(small(2, 2, 1), 10, "", dir.string());
  auto zero_again = small(1, 1, 2);
  zero_again.zero = parallel::ZeroStage::optimizer_states;
  require_continues(run(zero_again, 20, dir.string()), full, 10);
  fs::remove_all(dir);
}

TEST_CASE("a checkpoint saved with ZeRO-2 resumes at ZeRO-1 and at one rank, and ZeRO-2 resumes a plain one",
          "[models][gpt][zero2][checkpoint]") {
  // ZeRO-2 saves its moment shards as flat ranges of each parameter, as ZeRO-1 does; its gradient shards
  // are not state (they are recomputed by the next backward).
  require_zero_checkpoint_resumes(2, fs::temp_directory_path() / "mpar-test-gpt-resume-zero2", small(2, 2, 1),
                                  small(1, 1, 2));
}

TEST_CASE("a checkpoint saved with ZeRO-3 resumes at ZeRO-1 and at one rank, and ZeRO-3 resumes a plain one",
          "[models][gpt][zero3][checkpoint]") {
  // ZeRO-3 gathers its weight shards to save the full blocks, and its moments as flat ranges, as ZeRO-1 does;
  // it resumes (with tp) a single-rank checkpoint.
  require_zero_checkpoint_resumes(3, fs::temp_directory_path() / "mpar-test-gpt-resume-zero3", small(1, 1, 1),
                                  small(2, 1, 2));
}

TEST_CASE("a rank failing mid-training stops every rank with its name; the job resumes from the last checkpoint",
          "[models][gpt][faults]") {
  const fs::path dir = fs::temp_directory_path() / "mpar-test-gpt-fault";
  fs::remove_all(dir);
  const auto c = small(2, 2, 1);
  std::vector<std::string> errors(4);
  std::mutex m;
  try {
    run_threads(4, [&](ThreadsCommunicator& w) {
      models::GptTrainer<ThreadsCommunicator> t(w, c, dataset());
      try {
        while (t.step() < 20) {
          if (t.step() == 8) t.save(dir);
          if (t.step() == 13 && w.rank() == 2) throw std::runtime_error("simulated hardware fault");
          t.train_step();
        }
      } catch (const std::exception& e) {
        std::lock_guard lock(m);
        errors[std::size_t(w.rank())] = e.what();
        throw;
      }
    });
    FAIL("the job did not fail");
  } catch (const comm_error& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("rank 2") && Catch::Contains("simulated hardware fault"));
  }
  // Every surviving rank left its collective with an error that names the failed rank.
  for (int r : {0, 1, 3}) {
    INFO("rank " << r << ": " << errors[std::size_t(r)]);
    CHECK_THAT(errors[std::size_t(r)], Catch::Contains("rank 2"));
  }
  // The checkpoint of step 8 is intact and the job continues from it exactly as if nothing had happened.
  require_continues(run(c, 20, dir.string()), reference(), 8);
  fs::remove_all(dir);
}

TEST_CASE("invalid configurations are refused before training, saying what to change", "[models][gpt][errors]") {
  auto expect = [](models::GptTrainConfig c, std::size_t world, const std::string& text) {
    INFO(text);
    REQUIRE_THROWS_WITH(c.validate(world), Catch::Contains(text));
  };
  expect(small(2, 1, 1), 4, "tp x pp x dp = 2 x 1 x 1 = 2 ranks, but the job has 4");
  auto heads = small(3, 1, 1);
  expect(heads, 3, "heads 4 is not divisible by the tensor-parallel size 3");
  auto batch = small(1, 1, 2);
  batch.global_batch = 6;
  expect(batch, 2, "use --batch as a multiple of 4");
  auto inter = small(1, 2, 1, "interleaved_1f1b");
  inter.chunks = 2;
  inter.microbatches = 3;
  inter.global_batch = 6;
  expect(inter, 2, "multiple");
  auto deep = small(1, 4, 1, "interleaved_1f1b");
  deep.chunks = 2;
  deep.microbatches = 4;
  expect(deep, 4, "8 pipeline stages (pp x chunks) for only 4 layers");
  auto bw = small(1, 4, 1, "2bw");
  bw.microbatches = 2;
  expect(bw, 4, "M (micro-batches per weight update) must be at least P");
}

TEST_CASE("the loss falls clearly below the unigram entropy of the text", "[models][gpt][convergence]") {
  auto c = small(2, 1, 1);
  c.model.layers = 2;
  c.model.hidden = 64;
  c.model.seq = 32;
  c.global_batch = 16;
  c.steps = 300;
  c.warmup = 20;
  c.lr = 1e-2;
  c.min_lr = 1e-3;
  static const data::CharDataset ds32(data::default_text_path, 32);
  c.model.vocab = ds32.vocab_size();
  double last = 0;
  run_threads(2, [&](ThreadsCommunicator& w) {
    models::GptTrainer<ThreadsCommunicator> t(w, c, ds32);
    double tail = 0;
    for (std::size_t s = 0; s < c.steps; ++s) {
      const double l = t.train_step().loss;
      if (s + 20 >= c.steps) tail += l / 20;
    }
    if (w.rank() == 0) last = tail;
  });
  // GPL-3 text: unigram entropy 3.17 nats; a context-aware model must do clearly better.
  INFO("mean loss of the last 20 steps " << last << " vs unigram entropy " << ds32.unigram_entropy());
  REQUIRE(last < ds32.unigram_entropy() - 0.6);
}

// ---------------------------------------------------------------------------------------------------------
// Mixture of experts inside the GPT: expert parallelism (inside data parallelism) against the single rank.

namespace {

/** The small SGD model with 4 experts (top-2) in every other block (blocks 1 and 3). Capacity factor 2 gives a
 *  capacity of k T / E * 2 = T assignments per expert and rank: nothing can drop, whatever the routing. */
models::GptTrainConfig small_moe(std::size_t tp, std::size_t pp, std::size_t dp, std::size_t ep,
                                 std::string schedule = "1f1b") {
  auto c = small_sgd(tp, pp, dp, std::move(schedule));
  c.ep = ep;
  c.model.experts = 4;
  c.model.moe_top_k = 2;
  c.model.moe_capacity = 2.0;
  c.model.moe_aux_weight = 0.1f;  // large enough that a wrong load-balancing gradient shows in the parameters
  c.model.moe_every = 2;
  return c;
}

constexpr std::size_t moe_steps = 8;

const RunResult& reference_moe() {
  static const RunResult r = run(small_moe(1, 1, 1, 1), moe_steps);
  return r;
}

void require_moe_equivalent(const RunResult& got, const RunResult& ref, const std::string& what, bool params = true) {
  require_equivalent(got, ref, what, params);
  INFO(what);
  REQUIRE(got.dropped == 0);
  for (std::size_t i = 0; i < ref.aux.size(); ++i) REQUIRE(got.aux[i] == Approx(ref.aux[i]).epsilon(loss_tol));
}

}  // namespace

// Tolerances as above: losses and load-balancing losses 2e-5 relative, gradient norms 1e-3, every parameter
// (gates and every expert included, gathered over the expert axis) 1e-4 norm-relative after 8 SGD steps.
/**
 * The Llama family on the same small shape: 4 heads sharing 2 key/value heads, a SwiGLU width of 64, trained with
 * SGD so that parameters compare as well as losses.
 */
models::GptTrainConfig small_llama(std::size_t tp, std::size_t pp, std::size_t dp, std::string schedule = "1f1b") {
  auto c = small_sgd(tp, pp, dp, std::move(schedule));
  c.model.family = models::ModelFamily::llama;
  c.model.kv_heads = 2;
  c.model.ffn = 64;
  return c;
}

TEST_CASE("Llama: tp, pp, dp with ZeRO-3, sequence parallelism and bf16 reproduce the single-rank run",
          "[models][llama]") {
  const RunResult ref = run(small_llama(1, 1, 1), 20);
  REQUIRE(ref.losses.back() < ref.losses.front() - 0.5);  // it learns
  // Llama's parameters: rotary positions (no position table), RMSNorm gains only, an untied head.
  CHECK(ref.params.contains("head.weight"));
  CHECK(ref.params.contains("embed.token.weight"));
  CHECK(!ref.params.contains("embed.position.weight"));
  CHECK(ref.params.contains("block0.attn.qkv.weight"));
  CHECK(!ref.params.contains("block0.attn.qkv.bias"));
  CHECK(ref.params.at("block0.attn.qkv.weight").size() == 32 * (4 + 2 * 2) * 8);
  for (auto [tp, pp, dp] :
       {std::tuple<std::size_t, std::size_t, std::size_t>{2, 1, 1}, {1, 2, 1}, {1, 1, 2}, {2, 2, 2}})
    require_equivalent(run(small_llama(tp, pp, dp), 20), ref,
                       "llama tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp),
                       true);
  // ZeRO-3 shards AdamW's states: against the single rank under AdamW, losses and gradient norms.
  const auto adamw = [](models::GptTrainConfig c) {
    c.optimizer = parallel::UpdateRule::adamw;
    c.lr = 3e-3;
    return c;
  };
  auto z3 = adamw(small_llama(2, 1, 2));
  z3.zero = parallel::ZeroStage::parameters;
  require_equivalent(run(z3, 20), run(adamw(small_llama(1, 1, 1)), 20), "llama AdamW ZeRO-3 tp=2 dp=2", false);
  require_equivalent(run(sequence_parallel(small_llama(2, 2, 1, "zb_h1")), 20), ref, "llama sp tp=2 pp=2 zb_h1", true);
  auto selective = small_llama(1, 2, 1);
  selective.recompute_stages = {nn::Recompute::selective, nn::Recompute::full};
  require_equivalent(run(selective, 20), ref, "llama pp=2, selective and full recomputation", true);
  auto bf16 = [](models::GptTrainConfig c) {
    c.precision = parallel::Precision::bf16;
    return c;
  };
  const RunResult bf16_ref = run(bf16(small_llama(1, 1, 1)), 10);
  REQUIRE(std::fabs(bf16_ref.losses[3] - ref.losses[3]) > 0.0);  // 16-bit arithmetic ran
  require_bf16_equivalent(run(bf16(small_llama(2, 2, 1)), 10), bf16_ref, "llama bf16 tp=2 pp=2", true);
}

TEST_CASE("Llama: context parallelism (ring grouped-query attention) reproduces the single-rank run",
          "[models][llama][context]") {
  const RunResult ref = run(small_llama(1, 1, 1), 20);
  const auto with_cp = [](models::GptTrainConfig c, std::size_t cp) {
    c.cp = cp;
    return c;
  };
  require_equivalent(run(with_cp(small_llama(1, 1, 1), 2), 20), ref, "llama cp=2", true);
  require_equivalent(run(with_cp(small_llama(2, 1, 1), 2), 20), ref, "llama cp=2 tp=2", true);
  require_equivalent(run(with_cp(small_llama(1, 2, 1), 2), 20), ref, "llama cp=2 pp=2", true);
  auto cp4 = with_cp(small_llama(1, 1, 1), 4);  // seq 16 = 8 chunks of 2 tokens
  cp4.recompute = true;
  require_equivalent(run(cp4, 20), ref, "llama cp=4 recompute", true);
  // ZeRO-3 over the dp x cp ranks of the gradient reduction, under AdamW: losses and gradient norms.
  const auto adamw = [](models::GptTrainConfig c) {
    c.optimizer = parallel::UpdateRule::adamw;
    c.lr = 3e-3;
    return c;
  };
  auto z3 = adamw(with_cp(small_llama(2, 1, 2), 2));
  z3.zero = parallel::ZeroStage::parameters;
  require_equivalent(run(z3, 20), run(adamw(small_llama(1, 1, 1)), 20), "llama AdamW ZeRO-3 cp=2 tp=2 dp=2", false);
}

TEST_CASE("Llama: a checkpoint resumes in another layout; a GPT-2 run refuses it; what cannot run is refused",
          "[models][llama][checkpoint][errors]") {
  const fs::path dir = fs::temp_directory_path() / "mpar-test-llama-resume";
  fs::remove_all(dir);
  const RunResult full = run(small_llama(1, 1, 1), 20);
  (void)run(small_llama(2, 2, 1), 10, "", dir.string());
  require_continues(run(small_llama(1, 2, 2), 20, dir.string()), full, 10);
  auto gpt2 = small_sgd(1, 1, 1);
  CHECK_THROWS_WITH(run(gpt2, 20, dir.string()), Catch::Contains("model.family"));
  fs::remove_all(dir);
  auto kv = small_llama(4, 1, 1);  // 2 key/value heads over 4 tensor ranks
  CHECK_THROWS_WITH(run(kv, 1), Catch::Contains("--kv-heads 2 is not divisible by the tensor-parallel size 4"));
  auto groups = small_llama(1, 1, 1);
  groups.model.kv_heads = 3;
  CHECK_THROWS_WITH(run(groups, 1), Catch::Contains("not divisible by --kv-heads 3"));
  auto dropout = small_llama(1, 1, 1);
  dropout.model.dropout = 0.1;
  CHECK_THROWS_WITH(run(dropout, 1), Catch::Contains("no dropout"));
}

TEST_CASE("GPT with MoE: expert parallelism with tp, pp, dp reproduces the single-rank run", "[models][gpt][moe]") {
  const RunResult& ref = reference_moe();
  REQUIRE(ref.dropped == 0);
  REQUIRE(ref.aux.front() > 0.1 * 0.9);  // alpha E sum f P >= alpha (equality at perfect balance)
  REQUIRE(ref.losses.back() < ref.losses.front());
  REQUIRE(ref.params.count("block1.moe.experts.w1") == 1);
  REQUIRE(ref.params.count("block0.moe.experts.w1") == 0);  // block 0 stays dense with moe_every = 2
  for (auto [tp, pp, dp, ep] : {std::tuple<std::size_t, std::size_t, std::size_t, std::size_t>{1, 1, 1, 2},
                                {1, 1, 2, 1},
                                {2, 1, 1, 2},
                                {1, 2, 1, 2},
                                {1, 1, 2, 2}})
    require_moe_equivalent(run(small_moe(tp, pp, dp, ep), moe_steps), ref,
                           "MoE tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp) +
                               " ep=" + std::to_string(ep));
  // Split backward (zero-bubble) and recomputation rerun the MoE forward with its collectives.
  require_moe_equivalent(run(small_moe(1, 2, 1, 2, "zb_h1"), moe_steps), ref, "MoE zb_h1 pp=2 ep=2");
  auto inter = small_moe(1, 2, 1, 2, "interleaved_1f1b");
  inter.chunks = 2;  // MoE blocks 1 and 3 on different chunks of the two pipeline ranks
  require_moe_equivalent(run(inter, moe_steps), ref, "MoE interleaved_1f1b pp=2 chunks=2 ep=2");
  auto re = small_moe(1, 1, 1, 2);
  re.recompute = true;
  require_moe_equivalent(run(re, moe_steps), ref, "MoE recompute ep=2");
  // The load-balancing loss is part of the objective: without it the gates train differently.
  auto no_aux = small_moe(1, 1, 1, 1);
  no_aux.model.moe_aux_weight = 0.0f;
  const RunResult plain = run(no_aux, moe_steps);
  REQUIRE(plain.aux.front() == 0.0);
  REQUIRE(rel_diff(plain.params.at("block1.moe.gate.weight"), ref.params.at("block1.moe.gate.weight")) > 1e-4);
}

TEST_CASE("GPT with MoE and dropout: expert, data and pipeline layouts reproduce the single-rank run",
          "[models][gpt][moe][dropout]") {
  auto with_dropout = [](models::GptTrainConfig c) {
    c.model.dropout = 0.1;
    return c;
  };
  // Expert ranks take slices of every micro-batch: their sequences' masks are those of the single-rank run.
  const RunResult ref = run(with_dropout(small_moe(1, 1, 1, 1)), moe_steps);
  REQUIRE(largest_difference(ref, reference_moe()) > 10 * update_tol);
  for (auto [tp, pp, dp, ep] :
       {std::tuple<std::size_t, std::size_t, std::size_t, std::size_t>{1, 1, 1, 2}, {1, 1, 2, 2}, {2, 2, 1, 2}})
    require_moe_equivalent(run(with_dropout(small_moe(tp, pp, dp, ep)), moe_steps), ref,
                           "MoE with dropout tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) +
                               " dp=" + std::to_string(dp) + " ep=" + std::to_string(ep));
}

TEST_CASE("GPT with MoE: clipping counts every expert once, AdamW and ZeRO-1 (ep = 1) agree",
          "[models][gpt][moe][clip]") {
  auto one = small_moe(1, 1, 1, 1);
  one.clip = 0.05;
  const RunResult ref = run(one, 5);
  for (double n : ref.norms) REQUIRE(n > 0.05);
  for (auto [dp, ep] : {std::pair<std::size_t, std::size_t>{1, 2}, {2, 2}}) {
    auto c = small_moe(1, 1, dp, ep);
    c.clip = 0.05;
    require_moe_equivalent(run(c, 5), ref, "clipped MoE dp=" + std::to_string(dp) + " ep=" + std::to_string(ep));
  }
  auto adam = [](std::size_t tp, std::size_t dp, std::size_t ep) {
    auto c = small_moe(tp, 1, dp, ep);
    c.optimizer = parallel::UpdateRule::adamw;
    c.lr = 3e-3;
    return c;
  };
  const RunResult adam_ref = run(adam(1, 1, 1), 5);
  require_moe_equivalent(run(adam(2, 1, 2), 5), adam_ref, "AdamW MoE tp=2 ep=2", false);
  auto zero = adam(1, 2, 1);
  zero.zero = parallel::ZeroStage::optimizer_states;
  require_moe_equivalent(run(zero, 5), adam_ref, "ZeRO-1 MoE dp=2 ep=1", false);
}

namespace {
/** `small_moe` trained with AdamW (what ZeRO shards), at ZeRO stage `stage` with several buckets per step. */
models::GptTrainConfig moe_adamw(std::size_t tp, std::size_t pp, std::size_t dp, std::size_t ep, int stage = 0) {
  auto c = small_moe(tp, pp, dp, ep);
  c.optimizer = parallel::UpdateRule::adamw;
  c.lr = 3e-3;
  c.zero = parallel::zero_stage_from_number(stage);
  c.bucket_bytes = 4096;
  return c;
}
}  // namespace

// As DeepSpeed-MoE: the replicated parameters' states (and gradients, and weights) are sharded over the data x
// expert ranks, which all hold them; each expert's over the data ranks of its expert rank, the only ones that do.
TEST_CASE("GPT with MoE: ZeRO-1, -2 and -3 with expert parallelism reproduce the single-rank run",
          "[models][gpt][moe][zero]") {
  const RunResult ref = run(moe_adamw(1, 1, 1, 1), 5);
  struct Layout {
    std::size_t tp, pp, dp, ep;
  };
  for (const Layout l : {Layout{1, 1, 1, 2}, Layout{1, 1, 2, 2}, Layout{2, 1, 1, 2}, Layout{1, 2, 1, 2}}) {
    RunResult previous;
    for (int stage : {1, 2, 3}) {
      const std::string what = "ZeRO-" + std::to_string(stage) + " MoE tp=" + std::to_string(l.tp) +
                               " pp=" + std::to_string(l.pp) + " dp=" + std::to_string(l.dp) +
                               " ep=" + std::to_string(l.ep);
      const RunResult got = run(moe_adamw(l.tp, l.pp, l.dp, l.ep, stage), 5);
      // AdamW: losses, aux losses and norms against the single rank (parameters: see require_equivalent).
      require_moe_equivalent(got, ref, what, false);
      // A higher stage changes how long memory lives, not the arithmetic, as without experts.
      if (stage > 1) require_same_parameters(got, previous, what + " vs the stage below", 1e-6);
      previous = got;
    }
  }
  // Experts in block 3 only: pipeline stage 0 holds none, so it has no experts' optimizer, and its share of the
  // gradient norm is summed over the same groups as stage 1's.
  auto last_only = [](models::GptTrainConfig c) {
    c.model.moe_every = 4;
    return c;
  };
  require_moe_equivalent(run(last_only(moe_adamw(1, 2, 1, 2, 3)), 5), run(last_only(moe_adamw(1, 1, 1, 1)), 5),
                         "ZeRO-3 MoE pp=2 ep=2, experts on the last stage only", false);
}

TEST_CASE("GPT with MoE: experts split over the tensor ranks (--etp) reproduce the single rank and resume across etp",
          "[models][gpt][moe][etp]") {
  const auto split = [](models::GptTrainConfig c) {
    c.model.expert_tp = c.tp;
    return c;
  };
  const RunResult& ref = reference_moe();
  for (auto [pp, ep] : {std::pair<std::size_t, std::size_t>{1, 1}, {1, 2}, {2, 2}})
    require_moe_equivalent(run(split(small_moe(2, pp, 1, ep)), moe_steps), ref,
                           "MoE tp=2 etp=2 pp=" + std::to_string(pp) + " ep=" + std::to_string(ep));
  require_moe_equivalent(run(split(small_moe(2, 2, 1, 1, "zb_h1")), moe_steps), ref, "MoE zb_h1 tp=2 etp=2 pp=2");
  // Each tensor rank holds half of every expert: the experts' floats per rank halve, the gate's do not.
  std::vector<double> expert_floats(2), gate_floats(2);
  run_threads(2, [&](ThreadsCommunicator& w) {
    models::GptTrainer<ThreadsCommunicator> whole(w, small_moe(2, 1, 1, 1), dataset()),
        halves(w, split(small_moe(2, 1, 1, 1)), dataset());
    double e = 0, g = 0, e_whole = 0;
    for (const auto& [name, p] : halves.named_parameters()) {
      if (name.find(".moe.experts.") != std::string::npos) e += double(p->value.size());
      if (name.find(".moe.gate.") != std::string::npos) g += double(p->value.size());
    }
    for (const auto& [name, p] : whole.named_parameters())
      if (name.find(".moe.experts.") != std::string::npos) e_whole += double(p->value.size());
    expert_floats[std::size_t(w.rank())] = e / e_whole;  // each rank writes its own slot
    gate_floats[std::size_t(w.rank())] = g;
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(expert_floats[r] == 0.5);
    CHECK(gate_floats[r] == 2 * 32 * 4);  // two MoE blocks' gates [32, 4], whole on every rank
  }
  // AdamW under ZeRO-1 and ZeRO-3 with the experts split: losses, aux losses and norms of the single rank.
  const RunResult adamw_ref = run(moe_adamw(1, 1, 1, 1), 5);
  for (int stage : {1, 3})
    require_moe_equivalent(run(split(moe_adamw(2, 1, 2, 2, stage)), 5), adamw_ref,
                           "ZeRO-" + std::to_string(stage) + " MoE tp=2 etp=2 dp=2 ep=2", false);
  // A checkpoint of tp = 2 x ep = 2 with split experts resumes with whole experts (one rank, tp = 2) and back.
  const fs::path dir = fs::temp_directory_path() / "mpar-test-gpt-moe-etp-resume";
  fs::remove_all(dir);
  (void)run(split(small_moe(2, 1, 1, 2)), 4, "", dir.string());
  require_continues(run(small_moe(1, 1, 1, 1), moe_steps, dir.string()), ref, 4);
  require_continues(run(small_moe(2, 1, 1, 1), moe_steps, dir.string()), ref, 4);
  fs::remove_all(dir);
  (void)run(small_moe(1, 1, 1, 2), 4, "", dir.string());
  require_continues(run(split(small_moe(2, 1, 1, 1)), moe_steps, dir.string()), ref, 4);
  fs::remove_all(dir);
  // What cannot run is refused, naming the fix.
  auto partial = small_moe(4, 1, 1, 1);
  partial.model.heads = 4;
  partial.model.expert_tp = 2;
  CHECK_THROWS_WITH(run(partial, 1), Catch::Contains("use --etp 1 or --etp 4"));
  auto dense = small_sgd(2, 1, 1);
  dense.model.expert_tp = 2;
  CHECK_THROWS_WITH(run(dense, 1), Catch::Contains("but the model has none; add --experts N or use --etp 1"));
}

TEST_CASE("GPT with MoE under ZeRO: states held per rank, and checkpoints that resume on other layouts",
          "[models][gpt][moe][zero][checkpoint]") {
  // dp = 2 x ep = 2: the replicated parameters' moments in quarters, each expert's in halves (its data ranks).
  for (int stage : {1, 2}) {
    struct Held {
      double replicated = 0, experts = 0, states = 0;  ///< floats of this rank's parameters, and of its moments
    };
    std::vector<Held> held(4);
    run_threads(4, [&](ThreadsCommunicator& w) {
      models::GptTrainer<ThreadsCommunicator> t(w, moe_adamw(1, 1, 2, 2, stage), dataset());
      (void)t.train_step();
      Held h;
      for (const auto& [name, p] : t.named_parameters())
        (optim::sharded_over_expert(*p) ? h.experts : h.replicated) += double(p->value.size());
      h.states = double(t.memory().optimizer_states / sizeof(float));
      held[std::size_t(w.rank())] = h;  // checked below, on this thread: Catch's assertions are not thread-safe
    });
    for (std::size_t r = 0; r < held.size(); ++r) {
      const Held& h = held[r];
      INFO("stage " << stage << ", rank " << r << ": replicated " << h.replicated << ", experts " << h.experts);
      REQUIRE(h.experts > 0);
      CHECK(h.states == Approx(2 * (h.replicated / 4 + h.experts / 2)).epsilon(0.01));
    }
  }
  // Saved under ZeRO-2 with dp = 2 x ep = 2 (the moments of both optimizers in the checkpoint), resumed without
  // ZeRO on one rank and under ZeRO-3 at ep = 2: the losses continue those of the uninterrupted run.
  const fs::path dir = fs::temp_directory_path() / "mpar-test-gpt-moe-zero-resume";
  fs::remove_all(dir);
  const RunResult full = run(moe_adamw(1, 1, 1, 1), moe_steps);
  (void)run(moe_adamw(1, 1, 2, 2, 2), 4, "", dir.string());
  for (auto [dp, ep, stage] : {std::tuple<std::size_t, std::size_t, int>{1, 1, 0}, {1, 2, 3}, {2, 2, 1}}) {
    INFO("resumed with dp=" << dp << " ep=" << ep << " ZeRO-" << stage);
    const RunResult rest = run(moe_adamw(1, 1, dp, ep, stage), moe_steps, dir.string());
    REQUIRE(rest.losses.size() == moe_steps - 4);
    for (std::size_t i = 0; i < rest.losses.size(); ++i) {
      REQUIRE(rest.losses[i] == Approx(full.losses[4 + i]).epsilon(loss_tol));
      REQUIRE(rest.aux[i] == Approx(full.aux[4 + i]).epsilon(loss_tol));
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("GPT with MoE under f16 loss scaling: the load-balancing gradient is scaled like the loss",
          "[models][gpt][moe][precision]") {
  // The effect of the load-balancing loss on a gate (its parameters with minus without it) must be the same
  // under f16 (gradients scaled by 65536, then unscaled) as in fp32; an unscaled aux gradient would vanish.
  auto with = [](const char* prec, float aux, std::size_t ep) {
    auto c = small_moe(1, 1, 1, ep);
    c.precision = parallel::parse_precision(prec);
    c.model.moe_aux_weight = aux;
    return run(c, moe_steps).params.at("block1.moe.gate.weight");
  };
  auto effect = [](std::vector<float> a, const std::vector<float>& b) {
    for (std::size_t i = 0; i < a.size(); ++i) a[i] -= b[i];
    return a;
  };
  const auto fp32 = effect(reference_moe().params.at("block1.moe.gate.weight"), with("fp32", 0.0f, 1));
  const auto f16 = effect(with("f16", 0.1f, 2), with("f16", 0.0f, 2));
  INFO("relative difference of the aux effect, f16 ep=2 vs fp32: " << rel_diff(f16, fp32));
  REQUIRE(rel_diff(f16, fp32) < 0.1);
}

TEST_CASE("GPT with MoE: a checkpoint saved with ep = 2 resumes on another expert layout",
          "[models][gpt][moe][checkpoint]") {
  const fs::path dir = fs::temp_directory_path() / "mpar-test-gpt-moe-resume";
  fs::remove_all(dir);
  auto adam = [](std::size_t dp, std::size_t ep) {
    auto c = small_moe(1, 1, dp, ep);
    c.optimizer = parallel::UpdateRule::adamw;
    c.lr = 3e-3;
    return c;
  };
  const RunResult full = run(adam(1, 1), moe_steps);
  (void)run(adam(1, 2), 4, "", dir.string());
  for (auto [dp, ep] : {std::pair<std::size_t, std::size_t>{1, 1}, {2, 1}, {1, 2}}) {
    INFO("resumed with dp=" << dp << " ep=" << ep);
    const RunResult rest = run(adam(dp, ep), moe_steps, dir.string());
    REQUIRE(rest.losses.size() == moe_steps - 4);
    for (std::size_t i = 0; i < rest.losses.size(); ++i) {
      REQUIRE(rest.losses[i] == Approx(full.losses[4 + i]).epsilon(loss_tol));
      REQUIRE(rest.aux[i] == Approx(full.aux[4 + i]).epsilon(loss_tol));
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("GPT with MoE: a small capacity drops tokens and still trains", "[models][gpt][moe]") {
  auto c = small_moe(1, 1, 1, 2);
  c.model.moe_capacity = 0.5;  // half the even share per expert and rank
  const RunResult r = run(c, 4);
  REQUIRE(r.dropped > 0);
  for (double l : r.losses) REQUIRE(std::isfinite(l));
}

TEST_CASE("GPT with MoE: invalid expert layouts are refused, saying what to change", "[models][gpt][moe][errors]") {
  auto expect = [](models::GptTrainConfig c, std::size_t world, const std::string& text) {
    INFO(text);
    REQUIRE_THROWS_WITH(c.validate(world), Catch::Contains(text));
  };
  expect(small_moe(1, 1, 1, 2), 4, "tp x pp x dp x ep = 1 x 1 x 1 x 2 = 2 ranks, but the job has 4");
  auto odd = small_moe(1, 1, 1, 3);
  odd.global_batch = 12;
  expect(odd, 3, "4 experts do not divide over the expert-parallel size 3");
  auto dense = small_sgd(1, 1, 1);
  dense.ep = 2;
  expect(dense, 2, "--ep 2 spreads experts, but the model has none");
  auto zero = small_moe(1, 1, 1, 2);
  zero.zero = parallel::ZeroStage::gradients;  // ZeRO runs with experts (below), but shards AdamW's states only
  expect(zero, 2, "use --optimizer adamw with --zero 2");
  auto batch = small_moe(1, 1, 2, 2);
  batch.global_batch = 12;
  expect(batch, 4, "use --batch as a multiple of 8");
  auto topk = small_moe(1, 1, 1, 1);
  topk.model.moe_top_k = 5;
  expect(topk, 1, "--topk 5 must be between 1 and --experts 4");
}

// bf16 autocast: every layout reproduces the single-rank bf16 run (tolerances at require_bf16_equivalent).
TEST_CASE("bf16 autocast: tp, pp, dp and ep layouts reproduce the single-rank bf16 run",
          "[models][gpt][precision][autocast]") {
  constexpr std::size_t steps = 10;
  auto check = [](const RunResult& got, const RunResult& ref, const std::string& what) {
    require_bf16_equivalent(got, ref, what, true);
  };
  auto bf16 = [](models::GptTrainConfig c) {
    c.precision = parallel::Precision::bf16;
    return c;
  };
  const RunResult ref = run(bf16(small_sgd(1, 1, 1)), steps);
  // The bf16 run is not the fp32 run (the GEMMs did round), but it learns.
  REQUIRE(ref.losses.back() < ref.losses.front());
  const RunResult fp32 = run(small_sgd(1, 1, 1), steps);
  REQUIRE(ref.losses.back() != fp32.losses.back());
  for (auto [tp, pp, dp] :
       {std::tuple<std::size_t, std::size_t, std::size_t>{2, 1, 1}, {1, 2, 1}, {1, 1, 2}, {2, 2, 1}})
    check(run(bf16(small_sgd(tp, pp, dp)), steps), ref,
          "bf16 tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) + " dp=" + std::to_string(dp));
  // Expert parallelism: the experts' six GEMMs per expert take bf16 operands too (parallel::MoeMlp), the gate stays fp32.
  const RunResult moe_ref = run(bf16(small_moe(1, 1, 1, 1)), moe_steps);
  check(run(bf16(small_moe(1, 1, 1, 2)), moe_steps), moe_ref, "bf16 MoE ep=2");
}

// Accuracy: bf16 training follows the fp32 curve. The small model's 20 AdamW steps (the reference run) end
// within 2 % of the fp32 final loss.
TEST_CASE("bf16 autocast: training follows the fp32 loss curve within 2 %", "[models][gpt][precision][autocast]") {
  const RunResult& fp32 = reference(20);
  auto c = small(1, 1, 1);
  c.precision = parallel::Precision::bf16;
  const RunResult half = run(c, 20);
  INFO("fp32 final loss " << fp32.losses.back() << ", bf16 " << half.losses.back());
  REQUIRE(half.losses.back() < half.losses.front());
  CHECK(std::fabs(half.losses.back() - fp32.losses.back()) <= 0.02 * fp32.losses.back());
}
