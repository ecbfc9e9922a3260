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
#include <type_traits>
#include <vector>

#include <mpar/backend/graph_backend.hpp>
#include <mpar/backend/stream/stream_backend.hpp>
#include <mpar/comm/stream_ordered.hpp>
#include <mpar/comm/threads.hpp>
#include <mpar/models/gpt_trainer.hpp>
#include <mpar/observe/counting_backend.hpp>
#include <mpar/optim/rank_scalars.hpp>

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

/** Trains `c` for `steps` steps on one thread rank over backend B (with a captured step if `c.graph`). */
template <class B>
GraphGptRun graph_gpt_train(const mpar::models::GptTrainConfig& c, int steps) {
  GraphGptRun r;
  mpar::run_threads(1, [&](mpar::ThreadsCommunicator& w) {
    B::init_rank();
    mpar::testing::on_rank_world<B>(w, [&](auto& world) {
      mpar::models::GptTrainer<std::decay_t<decltype(world)>, B> t(world, c, mpar::testing::gpt_dataset());
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
        mpar::optim::copy_to_host<B>(p->value.data(), v.data(), v.size());
        r.values.push_back(std::move(v));
      }
      B::synchronize();
    });
  });
  return r;
}

/** The one-rank GPT at `precision`, captured after `warmup` eager steps. */
mpar::models::GptTrainConfig graph_gpt_config(const char* precision, std::size_t warmup) {
  auto c = mpar::testing::small_gpt(1, 1, 1);
  c.precision = precision;
  c.graph = true;
  c.graph_warmup = warmup;
  return c;
}

}  // namespace

TEMPLATE_TEST_CASE("GptTrainConfig::graph: replays of the captured step equal eager HostBackend steps bit for bit",
                   "[stream][gpt][graph]", mpar::StreamHostBackend, mpar::DiscreteHostBackend) {
  constexpr int steps = 6;
  for (const char* precision : {"fp32", "bf16"}) {
    INFO(precision << " over " << TestType::name);
    const auto c = graph_gpt_config(precision, 2);  // steps 0, 1 eager; 2 captured and launched; 3 to 5 launches
    auto eager_config = c;
    eager_config.graph = false;
    const GraphGptRun want = graph_gpt_train<mpar::HostBackend>(eager_config, steps);
    const GraphGptRun got = graph_gpt_train<TestType>(c, steps);
    CHECK(got.replayed == std::vector<bool>{false, false, true, true, true, true});
    CHECK(want.replayed == std::vector<bool>(steps, false));
    CHECK(got.losses == want.losses);
    CHECK(got.norms == want.norms);
    REQUIRE(got.values.size() == want.values.size());
    for (std::size_t i = 0; i < want.values.size(); ++i) {
      INFO("parameter " << i);
      CHECK(got.values[i] == want.values[i]);
    }
    // What a frozen host value would repeat changes at every replayed step: the learning rate (warm-up, then
    // cosine decay), and with it the update; the batch, and with it the loss.
    for (int s = 3; s < steps; ++s) {
      CHECK(want.lrs[std::size_t(s)] != want.lrs[std::size_t(s) - 1]);
      CHECK(want.losses[std::size_t(s)] != want.losses[std::size_t(s) - 1]);
    }
    CHECK(got.lrs == want.lrs);
    CHECK(got.operations > 0);
    std::printf("graph step (%s, %s): %zu operations captured\n", precision, TestType::name, got.operations);
  }
}

TEST_CASE("GptTrainConfig::graph with graph_warmup 1: the capture right after one eager step", "[stream][gpt][graph]") {
  const auto c = graph_gpt_config("fp32", 1);
  auto eager_config = c;
  eager_config.graph = false;
  const GraphGptRun want = graph_gpt_train<mpar::HostBackend>(eager_config, 4);
  const GraphGptRun got = graph_gpt_train<mpar::StreamHostBackend>(c, 4);
  CHECK(got.replayed == std::vector<bool>{false, true, true, true});
  CHECK(got.losses == want.losses);
  CHECK(got.norms == want.norms);
  CHECK(got.values == want.values);
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
  STATIC_REQUIRE(mpar::graph_backend<mpar::observe::CountingBackend<mpar::StreamHostBackend>>);
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
  SECTION("more than one rank") {
    auto c = graph_gpt_config("fp32", 1);
    c.pp = 2;
    CHECK_THROWS_WITH(c.validate(2), Catch::Contains("--graph captures one rank's step") && Catch::Contains("--pp 2") &&
                                         Catch::Contains("drop --graph"));
    c.pp = 1;
    c.dp = 2;
    CHECK_THROWS_WITH(c.validate(2), Catch::Contains("--graph captures one rank's step"));
  }
  SECTION("SGD, ZeRO and MoE take host values") {
    auto sgd = graph_gpt_config("fp32", 1);
    sgd.optimizer = "sgd";
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
