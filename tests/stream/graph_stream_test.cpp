// The emulated capture of the stream backends (`graph_backend`, backend/stream/stream_graph.hpp): a training
// step recorded once and replayed equals the same step issued eagerly, bit for bit, when everything that
// changes between steps lives in rank memory (the batch comes in by an asynchronous copy the graph holds);
// a host wait during a capture throws naming the call; memory freed during a capture stays the graph's.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <mpar/backend/detail/graph_backend.hpp>
#include <mpar/backend/stream/stream_backend.hpp>
#include <mpar/comm/stream_ordered_communicator.hpp>
#include <mpar/comm/threads.hpp>
#include <mpar/nn/parameter.hpp>
#include <mpar/optim/adamw.hpp>

#include "rank_world.hpp"

using namespace mpar;

namespace {

/** Sizes of the least-squares model the step trains: a batch of `m` rows X [m, k], targets Y [m, n], W [k, n]. */
constexpr std::size_t graph_m = 6, graph_k = 5, graph_n = 3;

/** The step's batch `t`: arbitrary but deterministic values, X then Y, different for every step. */
std::vector<float> graph_test_batch(std::size_t t) {
  std::vector<float> xy(graph_m * graph_k + graph_m * graph_n);
  for (std::size_t i = 0; i < xy.size(); ++i) xy[i] = float(int((i * 7 + t * 13) % 11) - 5) / 4.0f;
  return xy;
}

/**
 * A model trained by backend operations only: SGD with momentum on 1/2 |X W - Y|^2 / m, the gradient clipped
 * to a norm computed in rank memory (`update_factors`), the loss copied into host memory the step owns.
 */
template <class B>
struct GraphTestModel {
  Buffer<float> w = B::template allocate<float>(graph_k * graph_n);
  Buffer<float> grad = B::template allocate<float>(graph_k * graph_n);
  Buffer<float> momentum = B::template allocate<float>(graph_k * graph_n);
  Buffer<float> batch = B::template allocate<float>(graph_m * (graph_k + graph_n));  // X then Y
  Buffer<double> loss = B::template allocate<double>(1), squares = B::template allocate<double>(1),
                 norm = B::template allocate<double>(1);
  Buffer<UpdateFactors> factors = B::template allocate<UpdateFactors>(1);
  typename B::template pinned_buffer<float> batch_in =
      typename B::template pinned_buffer<float>(graph_m * (graph_k + graph_n));  // written by the host
  typename B::template pinned_buffer<double> loss_out =
      typename B::template pinned_buffer<double>(1);  // read by the host

  GraphTestModel() {
    std::vector<float> w0(graph_k * graph_n);
    for (std::size_t i = 0; i < w0.size(); ++i) w0[i] = float(int(i % 5) - 2) / 8.0f;
    typename B::template pinned_buffer<float> staged(w0.size());
    for (std::size_t i = 0; i < w0.size(); ++i) staged[i] = w0[i];
    B::template copy_from_host_async<float>(w0.size(), staged.data(), w.data());
    B::run(ops::zero<float>{.n = momentum.size(), .x = momentum.data()});
    B::synchronize();  // the staging buffer must outlive the copy
  }

  /** Issues one step (nothing here waits on the host); `first` is SGD's first step (no momentum yet). */
  void issue_step(bool first) {
    const float* x = batch.data();
    const float* y = batch.data() + graph_m * graph_k;
    B::template copy_from_host_async<float>(batch.size(), batch_in.data(), batch.data());
    // A temporary of the step: freed at its end, so during a capture its memory must stay the graph's.
    Buffer<float> residual = B::template allocate<float>(graph_m * graph_n);
    Buffer<float> prediction = B::template allocate<float>(graph_m * graph_n);
    B::run(ops::gemm<float>{.ta = Trans::no,
                            .tb = Trans::no,
                            .m = graph_m,
                            .n = graph_n,
                            .k = graph_k,
                            .alpha = 1.0f,
                            .a = x,
                            .lda = graph_k,
                            .b = w.data(),
                            .ldb = graph_n,
                            .beta = 0.0f,
                            .c = prediction.data(),
                            .ldc = graph_n});
    B::run(ops::copy<float>{.n = residual.size(), .src = y, .dst = residual.data()});
    B::run(ops::scale{.n = residual.size(), .factor = -1.0f, .x = residual.data()});
    B::run(
        ops::add{.n = residual.size(), .x = prediction.data(), .z = residual.data(), .y = residual.data()});  // X W - Y
    B::run(ops::zero<double>{.n = 1, .x = loss.data()});
    B::run(ops::sum_squares{.n = residual.size(), .x = residual.data(), .acc = loss.data()});
    B::template copy_to_host_async<double>(1, loss.data(), loss_out.data());
    B::run(ops::gemm<float>{.ta = Trans::yes,
                            .tb = Trans::no,
                            .m = graph_k,
                            .n = graph_n,
                            .k = graph_m,
                            .alpha = 1.0f / float(graph_m),
                            .a = x,
                            .lda = graph_k,
                            .b = residual.data(),
                            .ldb = graph_n,
                            .beta = 0.0f,
                            .c = grad.data(),
                            .ldc = graph_n});  // X^T (X W - Y) / m
    B::run(ops::zero<double>{.n = 1, .x = squares.data()});
    B::run(ops::sum_squares{.n = grad.size(), .x = grad.data(), .acc = squares.data()});
    B::run(ops::update_factors{.squares = squares.data(),
                               .max_norm = 0.5,
                               .inv_loss_scale = 1.0f,
                               .skip_nonfinite = true,
                               .norm = norm.data(),
                               .factors = factors.data()});
    B::run(ops::sgd_update{.n = w.size(),
                           .w = w.data(),
                           .g = grad.data(),
                           .buf = momentum.data(),
                           .momentum = 0.9f,
                           .dampening = 0.0f,
                           .nesterov = false,
                           .lr = 0.05f,
                           .weight_decay = 0.01f,
                           .first = first,
                           .factors = factors.data()});
  }
  /** The host's part before step `t`: the batch into the pinned buffer (the previous step's copy has run). */
  void stage_batch(std::size_t t) {
    const std::vector<float> xy = graph_test_batch(t);
    for (std::size_t i = 0; i < xy.size(); ++i) batch_in[i] = xy[i];
  }
  /** Waits for the step issued last and returns its loss. */
  double finish_step() {
    typename B::event_type done;
    B::record_event(done);
    B::wait_event(done);
    return loss_out[0];
  }
  std::vector<float> weights() {
    typename B::template pinned_buffer<float> out(w.size());
    B::template copy_to_host_async<float>(w.size(), w.data(), out.data());
    B::synchronize();
    return std::vector<float>(out.data(), out.data() + out.size());
  }
};

struct GraphTestRun {
  std::vector<double> losses;
  std::vector<float> weights;
  std::size_t nodes = 0;
};

/** `steps` steps issued eagerly, or the first eager and the others replays of the second, captured. */
template <class B>
GraphTestRun graph_test_train(std::size_t steps, bool captured) {
  GraphTestRun r;
  testing::on_own_thread([&] {
    B::init_rank();
    GraphTestModel<B> model;
    typename B::graph_type graph;
    for (std::size_t t = 0; t < steps; ++t) {
      model.stage_batch(t);
      if (!captured || t == 0) {
        model.issue_step(t == 0);
      } else {
        if (t == 1) {
          B::begin_capture();
          model.issue_step(false);
          graph = B::end_capture();
          r.nodes = graph.nodes();
        }
        B::launch(graph);
      }
      r.losses.push_back(model.finish_step());
    }
    r.weights = model.weights();
  });
  return r;
}

}  // namespace

TEMPLATE_TEST_CASE("graph_backend (emulated): replays of a captured step equal eager steps bit for bit",
                   "[stream][graph]", StreamHostBackend, DiscreteHostBackend) {
  constexpr std::size_t steps = 6;
  const GraphTestRun eager = graph_test_train<TestType>(steps, false);
  const GraphTestRun replayed = graph_test_train<TestType>(steps, true);
  CHECK(replayed.nodes == 13);  // the operations issue_step issues, counted by hand; the two frees are not nodes
  REQUIRE(eager.losses.size() == steps);
  CHECK(eager.losses == replayed.losses);
  CHECK(eager.weights == replayed.weights);
  // The steps differ (new batch, updated weights): a replay that repeated the capture's values would not match.
  CHECK(eager.losses[1] != eager.losses[2]);
}

TEMPLATE_TEST_CASE("graph_backend (emulated): recording does not run, and host scalars are frozen at capture",
                   "[stream][graph]", StreamHostBackend, DiscreteHostBackend) {
  using B = TestType;
  testing::on_own_thread([] {
    B::init_rank();
    Buffer<float> x = B::template allocate<float>(4);
    B::run(ops::fill<float>{.n = x.size(), .value = 1.0f, .x = x.data()});
    float value = 2.0f;
    B::begin_capture();
    B::run(
        ops::fill<float>{.n = x.size(), .value = value, .x = x.data()});  // the value is an argument: the graph keeps 2
    B::run(ops::add{.n = x.size(), .x = x.data(), .z = x.data(), .y = x.data()});
    typename B::graph_type g = B::end_capture();
    value = 100.0f;  // too late for the graph, as for a CUDA kernel's arguments
    std::vector<float> out(4);
    B::template copy_to_host_async<float>(4, x.data(), out.data());
    B::synchronize();
    CHECK(out == std::vector<float>(4, 1.0f));  // the capture ran nothing
    B::launch(g);
    B::launch(g);
    B::template copy_to_host_async<float>(4, x.data(), out.data());
    B::synchronize();
    CHECK(out == std::vector<float>(4, 4.0f));
  });
}

TEMPLATE_TEST_CASE("graph_backend (emulated): a host wait during a capture throws naming the call", "[stream][graph]",
                   StreamHostBackend, DiscreteHostBackend) {
  using B = TestType;
  testing::on_own_thread([] {
    B::init_rank();
    Buffer<double> acc = B::template allocate<double>(1);
    typename B::event_type before;
    B::record_event(before);
    B::begin_capture();
    B::run(ops::zero<double>{.n = 1, .x = acc.data()});
    CHECK_THROWS_WITH(B::synchronize(), Catch::Contains("'synchronize' during a capture"));
    CHECK_THROWS_WITH(B::wait_event(before), Catch::Contains("'wait_event' during a capture"));
    CHECK_THROWS_WITH((void)B::event_done(before), Catch::Contains("'event_done' during a capture"));
    typename B::event_type inside;
    CHECK_THROWS_WITH(B::record_event(inside), Catch::Contains("'record_event' during a capture"));
    CHECK_THROWS_AS(B::begin_capture(), stream::capture_error);  // captures do not nest
    typename B::graph_type g = B::end_capture();
    CHECK(g.nodes() == 1);  // the zero; what threw recorded nothing
    CHECK_THROWS_AS(B::end_capture(), stream::capture_error);
    B::synchronize();  // after the capture, waits work again
  });
}

TEMPLATE_TEST_CASE("graph_backend (emulated): memory freed during a capture stays the graph's until it is dropped",
                   "[stream][graph]", StreamHostBackend, DiscreteHostBackend) {
  using B = TestType;
  testing::on_own_thread([] {
    B::init_rank();
    Buffer<float> out = B::template allocate<float>(64);
    typename B::graph_type g;
    B::begin_capture();
    {
      Buffer<float> scratch = B::template allocate<float>(64);  // freed at the end of the scope, inside the capture
      B::run(ops::fill<float>{.n = scratch.size(), .value = 3.0f, .x = scratch.data()});
      B::run(ops::copy<float>{.n = scratch.size(), .src = scratch.data(), .dst = out.data()});
    }
    g = B::end_capture();
    // Were the scratch block free, a buffer of its size class could be handed it now, and the replays would
    // overwrite this one's 5s with 3s.
    Buffer<float> kept = B::template allocate<float>(64);
    B::run(ops::fill<float>{.n = kept.size(), .value = 5.0f, .x = kept.data()});
    B::launch(g);
    B::launch(g);
    std::vector<float> got(64), was(64);
    B::template copy_to_host_async<float>(64, kept.data(), got.data());
    B::template copy_to_host_async<float>(64, out.data(), was.data());
    B::synchronize();
    CHECK(got == std::vector<float>(64, 5.0f));
    CHECK(was == std::vector<float>(64, 3.0f));
    g = {};  // the graph's frees are issued now, in stream order
    B::synchronize();
  });
}

namespace {

/** The host values of AdamW step `t`: a learning rate of a schedule, gradients, and a skipped update at t = 2. */
struct AdamWGraphTestInput {
  float lr;
  UpdateFactors factors;
  std::vector<float> grads;  // the weight's, then the bias's
};
AdamWGraphTestInput adamw_graph_test_input(std::size_t t, std::size_t n) {
  AdamWGraphTestInput in{0.01f / float(t + 1), {t == 3 ? 0.5f : 1.0f, t == 2 ? 1.0f : 0.0f}, std::vector<float>(n)};
  for (std::size_t i = 0; i < n; ++i) in.grads[i] = float(int((i * 5 + t * 3) % 9) - 4) / 3.0f;
  return in;
}

struct AdamWGraphTestRun {
  std::vector<float> state;  // weights, first and second moments of both parameters
  AdamWScalars scalars{};    // step_in_rank's, read back (zero for the eager run)
  std::size_t host_steps = 0;
};

/**
 * `steps` AdamW updates of a weight (decays) and a bias (does not): eagerly with host scalars (`step(lr, factors)`,
 * a skipped update retracted by the host), or with `step_in_rank`, the first eager and the others replays of a
 * captured second step whose learning rate, gradients and factors come in by asynchronous copies.
 */
template <class B>
AdamWGraphTestRun adamw_graph_test_train(std::size_t steps, bool captured) {
  AdamWGraphTestRun r;
  testing::on_own_thread([&] {
    B::init_rank();
    constexpr std::size_t rows = 3, cols = 4;
    nn::Parameter w{"w", 1, {rows, cols}}, b{"bias", 2, {cols}};
    const std::size_t n = rows * cols + cols;
    typename B::template pinned_buffer<float> staged(n);
    for (std::size_t i = 0; i < n; ++i) staged[i] = float(int(i % 7) - 3) / 5.0f;
    for (nn::Parameter* p : {&w, &b}) {
      const std::size_t size = p->global_size(), at = p == &w ? 0 : rows * cols;
      p->value = B::template allocate<float>(size);
      p->grad = B::template allocate<float>(size);
      B::template copy_from_host_async<float>(size, staged.data() + at, p->value.data());
    }
    B::synchronize();
    optim::AdamW<B> opt({&w, &b}, optim::AdamWConfig{0.01f, 0.9f, 0.99f, 1e-6f, 0.1f, optim::decays_weight_matrices});
    Buffer<float> lr = B::template allocate<float>(1);
    Buffer<UpdateFactors> factors = B::template allocate<UpdateFactors>(1);
    typename B::template pinned_buffer<float> lr_in(1), grads_in(n);
    typename B::template pinned_buffer<UpdateFactors> factors_in(1);
    auto issue_inputs = [&] {  // the step's host values into rank memory, by copies a graph replays
      B::template copy_from_host_async<float>(1, lr_in.data(), lr.data());
      B::template copy_from_host_async<UpdateFactors>(1, factors_in.data(), factors.data());
      B::template copy_from_host_async<float>(rows * cols, grads_in.data(), w.grad.data());
      B::template copy_from_host_async<float>(cols, grads_in.data() + rows * cols, b.grad.data());
    };
    typename B::graph_type graph;
    for (std::size_t t = 0; t < steps; ++t) {
      const AdamWGraphTestInput in = adamw_graph_test_input(t, n);
      lr_in[0] = in.lr;
      factors_in[0] = in.factors;
      for (std::size_t i = 0; i < n; ++i) grads_in[i] = in.grads[i];
      if (!captured) {
        issue_inputs();
        opt.step(in.lr, static_cast<const UpdateFactors*>(factors.data()));
        if (in.factors.skip != 0.0f) opt.retract_step();  // what a trainer does once it reads the skip back
      } else if (t == 0) {
        issue_inputs();
        opt.step_in_rank(lr.data(), factors.data());  // eager: carries the count into rank memory
      } else {
        if (t == 1) {
          B::begin_capture();
          issue_inputs();
          opt.step_in_rank(lr.data(), factors.data());
          graph = B::end_capture();
        }
        B::launch(graph);
      }
      B::synchronize();  // the pinned inputs are rewritten next
    }
    std::vector<const float*> parts;
    std::vector<std::size_t> sizes;
    for (std::size_t i = 0; i < 2; ++i) {
      nn::Parameter& p = i == 0 ? w : b;
      parts.insert(parts.end(), {p.value.data(), opt.first_moment(i).data(), opt.second_moment(i).data()});
      sizes.insert(sizes.end(), 3, p.value.size());
    }
    for (std::size_t k = 0; k < parts.size(); ++k) {
      std::vector<float> out(sizes[k]);
      B::template copy_to_host_async<float>(sizes[k], parts[k], out.data());
      B::synchronize();
      r.state.insert(r.state.end(), out.begin(), out.end());
    }
    if (captured) {
      B::template copy_to_host_async<AdamWScalars>(1, opt.rank_scalars(), &r.scalars);
      B::synchronize();
    }
    r.host_steps = opt.steps();
  });
  return r;
}

}  // namespace

TEMPLATE_TEST_CASE("AdamW::step_in_rank: replays of a captured update equal eager host-scalar updates bit for bit",
                   "[stream][graph][adamw]", StreamHostBackend, DiscreteHostBackend) {
  constexpr std::size_t steps = 6;  // a skipped update at t = 2, a gradient scale at t = 3, the rate decays
  const AdamWGraphTestRun eager = adamw_graph_test_train<TestType>(steps, false);
  const AdamWGraphTestRun replayed = adamw_graph_test_train<TestType>(steps, true);
  REQUIRE(eager.state.size() == replayed.state.size());
  CHECK(eager.state == replayed.state);
  CHECK(replayed.scalars.steps == eager.host_steps);  // the skipped update not counted, in rank memory
  CHECK(eager.host_steps == steps - 1);
  CHECK(replayed.scalars.lr == adamw_graph_test_input(steps - 1, 1).lr);  // the last replay's rate, not the capture's
}

TEST_CASE("graph_backend: the stream backends and their graphs model the concept", "[stream][graph]") {
  STATIC_REQUIRE(mpar::detail::graph_backend<StreamHostBackend>);
  STATIC_REQUIRE(mpar::detail::graph_backend<DiscreteHostBackend>);
  STATIC_REQUIRE(
      !mpar::detail::graph_backend<HostBackend>);  // its operations run before they return: nothing to record
}

TEMPLATE_TEST_CASE(
    "graph_backend (emulated): a stream-ordered communicator's calls captured with the step replay with each launch",
    "[stream][graph][comm]", StreamHostBackend, DiscreteHostBackend) {
  using B = TestType;
  constexpr std::size_t n = 5;
  constexpr int launches = 3;
  // Per rank (checked after the ranks joined: Catch's assertions are not for several threads): every launch's
  // copies out, the eager call's result, and whether the host queries during the capture threw.
  struct Seen {
    std::vector<std::vector<float>> replayed, eager;
    bool barrier_threw = false, test_threw = false;
  };
  std::vector<Seen> seen(2);
  // Rank r's values at launch t, and the sum over both ranks that a naive loop expects.
  auto value = [](int r, int t, std::size_t i) { return float(int(i) + 10 * t + 100 * r); };
  run_threads(2, [&](ThreadsCommunicator& w) {
    B::init_rank();
    Seen& mine = seen[std::size_t(w.rank())];
    StreamOrderedCommunicator<ThreadsCommunicator, B> comm(w);
    Buffer<float> x = B::template allocate<float>(n), y = B::template allocate<float>(n),
                  z = B::template allocate<float>(n);
    typename B::template pinned_buffer<float> in(n), out(2 * n), eager_out(n);
    typename B::graph_type g;
    B::begin_capture();
    B::template copy_from_host_async<float>(n, in.data(), x.data());
    comm.all_reduce(std::span<float>(x), ReduceOp::sum);  // blocking: the copy below reads its result
    B::run(ops::copy<float>{.n = n, .src = x.data(), .dst = y.data()});
    auto request = comm.iall_reduce(std::span<float>(y), ReduceOp::max);  // both ranks hold the sum: max is it
    B::run(ops::scale{.n = n, .factor = 2.0f, .x = x.data()});            // overlaps the request
    request.wait();
    B::template copy_to_host_async<float>(n, x.data(), out.data());
    B::template copy_to_host_async<float>(n, y.data(), out.data() + n);
    try {
      comm.barrier();  // answers the host, which a graph cannot
    } catch (const stream::capture_error&) {
      mine.barrier_threw = true;
    }
    try {
      (void)request.test();
    } catch (const stream::capture_error&) {
      mine.test_threw = true;
    }
    g = B::end_capture();
    for (int t = 0; t < launches; ++t) {
      for (std::size_t i = 0; i < n; ++i) in[i] = value(w.rank(), t, i);
      B::launch(g);
      // An eager call issued right after the launch, before any wait: it runs after the replay's calls (a
      // recorded call issued only when its operation ran would queue behind this one, which waits for the replay).
      B::run(ops::fill<float>{.n = n, .value = float(t + w.rank()), .x = z.data()});
      comm.all_reduce(std::span<float>(z), ReduceOp::sum);
      B::template copy_to_host_async<float>(n, z.data(), eager_out.data());
      B::synchronize();
      mine.replayed.emplace_back(out.begin(), out.end());
      mine.eager.emplace_back(eager_out.begin(), eager_out.end());
    }
  });
  for (std::size_t r = 0; r < seen.size(); ++r) {
    INFO("rank " << r);
    CHECK(seen[r].barrier_threw);
    CHECK(seen[r].test_threw);
    REQUIRE(seen[r].replayed.size() == std::size_t(launches));
    for (int t = 0; t < launches; ++t) {
      std::vector<float> want(2 * n), want_eager(n, float(2 * t + 1));
      for (std::size_t i = 0; i < n; ++i) {
        want[i] = 2.0f * (value(0, t, i) + value(1, t, i));
        want[n + i] = value(0, t, i) + value(1, t, i);
      }
      CHECK(seen[r].replayed[std::size_t(t)] == want);
      CHECK(seen[r].eager[std::size_t(t)] == want_eager);
    }
  }
}
