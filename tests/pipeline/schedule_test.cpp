// Schedules, verifier, simulator, partitions and trace output: no communicator involved.
#include <catch2/catch.hpp>

#include <sstream>
#include <string>

#include "mpar/observe.hpp"
#include "mpar/pipeline.hpp"
#include "mpar/pipeline/simulator.hpp"
#include "mpar/pipeline/timeline_trace.hpp"

using namespace mpar::pipeline;
using Catch::Matchers::Contains;

namespace {
bool valid_for(std::string_view name, const ScheduleConfig& c) {
  if (name == Interleaved1F1B::name) return Interleaved1F1B::check(c).empty();
  if (name == PipeDream2BW::name) return PipeDream2BW::check(c).empty();
  return c.chunks == 1;
}
}  // namespace

TEST_CASE("every schedule verifies for P in {1,2,4,8}, M in 1..8, V in {1,2}", "[pipeline][verifier]") {
  int checked = 0;
  for (auto name : schedule_names)
    for (int P : {1, 2, 4, 8})
      for (int M = 1; M <= 8; ++M)
        for (int V : {1, 2}) {
          const ScheduleConfig c{P, M, V, name == PipeDream2BW::name ? 3 : 1};
          if (!valid_for(name, c)) continue;
          const Programs p = make_programs(name, c);
          const VerifyReport rep = verify(p);
          INFO(name << " P=" << P << " M=" << M << " V=" << V << ": " << rep.error);
          REQUIRE(rep.ok);
          // The ordered placement is deadlock-free with blocking sends too, at the same uniform-cost makespan.
          ScheduleConfig co = c;
          co.placement = CommPlacement::ordered;
          const Programs po = make_programs(name, co);
          const VerifyReport ro = verify(po, SendMode::rendezvous);
          INFO("ordered, rendezvous: " << ro.error);
          REQUIRE(ro.ok);
          // ... and with NCCL's grouped, in-order matching, what the executor runs over NCCL.
          const VerifyReport rg = verify(po, SendMode::grouped);
          INFO("ordered, grouped: " << rg.error);
          REQUIRE(rg.ok);
          CHECK(verify(po).ok);
          CHECK(simulate(po, CostModel::uniform(1, 1, 1)).makespan ==
                simulate(p, CostModel::uniform(1, 1, 1)).makespan);
          // Each (stage, micro-batch) runs F and B (and W when split) exactly once.
          std::size_t compute = 0;
          for (const auto& r : p.ranks)
            for (const auto& a : r)
              compute += (a.op == Op::forward || a.op == Op::backward || a.op == Op::backward_input ||
                          a.op == Op::backward_weight);
          CHECK(compute == std::size_t(c.total_stages() * c.total_microbatches() * (p.split_backward ? 3 : 2)));
          ++checked;
        }
  CHECK(checked > 150);
}

TEST_CASE("simulator reproduces the GPipe and 1F1B bubble (P-1)/(M+P-1) and their peak activations",
          "[pipeline][simulator]") {
  for (double b : {1.0, 2.0})
    for (int P : {1, 2, 4, 8})
      for (int M : {1, 2, 4, 8, 16, 32}) {
        const double F = 1.0, B = b, W = 1.0;
        for (auto name : {GPipe::name, OneFOneB::name}) {
          const SimResult r = simulate(make_programs(name, {P, M}), CostModel::uniform(F, B, W));
          INFO(name << " P=" << P << " M=" << M << " B=" << B);
          CHECK(r.bubble_time == Approx((P - 1) * (F + B + W)));
          CHECK(r.makespan == Approx((M + P - 1) * (F + B + W)));
          CHECK(r.bubble_ratio == Approx(double(P - 1) / (M + P - 1)));
          CHECK(r.peak_activations[0] == (name == GPipe::name ? M : std::min(M, P)));
        }
      }
  // The published example: p = 8, m = 32 -> 17.9 %.
  CHECK(simulate(make_programs<OneFOneB>({8, 32}), CostModel::uniform(1, 1, 1)).bubble_ratio == Approx(7.0 / 39));
}

TEST_CASE("interleaved 1F1B divides the bubble by V", "[pipeline][simulator]") {
  for (int P : {2, 4})
    for (int V : {2, 3, 4})
      for (int M : {P, 2 * P, 4 * P}) {
        // A chunk holds 1/V of a rank's layers, so it costs 1/V of the stage's F, B, W.
        const double F = 1.0, B = 1.0, W = 1.0;
        const SimResult r =
            simulate(make_programs<Interleaved1F1B>({P, M, V}), CostModel::uniform(F / V, B / V, W / V));
        INFO("P=" << P << " M=" << M << " V=" << V);
        CHECK(r.bubble_time == Approx((P - 1) * (F + B + W) / V));
        CHECK(r.bubble_ratio == Approx(double(P - 1) / V / (M + double(P - 1) / V)));
      }
}

TEST_CASE("ZB-H1 bubble is (P-1)(F+B-W), below 1F1B, at 1F1B's memory; ZB-H2 closes it", "[pipeline][simulator]") {
  for (int P : {2, 4, 8})
    for (int M : {P, 2 * P, 3 * P}) {
      const SimResult h1 = simulate(make_programs<ZBH1>({P, M}), CostModel::uniform(1, 1, 1));
      const SimResult f1 = simulate(make_programs<OneFOneB>({P, M}), CostModel::uniform(1, 1, 1));
      INFO("P=" << P << " M=" << M);
      CHECK(h1.bubble_time == Approx((P - 1) * (1.0 + 1.0 - 1.0)));
      CHECK(h1.bubble_time < f1.bubble_time);
      CHECK(h1.peak_activations[0] == P);
      if (M >= 2 * P - 1) {
        const SimResult h2 = simulate(make_programs<ZBH2>({P, M}), CostModel::uniform(1, 1, 1));
        // 2W >= F + B: zero bubble once consecutive steps overlap (each rank's own span is all work).
        CHECK(h2.steady_bubble_time == Approx(0.0));
        CHECK(h2.peak_activations[0] == 2 * P - 1);
      }
    }
}

TEST_CASE("ZB-H1 and ZB-H2 follow the paper's formulas for unequal F, B, W", "[pipeline][simulator]") {
  struct Costs {
    double f, b, w;
  };
  for (const Costs c : {Costs{1, 1, 0.5}, Costs{1, 2, 1}, Costs{2, 1, 1}, Costs{1, 1, 1}})
    for (int P : {2, 4, 8}) {
      const int M = 3 * P;
      INFO("F=" << c.f << " B=" << c.b << " W=" << c.w << " P=" << P);
      const SimResult h1 = simulate(make_programs<ZBH1>({P, M}), CostModel::uniform(c.f, c.b, c.w));
      CHECK(h1.bubble_time == Approx((P - 1) * (c.f + c.b - c.w)));
      const SimResult h2 = simulate(make_programs<ZBH2>({P, M}), CostModel::uniform(c.f, c.b, c.w));
      CHECK(h2.steady_bubble_time == Approx(std::max(0.0, (P - 1) * (c.f + c.b - 2 * c.w))));
    }
}

TEST_CASE("simulator scales to thousands of ranks in O(total actions)", "[pipeline][simulator]") {
  // CTest's timeout bounds the run time; the simulated numbers must be exact at this scale.
  const Programs p = make_programs<OneFOneB>({2048, 32});
  const SimResult r = simulate(p, CostModel::uniform(1, 2, 0.5, 0.0));
  CHECK(r.bubble_ratio == Approx(2047.0 / (32 + 2047)));
  // p2p latency adds (P-1) hops each way to the critical path.
  const SimResult lat = simulate(make_programs<OneFOneB>({4, 8}), CostModel::uniform(1, 1, 1, 0.5));
  CHECK(lat.makespan > simulate(make_programs<OneFOneB>({4, 8}), CostModel::uniform(1, 1, 1)).makespan);
}

namespace {
// Rank 0 waits for a gradient before it sends the activation that would produce it.
constexpr Programs deadlocking() {
  Programs p{"hand-made", {2, 1, 1, 1}, false, false, {}};
  p.ranks = {{{Op::forward, 0, 0, -1},
              {Op::recv_gradient, 0, 0, 1},
              {Op::send_activation, 0, 0, 1},
              {Op::backward, 0, 0, -1},
              {Op::optimizer_step, 0, 0, -1}},
             {{Op::recv_activation, 0, 0, 0},
              {Op::forward, 0, 0, -1},
              {Op::backward, 0, 0, -1},
              {Op::send_gradient, 0, 0, 0},
              {Op::optimizer_step, 0, 0, -1}}};
  return p;
}
}  // namespace

TEST_CASE("verifier rejects a deadlocking program, naming the ranks and the blocked actions", "[pipeline][verifier]") {
  static_assert(!verify(deadlocking()).ok, "the verifier runs at compile time too");
  const VerifyReport rep = verify(deadlocking());
  REQUIRE_FALSE(rep.ok);
  CHECK_THAT(rep.error, Contains("deadlock"));
  CHECK_THAT(rep.error, Contains("rank 0 action #1 recv_gradient(mb 0, chunk 0) from rank 1"));
  CHECK_THAT(rep.error, Contains("rank 1 action #0 recv_activation(mb 0, chunk 0) from rank 0"));
  CHECK_THROWS_WITH(verify_or_throw(deadlocking()), Contains("hand-made") && Contains("deadlock"));
  CHECK_THROWS_WITH(simulate(deadlocking(), CostModel::uniform(1, 1, 1)), Contains("deadlock"));
}

TEST_CASE("verifier catches broken dependencies, unmatched sends and crossed blocking sends", "[pipeline][verifier]") {
  Programs p = make_programs<OneFOneB>({2, 2});
  // Backward before its forward on rank 1.
  Programs bad = p;
  std::swap(bad.ranks[1][1], bad.ranks[1][2]);
  CHECK_THAT(verify(bad).error, Contains("rank 1") && Contains("needs its own forward first"));
  // A forward whose input never arrives: drop rank 1's first receive.
  bad = p;
  bad.ranks[1].erase(bad.ranks[1].begin());
  CHECK_THAT(verify(bad).error, Contains("needs the activation from rank 0"));
  // A second send of a message nobody receives again.
  bad = p;
  bad.ranks[1].push_back({Op::send_gradient, 1, 0, 0});
  CHECK_FALSE(verify(bad).ok);
  CHECK_THAT(verify(bad).error, Contains("rank 1") && Contains("already sent"));
  // Wrong peer.
  bad = p;
  bad.ranks[0][1].peer = 0;
  CHECK_THAT(verify(bad).error, Contains("lives on rank 1"));
  // With blocking (rendezvous) sends, the lazy placement of 1F1B crosses a send-activation with a
  // send-gradient and deadlocks; the ordered placement does not.
  const VerifyReport rv = verify(make_programs<OneFOneB>({2, 4}), SendMode::rendezvous);
  CHECK_THAT(rv.error, Contains("deadlock") && Contains("rank 0 action #3 send_activation(mb 1, chunk 0) to rank 1") &&
                           Contains("rank 1 action #3 send_gradient(mb 0, chunk 0) to rank 0"));
  CHECK(verify(make_programs<OneFOneB>({2, 4, 1, 1, CommPlacement::ordered}), SendMode::rendezvous).ok);
}

TEST_CASE("a send window: each rank's n-th send waits until its (n-w)-th was received", "[pipeline][verify]") {
  // In the lazy interleaved programs (P = 2) both ranks send twice before receiving the other's first message, so
  // with one send in flight each waits at its second send for a receive the other has not reached.
  const Programs inter = make_programs<Interleaved1F1B>({2, 4, 2});
  const VerifyReport one = verify(inter, SendMode::buffered, 1);
  CHECK_THAT(one.error, Contains("deadlock"));
  CHECK(verify(inter, SendMode::buffered, 2).ok);
  CHECK(verify(inter, SendMode::buffered, 0).ok);  // 0: unbounded
  for (auto name : {GPipe::name, OneFOneB::name, ZBH1::name, ZBH2::name})
    for (int P : {2, 4})
      for (int M : {P, 2 * P + 1}) {
        INFO(name << " P=" << P << " M=" << M);
        CHECK(verify(make_programs(name, {P, M}), SendMode::buffered, 1).ok);
      }
  // Rendezvous sends are window 0: crossed sends that pass with one in flight do not pass there.
  CHECK_FALSE(verify(make_programs<OneFOneB>({2, 4}), SendMode::rendezvous).ok);
  // The window is a property of buffered sends only; the other modes ignore it.
  CHECK(verify(make_programs<OneFOneB>({2, 4, 1, 1, CommPlacement::ordered}), SendMode::grouped, 1).ok);
}

TEST_CASE("invalid configurations get a sentence saying what to change", "[pipeline][config]") {
  CHECK_THROWS_WITH(make_programs<Interleaved1F1B>({4, 6, 2}), Contains("multiple of P") && Contains("use M = 8"));
  CHECK_THROWS_WITH(make_programs<OneFOneB>({4, 8, 2}), Contains("V = 1"));
  CHECK_THROWS_WITH(make_programs<PipeDream2BW>({4, 2, 1, 2}), Contains("at least P"));
  CHECK_THROWS_WITH(make_programs("nope", {2, 2}), Contains("unknown pipeline schedule") && Contains("zb_h1"));
  CHECK_THROWS_WITH(make_programs<GPipe>({0, 2}), Contains("at least 1"));
  // More stages than layers, and V·P > layers.
  CHECK_THROWS_WITH(Partition::even(3, 4), Contains("more stages") && Contains("than layers (3)"));
  CHECK_THROWS_WITH(Partition::even(6, 4 * 2), Contains("P·V"));
}

TEST_CASE("static schedules are built and verified by the compiler", "[pipeline][static]") {
  using S = StaticSchedule<OneFOneB, 4, 8>;
  static_assert(S::verified);
  static_assert(S::peak_activations[0] == 4 && S::peak_activations[3] == 1);
  static_assert(S::program[3][0].op == Op::recv_activation && S::program[3][0].peer == 2);
  static_assert(StaticSchedule<Interleaved1F1B, 2, 4, 2>::verified);
  static_assert(StaticSchedule<ZBH1, 4, 8>::peak_activations[0] == 4);
  static_assert(StaticSchedule<GPipe, 3, 5>::peak_activations[0] == 5);
  static_assert(StaticSchedule<PipeDream2BW, 2, 2, 1, 3>::verified);
  // Blocking-send safety, proven by the compiler.
  static_assert(verify(ZBH1::build({4, 8, 1, 1, CommPlacement::ordered}), SendMode::rendezvous).ok);
  static_assert(!verify(OneFOneB::build({4, 8}), SendMode::rendezvous).ok);
  const Programs p = S::programs();
  CHECK(verify(p).ok);
  CHECK(p.ranks[0].size() == S::lengths[0]);
  CHECK(p.ranks == make_programs<OneFOneB>({4, 8}).ranks);
}

TEST_CASE("partitions cover every layer exactly once", "[pipeline][partition]") {
  const Partition e = Partition::even(10, 4);
  CHECK(e.sizes() == std::vector<std::size_t>{3, 3, 2, 2});
  CHECK(e.begin(2) == 6);
  CHECK(e.end(3) == 10);
  CHECK(e.stage_of(5) == 1);
  CHECK(Partition(7, {1, 4, 2}).begin(2) == 5);
  CHECK_THROWS_WITH(Partition(7, {1, 4, 1}), Contains("cover 6 layers but the model has 7") && Contains("dropped"));
  CHECK_THROWS_WITH(Partition(7, {4, 4}), Contains("doubled"));
  CHECK_THROWS_WITH(Partition(7, {7, 0}), Contains("stage 1 has no layer"));
  // Balanced: a heavy last layer (an LM head, say) gets a stage nearly to itself.
  const Partition b = Partition::balanced({1, 1, 1, 1, 1, 1, 4}, 3);
  CHECK(b.sizes() == std::vector<std::size_t>{3, 3, 1});
  const Partition b2 = Partition::balanced({2, 1, 1, 1, 1, 2}, 2);
  CHECK(b2.sizes() == std::vector<std::size_t>{3, 3});
  using SP = StaticPartition<10, 4, 3, 3>;
  static_assert(SP::begin[2] == 7 && SP::stages == 3);
  CHECK(SP::runtime().end(2) == 10);
}

TEST_CASE("Chrome trace and text timeline show the simulated schedule", "[pipeline][observe]") {
  const SimResult r = simulate(make_programs<OneFOneB>({2, 3}), CostModel::uniform(1, 1, 1, 0.25));
  const std::string json = to_chrome_trace(r.timeline, 1e-3).str();
  CHECK_THAT(json, Contains(R"("ph":"X","name":"F0")"));
  CHECK_THAT(json, Contains(R"("name":"process_name","pid":1,"tid":0,"args":{"name":"pipeline rank 1"})"));
  CHECK_THAT(json, Contains(R"("name":"thread_name","pid":0,"tid":1,"args":{"name":"communication"})"));
  CHECK_THAT(json, Contains(R"("name":"F0","cat":"forward","pid":0,"tid":0,"ts":0.000,"dur":1000.000)"));
  const std::string text = r.text();
  std::istringstream is(text);
  std::string l0, l1;
  std::getline(is, l0);
  std::getline(is, l1);
  CHECK_THAT(l0, Contains("rank 0 |F0 F1 "));
  CHECK_THAT(l1, Contains("rank 1 |."));
  CHECK_THAT(l1, Contains("B0"));
}

namespace {
// GPipe on two ranks, M = 2, with all of a rank's messages in one run each.
constexpr Programs gpipe_batched(bool swap_receives) {
  Programs p{"hand-made", {2, 2, 1, 1}, false, false, {}};
  p.ranks = {{{Op::forward, 0, 0, -1},
              {Op::forward, 1, 0, -1},
              {Op::send_activation, 0, 0, 1},
              {Op::send_activation, 1, 0, 1},
              {Op::recv_gradient, 0, 0, 1},
              {Op::recv_gradient, 1, 0, 1},
              {Op::backward, 0, 0, -1},
              {Op::backward, 1, 0, -1},
              {Op::optimizer_step, 0, 0, -1}},
             {{Op::recv_activation, swap_receives ? 1 : 0, 0, 0},
              {Op::recv_activation, swap_receives ? 0 : 1, 0, 0},
              {Op::forward, 0, 0, -1},
              {Op::forward, 1, 0, -1},
              {Op::backward, 0, 0, -1},
              {Op::backward, 1, 0, -1},
              {Op::send_gradient, 0, 0, 0},
              {Op::send_gradient, 1, 0, 0},
              {Op::optimizer_step, 0, 0, -1}}};
  return p;
}
}  // namespace

TEST_CASE("grouped (NCCL) semantics: in-order matching and whole-group completion are checked",
          "[pipeline][verifier]") {
  static_assert(verify(gpipe_batched(false), SendMode::grouped).ok);
  // Tags make the order of two receives irrelevant; NCCL pairs messages in issue order.
  CHECK(verify(gpipe_batched(true)).ok);
  const VerifyReport swapped = verify(gpipe_batched(true), SendMode::grouped);
  CHECK_THAT(swapped.error, Contains("send #0 from rank 0 to rank 1 (the activation of micro-batch 0 for stage 1)") &&
                                Contains("received as the activation of micro-batch 1"));
  // A group completes only as a whole: the lazy placement of interleaved 1F1B puts a gradient send
  // and the next activation receive in one group on each rank, crossed with the peer's.
  const Programs lazy = make_programs<Interleaved1F1B>({2, 4, 2});
  CHECK(verify(lazy).ok);
  CHECK_THAT(verify(lazy, SendMode::grouped).error, Contains("deadlock") && Contains("rank 0") && Contains("rank 1"));
  CHECK(verify(make_programs<Interleaved1F1B>({2, 4, 2, 1, CommPlacement::ordered}), SendMode::grouped).ok);
}
