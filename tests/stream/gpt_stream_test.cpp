// The GPT trained over the stream-emulating backend (backend/stream/): every operation runs later, on a
// worker thread per rank, and fresh rank memory is NaN. A host read of rank memory that is not ordered by
// an event wait sees a stale or NaN value (and ThreadSanitizer, in CI's tsan stage, reports the race), so
// equal losses and equal parameters, bit for bit, against HostBackend show that the training path reads
// rank memory only through the stream-ordered copies.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include <mpar/backend/rank_transfer.hpp>
#include <mpar/backend/stream/stream_backend.hpp>
#include <mpar/comm/stream_ordered_communicator.hpp>
#include <mpar/comm/threads.hpp>
#include <mpar/models/gpt_generate.hpp>
#include <mpar/models/gpt_trainer.hpp>
#include <mpar/observe/counting_backend.hpp>

#include "models/gpt_test_config.hpp"
#include "rank_world.hpp"

using namespace mpar;

namespace {

struct RankRun {
  std::vector<double> losses, norms, aux;
  std::vector<std::size_t> dropped;
  std::vector<std::string> names;
  std::vector<std::vector<float>> values;  // every parameter this rank holds, after the steps
};

/**
 * Trains `c` for `steps` steps on thread ranks over backend B, `window` steps per `train_steps` call (2bw: one
 * program without a flush); returns every rank's losses and parameters.
 */
template <class B>
std::vector<RankRun> train(const models::GptTrainConfig& c, int steps, int window = 1) {
  std::vector<RankRun> out(c.world_size());
  run_threads(int(c.world_size()), [&](ThreadsCommunicator& w) {
    B::init_rank();
    auto run = [&](auto& world) {
      models::GptTrainer<std::decay_t<decltype(world)>, B> t(world, c, testing::gpt_dataset());
      RankRun& r = out[std::size_t(w.rank())];
      while (t.step() < std::size_t(steps))
        for (const models::StepReport& rep : t.train_steps(std::min(std::size_t(window), steps - t.step()))) {
          r.losses.push_back(rep.loss);
          r.norms.push_back(rep.grad_norm);
          r.aux.push_back(rep.aux_loss);
          r.dropped.push_back(rep.dropped);
        }
      for (const nn::Parameter* p : t.parameters()) {
        r.names.push_back(p->name);
        std::vector<float> v(p->value.size());
        mpar::copy_to_host<B>(p->value.data(), v.data(), v.size());
        r.values.push_back(std::move(v));
      }
      B::synchronize();
    };
    testing::on_rank_world<B>(w, run);
  });
  return out;
}

/**
 * Bit-for-bit: the losses, the gradient norms and every parameter of every rank; returns HostBackend's run. `window`:
 * B's run takes that many steps per `train_steps` call, HostBackend's `want_window`.
 */
template <class B>
std::vector<RankRun> check_equal_to_host(const std::string& name, const models::GptTrainConfig& c, int steps = 3,
                                         int window = 1, int want_window = 1) {
  const auto want = train<HostBackend>(c, steps, want_window);
  const auto got = train<B>(c, steps, window);
  REQUIRE(got.size() == want.size());
  for (std::size_t r = 0; r < want.size(); ++r) {
    INFO(name << " over " << B::name << ", rank " << r);
    CHECK(got[r].losses == want[r].losses);
    CHECK(got[r].norms == want[r].norms);
    CHECK(got[r].aux == want[r].aux);
    CHECK(got[r].dropped == want[r].dropped);
    REQUIRE(got[r].names == want[r].names);
    for (std::size_t i = 0; i < want[r].values.size(); ++i) {
      INFO("parameter " << want[r].names[i]);
      CHECK(got[r].values[i] == want[r].values[i]);
    }
  }
  return want;
}

/**
 * Expert parallelism: MoE in every other block at ep2, 4 experts (two per rank), top-2 at the default
 * capacity factor 1.25, which drops assignments: the routing, the capacity-bounded all-to-all and the
 * load-balancing loss as backend operations and stream-ordered collectives.
 */
models::GptTrainConfig moe_ep2() {
  auto c = testing::small_gpt(1, 1, 1);
  c.ep = 2;
  c.model.experts = 4;
  c.model.moe_top_k = 2;
  c.model.moe_every = 2;
  return c;
}

}  // namespace

namespace {

/** Every layout the trainer takes over the stream backends, with a name. */
std::vector<std::pair<std::string, models::GptTrainConfig>> layouts() {
  std::vector<std::pair<std::string, models::GptTrainConfig>> out{{"1 rank", testing::small_gpt(1, 1, 1)},
                                                                  {"tp2", testing::small_gpt(2, 1, 1)},
                                                                  {"dp2", testing::small_gpt(1, 1, 2)},
                                                                  {"dp2 x tp2", testing::small_gpt(2, 1, 2)},
                                                                  {"pp2 1f1b", testing::small_gpt(1, 2, 1)},
                                                                  {"pp2 gpipe", testing::small_gpt(1, 2, 1, "gpipe")},
                                                                  {"pp2 zb_h1", testing::small_gpt(1, 2, 1, "zb_h1")},
                                                                  {"pp2 zb_h2", testing::small_gpt(1, 2, 1, "zb_h2")},
                                                                  {"tp2 x pp2", testing::small_gpt(2, 2, 1)}};
  auto il = testing::small_gpt(1, 2, 1, "interleaved_1f1b");
  il.chunks = 2;
  out.emplace_back("pp2 interleaved", il);
  auto rc = testing::small_gpt(1, 2, 1);
  rc.recompute = true;
  out.emplace_back("pp2 recompute", rc);
  auto z = testing::small_gpt(1, 1, 2);
  z.zero = parallel::ZeroStage::optimizer_states;
  out.emplace_back("ZeRO-1 dp2", z);
  for (int stage : {2, 3}) {
    auto zs = testing::small_gpt(1, 1, 2);
    zs.zero = parallel::zero_stage_from_number(stage);
    zs.bucket_bytes = 4096;  // several buckets: reduce-scatters in flight while the backward goes on
    out.emplace_back("ZeRO-" + std::to_string(stage) + " dp2", zs);
  }
  auto z3tp = testing::small_gpt(2, 1, 2);
  z3tp.zero = parallel::ZeroStage::parameters;
  out.emplace_back("ZeRO-3 dp2 x tp2", z3tp);
  auto z3pp = testing::small_gpt(1, 2, 2);  // the tied embedding gathered on the first stage for its broadcast
  z3pp.zero = parallel::ZeroStage::parameters;
  out.emplace_back("ZeRO-3 dp2 x pp2", z3pp);
  // 16 bits under ZeRO: stage 3 rounds each gathered unit on the stream (B::convert), stages 1 and 2 keep the
  // compute copies of the path without ZeRO. Several buckets, so the one update spans blocks of several.
  for (const auto& [stage, p] : {std::pair<int, const char*>{1, "bf16"}, {2, "f16"}, {3, "bf16"}, {3, "f16"}}) {
    auto zp = testing::small_gpt(1, 1, 2);
    zp.zero = parallel::zero_stage_from_number(stage);
    zp.precision = parallel::parse_precision(p);
    zp.bucket_bytes = 4096;
    out.emplace_back("ZeRO-" + std::to_string(stage) + " dp2 " + p, zp);
  }
  out.emplace_back("pp2 2bw", testing::small_gpt(1, 2, 1, "2bw"));
  // Context parallelism: ring attention's K/V and dK/dV hops are isend/irecv requests ordered on the rank's
  // stream, its per-block online softmax backend operations between the GEMMs (nn/ring_attention.hpp).
  auto cp2 = testing::small_gpt(1, 1, 1);
  cp2.cp = 2;
  out.emplace_back("cp2", cp2);
  auto cp2dp2 = testing::small_gpt(1, 1, 2);
  cp2dp2.cp = 2;
  out.emplace_back("cp2 x dp2", cp2dp2);
  // Sequence parallelism: the token shards' slices are backend copies, the gathers and reduce-scatters collectives
  // on the rank's stream, and a column projection's kept shard is all-gathered again in its backward.
  auto sp = testing::small_gpt(2, 2, 1);
  sp.model.sequence_parallel = true;
  out.emplace_back("sp tp2 x pp2", sp);
  // The Llama family: grouped-query attention's KV rearrangement and the rotary positions (uploaded into rank
  // memory once), RMSNorm and SwiGLU on the stream; under cp the ring carries the unrepeated KV heads.
  const auto llama = [](models::GptTrainConfig c) {
    c.model.family = models::ModelFamily::llama;
    c.model.kv_heads = 2;
    c.model.ffn = 64;
    return c;
  };
  out.emplace_back("llama tp2 x pp2", llama(testing::small_gpt(2, 2, 1)));
  auto llama_cp = llama(testing::small_gpt(2, 1, 1));
  llama_cp.cp = 2;
  out.emplace_back("llama cp2 x tp2", llama_cp);
  sp.precision = parallel::Precision::bf16;
  out.emplace_back("sp tp2 x pp2 bf16", sp);
  for (const char* p : {"bf16", "f16"}) {
    auto one = testing::small_gpt(1, 1, 1);
    one.precision = parallel::parse_precision(p);
    out.emplace_back(std::string(p), one);
    auto pp = testing::small_gpt(1, 2, 1);
    pp.precision = parallel::parse_precision(p);
    out.emplace_back(std::string(p) + " pp2", pp);
  }
  return out;
}

/** The configuration `layouts()` names `name`. */
models::GptTrainConfig layout(const std::string& name) {
  for (auto& [n, c] : layouts())
    if (n == name) return c;
  FAIL("no layout named " << name);
  return {};
}

/** `check_equal_to_host` at each named layout of `layouts()`. */
template <class B>
void check_equal_to_host(std::initializer_list<const char*> names, int steps = 3) {
  for (const char* name : names) check_equal_to_host<B>(name, layout(name), steps);
}

}  // namespace

TEST_CASE("GPT over StreamHostBackend: one rank equals HostBackend bit for bit", "[stream][gpt]") {
  check_equal_to_host<StreamHostBackend>({"1 rank"});
}

TEST_CASE("GPT over StreamHostBackend: tp2 equals HostBackend bit for bit", "[stream][gpt]") {
  check_equal_to_host<StreamHostBackend>({"tp2"});
}

TEST_CASE("GPT over StreamHostBackend: pp2 (1F1B, GPipe, recompute) and tp2 x pp2 equal HostBackend bit for bit",
          "[stream][gpt]") {
  check_equal_to_host<StreamHostBackend>({"pp2 1f1b", "pp2 gpipe", "tp2 x pp2", "pp2 recompute"});
}

TEST_CASE("GPT over StreamHostBackend: dp2 and ZeRO-1 dp2 equal HostBackend bit for bit", "[stream][gpt][dp]") {
  check_equal_to_host<StreamHostBackend>({"dp2", "ZeRO-1 dp2"});
}

TEST_CASE("GPT over DiscreteHostBackend: the host never touches rank memory, and the result equals HostBackend",
          "[stream][gpt][discrete]") {
  check_equal_to_host<DiscreteHostBackend>({"1 rank", "tp2", "pp2 1f1b", "pp2 gpipe", "tp2 x pp2", "pp2 recompute"});
}

TEST_CASE("GPT over DiscreteHostBackend: dp2 and ZeRO-1 dp2 equal HostBackend", "[stream][gpt][discrete][dp]") {
  check_equal_to_host<DiscreteHostBackend>({"dp2", "ZeRO-1 dp2"});
}

TEST_CASE(
    "GPT over StreamHostBackend and DiscreteHostBackend: context parallelism (ring attention) equals "
    "HostBackend bit for bit",
    "[stream][gpt][discrete][context]") {
  check_equal_to_host<StreamHostBackend>({"cp2", "cp2 x dp2"}, 2);
  check_equal_to_host<DiscreteHostBackend>({"cp2", "cp2 x dp2"}, 2);
}

TEST_CASE(
    "GPT over StreamHostBackend and DiscreteHostBackend: sequence parallelism equals HostBackend bit for bit, "
    "without the host touching rank memory",
    "[stream][gpt][discrete][sequence]") {
  check_equal_to_host<StreamHostBackend>({"sp tp2 x pp2", "sp tp2 x pp2 bf16"}, 2);
  check_equal_to_host<DiscreteHostBackend>({"sp tp2 x pp2", "sp tp2 x pp2 bf16"}, 2);
}

TEST_CASE(
    "GPT over StreamHostBackend and DiscreteHostBackend: the Llama family (tp2 x pp2, cp2 x tp2) equals HostBackend "
    "bit for bit",
    "[stream][gpt][discrete][llama]") {
  check_equal_to_host<StreamHostBackend>({"llama tp2 x pp2", "llama cp2 x tp2"}, 2);
  check_equal_to_host<DiscreteHostBackend>({"llama tp2 x pp2", "llama cp2 x tp2"}, 2);
}

TEST_CASE("GPT over StreamHostBackend: interleaved and zero-bubble schedules equal HostBackend bit for bit",
          "[stream][gpt][schedules]") {
  check_equal_to_host<StreamHostBackend>({"pp2 interleaved", "pp2 zb_h1", "pp2 zb_h2"}, 2);
}

TEST_CASE("GPT over StreamHostBackend: ZeRO-2, ZeRO-3 and 2bw equal HostBackend bit for bit",
          "[stream][gpt][zero][2bw]") {
  // 2bw: the second weight version is copied on the rank's stream after the update; ZeRO-3: each unit's
  // gathered weights are copied out of the all-gather's buffer on the stream, after the all-gather.
  check_equal_to_host<StreamHostBackend>({"ZeRO-2 dp2", "ZeRO-3 dp2", "ZeRO-3 dp2 x tp2", "pp2 2bw"}, 2);
}

TEST_CASE(
    "2bw without a flush: steps run as one program equal flushed steps bit for bit, over HostBackend, "
    "StreamHostBackend and DiscreteHostBackend",
    "[stream][gpt][discrete][2bw]") {
  // The older version is copied on the rank's stream before each update inside the program and swapped in for the
  // micro-batches that still need it; nothing is read or written by the host.
  const auto c = testing::small_gpt(1, 2, 1, "2bw");
  check_equal_to_host<HostBackend>("pp2 2bw, 4 steps per program against 1", c, 4, 4, 1);
  check_equal_to_host<StreamHostBackend>("pp2 2bw, 4 steps per program", c, 4, 4, 4);
  check_equal_to_host<DiscreteHostBackend>("pp2 2bw, 2 + 2 steps per program", c, 4, 2, 4);
  // bf16: each version's compute copies too; the first program's last version is rounded again at the second's start.
  auto bf16 = c;
  bf16.precision = parallel::Precision::bf16;
  check_equal_to_host<HostBackend>("bf16 pp2 2bw, 2 + 2 steps per program against 1", bf16, 4, 2, 1);
  check_equal_to_host<StreamHostBackend>("bf16 pp2 2bw, 4 steps per program", bf16, 4, 4, 4);
  check_equal_to_host<DiscreteHostBackend>("bf16 pp2 2bw, 2 + 2 steps per program", bf16, 4, 2, 2);
}

TEST_CASE("GPT over DiscreteHostBackend: ZeRO-2, ZeRO-3 and 2bw never touch rank memory from the host",
          "[stream][gpt][discrete][zero][2bw]") {
  check_equal_to_host<DiscreteHostBackend>({"ZeRO-2 dp2", "ZeRO-3 dp2", "ZeRO-3 dp2 x tp2", "pp2 2bw"}, 2);
}

TEST_CASE("GPT over StreamHostBackend: ZeRO under bf16 and f16, and ZeRO-3 with pp2, equal HostBackend bit for bit",
          "[stream][gpt][zero][precision]") {
  check_equal_to_host<StreamHostBackend>(
      {"ZeRO-1 dp2 bf16", "ZeRO-2 dp2 f16", "ZeRO-3 dp2 bf16", "ZeRO-3 dp2 f16", "ZeRO-3 dp2 x pp2"}, 2);
}

TEST_CASE(
    "GPT over DiscreteHostBackend: ZeRO-3 under bf16 and f16 and with pp2 never touches rank memory from the host",
    "[stream][gpt][discrete][zero][precision]") {
  check_equal_to_host<DiscreteHostBackend>({"ZeRO-3 dp2 bf16", "ZeRO-3 dp2 f16", "ZeRO-3 dp2 x pp2"}, 2);
}

TEST_CASE("GPT over StreamHostBackend: bf16, f16 and dp2 x tp2 equal HostBackend bit for bit",
          "[stream][gpt][precision]") {
  check_equal_to_host<StreamHostBackend>({"bf16", "f16", "dp2 x tp2"}, 2);
}

TEST_CASE("GPT over DiscreteHostBackend: interleaved, zero-bubble, bf16 and f16 never touch rank memory from the host",
          "[stream][gpt][discrete][schedules][precision]") {
  check_equal_to_host<DiscreteHostBackend>({"pp2 interleaved", "pp2 zb_h2", "bf16", "f16 pp2"}, 2);
}

namespace {

/** What every rank asked of backend B (counted) in the third step: the first two build caches and staging. */
template <class B>
std::vector<observe::BackendCounts> step_counts(const models::GptTrainConfig& c) {
  std::vector<observe::BackendCounts> out(c.world_size());
  run_threads(int(c.world_size()), [&](ThreadsCommunicator& w) {
    B::init_rank();
    StreamOrderedCommunicator<ThreadsCommunicator, B> world(w);
    models::GptTrainer<StreamOrderedCommunicator<ThreadsCommunicator, B>, B> t(world, c, testing::gpt_dataset());
    (void)t.train_step();
    (void)t.train_step();
    const observe::BackendCounts a = B::counts();
    (void)t.train_step();
    out[std::size_t(w.rank())] = B::counts() - a;
    B::synchronize();
  });
  return out;
}

}  // namespace

TEST_CASE("GPT over CountingBackend<StreamHostBackend>: at most two host waits per training step at every layout",
          "[stream][gpt][counts]") {
  using Counting = observe::CountingBackend<StreamHostBackend>;
  STATIC_REQUIRE(!observe::operations_block_host<Counting>);
  for (const auto& [name, c] : layouts()) {
    // Per step: the statistics (every micro-batch's loss accumulated in rank memory, aux loss, norm, found-inf)
    // read once by the optimizer; with more than one rank, the step report's host measurements (times, dropped
    // tokens) reduced over the world and read once more. Nothing waits per micro-batch or per message:
    // operations never block (operations_block_host is false), pipeline headers are checked after the
    // statistics wait has passed their copies.
    const std::uint64_t expected = c.world_size() > 1 ? 2 : 1;
    const auto counts = step_counts<Counting>(c);
    for (std::size_t r = 0; r < counts.size(); ++r) {
      INFO(name << ", rank " << r << ": " << counts[r].by_kind());
      CHECK(counts[r].total_launches() > 0);
      CHECK(counts[r].host_syncs() == counts[r].synchronize_calls + counts[r].event_waits);
      CHECK(counts[r].host_syncs() <= 2);
      CHECK(counts[r].host_syncs() == expected);
      CHECK(counts[r].synchronize_calls == 0);
      const bool last_stage = r >= counts.size() - counts.size() / c.pp;  // pipeline is the outermost axis
      const bool first_stage = r < counts.size() / c.pp;
      CHECK(counts[r][observe::Op::accumulate] == (last_stage ? std::uint64_t(c.microbatches) : 0));
      // One optimizer launch per step, with and without ZeRO: the rank's parameters (or its ZeRO shard of every
      // bucket) lie contiguously with their gradients and moments.
      CHECK(counts[r][observe::Op::adamw_update] == 1);
      // The host touches no rank memory (DiscreteHostBackend above faults on any access); the bytes the host
      // reads are the step's inputs only, uploaded by stream-ordered copies: the first stage's token ids (once
      // more when recomputation reruns its forward) and the last stage's targets, 4 bytes per token (a context
      // rank holds seq / cp tokens of each sequence).
      const std::uint64_t inputs = std::uint64_t(c.microbatches) * c.microbatch_size() * c.model.seq / c.cp * 4;
      CHECK(counts[r].host_bytes == (first_stage ? inputs * (c.recompute ? 2 : 1) : 0) + (last_stage ? inputs : 0));
      // Ring attention: one online-softmax update per score block (per sequence, 2 cp - 1 full blocks and 2
      // diagonal ones, docs/context-parallel.md) and one backward per block; one finish and one delta per block
      // layer and micro-batch. No other layout issues them.
      const std::uint64_t ring_layers = c.cp > 1 ? std::uint64_t(c.model.layers / c.pp) * c.microbatches : 0;
      const std::uint64_t score_blocks = ring_layers * c.microbatch_size() * (2 * c.cp + 1);
      CHECK(counts[r][observe::Op::online_softmax_update] == score_blocks);
      CHECK(counts[r][observe::Op::online_softmax_backward] == score_blocks);
      CHECK(counts[r][observe::Op::online_softmax_finish] == ring_layers);
      CHECK(counts[r][observe::Op::online_softmax_delta] == ring_layers);
      // Strided copies, one launch each whatever the rows: ring attention packs the K/V columns of its QKV in
      // the forward and again in the backward and puts dK/dV into dQKV's columns once per layer and micro-batch
      // (not one copy per token row); under cp the first stage takes its two chunks' rows of the position table
      // in one (Llama has no table: its positions are rotary). (No layout here recomputes under cp, which would pack
      // again.)
      const std::uint64_t position_tables =
          c.cp > 1 && first_stage && !c.model.is_llama() ? std::uint64_t(c.microbatches) : 0;
      CHECK(counts[r][observe::Op::copy_2d] == 3 * ring_layers + position_tables);
      std::printf("%-16s rank %zu: host syncs %llu, launches %llu, host bytes %llu\n", name.c_str(), r,
                  (unsigned long long)counts[r].host_syncs(), (unsigned long long)counts[r].total_launches(),
                  (unsigned long long)counts[r].host_bytes);
    }
  }
}

TEST_CASE("GPT with MoE at ep2 over CountingBackend<StreamHostBackend>: two host waits per training step",
          "[stream][gpt][counts][moe]") {
  using Counting = observe::CountingBackend<StreamHostBackend>;
  using observe::Op;
  const auto c = moe_ep2();
  const std::uint64_t m = std::uint64_t(c.microbatches), moe_blocks = c.model.layers / c.model.moe_every;
  const auto counts = step_counts<Counting>(c);
  for (std::size_t r = 0; r < counts.size(); ++r) {
    INFO("moe ep2, rank " << r << ": " << counts[r].by_kind());
    // The same two waits as a dense step with two ranks: the routing, the all-to-all sizes (static: capacity x
    // experts), the load-balancing loss and the dropped count never cross to the host on their own.
    CHECK(counts[r].host_syncs() == 2);
    CHECK(counts[r].event_waits == 2);
    CHECK(counts[r].synchronize_calls == 0);
    // Per MoE block and micro-batch: one routing decision, its statistics, loss and slots, one dispatch gather,
    // the combine and its backward, the gate gradient; the backward adds the load-balancing loss and the dropped
    // count into the step's statistics (accumulate), besides the micro-batch's loss.
    for (Op op : {Op::moe_route, Op::moe_gate_stats, Op::moe_aux_loss, Op::moe_slots, Op::moe_gate_backward,
                  Op::gather_rows, Op::scatter_add_rows_backward})
      CHECK(counts[r][op] == m * moe_blocks);
    CHECK(counts[r][Op::scatter_add_rows] == 2 * m * moe_blocks);
    CHECK(counts[r][Op::accumulate] == m + 2 * m * moe_blocks);
    // Each local expert's rows from every source in one strided copy and back, in the forward and the backward.
    const std::uint64_t local_experts = c.model.experts / std::uint64_t(c.ep);
    CHECK(counts[r][Op::copy_2d] == 4 * local_experts * m * moe_blocks);
    // The host reads only the step's inputs (token ids and targets, stream-ordered copies).
    const std::uint64_t inputs = m * c.microbatch_size() * c.model.seq * 4;
    CHECK(counts[r].host_bytes == 2 * inputs);
  }
}

TEST_CASE("GPT with MoE at ep2 over StreamHostBackend and DiscreteHostBackend equals HostBackend bit for bit",
          "[stream][gpt][moe]") {
  const auto want = check_equal_to_host<StreamHostBackend>("moe ep2", moe_ep2(), 2);
  for (const RankRun& r : want) {
    CHECK(r.aux.back() > 0.0);    // the load-balancing loss is part of what is compared
    CHECK(r.dropped.back() > 0);  // and the capacity dropped assignments
  }
  check_equal_to_host<DiscreteHostBackend>("moe ep2", moe_ep2(), 2);
}

namespace {

/** Greedy and sampled ids from a freshly initialised whole model on `tp` thread ranks over backend B (rank 0's). */
template <class B>
std::vector<std::int32_t> generated_ids(std::size_t tp) {
  auto cfg = testing::small_gpt(tp, 1, 1).model;
  cfg.layers = 2;
  cfg.vocab_multiple = 16;
  const std::vector<std::int32_t> prompt{3, 1, 4, 1, 5, 9, 2, 6};
  std::vector<std::int32_t> out;
  run_threads(int(tp), [&](ThreadsCommunicator& w) {
    B::init_rank();
    auto run = [&](auto& world) {
      models::GptPipelinePart<std::decay_t<decltype(world)>, B> stage(world, cfg, true, true, 0, cfg.layers);
      auto ids = models::generate(stage, prompt, 12, {0.0, 0, 1});
      const auto sampled = models::generate(stage, prompt, 12, {0.8, 10, 7});
      ids.insert(ids.end(), sampled.begin(), sampled.end());
      B::synchronize();
      if (w.rank() == 0) out = ids;
    };
    if constexpr (std::is_same_v<B, HostBackend>)
      testing::on_rank_world<B>(w, run);
    else
      testing::on_rank_memory_world<B>(w, run);  // no host twin: as over NCCL
  });
  return out;
}

}  // namespace

TEST_CASE("generate over DiscreteHostBackend: the host never touches rank memory, and the ids equal HostBackend's",
          "[stream][gpt][discrete][generate]") {
  const auto want = generated_ids<HostBackend>(1);
  REQUIRE(want.size() == 24);
  CHECK(generated_ids<DiscreteHostBackend>(1) == want);
  CHECK(generated_ids<StreamHostBackend>(1) == want);
  CHECK(generated_ids<HostBackend>(2) == want);
  CHECK(generated_ids<DiscreteHostBackend>(2) == want);
}

TEST_CASE(
    "GPT over StreamHostBackend and DiscreteHostBackend: drawn plans (uneven stages, per-stage recomputation) "
    "equal HostBackend bit for bit",
    "[stream][gpt][discrete][plans]") {
  // Four of the plans tests/models trains against the single rank (seed 46), each over both stream backends.
  const auto plans = testing::drawn_plans(24, 46);
  for (std::size_t i : {0, 5, 10, 15}) {
    check_equal_to_host<StreamHostBackend>(plans[i].first, plans[i].second, 2);
    check_equal_to_host<DiscreteHostBackend>(plans[i].first, plans[i].second, 2);
  }
}

TEST_CASE(
    "GPT over CountingBackend<StreamHostBackend>: each stage runs the blocks and the recomputation its plan gives "
    "it",
    "[stream][gpt][counts][plans]") {
  using Counting = observe::CountingBackend<StreamHostBackend>;
  constexpr nn::Recompute none = nn::Recompute::none, full = nn::Recompute::full;
  const auto with = [](std::vector<std::size_t> layers, std::vector<nn::Recompute> recompute) {
    auto c = testing::small_gpt(1, 2, 1);
    c.stage_layers = std::move(layers);
    c.recompute_stages = std::move(recompute);
    return step_counts<Counting>(c);
  };
  // Stage 0 recomputes, stage 1 does not: each rank issues what the same stage issues when every stage, or none,
  // recomputes; and recomputation adds GEMMs (the forward again), so the comparison can tell them apart.
  const auto mixed = with({1, 3}, {full, none}), all = with({1, 3}, {full, full}), kept = with({1, 3}, {none, none});
  CHECK(mixed[0].gemms() == all[0].gemms());
  CHECK(mixed[1].gemms() == kept[1].gemms());
  CHECK(all[0].gemms() > kept[0].gemms());
  CHECK(all[1].gemms() > kept[1].gemms());
  // The blocks follow the partition: 1 + 3 against 3 + 1 moves two blocks' GEMMs from the last rank to the first.
  const auto swapped = with({3, 1}, {none, none});
  CHECK(swapped[0].gemms() > kept[0].gemms());
  CHECK(swapped[1].gemms() < kept[1].gemms());
  CHECK(swapped[0].gemms() + swapped[1].gemms() == kept[0].gemms() + kept[1].gemms());
  // Selective recomputation on stage 0 repeats its attention scores' product in backward: more GEMMs than keeping
  // everything, fewer than rerunning the stage's forward; stage 1 is untouched.
  const auto selective = with({1, 3}, {nn::Recompute::selective, none});
  CHECK(selective[0].gemms() > kept[0].gemms());
  CHECK(selective[0].gemms() < all[0].gemms());
  CHECK(selective[1].gemms() == kept[1].gemms());
}
