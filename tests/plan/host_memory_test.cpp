// The memory model against the peak memory the GPT trainer really allocates on the host backend.
//
// This translation unit replaces the global allocation functions (observe/track_allocations.hpp),
// so every heap block a rank's thread allocates is counted; the trainer runs two steps per
// configuration and the largest per-step peak above the live bytes before the step is compared with
// the estimate's activations + communication buffers, the model states with what the trainer holds.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "mpar/comm/threads.hpp"
#include "mpar/models/gpt_trainer.hpp"
#include "mpar/observe/allocations.hpp"
#include "mpar/observe/track_allocations.hpp"
#include "mpar/plan.hpp"

namespace {

struct Measured {
  std::vector<double> step_peak, states;
  std::size_t padded_vocab = 0;
};

/** A small text with 60-odd distinct characters, so the test needs no file from the system. */
std::string training_text_path() {
  static const std::string path = [] {
    const auto p = std::filesystem::temp_directory_path() / "mpar_plan_host_memory.txt";
    std::ofstream f(p);
    const std::string words[] = {"pipeline ",   "tensor ",           "Data, ",  "parallel. ",
                                 "Memory; ",    "bubble ",           "ZeRO-1 ", "(recompute) ",
                                 "0123456789 ", "QUICK brown fox! ", "jumps? ", "over_lazy: dog\n"};
    for (int i = 0; i < 2000; ++i) f << words[(i * 7 + i / 3) % 12];
    return p.string();
  }();
  return path;
}

Measured run_trainer(const mpar::models::GptTrainConfig& base) {
  using namespace mpar;
  const std::size_t n = base.world_size();
  Measured m;
  m.step_peak.assign(n, 0);
  m.states.assign(n, 0);
  run_threads(int(n), [&](ThreadsCommunicator& world) {
    observe::AllocationCounter& mem = observe::rank_counter(std::size_t(world.rank()));
    observe::track_this_thread(&mem);
    {
      data::CharDataset ds(training_text_path(), base.model.seq);
      models::GptTrainConfig cfg = base;
      cfg.model.vocab = ds.vocab_size();
      models::GptTrainer<ThreadsCommunicator> tr(world, cfg, ds);
      // The steady state the model predicts: the first step also builds the host GEMM's per-shape
      // primitives (oneDNN allocates its JIT kernels then, through operator new), so it is not counted.
      std::int64_t peak = 0;
      while (tr.step() < cfg.steps) {
        const std::int64_t before = mem.live.load();
        mem.reset_peak();
        (void)tr.train_step();
        if (tr.step() > 1) peak = std::max(peak, mem.peak.load() - before);
      }
      const auto b = tr.memory();
      m.step_peak[std::size_t(world.rank())] = double(peak);
      m.states[std::size_t(world.rank())] = double(b.parameters + b.gradients + b.optimizer_states + b.compute_copies);
      if (world.rank() == 0) m.padded_vocab = cfg.model.padded_vocab();
    }
    observe::track_this_thread(nullptr);
  });
  return m;
}

}  // namespace

TEST_CASE("fp32 host memory estimate is within 10 % of the GPT trainer's measured peak",
          "[plan][memory][host][sweep]") {
  struct Case {
    std::size_t tp, pp;
    int microbatches;
    bool recompute;
    const char* schedule;
    std::size_t cp = 1;
    bool sequence_parallel = false;
    bool selective = false;  // every stage recomputes its attention probabilities (instead of `recompute`)
    std::vector<mpar::nn::Recompute> per_stage = {};  // each stage its own mode (instead of both above)
  };
  using mpar::nn::Recompute;
  // Few, small runs keep this under a few seconds; runs of more shapes by hand (GPipe, pp = 4,
  // recompute at pp = 4) agreed within 8 % as well (docs/planner.md).
  const Case cases[] = {
      {1, 1, 4, false, "1f1b"},
      {1, 2, 4, true, "1f1b"},
      {2, 2, 4, false, "1f1b"},
      {1, 2, 4, false, "zb_h1"},
      {1, 2, 4, false, "2bw"},  // 2bw: the previous weight version the trainer keeps
      {1, 1, 4, false, "1f1b", 2},
      {2, 2, 4, true, "1f1b", 2},  // context parallelism: ring attention
      {2, 1, 4, false, "1f1b"},
      {2, 1, 4, false, "1f1b", 1, true},  // sequence parallelism: tp = 2 without, with
      {2, 2, 4, false, "1f1b", 1, true},
      {2, 2, 4, true, "1f1b", 1, true},
      {1, 2, 4, false, "1f1b", 1, false, true},  // selective: the probabilities are 1/9 of a layer's activations
      // Recomputation per stage: the first rank (two micro-batches in flight) recomputing, as the planner mixes
      // it, and the other way round, where counting the first stage in the second's mode would miss by far.
      {1, 2, 4, false, "1f1b", 1, false, false, {Recompute::full, Recompute::none}},
      {1, 2, 4, false, "1f1b", 1, false, false, {Recompute::none, Recompute::full}}};
  std::vector<double> tp2_peaks;  // the step peaks of tp = 2 pp = 1 without and with sequence parallelism
  for (const Case& k : cases) {
    mpar::models::GptTrainConfig cfg;
    cfg.model.hidden = 128, cfg.model.heads = 4, cfg.model.layers = 4, cfg.model.seq = 64;
    cfg.tp = k.tp, cfg.pp = k.pp, cfg.dp = 1, cfg.cp = k.cp, cfg.microbatches = k.microbatches,
    cfg.global_batch = 4 * std::size_t(k.microbatches);
    cfg.recompute = k.recompute, cfg.schedule = mpar::pipeline::schedule_kind(k.schedule), cfg.steps = 3,
    cfg.warmup = 1;
    cfg.model.sequence_parallel = k.sequence_parallel;
    if (k.selective) cfg.recompute_stages.assign(k.pp, mpar::nn::Recompute::selective);
    if (!k.per_stage.empty()) cfg.recompute_stages = k.per_stage;
    const Measured got = run_trainer(cfg);

    using namespace mpar::plan;
    const GptModel model{cfg.model.layers, cfg.model.hidden, cfg.model.heads, cfg.model.seq, got.padded_vocab};
    ParallelConfig c;
    c.tp = k.tp, c.pp = k.pp, c.cp = k.cp, c.microbatch_size = 4, c.microbatches = std::size_t(k.microbatches);
    c.recompute = k.selective ? Recompute::selective : k.recompute ? Recompute::full : Recompute::none;
    if (!k.per_stage.empty())  // `recompute` names the most any stage recomputes, as the planner sets it
      c.recompute = std::max(k.per_stage[0], k.per_stage[1]), c.recompute_stages = k.per_stage;
    c.schedule = *parse_schedule(k.schedule);
    c.sequence_parallel = k.sequence_parallel;
    MemoryOptions o;
    o.attention_dropout = false;  // the trainer's default dropout is 0
    ActivationPeaks peaks;
    for (std::size_t r = 0; r < k.pp; ++r) {
      const MemoryEstimate e = rank_memory(model, c, Precision::fp32_host(8), r, peaks(c)[r], o);
      const double measured_step = got.step_peak[r * k.tp * k.cp],
                   measured_states = got.states[r * k.tp * k.cp];  // tensor and context rank 0 of stage r
      INFO("tp=" << k.tp << (k.sequence_parallel ? " sp" : "") << " cp=" << k.cp << " pp=" << k.pp
                 << " M=" << k.microbatches << " " << k.schedule << (k.recompute ? " recompute" : "")
                 << (k.selective ? " selective" : "")
                 << (k.per_stage.empty() ? "" : " recompute per stage " + c.recompute_layout()) << ", pipeline rank "
                 << r << ": step peak measured " << measured_step << " B, estimated " << e.activations + e.communication
                 << " B; model states measured " << measured_states << " B, estimated "
                 << e.parameters + e.gradients + e.optimizer << " B");
      // With cp > 1 the gradients reduce over the data x context group, in place (ranges of the gradient
      // arena): no bucket buffers on either side.
      CHECK(std::abs((e.activations + e.communication) / measured_step - 1) < 0.10);
      CHECK(std::abs((e.parameters + e.gradients + e.optimizer) / measured_states - 1) < 0.10);
      CHECK(std::abs(e.total() / (measured_step + measured_states) - 1) < 0.10);
    }
    if (k.tp == 2 && k.pp == 1 && k.cp == 1) tp2_peaks.push_back(got.step_peak[0]);
  }
  // Sequence parallelism's point: the layer norms' inputs and what the column-parallel layers keep are token
  // shards, so a tensor rank's activations shrink (the planner says by about as much).
  REQUIRE(tp2_peaks.size() == 2);
  CHECK(tp2_peaks[1] < 0.95 * tp2_peaks[0]);
}

TEST_CASE(
    "ZeRO-2 and ZeRO-3 model states and totals at dp = 2 are within 10 % of the estimate; the totals fall with each "
    "stage",
    "[plan][memory][host][zero3][sweep]") {
  // What train_gpt prints per rank: the model states held between steps plus the step's peak above them
  // (the same allocation tracking). ZeRO-3 holds 1/dp of the weights, gradients and AdamW states between steps
  // and gathers a unit (and the next, prefetched) around its use.
  // Eight layers: at dp = 2 ZeRO-3 saves N/2 of weights and spends two gathered layers during the passes, so
  // with four layers the two would nearly cancel (measured 22.60 against ZeRO-2's 22.63 MB).
  double measured_total[4] = {}, estimated_total[4] = {};
  for (int stage : {1, 2, 3}) {
    mpar::models::GptTrainConfig cfg;
    cfg.model.hidden = 128, cfg.model.heads = 4, cfg.model.layers = 8, cfg.model.seq = 64;
    cfg.dp = 2, cfg.microbatches = 2, cfg.global_batch = 16, cfg.zero = mpar::parallel::zero_stage_from_number(stage);
    cfg.steps = 3, cfg.warmup = 1;
    const Measured got = run_trainer(cfg);

    using namespace mpar::plan;
    const GptModel model{cfg.model.layers, cfg.model.hidden, cfg.model.heads, cfg.model.seq, got.padded_vocab};
    ParallelConfig c;
    c.dp = 2, c.microbatch_size = 4, c.microbatches = 2;
    c.zero = mpar::parallel::zero_stage_from_number(stage);
    MemoryOptions o;
    o.attention_dropout = false;
    o.dp_bucket_bytes = double(cfg.bucket_bytes);
    ActivationPeaks peaks;
    const MemoryEstimate e = rank_memory(model, c, Precision::fp32_host(8), 0, peaks(c)[0], o);
    measured_total[stage] = got.states[0] + got.step_peak[0];
    estimated_total[stage] = e.total();
    INFO("ZeRO-" << stage << ": model states measured " << got.states[0] << " B, estimated "
                 << e.parameters + e.gradients + e.optimizer << " B; step peak measured " << got.step_peak[0]
                 << " B, estimated " << e.activations + e.communication + e.accumulated_gradients << " B");
    // ZeRO-1 keeps every gradient (in the gradient arena; its buckets are ranges of it, reduced in place) and
    // its shard of the averaged gradient (1.5 N gradient floats); stages 2 and 3 only the shards.
    CHECK(std::abs((e.parameters + e.gradients + e.optimizer) / got.states[0] - 1) < 0.10);
    // The total, at ZeRO-2/3 with the full-size gradients the backward accumulates the micro-batches into.
    CHECK((e.accumulated_gradients > 0) == (stage >= 2));
    CHECK(std::abs(e.total() / measured_total[stage] - 1) < 0.10);
    CHECK(got.states[1] == got.states[0]);  // both data ranks hold the same share
  }
  INFO("measured totals " << measured_total[1] << ", " << measured_total[2] << ", " << measured_total[3]
                          << " B; estimated " << estimated_total[1] << ", " << estimated_total[2] << ", "
                          << estimated_total[3] << " B");
  CHECK(measured_total[3] < measured_total[2]);
  // ZeRO-2 frees the full gradients between steps, but the backward accumulates into them while the activations
  // peak, so at this size its peak total is about ZeRO-1's: a block's bucket starts its reduce-scatter as soon as
  // that block's weight gradients are made, so its buffers are in flight next to the activations the rest of the
  // backward still holds (measured 2.5 % above ZeRO-1); the model adds ZeRO-2's two bucket buffers in flight.
  CHECK(measured_total[2] <= 1.05 * measured_total[1]);
  CHECK(estimated_total[3] < estimated_total[2]);
  CHECK(std::abs(estimated_total[2] / estimated_total[1] - 1) < 0.05);
}

TEST_CASE("with experts: the memory estimate is within 10 % of the GPT trainer's measured peak",
          "[plan][memory][host][moe][sweep]") {
  struct Case {
    std::size_t pp, dp, ep;
    int zero;
    std::size_t tp = 1, etp = 1;
  };
  // 8 experts of width 4h (top-2) in blocks 1 and 3: at hidden 128 they are most of the parameters, so an estimate
  // without them is far off (checked last). Expert-parallel, pipelined, and ZeRO-1/2 over two groups (the
  // replicated parameters over dp x ep ranks, the experts over dp); at tp = 2 whole experts and experts split over
  // the tensor ranks (etp = 2).
  const Case cases[] = {{1, 1, 1, 0}, {1, 1, 2, 0},       {2, 1, 2, 0},      {1, 2, 2, 1},
                        {1, 1, 2, 2}, {1, 1, 2, 0, 2, 1}, {1, 1, 2, 0, 2, 2}};
  for (const Case& k : cases) {
    mpar::models::GptTrainConfig cfg;
    cfg.model.hidden = 128, cfg.model.heads = 4, cfg.model.layers = 4, cfg.model.seq = 64;
    cfg.model.experts = 8, cfg.model.moe_top_k = 2, cfg.model.moe_every = 2;
    cfg.model.expert_tp = k.etp;
    cfg.tp = k.tp, cfg.pp = k.pp, cfg.dp = k.dp, cfg.ep = k.ep,
    cfg.zero = mpar::parallel::zero_stage_from_number(k.zero), cfg.microbatches = 4;
    cfg.global_batch = 4 * 4 * k.dp * k.ep;  // micro-batches of 4 sequences on every rank
    cfg.steps = 3, cfg.warmup = 1;
    const Measured got = run_trainer(cfg);

    using namespace mpar::plan;
    GptModel model{cfg.model.layers, cfg.model.hidden, cfg.model.heads, cfg.model.seq, got.padded_vocab};
    model.experts = cfg.model.experts, model.moe_top_k = cfg.model.moe_top_k, model.moe_every = cfg.model.moe_every;
    model.moe_capacity = cfg.model.moe_capacity;
    ParallelConfig c;
    c.tp = k.tp, c.etp = k.etp, c.pp = k.pp, c.dp = k.dp * k.ep, c.ep = k.ep, c.microbatch_size = 4, c.microbatches = 4;
    c.zero = mpar::parallel::zero_stage_from_number(k.zero);
    MemoryOptions o;
    o.attention_dropout = false;
    o.dp_bucket_bytes = double(cfg.bucket_bytes);
    ActivationPeaks peaks;
    GptModel dense = model;
    dense.experts = 0;
    for (std::size_t r = 0; r < k.pp; ++r) {
      const MemoryEstimate e = rank_memory(model, c, Precision::fp32_host(8), r, peaks(c)[r], o);
      const std::size_t first = r * k.tp * k.dp * k.ep;  // tensor, data and expert rank 0 of stage r
      const double measured_step = got.step_peak[first], measured_states = got.states[first];
      // The step's peak above the states: activations, buffers and (ZeRO-2) the full gradients accumulated into.
      const double step = e.activations + e.communication + e.accumulated_gradients;
      INFO("tp=" << k.tp << " etp=" << k.etp << " pp=" << k.pp << " dp=" << k.dp << " ep=" << k.ep << " ZeRO-" << k.zero
                 << ", pipeline rank " << r << ": step peak measured " << measured_step << " B, estimated " << step
                 << " B; model states measured " << measured_states << " B, estimated "
                 << e.parameters + e.gradients + e.optimizer << " B");
      CHECK(std::abs(step / measured_step - 1) < 0.10);
      CHECK(std::abs((e.parameters + e.gradients + e.optimizer) / measured_states - 1) < 0.10);
      CHECK(std::abs(e.total() / (measured_step + measured_states) - 1) < 0.10);
      // The dense model's estimate misses the experts by far more than the tolerance.
      const MemoryEstimate without = rank_memory(dense, c, Precision::fp32_host(8), r, peaks(c)[r], o);
      CHECK(without.total() < 0.8 * (measured_step + measured_states));
    }
  }
}

TEST_CASE("with experts: the planner's parameter count is the GPT's, and the experts divide over ep",
          "[plan][memory][moe]") {
  mpar::models::GptConfig g;
  g.vocab = 64, g.hidden = 32, g.heads = 4, g.layers = 6, g.seq = 16;
  g.experts = 8, g.moe_top_k = 2, g.moe_every = 3;  // blocks 2 and 5
  mpar::plan::GptModel m{g.layers, g.hidden, g.heads, g.seq, g.padded_vocab()};
  m.experts = g.experts, m.moe_every = g.moe_every, m.moe_top_k = g.moe_top_k;
  CHECK(m.parameters() == double(g.parameter_count()));
  mpar::plan::ParallelConfig c;
  c.pp = 2, c.dp = 4, c.ep = 4;
  // Stage 0 holds blocks 0-2 (block 2 MoE), stage 1 blocks 3-5 (block 5): two of the eight experts each.
  for (std::size_t r = 0; r < 2; ++r) CHECK(mpar::plan::rank_expert_parameters(m, c, r) == 2 * m.expert_parameters());
  CHECK(c.expert_data_group() == 1);
  c.ep = 3;
  CHECK_THROWS_WITH(mpar::plan::rank_memory(m, c, mpar::plan::Precision::fp32_host(), 0, 1.0),
                    Catch::Contains("ep = 3 must divide dp = 4"));
}

TEST_CASE("Llama: the memory estimate is within 10 % of the GPT trainer's measured peak",
          "[plan][memory][host][llama][sweep]") {
  struct Case {
    std::size_t tp, pp;
    mpar::nn::Recompute recompute;
    bool sequence_parallel = false;
  };
  // Grouped-query attention (4 heads sharing 2 key/value heads) and a SwiGLU width of 344 (not 4h = 512): the KV
  // heads repeated into q, k, v, SiluGate's input and the untied head on the last rank are what the count adds.
  using mpar::nn::Recompute;
  const Case cases[] = {{1, 1, Recompute::none},
                        {2, 2, Recompute::none},
                        {1, 2, Recompute::full},
                        {1, 2, Recompute::selective},
                        {2, 1, Recompute::none, true}};
  for (const Case& k : cases) {
    mpar::models::GptTrainConfig cfg;
    cfg.model.family = mpar::models::ModelFamily::llama;
    cfg.model.hidden = 128, cfg.model.heads = 4, cfg.model.kv_heads = 2, cfg.model.ffn = 344, cfg.model.layers = 4,
    cfg.model.seq = 64;
    cfg.model.sequence_parallel = k.sequence_parallel;
    cfg.tp = k.tp, cfg.pp = k.pp, cfg.dp = 1, cfg.microbatches = 4, cfg.global_batch = 16;
    cfg.recompute_stages.assign(k.pp, k.recompute);
    cfg.steps = 3, cfg.warmup = 1;
    const Measured got = run_trainer(cfg);

    using namespace mpar::plan;
    GptModel model{cfg.model.layers, cfg.model.hidden, cfg.model.heads, cfg.model.seq, got.padded_vocab};
    model.family = ModelFamily::llama, model.kv_heads = cfg.model.kv_heads, model.ffn = cfg.model.ffn;
    ParallelConfig c;
    c.tp = k.tp, c.pp = k.pp, c.microbatch_size = 4, c.microbatches = 4, c.recompute = k.recompute;
    c.sequence_parallel = k.sequence_parallel;
    MemoryOptions o;
    o.attention_dropout = false;
    ActivationPeaks peaks;
    GptModel gpt2 = model;  // the same sizes counted as GPT-2's blocks
    gpt2.family = ModelFamily::gpt2, gpt2.kv_heads = 0, gpt2.ffn = 0;
    for (std::size_t r = 0; r < k.pp; ++r) {
      const MemoryEstimate e = rank_memory(model, c, Precision::fp32_host(8), r, peaks(c)[r], o);
      const double measured_step = got.step_peak[r * k.tp], measured_states = got.states[r * k.tp];
      INFO("llama tp=" << k.tp << (k.sequence_parallel ? " sp" : "") << " pp=" << k.pp << " recompute "
                       << recompute_name(k.recompute) << ", pipeline rank " << r << ": step peak measured "
                       << measured_step << " B, estimated " << e.activations + e.communication
                       << " B; model states measured " << measured_states << " B, estimated "
                       << e.parameters + e.gradients + e.optimizer << " B");
      CHECK(std::abs((e.activations + e.communication) / measured_step - 1) < 0.10);
      CHECK(std::abs((e.parameters + e.gradients + e.optimizer) / measured_states - 1) < 0.10);
      CHECK(std::abs(e.total() / (measured_step + measured_states) - 1) < 0.10);
      // Counted as GPT-2's blocks of the same sizes, the model states miss by more than the tolerance.
      const MemoryEstimate as_gpt2 = rank_memory(gpt2, c, Precision::fp32_host(8), r, peaks(c)[r], o);
      INFO("model states counted as GPT-2: " << as_gpt2.parameters + as_gpt2.gradients + as_gpt2.optimizer << " B");
      CHECK(std::abs((as_gpt2.parameters + as_gpt2.gradients + as_gpt2.optimizer) / measured_states - 1) > 0.05);
    }
  }
}

TEST_CASE("recomputation per block: the memory estimate is within 10 % of the GPT trainer's measured peak",
          "[plan][memory][host][recompute_blocks][sweep]") {
  using mpar::nn::Recompute;
  using enum mpar::nn::Recompute;
  // pp = 2, four blocks a stage, the first rank with two micro-batches in flight: each block keeps what its own
  // mode keeps (a full block its input, rebuilt alone), so counting the stage in any one mode misses by far.
  struct Case {
    std::size_t tp;
    std::vector<std::vector<Recompute>> blocks;
  };
  const Case cases[] = {{1, {{full, full, none, none}, {none, selective, selective, none}}},
                        {1, {{selective, full, selective, none}, {full, none, none, none}}},
                        {2, {{full, none, selective, none}, {none, none, full, full}}}};
  for (const Case& k : cases) {
    mpar::models::GptTrainConfig cfg;
    cfg.model.hidden = 128, cfg.model.heads = 4, cfg.model.layers = 8, cfg.model.seq = 64;
    cfg.tp = k.tp, cfg.pp = 2, cfg.dp = 1, cfg.microbatches = 4, cfg.global_batch = 16;
    cfg.steps = 3, cfg.warmup = 1;
    for (const auto& b : k.blocks) cfg.recompute_stages.push_back(*std::max_element(b.begin(), b.end()));
    cfg.recompute_blocks = k.blocks;
    const Measured got = run_trainer(cfg);

    using namespace mpar::plan;
    const GptModel model{cfg.model.layers, cfg.model.hidden, cfg.model.heads, cfg.model.seq, got.padded_vocab};
    ParallelConfig c;
    c.tp = k.tp, c.pp = 2, c.microbatch_size = 4, c.microbatches = 4;
    c.recompute_stages = cfg.recompute_stages;
    c.recompute = *std::max_element(c.recompute_stages.begin(), c.recompute_stages.end());
    c.recompute_blocks = k.blocks;
    MemoryOptions o;
    o.attention_dropout = false;  // the trainer's default dropout is 0
    ActivationPeaks peaks;
    for (std::size_t r = 0; r < 2; ++r) {
      const MemoryEstimate e = rank_memory(model, c, Precision::fp32_host(8), r, peaks(c)[r], o);
      const double measured_step = got.step_peak[r * k.tp];
      INFO("tp=" << k.tp << " recompute " << c.recompute_layout() << ", pipeline rank " << r << ": step peak measured "
                 << measured_step << " B, estimated " << e.activations + e.communication << " B");
      CHECK(std::abs((e.activations + e.communication) / measured_step - 1) < 0.10);
    }
  }
}
