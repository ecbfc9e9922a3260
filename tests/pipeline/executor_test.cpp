// The executor on the threads communicator: every synchronous schedule reproduces the single-rank
// loss and gradients; recomputation; 2BW's weight versions; the p2p header check; TP=2 x PP=2.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "mpar/comm/mesh_comms.hpp"
#include "mpar/comm/ordered_p2p_communicator.hpp"
#include "mpar/comm/threads.hpp"
#include "mpar/nn.hpp"
#include "mpar/pipeline.hpp"
#include "mpar/pipeline/run_pipeline_threads.hpp"
#include "mpar/pipeline/simulator.hpp"
#include "mpar/pipeline/summarise_measured.hpp"
#include "pipeline/tanh_linear_stage.hpp"

using namespace mpar;
using namespace mpar::pipeline;
using mpar_test::TanhStack;
using nn::Activation;
/** A replicated micro-batch activation: what the test stages take and return. */
using X = nn::Act<Replicate>;
using Catch::Matchers::Contains;

namespace {

constexpr std::size_t width = 8, tokens = 3;

Activation data(int mb, std::uint64_t stream) {
  Activation a({tokens, width});
  const CounterRng rng{42, stream};
  for (std::size_t i = 0; i < a.size(); ++i) a.data()[i] = float(2 * rng.uniform(std::uint64_t(mb) * 1000 + i) - 1);
  return a;
}

/** A stage without in_features(). */
struct NoWidth {
  TanhStack inner{width, 0, 1};
  using default_input = Replicate;
  template <class>
  using output_layout = Replicate;
  X forward(const X& x, int mb) { return inner.forward(x, mb); }
  X backward(const X& dy, int mb) { return inner.backward(dy, mb); }
  std::vector<nn::Parameter*> parameters() { return inner.parameters(); }
};

struct Result {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads, values;
};

/** The single-rank model over the whole batch at once: `layers` TanhLinear layers, MSE mean over the batch. */
Result reference(std::size_t layers, int M) {
  TanhStack model(width, 0, layers);
  Activation x({tokens * std::size_t(M), width}), t({tokens * std::size_t(M), width});
  for (int mb = 0; mb < M; ++mb) {
    const Activation xm = data(mb, 1), tm = data(mb, 2);
    std::copy(xm.values().begin(), xm.values().end(), x.values().begin() + std::ptrdiff_t(xm.size()) * mb);
    std::copy(tm.values().begin(), tm.values().end(), t.values().begin() + std::ptrdiff_t(tm.size()) * mb);
  }
  Activation y = model.forward(X(x), 0).tensor(), dy(y.shape());
  Result r;
  r.loss = mpar_test::mse(y, t, dy);
  (void)model.backward(X(dy), 0);
  for (auto* p : model.parameters()) r.grads[p->name].assign(p->grad.begin(), p->grad.end());
  return r;
}

/** NCCL's point-to-point semantics (in-order matching, groups, rendezvous) over the threads communicator. */
using NcclLike = OrderedP2pCommunicator<ThreadsCommunicator>;

/**
 * Runs one step of `name` on P threads with V chunks of `lps` layers each, over the threads
 * communicator or, with `Wrap = NcclLike`, over NCCL's point-to-point semantics.
 */
template <class Wrap = ThreadsCommunicator>
Result pipelined(std::string_view name, int P, int M, int V, std::size_t lps, bool recompute = false,
                 CommPlacement placement = CommPlacement::lazy, ExecutorOptions opt = {}) {
  const Programs prog = make_programs(name, {P, M, V, 1, placement});
  Result out;
  std::mutex mu;
  run_threads(P, [&](ThreadsCommunicator& world) {
    Wrap comm(world);
    const int r = comm.rank();
    std::vector<TanhStack> chunks;
    for (int c = 0; c < V; ++c) chunks.emplace_back(width, std::size_t(global_stage(prog.config, r, c)) * lps, lps);
    std::vector<TanhStack*> ptrs;
    for (auto& c : chunks) ptrs.push_back(&c);
    ExecutorOptions o = opt;  // each rank its own copy (the ranks are threads)
    o.recompute.assign(std::size_t(V), recompute);
    if (o.microbatch_tokens == 0) o.microbatch_tokens = tokens;
    Executor<TanhStack, Wrap> ex(comm, prog, ptrs, o);
    std::vector<X> inputs;
    std::vector<Activation> targets;
    for (int mb = 0; mb < M; ++mb) inputs.emplace_back(data(mb, 1)), targets.push_back(data(mb, 2));
    const StepStats st =
        ex.step(inputs, [&](const X& y, int mb, X& dy) { return mpar_test::mse(y, targets[std::size_t(mb)], dy); });
    std::lock_guard l(mu);
    out.loss = st.loss;
    for (auto* p : ex.parameters()) out.grads[p->name].assign(p->grad.begin(), p->grad.end());
  });
  return out;
}

void compare(const Result& got, const Result& want) {
  CHECK(got.loss == Approx(want.loss).epsilon(1e-5));
  REQUIRE(got.grads.size() == want.grads.size());
  for (const auto& [name, g] : want.grads) {
    const auto& h = got.grads.at(name);
    REQUIRE(h.size() == g.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      INFO(name << "[" << i << "]");
      CHECK(h[i] == Approx(g[i]).margin(2e-6).epsilon(1e-4));
    }
  }
}

}  // namespace

TEST_CASE("every synchronous schedule reproduces the single-rank loss and gradients", "[pipeline][executor]") {
  for (auto name : {GPipe::name, OneFOneB::name, ZBH1::name, ZBH2::name})
    for (int P : {1, 2, 4})
      for (int M = 1; M <= 8; ++M) {
        INFO(name << " P=" << P << " M=" << M);
        compare(pipelined(name, P, M, 1, 1), reference(std::size_t(P), M));
      }
  for (int P : {1, 2, 4})
    for (int M = P; M <= 8; M += P) {
      INFO("interleaved P=" << P << " M=" << M << " V=2");
      compare(pipelined(Interleaved1F1B::name, P, M, 2, 1), reference(std::size_t(2 * P), M));
    }
}

TEST_CASE("programs with the blocking-safe (ordered) placement run to the same result", "[pipeline][executor]") {
  for (auto name : {GPipe::name, OneFOneB::name, ZBH1::name, ZBH2::name}) {
    INFO(name);
    compare(pipelined(name, 4, 6, 1, 1, false, CommPlacement::ordered), reference(4, 6));
  }
  compare(pipelined(Interleaved1F1B::name, 2, 4, 2, 1, false, CommPlacement::ordered), reference(4, 4));
}

TEST_CASE(
    "over NCCL's point-to-point semantics (grouped, in order, rendezvous) every schedule reproduces the single-rank "
    "result",
    "[pipeline][executor][nccl-semantics]") {
  // A receive is posted with its size before the message arrives: tokens from the options, the
  // width from the stage's in_features().
  const ExecutorOptions shape;
  for (auto name : {GPipe::name, OneFOneB::name, ZBH1::name, ZBH2::name})
    for (int P : {2, 4})
      for (int M : {1, 3, 8}) {
        INFO(name << " P=" << P << " M=" << M);
        compare(pipelined<NcclLike>(name, P, M, 1, 1, false, CommPlacement::ordered, shape),
                reference(std::size_t(P), M));
      }
  compare(pipelined<NcclLike>(Interleaved1F1B::name, 2, 4, 2, 1, false, CommPlacement::ordered, shape),
          reference(4, 4));
  compare(pipelined<NcclLike>(Interleaved1F1B::name, 4, 8, 2, 1, true, CommPlacement::ordered, shape), reference(8, 8));
  // The grouped mode on a tag-matching communicator runs the same messages, just later.
  ExecutorOptions forced = shape;
  forced.p2p = PointToPoint::grouped;
  compare(pipelined(OneFOneB::name, 4, 6, 1, 1, false, CommPlacement::ordered, forced), reference(4, 6));
}

TEST_CASE("over in-order point-to-point, programs that would stall and unknown boundary shapes are refused up front",
          "[pipeline][executor][nccl-semantics]") {
  const ExecutorOptions shape;
  // Lazy interleaved programs complete with tags but deadlock with NCCL's groups: the verifier says so before any message.
  CHECK_THROWS_WITH(pipelined<NcclLike>(Interleaved1F1B::name, 2, 4, 2, 1, false, CommPlacement::lazy, shape),
                    Contains("cannot run with grouped, in-order point-to-point") && Contains("deadlock") &&
                        Contains("CommPlacement::ordered"));
  ExecutorOptions posted = shape;
  posted.p2p = PointToPoint::posted;
  CHECK_THROWS_WITH(pipelined<NcclLike>(OneFOneB::name, 2, 4, 1, 1, false, CommPlacement::ordered, posted),
                    Contains("in issue order without tags") && Contains("PointToPoint::grouped"));
  // A boundary shape other than the posted receive's is named on the receiving rank (tag matching
  // lets the header arrive alone, so the check comes before the payload).
  ExecutorOptions wrong = shape;
  wrong.microbatch_tokens = tokens + 1;
  wrong.p2p = PointToPoint::grouped;
  CHECK_THROWS_WITH(pipelined(GPipe::name, 2, 2, 1, 1, false, CommPlacement::ordered, wrong),
                    Contains("rank 1") && Contains("shape 3x8") && Contains("expects 4x8"));
  // A stage without in_features() needs the width in the options.
  CHECK_THROWS_WITH(run_threads(2,
                                [&](ThreadsCommunicator& world) {
                                  NcclLike comm(world);
                                  NoWidth stage;
                                  ExecutorOptions o;
                                  o.microbatch_tokens = tokens;
                                  Executor<NoWidth, NcclLike> ex(comm, make_programs<OneFOneB>({2, 2}), {&stage}, o);
                                }),
                    Contains("boundary_cols"));
}

TEST_CASE("activation recomputation gives the same gradients", "[pipeline][executor]") {
  compare(pipelined(OneFOneB::name, 2, 4, 1, 2, true), reference(4, 4));
  compare(pipelined(ZBH1::name, 4, 4, 1, 1, true), reference(4, 4));
}

namespace {
/**
 * A TanhStack that counts its forwards and tracks the micro-batches whose activations it holds (a
 * forward keeps them; drop, or the backward's weight half, frees them).
 */
class CountingStack : public TanhStack {
 public:
  using TanhStack::TanhStack;
  X forward(const X& x, int mb) {
    ++forwards;
    held.insert(mb);
    peak_held = std::max(peak_held, held.size());
    return TanhStack::forward(x, mb);
  }
  void drop(int mb) {
    held.erase(mb);
    TanhStack::drop(mb);
  }
  void backward_weight(int mb) {
    TanhStack::backward_weight(mb);
    held.erase(mb);
  }
  X backward(const X& dy, int mb) {
    X g = backward_input(dy, mb);
    backward_weight(mb);
    return g;
  }
  std::size_t forwards = 0, peak_held = 0;
  std::set<int> held;
};
}  // namespace

TEST_CASE("activation recomputation reruns each forward once and holds one micro-batch's activations at a time",
          "[pipeline][executor][recompute]") {
  // 1F1B, P = 2, M = 4: without recomputation stage 0 holds two micro-batches (F0 F1 B0 ...); with it every
  // forward's activations are dropped at once and rebuilt by a second forward just before its backward.
  constexpr int P = 2, M = 4;
  for (bool recompute : {false, true}) {
    INFO("recompute " << recompute);
    std::mutex mu;
    std::vector<std::size_t> forwards(P), peak(P), left(P);
    Result out;
    run_threads(P, [&](ThreadsCommunicator& comm) {
      const int r = comm.rank();
      CountingStack stage(width, std::size_t(r) * 2, 2);
      ExecutorOptions o;
      o.recompute = {recompute};
      o.microbatch_tokens = tokens;
      Executor<CountingStack, ThreadsCommunicator> ex(comm, make_programs(OneFOneB::name, {P, M, 1, 1}), {&stage}, o);
      std::vector<X> inputs;
      std::vector<Activation> targets;
      for (int mb = 0; mb < M; ++mb) inputs.emplace_back(data(mb, 1)), targets.push_back(data(mb, 2));
      const StepStats st =
          ex.step(inputs, [&](const X& y, int mb, X& dy) { return mpar_test::mse(y, targets[std::size_t(mb)], dy); });
      std::lock_guard l(mu);
      forwards[std::size_t(r)] = stage.forwards;
      peak[std::size_t(r)] = stage.peak_held;
      left[std::size_t(r)] = stage.held.size();
      out.loss = st.loss;
      for (auto* p : ex.parameters()) out.grads[p->name].assign(p->grad.begin(), p->grad.end());
    });
    compare(out, reference(4, M));
    for (int r = 0; r < P; ++r) {
      INFO("stage " << r);
      CHECK(forwards[std::size_t(r)] == std::size_t(recompute ? 2 * M : M));
      CHECK(left[std::size_t(r)] == 0);
    }
    CHECK(peak[0] == (recompute ? 1u : 2u));  // stage 0 runs F0 F1 before B0
    if (recompute) CHECK(peak[1] == 1u);
  }
}

namespace {

/** Every parameter value of `s`, in `parameters()` order. */
std::vector<float> weights_of(TanhStack& s) {
  std::vector<float> all;
  for (auto* p : s.parameters()) all.insert(all.end(), p->value.begin(), p->value.end());
  return all;
}
void load_weights(TanhStack& s, const std::vector<float>& all) {
  std::size_t k = 0;
  for (auto* p : s.parameters())
    for (auto& v : p->value) v = all[k++];
}
/** Every parameter gradient of `s`, which is zeroed. */
std::vector<float> take_grads(TanhStack& s) {
  std::vector<float> all;
  for (auto* p : s.parameters()) all.insert(all.end(), p->grad.begin(), p->grad.end()), p->zero_grad();
  return all;
}

/** w[stage][v]: the weights of two one-layer stages at version v (v = 0 before the first update). */
using WeightHistory = std::array<std::vector<std::vector<float>>, 2>;

/**
 * The reference for 2BW on P = 2 one-layer stages, by hand on one rank: `batches` batches of `M` micro-batches,
 * micro-batch `mb` computing on stage s with the weight version `version(s, mb)`, SGD with `lr`, each batch's
 * update applied to the newest version: W(b+1) = W(b) - lr g.
 */
template <class Version>
WeightHistory replay_2bw(int batches, int M, float lr, Version version) {
  TanhStack s0(width, 0, 1), s1(width, 1, 1);
  WeightHistory w;
  w[0].push_back(weights_of(s0));
  w[1].push_back(weights_of(s1));
  for (int b = 0; b < batches; ++b) {
    std::vector<float> g0(w[0][0].size(), 0.0f), g1(w[1][0].size(), 0.0f);
    for (int mb = b * M; mb < b * M + M; ++mb) {
      load_weights(s0, w[0][std::size_t(version(0, mb))]);
      load_weights(s1, w[1][std::size_t(version(1, mb))]);
      Activation y = s1.forward(s0.forward(X(data(mb, 1)), 0), 0).tensor(), dy(y.shape());
      (void)mpar_test::mse(y, data(mb, 2), dy);
      for (auto& x : dy.values()) x /= float(M);
      (void)s0.backward(s1.backward(X(dy), 0), 0);
      const auto a = take_grads(s0), c = take_grads(s1);
      for (std::size_t i = 0; i < a.size(); ++i) g0[i] += a[i];
      for (std::size_t i = 0; i < c.size(); ++i) g1[i] += c[i];
    }
    auto n0 = w[0].back(), n1 = w[1].back();
    for (std::size_t i = 0; i < n0.size(); ++i) n0[i] -= lr * g0[i];
    for (std::size_t i = 0; i < n1.size(); ++i) n1[i] -= lr * g1[i];
    w[0].push_back(std::move(n0));
    w[1].push_back(std::move(n1));
  }
  return w;
}

/** What the executor leaves on each of two one-layer stages after running `prog` over `microbatches` with SGD. */
struct Run2bw {
  std::vector<float> weights[2];
  int versions[2] = {0, 0};
};
Run2bw run_2bw(const Programs& prog, int microbatches, float lr, const ExecutorOptions& o = {}) {
  Run2bw out;
  std::mutex mu;
  run_threads(2, [&](ThreadsCommunicator& comm) {
    const int r = comm.rank();
    TanhStack stage(width, std::size_t(r), 1);
    Executor<TanhStack, ThreadsCommunicator> ex(comm, prog, {&stage}, o);
    std::vector<X> inputs;
    std::vector<Activation> targets;
    for (int mb = 0; mb < microbatches; ++mb) inputs.emplace_back(data(mb, 1)), targets.push_back(data(mb, 2));
    (void)ex.step(
        inputs, [&](const X& y, int mb, X& dy) { return mpar_test::mse(y, targets[std::size_t(mb)], dy); },
        [&](const std::vector<nn::Parameter*>& ps) {
          for (auto* p : ps)
            for (std::size_t i = 0; i < p->value.size(); ++i) p->value[i] -= lr * p->grad[i];
        });
    std::lock_guard l(mu);
    out.weights[r] = weights_of(stage);
    out.versions[r] = ex.weight_version();
  });
  return out;
}

/** The largest difference between the weights a run ended with and version `v` of a reference. */
double distance(const Run2bw& run, const WeightHistory& w, int v) {
  double d = 0;
  for (int s = 0; s < 2; ++s)
    for (std::size_t i = 0; i < run.weights[s].size(); ++i)
      d = std::max(d, double(std::abs(run.weights[s][i] - w[std::size_t(s)][std::size_t(v)][i])));
  return d;
}

/** Checks a run's weights element by element against version `v` of a reference. */
void check_weights(const Run2bw& run, const WeightHistory& w, int v, const std::string& what) {
  for (int s = 0; s < 2; ++s)
    for (std::size_t i = 0; i < run.weights[s].size(); ++i) {
      INFO(what << "stage " << s << " element " << i);
      CHECK(run.weights[s][i] == Approx(w[std::size_t(s)][std::size_t(v)][i]).margin(1e-6).epsilon(1e-5));
    }
}

}  // namespace

TEST_CASE("PipeDream-2BW with per-batch versions: no flush, every batch on one version on all stages",
          "[pipeline][executor][2bw]") {
  // P = 2 (one layer per stage), M = 2, three batches in one program, SGD with lr 0.5. With
  // WeightVersions::per_batch batch b runs on W(max(b-1, 0)) on both stages and each update applies to the
  // newest version: W(b+1) = W(b) - lr g(W(b-1)). The reference replays that by hand on one rank, batch by
  // batch with a flush; the executor runs 1F1B over all six micro-batches without one.
  const float lr = 0.5f;
  const int M = 2, batches = 3, P = 2;
  const auto want = replay_2bw(batches, M, lr, [&](int, int mb) { return std::max(mb / M - 1, 0); });
  const auto synchronous = replay_2bw(batches, M, lr, [&](int, int mb) { return mb / M; });

  const Programs prog = make_programs<PipeDream2BW>({P, M, 1, batches});
  REQUIRE(verify(prog).ok);
  for (bool recompute : {false, true}) {
    ExecutorOptions o;
    o.versions = WeightVersions::per_batch;
    o.recompute = {recompute};
    const Run2bw run = run_2bw(prog, batches * M, lr, o);
    check_weights(run, want, batches, recompute ? "recompute, " : "");
    CHECK(distance(run, synchronous, batches) > 1e-3);  // the lag matters: the synchronous replay ends far from it
  }
  // The bubble as a count (a forward one slot, a backward two): 1F1B's flush costs 3 (P - 1) idle slots per rank
  // every step; the flush-free program pays its fill and drain once, 3 (P - 1) per rank over all three batches.
  CHECK(idle_slots(make_programs<OneFOneB>({P, M, 1, 1})) == 3 * (P - 1) * P);
  CHECK(idle_slots(prog) == Approx(3.0 * (P - 1) * P / batches));
}

TEST_CASE("PipeDream-2BW: each backward uses its forward's weights; updates apply one step late",
          "[pipeline][executor][2bw]") {
  // P = 2 (one layer per stage), M = 2, two batches, SGD with lr 0.5. From the 1F1B order without flush:
  //   rank 0: F0 F1 B0 F2 B1 [step 0] F3 B2 B3 [step 1]   rank 1: F0 B0 F1 B1 [step 0] F2 B2 F3 B3 [step 1]
  // so micro-batch 2 runs stage 0 with version 0 and stage 1 with version 1; all else is as written below.
  const float lr = 0.5f;
  const int M = 2;
  // By hand: version[stage][mb] is the weight version each micro-batch's forward (and backward) uses.
  using Versions = int[2][4];
  const Versions version = {{0, 0, 0, 1}, {0, 0, 1, 1}};
  auto replay = [&](const Versions& ver) { return replay_2bw(2, M, lr, [&](int s, int mb) { return ver[s][mb]; }); };
  const auto w = replay(version);
  // What the executor would hold with a wrong version rule: micro-batch 2 on stage 0 with the newest
  // weights (no stashing), or on stage 1 with the stale ones (the update applied too late).
  const Versions newest = {{0, 0, 1, 1}, {0, 0, 1, 1}}, stale = {{0, 0, 0, 1}, {0, 0, 0, 1}};
  const auto w_newest = replay(newest), w_stale = replay(stale);

  const Run2bw run = run_2bw(make_programs<PipeDream2BW>({2, M, 1, 2}), 2 * M, lr);
  CHECK(run.versions[0] == 2);
  CHECK(run.versions[1] == 2);
  check_weights(run, w, 2, "");
  // The version rule matters: each wrong rule ends more than 100 times the tolerance away from the
  // weights the executor produced.
  CHECK(distance(run, w_newest, 2) > 1e-3);
  CHECK(distance(run, w_stale, 2) > 1e-3);
}

TEST_CASE("a shape mismatch at a stage boundary is an error naming ranks, micro-batch and shapes",
          "[pipeline][executor]") {
  CHECK_THROWS_WITH(
      run_threads(2,
                  [&](ThreadsCommunicator& comm) {
                    // Stage 1 is built for 6 input features; stage 0 sends 8.
                    TanhStack stage(comm.rank() == 0 ? width : 6, 0, 1);
                    Executor<TanhStack, ThreadsCommunicator> ex(comm, make_programs<GPipe>({2, 2}), {&stage});
                    std::vector<X> in{X(data(0, 1)), X(data(1, 1))};
                    (void)ex.step(in, [](const X&, int, X&) { return 0.0; });
                  }),
      Contains("rank 1 (stage 1) received from rank 0 the activation of micro-batch 0 with shape 3x8 f32 but "
               "expects *x6"));
}

TEST_CASE("measured step statistics add up", "[pipeline][executor]") {
  std::vector<StepStats> all(2);
  run_threads(2, [&](ThreadsCommunicator& comm) {
    TanhStack stage(width, std::size_t(comm.rank()), 1);
    Executor<TanhStack, ThreadsCommunicator> ex(comm, make_programs<OneFOneB>({2, 4}), {&stage});
    std::vector<X> in;
    std::vector<Activation> tg;
    for (int mb = 0; mb < 4; ++mb) in.emplace_back(data(mb, 1)), tg.push_back(data(mb, 2));
    all[std::size_t(comm.rank())] =
        ex.step(in, [&](const X& y, int mb, X& dy) { return mpar_test::mse(y, tg[std::size_t(mb)], dy); });
  });
  // Structure and accounting laws only: how long anything took depends on the machine's load.
  const auto programs = make_programs<OneFOneB>({2, 4});
  for (const auto& s : all) {
    CHECK(s.wall >= 0);
    CHECK(s.compute >= 0);
    CHECK(s.communication >= 0);
    CHECK(s.compute + s.communication <= s.wall * 1.0001 + 1e-9);  // parts of the step, never more than it
    CHECK(s.bubble_ratio >= 0);
    CHECK(s.bubble_ratio <= 1);
    // One event per action of the rank's program, in program order, each ending after it starts.
    const auto& prog = programs.ranks[std::size_t(s.rank)];
    REQUIRE(s.timeline.events.size() == prog.size());
    for (std::size_t i = 0; i < prog.size(); ++i) {
      CHECK(s.timeline.events[i].action == prog[i]);
      CHECK(s.timeline.events[i].end >= s.timeline.events[i].start);
    }
  }
  const SimResult m = summarise_measured(all);
  CHECK(m.makespan >= 0);
  CHECK(m.bubble_ratio >= 0);
  CHECK(CostModel::from_timeline(m.timeline).forward.size() == 2);
}

namespace {
/**
 * TP = 2 x PP = 2 on 4 threads: `name` with V chunks per rank, each chunk one tensor-parallel MLP
 * (`nn::make_mlp` on the tensor group), against the same MLPs on one rank (`nn::make_serial_mlp`),
 * micro-batch by micro-batch with dL/dy scaled by 1/M. Every rank's gradient shard and the loss
 * must match.
 */
void tp2_pp2(std::string_view name, int M, int V) {
  constexpr std::size_t hidden = 8, ffn = 16;
  const int P = 2, S = P * V;
  auto cfg = [&](int stage) {
    return nn::MlpConfig{hidden, ffn, 11, 10 * std::uint64_t(stage), "mlp" + std::to_string(stage)};
  };
  auto sample = [&](int mb, std::uint64_t stream) {
    Activation a({tokens, hidden});
    const CounterRng rng{5, stream};
    for (std::size_t i = 0; i < a.size(); ++i) a.data()[i] = float(rng.uniform(std::uint64_t(mb) * 100 + i) - 0.5);
    return a;
  };
  std::vector<nn::SerialMlp<>> serial;
  for (int s = 0; s < S; ++s) serial.push_back(nn::make_serial_mlp(cfg(s)));
  double ref_loss = 0;
  for (int mb = 0; mb < M; ++mb) {
    X h(sample(mb, 1));
    for (auto& m : serial) h = m.forward(h, mb);
    X dy(Activation(h.shape()));
    ref_loss += mpar_test::mse(h, sample(mb, 2), dy) / M;
    for (auto& v : dy.tensor().values()) v /= float(M);
    for (int s = S; s-- > 0;) dy = serial[std::size_t(s)].backward(dy, mb);
  }
  std::map<std::string, std::vector<float>> ref;
  for (auto& m : serial)
    for (auto* p : m.parameters()) ref[p->name].assign(p->grad.begin(), p->grad.end());

  std::mutex mu;
  std::vector<std::pair<nn::Parameter, double>> got;
  run_threads(4, [&](ThreadsCommunicator& world) {
    const DynamicMesh mesh(std::size_t(2), std::size_t(P), std::size_t(1),
                           std::size_t(1));  // tensor, pipeline, data, expert
    auto comms = make_mesh_comms(world, mesh);
    const int pp = comms.pipeline.rank();
    const Programs prog = make_programs(name, {P, M, V});
    using StageT = decltype(nn::make_mlp(comms.tensor, cfg(0)));
    std::vector<StageT> chunks;
    for (int c = 0; c < V; ++c) chunks.push_back(nn::make_mlp(comms.tensor, cfg(global_stage(prog.config, pp, c))));
    std::vector<StageT*> ptrs;
    for (auto& c : chunks) ptrs.push_back(&c);
    Executor<StageT, ThreadsCommunicator> ex(comms.pipeline, prog, ptrs);
    std::vector<X> inputs;
    std::vector<Activation> targets;
    for (int mb = 0; mb < M; ++mb) inputs.emplace_back(sample(mb, 1)), targets.push_back(sample(mb, 2));
    const StepStats st =
        ex.step(inputs, [&](const X& y, int mb, X& dy) { return mpar_test::mse(y, targets[std::size_t(mb)], dy); });
    std::lock_guard l(mu);
    for (auto* p : ex.parameters()) got.emplace_back(*p, st.loss);
  });
  CHECK(got.size() == std::size_t(4 * S * 4 / P));  // 4 parameters per MLP, S MLPs, each on 2 tensor ranks
  for (const auto& [p, loss] : got) {
    CHECK(loss == Approx(ref_loss).epsilon(1e-5));
    const auto& full = ref.at(p.name);
    // Compare this rank's block of the gradient with the same block of the reference.
    const std::size_t rank = p.global_shape.size();
    std::vector<std::size_t> idx(rank);
    for (std::size_t k = 0; k < p.grad.size(); ++k) {
      std::size_t rem = k, g = 0;
      for (std::size_t d = rank; d-- > 0;) idx[d] = rem % p.local_box[d].extent, rem /= p.local_box[d].extent;
      for (std::size_t d = 0; d < rank; ++d) g = g * p.global_shape[d] + p.local_box[d].offset + idx[d];
      INFO(name << " M=" << M << " " << p.name << "[" << k << "]");
      CHECK(p.grad[k] == Approx(full[g]).margin(1e-6).epsilon(1e-4));
    }
  }
}
}  // namespace

TEST_CASE("tensor parallel x pipeline parallel (TP=2, PP=2) reproduces the single-rank MLP stack",
          "[pipeline][executor][tp]") {
  for (auto name : {GPipe::name, OneFOneB::name, ZBH1::name, ZBH2::name})
    for (int M : {1, 3, 4}) tp2_pp2(name, M, 1);
  tp2_pp2(Interleaved1F1B::name, 4, 2);
}

TEST_CASE("run_pipeline_threads runs several steps with an optimizer", "[pipeline][executor]") {
  const int M = 4;
  std::vector<X> inputs;
  std::vector<Activation> targets;
  for (int mb = 0; mb < M; ++mb) inputs.emplace_back(data(mb, 1)), targets.push_back(data(mb, 2));
  const LossFn<Replicate> loss = [&](const X& y, int mb, X& dy) {
    return mpar_test::mse(y, targets[std::size_t(mb)], dy);
  };
  const OptimizerFn sgd = [](const std::vector<nn::Parameter*>& ps) {
    for (auto* p : ps)
      for (std::size_t i = 0; i < p->value.size(); ++i) p->value[i] -= 0.1f * p->grad[i];
  };
  const auto stats = run_pipeline_threads(
      make_programs<OneFOneB>({2, M}), [](int, int, int stage) { return TanhStack(width, std::size_t(stage), 1); },
      inputs, loss, 3, sgd);
  REQUIRE(stats.size() == 3);
  CHECK(stats[0][0].loss == Approx(reference(2, M).loss).epsilon(1e-5));
  CHECK(stats[0][1].loss == Approx(stats[0][0].loss));
  CHECK(stats[2][0].loss < stats[0][0].loss);  // SGD on the mean loss makes progress
}

TEST_CASE(
    "nn stages under ZB-H1: W actions run the weight GEMMs and the measured costs predict a smaller bubble than 1F1B",
    "[pipeline][executor][zb]") {
  using Mlp = nn::MlpStage<ThreadsCommunicator>;
  static_assert(mpar::pipeline::detail::split_backward_part<Mlp>,
                "an nn::Stage of tensor-parallel layers splits its backward");
  // Big enough that every GEMM takes measurable time.
  constexpr std::size_t hidden = 128, ffn = 512, rows = 128;
  const int P = 2, M = 4;
  auto sample = [&](int mb, std::uint64_t stream) {
    Activation a({rows, hidden});
    const CounterRng rng{9, stream};
    for (std::size_t i = 0; i < a.size(); ++i) a.data()[i] = float(rng.uniform(std::uint64_t(mb) * 100000 + i) - 0.5);
    return a;
  };
  std::vector<StepStats> all(static_cast<std::size_t>(P));
  std::vector<double> weight_grad_norm(static_cast<std::size_t>(P), 0.0);
  run_threads(P, [&](ThreadsCommunicator& world) {
    auto comms = make_mesh_comms(world, DynamicMesh(std::size_t(1), std::size_t(P), std::size_t(1), std::size_t(1)));
    const int pp = comms.pipeline.rank();
    Mlp stage =
        nn::make_mlp(comms.tensor, nn::MlpConfig{hidden, ffn, 17, 10 * std::uint64_t(pp), "mlp" + std::to_string(pp)});
    Executor<Mlp, ThreadsCommunicator> ex(comms.pipeline, make_programs<ZBH1>({P, M}), {&stage});
    std::vector<X> in;
    std::vector<Activation> tg;
    for (int mb = 0; mb < M; ++mb) in.emplace_back(sample(mb, 1)), tg.push_back(sample(mb, 2));
    const LossFn<Replicate> loss = [&](const X& y, int mb, X& dy) {
      return mpar_test::mse(y, tg[std::size_t(mb)], dy);
    };
    (void)ex.step(in, loss);  // warm-up (allocations, BLAS threads)
    for (auto* p : ex.parameters()) p->zero_grad();
    all[std::size_t(pp)] = ex.step(in, loss);
    double norm = 0;
    for (auto* p : ex.parameters())
      if (p->global_shape.size() == 2)
        for (float g : p->grad) norm += double(g) * g;
    weight_grad_norm[std::size_t(pp)] = norm;
  });
  double b_total = 0, w_total = 0;
  int w_events = 0;
  for (const auto& s : all) {
    CHECK(weight_grad_norm[std::size_t(s.rank)] > 0);
    for (const auto& e : s.timeline.events) {
      if (e.action.op == Op::backward_input) b_total += e.end - e.start;
      if (e.action.op == Op::backward_weight) {
        ++w_events;
        CHECK(e.end > e.start);
        w_total += e.end - e.start;
      }
    }
  }
  CHECK(w_events == P * M);
  INFO("measured B total " << b_total << " s, W total " << w_total << " s");
  // The measured timeline yields a cost model with a W cost per stage (how large depends on the load:
  // the measured W/B ratio is a benchmark, bench/pipeline); from given costs with W = B/2 (two of the
  // four backward GEMMs of the MLP), the simulator predicts ZB-H1's bubble below 1F1B's.
  const CostModel measured = CostModel::from_timeline(summarise_measured(all).timeline);
  CHECK(measured.backward_weight.size() == std::size_t(P));
  for (double w : measured.backward_weight) CHECK(w >= 0);
  const CostModel given = CostModel::uniform(1.0, 1.0, 0.5);
  const SimResult zb = simulate(make_programs<ZBH1>({P, M}), given);
  const SimResult f1 = simulate(make_programs<OneFOneB>({P, M}), given);
  INFO("predicted bubble: ZB-H1 " << zb.bubble_time << ", 1F1B " << f1.bubble_time);
  CHECK(zb.bubble_time < f1.bubble_time);
}

namespace {

/** Host memory that counts the bytes it holds and their peak: the rank memory of one rank. */
class PeakResource final : public MemoryResource {
 public:
  [[nodiscard]] void* allocate(std::size_t bytes) override {
    const std::size_t now = held_.fetch_add(bytes) + bytes;
    std::size_t p = peak_.load();
    while (now > p && !peak_.compare_exchange_weak(p, now)) {}
    return ::operator new(bytes);
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    held_.fetch_sub(bytes);
    ::operator delete(p);
  }
  [[nodiscard]] const char* name() const noexcept override { return "peak-counting host"; }
  void reset_peak() { peak_.store(held_.load()); }
  [[nodiscard]] std::size_t held() const { return held_.load(); }
  [[nodiscard]] std::size_t peak() const { return peak_.load(); }

 private:
  std::atomic<std::size_t> held_{0}, peak_{0};
};

/**
 * Per rank: the most rank memory it held during one step of `name` above what it held before the step (its
 * stages' weights, the inputs and targets), less the headers of the step's receives (posted when it starts, over
 * a tag-matching communicator: 32 bytes per message, next to a boundary of megabytes in a real model).
 */
template <class Wrap = ThreadsCommunicator>
std::vector<std::size_t> step_peaks(std::string_view name, int P, int M, int V,
                                    CommPlacement placement = CommPlacement::lazy) {
  const Programs prog = make_programs(name, {P, M, V, 1, placement});
  std::vector<std::size_t> peaks(std::size_t(P), 0);
  run_threads(P, [&](ThreadsCommunicator& world) {
    PeakResource mem;
    {
      const ScopedMemoryResource use(mem);
      Wrap comm(world);
      const int r = comm.rank();
      std::vector<TanhStack> chunks;
      for (int c = 0; c < V; ++c) chunks.emplace_back(width, std::size_t(global_stage(prog.config, r, c)), 1);
      std::vector<TanhStack*> ptrs;
      for (auto& c : chunks) ptrs.push_back(&c);
      ExecutorOptions o;
      o.microbatch_tokens = tokens;
      Executor<TanhStack, Wrap> ex(comm, prog, ptrs, o);
      std::vector<X> inputs;
      std::vector<Activation> targets;
      for (int mb = 0; mb < M; ++mb) inputs.emplace_back(data(mb, 1)), targets.push_back(data(mb, 2));
      const std::size_t before = mem.held();
      mem.reset_peak();
      (void)ex.step(inputs, [&](const X& y, int mb, X& dy) { return mpar_test::mse(y, targets[std::size_t(mb)], dy); });
      const bool posted_headers = !mpar::detail::ordered_point_to_point<Wrap>;
      const auto& mine = prog.ranks[std::size_t(r)];
      const auto receives =
          std::size_t(std::count_if(mine.begin(), mine.end(), [](const Action& a) { return is_recv(a.op); }));
      peaks[std::size_t(r)] =
          mem.peak() - before - (posted_headers ? receives * pipeline::detail::h_size * sizeof(float) : 0);
    }
  });
  return peaks;
}

}  // namespace

TEST_CASE("a rank's peak memory during a step does not grow with the number of micro-batches",
          "[pipeline][executor][memory]") {
  // Under 1F1B-like schedules a rank keeps at most P micro-batches' activations for backward, and a send's buffers
  // are freed once its transfer completes (ExecutorOptions::sends_in_flight bounds those in flight), so nothing
  // else scales with M. Sends held to the end of the step would add a boundary and a header per micro-batch and
  // direction.
  const std::size_t boundary = tokens * width * sizeof(float);
  struct Case {
    std::string_view name;
    int V;
    bool nccl_like;
  };
  for (const Case k : {Case{OneFOneB::name, 1, false}, Case{Interleaved1F1B::name, 2, false},
                       Case{ZBH1::name, 1, false}, Case{OneFOneB::name, 1, true}}) {
    constexpr int P = 2;
    std::map<int, std::vector<std::size_t>> peak;
    for (int M : {4, 8, 16})
      peak[M] =
          k.nccl_like ? step_peaks<NcclLike>(k.name, P, M, k.V, CommPlacement::ordered) : step_peaks(k.name, P, M, k.V);
    for (int r = 0; r < P; ++r) {
      INFO(k.name << (k.nccl_like ? " over NCCL's point-to-point semantics" : "") << ", rank " << r
                  << ": peak above the step's start at M = 4, 8, 16: " << peak[4][std::size_t(r)] << ", "
                  << peak[8][std::size_t(r)] << ", " << peak[16][std::size_t(r)] << " B (a boundary is " << boundary
                  << " B)");
      CHECK(peak[4][std::size_t(r)] > 0);
      CHECK(peak[8][std::size_t(r)] <= peak[4][std::size_t(r)] + boundary);
      CHECK(peak[16][std::size_t(r)] <= peak[4][std::size_t(r)] + boundary);
    }
  }
}

TEST_CASE("the send window is widened to what the programs need and still reproduces the single-rank result",
          "[pipeline][executor][memory]") {
  // One send in flight deadlocks the lazy interleaved programs (tests/pipeline/schedule_test.cpp): the executor
  // widens the window to 2, which the verifier proves safe, and the step gives the single-rank gradients.
  ExecutorOptions one;
  one.sends_in_flight = 1;
  compare(pipelined(Interleaved1F1B::name, 2, 4, 2, 1, false, CommPlacement::lazy, one), reference(4, 4));
  compare(pipelined(OneFOneB::name, 4, 8, 1, 1, false, CommPlacement::lazy, one), reference(4, 8));
  std::vector<std::size_t> window(2, 0);
  run_threads(2, [&](ThreadsCommunicator& comm) {
    TanhStack a(width, std::size_t(comm.rank()), 1), b(width, std::size_t(comm.rank()) + 2, 1);
    Executor<TanhStack, ThreadsCommunicator> inter(comm, make_programs<Interleaved1F1B>({2, 4, 2}), {&a, &b}, one);
    window[std::size_t(comm.rank())] = inter.sends_in_flight();
  });
  CHECK(window == std::vector<std::size_t>{2, 2});
  ExecutorOptions none;
  none.sends_in_flight = 0;
  CHECK_THROWS_WITH(pipelined(OneFOneB::name, 2, 4, 1, 1, false, CommPlacement::lazy, none),
                    Contains("sends_in_flight is 0"));
}

TEST_CASE(
    "pipeline::mean_squared_error: the mean of squares and its gradient, against hand values and finite "
    "differences",
    "[pipeline][loss]") {
  const std::vector<Activation> hand{Activation({1, 2}, std::vector<float>{0.0f, 4.0f})};
  const LossFn<Replicate> hand_loss = mean_squared_error(hand);
  X y(Activation({1, 2}, std::vector<float>{1.0f, 2.0f})), dy(Activation({1, 2}));
  CHECK(hand_loss(y, 0, dy) == 2.5);  // ((1 - 0)^2 + (2 - 4)^2) / 2
  CHECK(dy.tensor().values()[0] == 1.0f);
  CHECK(dy.tensor().values()[1] == -2.0f);

  const std::vector<Activation> targets{data(0, 2), data(1, 2)};
  const LossFn<Replicate> loss = mean_squared_error(targets);
  const Activation y0 = data(1, 1);
  X g(Activation(y0.shape()));
  (void)loss(X(y0), 1, g);
  for (std::size_t i = 0; i < y0.size(); i += 5) {
    const float h = 1e-2f;  // the loss is quadratic: the central difference is exact up to rounding
    Activation up = y0, down = y0;
    up.data()[i] += h, down.data()[i] -= h;
    X scratch(Activation(y0.shape()));
    const double fd = (loss(X(up), 1, scratch) - loss(X(down), 1, scratch)) / (double(up.data()[i]) - down.data()[i]);
    INFO("element " << i);
    CHECK(g.tensor().data()[i] == Approx(fd).epsilon(1e-4).margin(1e-6));
  }
  X scratch(Activation(y0.shape()));
  CHECK_THROWS_WITH(loss(X(y0), 2, scratch), Contains("micro-batch 2 has no target (2 given)"));
  X wide(Activation({tokens, width + 1})), dwide(Activation({tokens, width + 1}));
  CHECK_THROWS_WITH(loss(wide, 0, dwide), Contains("micro-batch 0's output is 3x9 but its target 3x8"));
}

TEST_CASE(
    "an Executor built from the rank's vector of stages, with mean_squared_error as its loss, equals the "
    "single-rank model",
    "[pipeline][executor][loss]") {
  const int P = 2, M = 2, V = 2;
  const Result ref = reference(std::size_t(P * V), M);
  const Programs prog = make_programs<Interleaved1F1B>({P, M, V});
  std::mutex mu;
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;
  run_threads(P, [&](ThreadsCommunicator& comm) {
    std::vector<TanhStack> chunks;
    for (int c = 0; c < V; ++c) chunks.emplace_back(width, std::size_t(global_stage(prog.config, comm.rank(), c)), 1);
    Executor<TanhStack, ThreadsCommunicator> ex(comm, prog, chunks);  // chunk c is chunks[c]
    std::vector<X> inputs;
    std::vector<Activation> targets;
    for (int mb = 0; mb < M; ++mb) inputs.emplace_back(data(mb, 1)), targets.push_back(data(mb, 2));
    const StepStats st = ex.step(inputs, mean_squared_error(targets));
    std::lock_guard l(mu);
    loss = st.loss;
    for (auto* p : ex.parameters()) grads[p->name].assign(p->grad.begin(), p->grad.end());
  });
  CHECK(loss == Approx(ref.loss).epsilon(1e-6));
  REQUIRE(grads.size() == ref.grads.size());
  for (const auto& [name, g] : ref.grads) {
    REQUIRE(grads.at(name).size() == g.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      INFO(name << "[" << i << "]");
      CHECK(grads.at(name)[i] == Approx(g[i]).epsilon(1e-5).margin(1e-7));
    }
  }
}
