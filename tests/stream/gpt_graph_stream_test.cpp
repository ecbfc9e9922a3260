// `GptTrainConfig::graph`: the GPT's training step captured once and replayed, over the stream-emulating
// backends' capture (backend/stream/stream_graph.hpp). A replay runs the operations the capture recorded with the
// arguments they were issued with, so a value the host chose at capture time (a learning rate, a micro-batch's
// ids, a staging slot) would repeat in every replay. Equal losses, gradient norms and parameters, bit for bit,
// against eager steps on HostBackend — while the learning rate and the batch change at every replayed step — show
// that everything a step needs reaches it through rank memory.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdio>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <mpar/backend/detail/graph_backend.hpp>
#include <mpar/backend/rank_transfer.hpp>
#include <mpar/backend/stream/stream_backend.hpp>
#include <mpar/comm/stream_ordered_communicator.hpp>
#include <mpar/comm/threads.hpp>
#include <mpar/models/gpt_trainer.hpp>
#include <mpar/observe/counting_backend.hpp>

#include "models/gpt_test_config.hpp"
#include "rank_world.hpp"

namespace {

/** What one rank's run of `graph_gpt_train` saw: the reports' numbers and every parameter after the steps. */
struct GraphGptRun {
  std::vector<double> losses, norms, lrs;
  std::vector<bool> replayed;
  std::vector<std::vector<float>> values;
  std::size_t operations = 0;  ///< of the captured step (0: none captured)
};

/** Trains `c` for `steps` steps on thread ranks over backend B (with a captured step if `c.graph`); every rank's run. */
template <class B>
std::vector<GraphGptRun> graph_gpt_train(const mpar::models::GptTrainConfig& c, int steps) {
  std::vector<GraphGptRun> out(c.world_size());
  mpar::run_threads(int(c.world_size()), [&](mpar::ThreadsCommunicator& w) {
    B::init_rank();
    mpar::testing::on_rank_world<B>(w, [&](auto& world) {
      mpar::models::GptTrainer<std::decay_t<decltype(world)>, B> t(world, c, mpar::testing::gpt_dataset());
      GraphGptRun& r = out[std::size_t(w.rank())];
      for (int i = 0; i < steps; ++i) {
        const mpar::models::StepReport rep = t.train_step();
        r.losses.push_back(rep.loss);
        r.norms.push_back(rep.grad_norm);
        r.lrs.push_back(rep.lr);
        r.replayed.push_back(rep.replayed);
      }
      r.operations = t.graph_operations();
      for (const mpar::nn::Parameter* p : t.parameters()) {
        std::vector<float> v(p->value.size());
        mpar::copy_to_host<B>(p->value.data(), v.data(), v.size());
        r.values.push_back(std::move(v));
      }
      B::synchronize();
    });
  });
  return out;
}

/** The GPT at `precision` on tp x dp ranks, captured after `warmup` eager steps. */
mpar::models::GptTrainConfig graph_gpt_config(const char* precision, std::size_t warmup, std::size_t tp = 1,
                                              std::size_t dp = 1) {
  auto c = mpar::testing::small_gpt(tp, 1, dp);
  c.warmup = 4;  // the learning rate climbs over steps 0-3 and decays from step 4: every capture here is in the climb
  c.precision = mpar::parallel::parse_precision(precision);
  c.graph = true;
  c.graph_warmup = warmup;
  return c;
}

}  // namespace

namespace {

/**
 * `c` (with `graph`) for `steps` steps over B against the same configuration trained eagerly on HostBackend: every
 * rank's losses, gradient norms, learning rates and parameters bit for bit; the steps from `c.graph_warmup` on
 * replayed. Returns the operations a rank's captured step holds.
 */
template <class B>
std::size_t check_graph_gpt_equals_host(const std::string& name, const mpar::models::GptTrainConfig& c, int steps) {
  auto eager_config = c;
  eager_config.graph = false;
  const auto want = graph_gpt_train<mpar::HostBackend>(eager_config, steps);
  const auto got = graph_gpt_train<B>(c, steps);
  REQUIRE(got.size() == want.size());
  for (std::size_t r = 0; r < want.size(); ++r) {
    INFO(name << " over " << B::name << ", rank " << r);
    std::vector<bool> replayed(std::size_t(steps), false);
    for (std::size_t s = c.graph_warmup; s < replayed.size(); ++s) replayed[s] = true;
    CHECK(got[r].replayed == replayed);
    CHECK(want[r].replayed == std::vector<bool>(std::size_t(steps), false));
    CHECK(got[r].losses == want[r].losses);
    CHECK(got[r].norms == want[r].norms);
    CHECK(got[r].lrs == want[r].lrs);
    REQUIRE(got[r].values.size() == want[r].values.size());
    for (std::size_t i = 0; i < want[r].values.size(); ++i) {
      INFO("parameter " << i);
      CHECK(got[r].values[i] == want[r].values[i]);
    }
    // What a frozen host value would repeat differs at every replay from the captured step's: the learning rate
    // (the capture falls in the warm-up, the replays climb to the peak and decay), and the batch (so the loss).
    const std::size_t captured = c.graph_warmup;
    for (std::size_t s = captured + 1; s < std::size_t(steps); ++s) {
      CHECK(want[r].lrs[s] != want[r].lrs[captured]);
      CHECK(want[r].losses[s] != want[r].losses[s - 1]);
    }
    CHECK(want[r].lrs.back() < want[r].lrs[c.warmup - 1]);  // the last replay is past the peak, decaying
    CHECK(got[r].operations > 0);
  }
  return got.front().operations;
}

}  // namespace

TEMPLATE_TEST_CASE("GptTrainConfig::graph: replays of the captured step equal eager HostBackend steps bit for bit",
                   "[stream][gpt][graph]", mpar::StreamHostBackend, mpar::DiscreteHostBackend) {
  for (const char* precision : {"fp32", "bf16"}) {
    // Steps 0, 1 eager; 2 captured and launched; 3 to 5 launches.
    const std::size_t ops = check_graph_gpt_equals_host<TestType>(precision, graph_gpt_config(precision, 2), 6);
    std::printf("graph step (one rank, %s, %s): %zu operations captured\n", precision, TestType::name, ops);
  }
}

TEST_CASE("GptTrainConfig::graph with graph_warmup 1: the capture right after one eager step", "[stream][gpt][graph]") {
  (void)check_graph_gpt_equals_host<mpar::StreamHostBackend>("warm-up 1", graph_gpt_config("fp32", 1), 6);
}

TEMPLATE_TEST_CASE(
    "GptTrainConfig::graph at tp2 (with and without sequence parallelism) and dp2: the captured collectives replay "
    "with the step, bit for bit against HostBackend",
    "[stream][gpt][graph][dp]", mpar::StreamHostBackend, mpar::DiscreteHostBackend) {
  // tp2: the layers' all-reduces and the loss's statistics over the tensor group; dp2: the gradient buckets'
  // all-reduces started during the backward (requests) and waited for by the optimizer. Each is issued to the
  // communication stream by every launch, after the operations before it, as the eager call is.
  for (const auto& [name, tp, dp] : {std::tuple<const char*, std::size_t, std::size_t>{"tp2", 2, 1}, {"dp2", 1, 2}}) {
    const std::size_t ops = check_graph_gpt_equals_host<TestType>(name, graph_gpt_config("fp32", 2, tp, dp), 6);
    std::printf("graph step (%s, fp32, %s): %zu operations captured\n", name, TestType::name, ops);
  }
  (void)check_graph_gpt_equals_host<TestType>("dp2 x tp2 bf16", graph_gpt_config("bf16", 1, 2, 2), 6);
  // Sequence parallelism: the tokens' all-gathers and reduce-scatters in every pass, and the layer norms' gradients
  // summed once per step (a packed all-reduce per block when its gradients become final) replay with the step.
  auto sp = graph_gpt_config("bf16", 2, 2, 1);
  sp.model.sequence_parallel = true;
  (void)check_graph_gpt_equals_host<TestType>("sp tp2 bf16", sp, 6);
}

namespace {

/** Per step: what the rank asked of CountingBackend<StreamHostBackend>, and the captured step's size. */
struct GraphGptCounts {
  std::vector<mpar::observe::BackendCounts> steps;
  std::size_t operations = 0;
};

/** The operations by kind, `adamw_advance` left out (the captured step's AdamW advances in rank memory). */
std::string graph_gpt_kinds_besides_advance(mpar::observe::BackendCounts c) {
  c.launches[std::size_t(mpar::observe::Op::adamw_advance)] = 0;
  return c.by_kind();
}

GraphGptCounts graph_gpt_counts(const mpar::models::GptTrainConfig& c, int steps) {
  using Counting = mpar::observe::CountingBackend<mpar::StreamHostBackend>;
  GraphGptCounts out;
  mpar::run_threads(1, [&](mpar::ThreadsCommunicator& w) {
    Counting::init_rank();
    mpar::StreamOrderedCommunicator<mpar::ThreadsCommunicator, Counting> world(w);
    mpar::models::GptTrainer<decltype(world), Counting> t(world, c, mpar::testing::gpt_dataset());
    for (int i = 0; i < steps; ++i) {
      const mpar::observe::BackendCounts before = Counting::counts();
      (void)t.train_step();
      out.steps.push_back(Counting::counts() - before);
    }
    out.operations = t.graph_operations();
    Counting::synchronize();
  });
  return out;
}

}  // namespace

TEST_CASE("GptTrainConfig::graph over CountingBackend: a replayed step is one launch and one host wait",
          "[stream][gpt][graph][counts]") {
  STATIC_REQUIRE(mpar::detail::graph_backend<mpar::observe::CountingBackend<mpar::StreamHostBackend>>);
  const auto c = graph_gpt_config("fp32", 2);
  const GraphGptCounts g = graph_gpt_counts(c, 5);
  auto eager_config = c;
  eager_config.graph = false;
  const GraphGptCounts e = graph_gpt_counts(eager_config, 5);
  const std::uint64_t inputs = std::uint64_t(c.local_batch() * c.model.seq) * 4;  // token ids, 4 bytes each
  for (std::size_t s = 0; s < g.steps.size(); ++s) {
    const auto& n = g.steps[s];
    INFO("step " << s << ": " << n.by_kind() << ", graph launches " << n.graph_launches);
    CHECK(n.synchronize_calls == 0);
    // The host writes the ids and the targets into pinned staging, and touches no other tensor memory.
    CHECK(n.host_bytes == 2 * inputs);
    if (s < 2) {  // warm-up: the step issued eagerly, the same operations as without the graph
      CHECK(n.graph_launches == 0);
      CHECK(graph_gpt_kinds_besides_advance(n) == graph_gpt_kinds_besides_advance(e.steps[s]));
      CHECK(n[mpar::observe::Op::adamw_advance] == 1);  // AdamW's count and learning rate in rank memory
      CHECK(e.steps[s][mpar::observe::Op::adamw_advance] == 0);
      // The statistics read; at the first step also AdamW's count carried into rank memory.
      CHECK(n.event_waits == (s == 0 ? 2 : 1));
    } else if (s == 2) {  // captured (its operations counted as issued, none run) and launched once
      CHECK(n.graph_launches == 1);
      CHECK(graph_gpt_kinds_besides_advance(n) == graph_gpt_kinds_besides_advance(e.steps[s]));
      CHECK(n.event_waits == 1);
      CHECK(g.operations >= n.total_launches());  // the graph also holds the copies and the collectives' waits
    } else {  // replayed: one launch, no operation issued one by one, the statistics read once
      CHECK(n.graph_launches == 1);
      CHECK(n.total_launches() == 0);
      CHECK(n.event_waits == 1);
      CHECK(n.host_syncs() == 1);
    }
  }
  // Without the graph nothing changed: one wait per step (the statistics), as gpt_stream_test's budget says.
  for (std::size_t s = 1; s < e.steps.size(); ++s) {
    CHECK(e.steps[s].host_syncs() == 1);
    CHECK(e.steps[s].graph_launches == 0);
  }
  std::printf("graph step: %zu operations in the graph; an eager step issues %llu backend operations\n", g.operations,
              static_cast<unsigned long long>(e.steps.back().total_launches()));
}

namespace {

/** Constructs a one-rank trainer of `c` over backend B (throws what the constructor throws). */
template <class B>
void graph_gpt_construct(const mpar::models::GptTrainConfig& c) {
  mpar::run_threads(1, [&](mpar::ThreadsCommunicator& w) {
    B::init_rank();
    mpar::testing::on_rank_world<B>(w, [&](auto& world) {
      mpar::models::GptTrainer<std::decay_t<decltype(world)>, B> t(world, c, mpar::testing::gpt_dataset());
    });
  });
}

}  // namespace

TEST_CASE("GptTrainConfig::graph: a layout whose step cannot be captured is refused at construction, naming the fix",
          "[stream][gpt][graph]") {
  using mpar::config_error;
  SECTION("a backend that cannot capture") {
    CHECK_THROWS_WITH(graph_gpt_construct<mpar::HostBackend>(graph_gpt_config("fp32", 1)),
                      Catch::Contains("--graph") && Catch::Contains("graph_backend") &&
                          Catch::Contains("host backend runs each operation as it is issued"));
  }
  SECTION("f16: the loss scale is a host decision") {
    CHECK_THROWS_WITH(graph_gpt_construct<mpar::StreamHostBackend>(graph_gpt_config("f16", 1)),
                      Catch::Contains("--graph with --precision f16") && Catch::Contains("use --precision bf16"));
  }
  SECTION("pipeline and context parallelism") {
    auto c = graph_gpt_config("fp32", 1);
    c.pp = 2;
    CHECK_THROWS_WITH(c.validate(2), Catch::Contains("--graph with --pp 2") && Catch::Contains("use --pp 1") &&
                                         Catch::Contains("drop --graph"));
    c.pp = 1;
    c.cp = 2;
    CHECK_THROWS_WITH(c.validate(2), Catch::Contains("--graph with --cp 2") && Catch::Contains("use --cp 1"));
  }
  SECTION("dropout: each step's masks are keyed by its number, a host value") {
    auto c = graph_gpt_config("fp32", 1);
    c.model.dropout = 0.1;
    CHECK_THROWS_WITH(c.validate(1), Catch::Contains("--graph with --dropout 0.1") &&
                                         Catch::Contains("use --dropout 0, or drop --graph"));
  }
  SECTION("SGD, ZeRO and MoE take host values") {
    auto sgd = graph_gpt_config("fp32", 1);
    sgd.optimizer = mpar::parallel::UpdateRule::sgd;
    CHECK_THROWS_WITH(sgd.validate(1),
                      Catch::Contains("--graph with --optimizer sgd") && Catch::Contains("use --optimizer adamw"));
    auto moe = graph_gpt_config("fp32", 1);
    moe.model.experts = 2;
    CHECK_THROWS_WITH(moe.validate(1), Catch::Contains("--graph with --experts 2"));
  }
  SECTION("no eager step before the capture") {
    CHECK_THROWS_WITH(graph_gpt_construct<mpar::StreamHostBackend>(graph_gpt_config("fp32", 0)),
                      Catch::Contains("--graph-warmup 0") && Catch::Contains("use --graph-warmup 1"));
  }
}
