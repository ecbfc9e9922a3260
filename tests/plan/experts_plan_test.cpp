// The planner with mixture-of-experts layers: the all-to-all's alpha-beta time, an MoE layer's work and costs,
// the expert groups' placement and reductions, the FLOP count, the search over ep, and mpar-plan's options.
// Expected values are written out from the formulas in docs/planner.md, not taken from the code under test.
#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "mpar/plan.hpp"

using namespace mpar::plan;

namespace {

const Network two_links{{100e9, 2e-6}, {10e9, 10e-6}};  // intra 100 GB/s, inter 10 GB/s per GPU

/** 4 layers of width 1024, 8 experts in layers 1 and 3, top-2, capacity 1: C = 2 x 512 / 8 = 128 slots. */
GptModel moe_model() {
  GptModel m{4, 1024, 16, 512, 1000};
  m.experts = 8, m.moe_every = 2, m.moe_top_k = 2, m.moe_capacity = 1.0;
  return m;
}

/** A model whose experts (4 MoE layers x 16 experts of 8 h^2 = 2.1 B parameters) fit 24 GiB only when split. */
Problem crowded_problem() {
  GptModel m{8, 2048, 16, 1024, 32000};
  m.experts = 16, m.moe_every = 2, m.moe_top_k = 2;
  Cluster c = a100_selene(8);
  c.memory_bytes = 24.0 * gib;
  return Problem{m, c, 64};
}

/** The words of `line`, as a shell would split it. */
std::vector<std::string> split_words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}
std::vector<std::string> with_words(std::vector<std::string> args, const std::string& more) {
  for (std::string& w : split_words(more)) args.push_back(std::move(w));
  return args;
}

/** tp = pp = 1 and no ZeRO: only expert parallelism can shrink the experts' model states. */
SearchSpace data_parallel_only() {
  SearchSpace s;
  s.tp = 1, s.pp = 1;
  s.zero1 = false, s.zero2 = false, s.zero3 = false;
  return s;
}

}  // namespace

TEST_CASE("all-to-all: one latency per peer, the blocks for other nodes on the NIC share, the rest on NVLink",
          "[plan][cost][experts]") {
  const double S = 1e9;
  // 8 ranks in one node: 7 blocks of S/8 leave over NVLink.
  CHECK(collective_seconds(Collective::all_to_all, Algorithm::ring, S, {8, 1}, two_links) ==
        Approx(7 * 2e-6 + 7.0 / 8 * S / 100e9));
  // 2 nodes x 4: 3 blocks over NVLink while 4 cross the network at 10 GB/s; the network decides.
  CHECK(collective_seconds(Collective::all_to_all, Algorithm::ring, S, {8, 2}, two_links) ==
        Approx(7 * 10e-6 + 4.0 / 8 * S / 10e9));
  // There is no tree or hierarchical all-to-all: every algorithm gives the same time.
  for (Algorithm a : {Algorithm::tree, Algorithm::hierarchical})
    CHECK(collective_seconds(Collective::all_to_all, a, S, {8, 2}, two_links) ==
          collective_seconds(Collective::all_to_all, Algorithm::ring, S, {8, 2}, two_links));
  CHECK(best_collective(Collective::all_to_all, S, {8, 2}, two_links).seconds ==
        collective_seconds(Collective::all_to_all, Algorithm::ring, S, {8, 2}, two_links));
  CHECK(collective_seconds(Collective::all_to_all, Algorithm::ring, S, {1, 1}, two_links) == 0);
}

TEST_CASE("an MoE layer's work: the attention split over tp, the gate and E C expert slots on every tensor rank",
          "[plan][cost][experts]") {
  const GptModel m = moe_model();
  const CostModel cm(m, a100_selene(8));
  ParallelConfig c;
  c.dp = 8;
  const double s = 512, h = 1024, E = 8, C = 128;
  CHECK(moe_expert_capacity(m, c) == C);
  const LayerWork dense = cm.layer_work(c), moe = cm.layer_work(c, true);
  CHECK(dense.expert_flops == 0);
  CHECK(moe.linear_flops == Approx(8 * s * h * h));                       // QKV and projection
  CHECK(moe.expert_flops == Approx(2 * s * h * E + 16 * h * h * E * C));  // gate, then W1 and W2 per slot
  CHECK(moe.attention_flops == dense.attention_flops);
  CHECK(moe.all_to_all_bytes == Approx(2 * E * C * h));  // bf16 activations
  CHECK(moe.tp_collectives == 1);
  // Capacity 1 at top-2: the experts compute exactly twice the dense MLP's products.
  CHECK(moe.expert_flops - 2 * s * h * E == Approx(2 * (dense.linear_flops - moe.linear_flops)));
  // No capacity limit: every expert has a slot for every token.
  GptModel unlimited = m;
  unlimited.moe_capacity = 0;
  CHECK(CostModel(unlimited, a100_selene(8)).layer_work(c, true).expert_flops ==
        Approx(2 * s * h * E + 16 * h * h * E * s));

  // Tensor parallelism splits the attention's GEMMs but not the experts.
  ParallelConfig t2 = c;
  t2.tp = 2, t2.dp = 4;
  const LayerWork moe2 = cm.layer_work(t2, true);
  CHECK(moe2.linear_flops == Approx(moe.linear_flops / 2));
  CHECK(moe2.expert_flops == moe.expert_flops);
}

TEST_CASE("an MoE layer's costs: its GEMMs at the GEMM rate, one tp collective, two all-to-alls each way",
          "[plan][cost][experts]") {
  const GptModel m = moe_model();
  const CostModel cm(m, a100_selene(16));
  ParallelConfig c;
  c.tp = 2, c.dp = 8;
  const GroupPlacement g1 = place(c, 8, Placement::tensor_innermost);
  const ChunkCosts one = cm.layer_costs(c, g1, true);
  const LayerWork w = cm.layer_work(c, true);
  const double gemm = 312e12 * 0.65, ew = 2.039e12 * 0.8;
  const double ar = best_collective(Collective::all_reduce, w.tp_collective_bytes, g1.tensor, cm.network()).seconds;
  CHECK(one.forward == Approx((w.linear_flops + w.expert_flops) / gemm + cm.attention_core_seconds(w) +
                              w.elementwise_bytes / ew + ar));
  CHECK(one.backward_weight == Approx(w.linear_flops / gemm));

  // Expert parallelism moves the same slots, plus dispatch and combine over the expert group.
  c.ep = 4;
  const GroupPlacement g4 = place(c, 8, Placement::tensor_innermost);
  CHECK(g4.expert.ranks == 4);
  CHECK(g4.expert.nodes == 1);  // 4 data ranks 2 apart: 8 neighbouring GPUs
  const double a2a = best_collective(Collective::all_to_all, w.all_to_all_bytes, g4.expert, cm.network()).seconds;
  CHECK(a2a > 0);
  const ChunkCosts four = cm.layer_costs(c, g4, true);
  CHECK(four.forward == Approx(one.forward + 2 * a2a));
  CHECK(four.backward_input == Approx(one.backward_input + 2 * a2a));
  CHECK(four.backward_weight == Approx(one.backward_weight));
}

TEST_CASE("a pipeline stage's costs add its dense and its MoE layers", "[plan][cost][experts]") {
  GptModel m = moe_model();
  m.moe_every = 4;  // only layer 3 holds experts: the second of two stages
  GptModel dense = m;
  dense.experts = 0;
  const CostModel with_experts(m, a100_selene(8)), without(dense, a100_selene(8));
  ParallelConfig c;
  c.pp = 2, c.dp = 4, c.microbatches = 4;
  const GroupPlacement g = place(c, 8, Placement::tensor_innermost);
  const ChunkCosts first = with_experts.chunk_costs(c, 0, 0, g), last = with_experts.chunk_costs(c, 1, 0, g);
  CHECK(first.forward == without.chunk_costs(c, 0, 0, g).forward);
  const ChunkCosts moe = with_experts.layer_costs(c, g, true), plain = with_experts.layer_costs(c, g);
  CHECK(last.forward == Approx(without.chunk_costs(c, 1, 0, g).forward - plain.forward + moe.forward));
  CHECK(last.backward_input ==
        Approx(without.chunk_costs(c, 1, 0, g).backward_input - plain.backward_input + moe.backward_input));
}

TEST_CASE("expert groups: ep neighbouring data ranks; the ranks holding the same experts reduce their gradients",
          "[plan][cost][experts]") {
  const GptModel m = moe_model();
  const CostModel cm(m, a100_selene(16));
  ParallelConfig c;
  c.tp = 2, c.dp = 8, c.ep = 2;
  const GroupPlacement g = place(c, 8, Placement::tensor_innermost);
  CHECK(g.expert.ranks == 2);
  CHECK(g.expert.nodes == 1);
  CHECK(g.expert_data.ranks == 4);  // dp / ep, 2 x 2 GPUs apart: 16 GPUs, 2 nodes
  CHECK(g.expert_data.nodes == 2);
  const double X = 1e8;
  CHECK(cm.dp_reduce_seconds(X, c, g, true) ==
        best_collective(Collective::all_reduce, X * cm.precision().grad_bytes, GroupShape{4, 2}, cm.network()).seconds);
  c.ep = 8;  // every data rank holds different experts: nothing to reduce
  CHECK(cm.dp_reduce_seconds(X, c, place(c, 8, Placement::tensor_innermost), true) == 0);

  // ZeRO-1 shards the replicated states over dp and the experts' over dp / ep.
  c.ep = 2, c.zero = ZeroStage::optimizer_states;
  const double P = 3e8, bytes = cm.precision().model_state_bytes(), ew = 2.039e12 * 0.8;
  CHECK(cm.optimizer_seconds(P, c, X) == Approx(2 * (P / 8 + X / 4) * bytes / ew));
  c.zero = ZeroStage::none;
  CHECK(cm.optimizer_seconds(P, c, X) == Approx(2 * (P + X) * bytes / ew));
}

TEST_CASE("FLOPs per iteration count each token through k experts and the gate", "[plan][experts]") {
  const GptModel m = moe_model();
  const double B = 8, s = 512, h = 1024, V = 1000, k = 2, E = 8;
  const double dense_layer = 24 * B * s * h * h + 4 * B * s * s * h;
  const double moe_layer = 8 * B * s * h * h + 4 * B * s * s * h + 16 * k * B * s * h * h + 2 * B * s * h * E;
  CHECK(m.model_flops(B) == Approx(3 * (2 * dense_layer + 2 * moe_layer) + 6 * B * s * h * V));
  CHECK(iteration_flops(m, B, Recompute::full) == Approx(4 * (2 * dense_layer + 2 * moe_layer) + 6 * B * s * h * V));
  GptModel dense = m;
  dense.experts = 0;  // Narayanan et al.'s count
  CHECK(dense.model_flops(B) == Approx(72 * B * s * 4 * h * h * (1 + s / (6 * h)) + 6 * B * s * h * V));
}

TEST_CASE("the search splits experts over ep where they do not fit otherwise", "[plan][search][experts]") {
  const Problem p = crowded_problem();
  const CostModel cm(p.model, p.cluster);
  const Plan plan = search(p, cm, data_parallel_only());
  REQUIRE(!plan.best.empty());
  for (const Candidate& c : plan.best) {
    INFO(c.config);
    CHECK(c.config.ep >= 4);
    CHECK(p.model.experts % c.config.ep == 0);
    CHECK(c.config.dp % c.config.ep == 0);
    CHECK(c.memory.total() <= 0.95 * 24.0 * gib);
  }
  REQUIRE(plan.rejected_by_kind.count("memory"));
  bool hint = false;
  for (const Rejection& r : plan.rejected) hint = hint || r.reason.find("a larger ep") != std::string::npos;
  CHECK(hint);

  // With ep fixed at 1, nothing fits.
  SearchSpace one = data_parallel_only();
  one.ep = 1;
  const Plan none = search(p, cm, one);
  CHECK(none.best.empty());
  CHECK(none.rejected_by_kind.count("memory"));

  // A dense model is never given experts to spread.
  Problem dense = p;
  dense.model.experts = 0;
  for (const Candidate& c : search(dense, CostModel(dense.model, dense.cluster), data_parallel_only()).best)
    CHECK(c.config.ep == 1);
}

TEST_CASE("configurations the trainer refuses with experts are rejected with the reason", "[plan][search][experts]") {
  Problem p = crowded_problem();
  p.cluster.memory_bytes = 80.0 * gib;
  const CostModel cm(p.model, p.cluster);
  SearchSpace s;
  s.cp = 2;
  const Plan plan = search(p, cm, s);
  CHECK(plan.best.empty());
  REQUIRE(plan.rejected_by_kind.count("context"));
  for (const Rejection& r : plan.rejected)
    if (r.kind == "context") CHECK_THAT(r.reason, Catch::Contains("cp > 1 needs a dense model"));
  CHECK_THROWS_WITH(search(p, cm, SearchSpace{.ep = 3}), Catch::Contains("does not divide the 16 experts"));
  // Sequence parallelism with experts (train_gpt refuses it): never a plan, always the reason.
  SearchSpace sp;
  sp.tp = 2, sp.sequence_parallel = true;
  const Plan with_sp = search(p, cm, sp);
  CHECK(with_sp.best.empty());
  REQUIRE(with_sp.rejected_by_kind.count("experts"));
  bool said = false;
  for (const Rejection& r : with_sp.rejected)
    said = said || r.reason.find("not sequence-parallel") != std::string::npos;
  CHECK(said);
  p.model.experts = 0;
  CHECK_THROWS_WITH(search(p, CostModel(p.model, p.cluster), SearchSpace{.ep = 2}),
                    Catch::Contains("the model has none"));
}

TEST_CASE("mpar-plan --experts plans an MoE model and shows each row's ep", "[plan][cli][experts]") {
  const std::vector<std::string> dense_model = split_words(
      "--layers 8 --hidden 2048 --heads 16 --seq 1024 --vocab 32000 --global-batch 64 --gpus 8 "
      "--gpus-per-node 8 --gpu-mem-gib 24 --peak-tflops 312 --intra-node-gbps 300 --inter-node-gbps 200 "
      "--tp 1 --pp 1 --zero1 off --zero2 off --zero3 off");
  const std::vector<std::string> model = with_words(dense_model, "--experts 16 --moe-every 2");
  const CliOptions o = parse_cli(model);
  CHECK(o.problem.model.experts == 16);
  CHECK(o.problem.model.moe_every == 2);
  CHECK(o.problem.model.moe_top_k == 2);
  CHECK(!o.space.ep.has_value());

  std::ostringstream out, err;
  REQUIRE(run_cli(model, out, err) == 0);
  CHECK(out.str().find("16 experts every 2 layer(s), top-2") != std::string::npos);
  CHECK(out.str().find("  #  tp  ep etp  pp") != std::string::npos);
  CHECK(out.str().find("best: tp=1 pp=1 dp=8 ep=") != std::string::npos);

  const std::vector<std::string> json = with_words(model, "--json --ep 8 --topk 1 --capacity 2");
  const CliOptions j = parse_cli(json);
  CHECK(j.problem.model.moe_top_k == 1);
  CHECK(j.problem.model.moe_capacity == 2.0);
  std::ostringstream jout, jerr;
  REQUIRE(run_cli(json, jout, jerr) == 0);
  CHECK(jout.str().find("\"ep\":8,") != std::string::npos);

  auto error_of = [](std::vector<std::string> args) {
    std::ostringstream eout, eerr;
    CHECK(run_cli(args, eout, eerr) == 1);
    return eerr.str();
  };
  CHECK_THAT(error_of(with_words(model, "--ep 3")), Catch::Contains("--ep 3 does not divide the 16 experts"));
  CHECK_THAT(error_of(with_words(dense_model, "--ep 2")), Catch::Contains("spreads experts, but the model has none"));
  CHECK_THAT(error_of(with_words(dense_model, "--topk 1")),
             Catch::Contains("--topk describes the experts of MoE layers, but the model has none"));
  CHECK_THAT(error_of(with_words(model, "--topk 17")), Catch::Contains("--topk between 1 and 16"));
  CHECK_THAT(error_of(with_words(model, "--capacity -1")),
             Catch::Contains("or 0: unlimited) expects a positive number, got '-1'"));
  CHECK(parse_cli(with_words(model, "--capacity 0")).problem.model.moe_capacity == 0.0);  // unlimited, as train_gpt
}

TEST_CASE("expert tensor parallelism: each rank computes 1/tp of every expert and all-reduces the slots each way",
          "[plan][cost][experts][etp]") {
  const GptModel m = moe_model();
  const CostModel cm(m, a100_selene(16));
  ParallelConfig c;
  c.tp = 2, c.dp = 8;
  const double s = 512, h = 1024, E = 8, C = 128, e = 2;  // bf16 activations
  const LayerWork whole = cm.layer_work(c, true);
  ParallelConfig split = c;
  split.etp = 2;
  const LayerWork halves = cm.layer_work(split, true);
  CHECK(halves.expert_flops == Approx(2 * s * h * E + 16 * h * h * E * C / 2));  // the gate stays whole
  CHECK(halves.expert_reduce_bytes == Approx(e * E * C * h));
  CHECK(whole.expert_reduce_bytes == 0);
  CHECK(halves.linear_flops == whole.linear_flops);
  // GeLU over [E C, 4h] splits with the experts (8 per slot element of width h, halved); the copies do not.
  CHECK(whole.elementwise_bytes - halves.elementwise_bytes == Approx(4 * e * E * C * h));
  const GroupPlacement g = place(c, 8, Placement::tensor_innermost);
  const double ar = best_collective(Collective::all_reduce, e * E * C * h, g.tensor, cm.network()).seconds;
  const double gemm = 312e12 * 0.65, ew = 2.039e12 * 0.8;
  const ChunkCosts one = cm.layer_costs(c, g, true), two = cm.layer_costs(split, g, true);
  CHECK(two.forward == Approx(one.forward - (whole.expert_flops - halves.expert_flops) / gemm -
                              (whole.elementwise_bytes - halves.elementwise_bytes) / ew + ar));

  // The memory model: the experts' parameters and their activations' expert-internal widths halve.
  for (std::size_t layer : {std::size_t(1), std::size_t(3)})
    CHECK(layer_expert_parameters(m, split, layer) == Approx(layer_expert_parameters(m, c, layer) / 2));
  CHECK(layer_expert_parameters(m, split, 0) == 0);
  const Precision prec = cm.precision();
  const MoeLayerBytes b1 = moe_layer_bytes(m, c, prec), b2 = moe_layer_bytes(m, split, prec);
  CHECK(b1.stored - b2.stored == Approx(e * E * C * 2 * h));            // pre-GeLU [E C, 4h] -> [E C, 2h]
  CHECK(b1.workspace - b2.workspace == Approx(e * 1 * C * 3 * 2 * h));  // ep C rows of 3 x 4h -> 3 x 2h
}

TEST_CASE("the search splits each expert over the tensor ranks where whole experts do not fit",
          "[plan][search][experts][etp]") {
  Problem p = crowded_problem();
  const CostModel cm(p.model, p.cluster);
  SearchSpace s;
  s.tp = 2, s.pp = 1, s.ep = 2, s.microbatch_size = 1;
  s.recompute = Recompute::none;
  s.zero1 = false, s.zero2 = false, s.zero3 = false;
  // A memory between the two layouts' needs: whole experts do not fit, experts split over tp = 2 do.
  ParallelConfig whole;
  whole.tp = 2, whole.dp = 4, whole.ep = 2, whole.microbatches = 64 / 4;
  ParallelConfig split = whole;
  split.etp = 2;
  ActivationPeaks peaks;
  const double need_whole = peak_memory(p.model, whole, cm.precision(), peaks(whole)).total(),
               need_split = peak_memory(p.model, split, cm.precision(), peaks(split)).total();
  REQUIRE(need_split < need_whole);
  p.cluster.memory_bytes = (need_split + need_whole) / 2 / 0.95;
  const Plan plan = search(p, CostModel(p.model, p.cluster), s);
  REQUIRE(!plan.best.empty());
  for (const Candidate& c : plan.best) {
    INFO(c.config);
    CHECK(c.config.etp == 2);
  }
  CHECK(plan.rejected_by_kind.count("memory"));
  // The plan file carries it, and train_gpt reads it back.
  const TrainingPlan tp = training_plan_of(plan.best.front(), p);
  CHECK(tp.etp == 2);
  CHECK(tp.to_json().find("\"etp\": 2") != std::string::npos);
  CHECK(TrainingPlan::from_json(tp.to_json()).etp == 2);
  // Fixed off, nothing fits; a dense model never gets it.
  SearchSpace off = s;
  off.expert_tensor_parallel = false;
  CHECK(search(p, CostModel(p.model, p.cluster), off).best.empty());
  Problem dense = p;
  dense.model.experts = 0;
  SearchSpace dense_space = s;
  dense_space.ep = 1;
  for (const Candidate& c : search(dense, CostModel(dense.model, dense.cluster), dense_space).best)
    CHECK(c.config.etp == 1);
  // A plan file with "etp" other than 1 or tp is refused.
  TrainingPlan bad = tp;
  bad.etp = 4;
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("\"etp\" 4 must be 1 or, with experts, \"tp\" 2"));
}
