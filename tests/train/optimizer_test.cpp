// The optimizer kernels' per-step factors read from rank memory, and parallel::DistributedOptimizer (one
// object for the optimizer side of a step) against hand-written clipping, loss scaling and updates.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "adamw_by_hand.hpp"
#include "mpar/backend/stream/host_access_trace.hpp"
#include "mpar/backend/stream/stream_backend.hpp"
#include "mpar/comm/mesh_comms.hpp"
#include "mpar/comm/threads.hpp"
#include "mpar/core/mesh.hpp"
#include "mpar/optim.hpp"
#include "mpar/parallel.hpp"
#include "support/rank_checks.hpp"
#include "vector_parameter.hpp"

using namespace mpar;
using mpar::testing::RankChecks;

namespace {

nn::Parameter param_with_zero_grad(std::string name, std::vector<float> value, bool sharded = false) {
  const std::vector<float> zeros(value.size(), 0.0f);
  return testing::vector_parameter(std::move(name), value, zeros, sharded);
}

/** A deterministic gradient value: element i of parameter k at step t on data rank r. */
float grad_value(std::size_t k, std::size_t i, int t, int r) {
  return float(0.3 * std::sin(0.7 * double(i) + 1.1 * double(k) + 0.5 * t + 2.3 * r) + 0.05 * double(r));
}

using Opt = parallel::DistributedOptimizer<ThreadsCommunicator>;

parallel::OptimizerGroups<ThreadsCommunicator> groups_of(MeshComms<ThreadsCommunicator>& c) {
  return {&c.world, &c.tensor, &c.pipeline, &c.data, &c.data, nullptr};
}

}  // namespace

TEST_CASE("optimizer kernels: factors, skip and the accumulated sum of squares equal hand formulas", "[train][optim]") {
  SECTION("sum_squares adds onto the accumulator in rank memory") {
    Buffer<double> acc{2.0};
    const std::vector<float> x{1.0f, -2.0f, 3.0f};
    HostBackend::run(ops::sum_squares{.n = x.size(), .x = x.data(), .acc = acc.data()});
    CHECK(acc[0] == 16.0);
    HostBackend::run(ops::sum_squares{.n = 0, .x = x.data(), .acc = acc.data()});
    CHECK(acc[0] == 16.0);
  }
  SECTION("update_factors: norm of the unscaled gradient, clipping times the inverse loss scale, skip on inf/NaN") {
    const float inv = 1.0f / 65536.0f;
    Buffer<double> sq{25.0 * 65536.0 * 65536.0}, norm{0.0};
    Buffer<UpdateFactors> f(1);
    HostBackend::run(ops::update_factors{.squares = sq.data(),
                                         .max_norm = 1.0,
                                         .inv_loss_scale = inv,
                                         .skip_nonfinite = true,
                                         .norm = norm.data(),
                                         .factors = f.data()});
    CHECK(norm[0] == 5.0);
    CHECK(f[0].grad_scale == float(1.0 / (5.0 + 1e-6)) * inv);
    CHECK(f[0].skip == 0.0f);
    HostBackend::run(ops::update_factors{.squares = sq.data(),
                                         .max_norm = 10.0,
                                         .inv_loss_scale = inv,
                                         .skip_nonfinite = true,
                                         .norm = norm.data(),
                                         .factors = f.data()});  // below the bound
    CHECK(f[0].grad_scale == inv);
    HostBackend::run(ops::update_factors{.squares = sq.data(),
                                         .max_norm = 0.0,
                                         .inv_loss_scale = inv,
                                         .skip_nonfinite = true,
                                         .norm = norm.data(),
                                         .factors = f.data()});  // clipping off
    CHECK(f[0].grad_scale == inv);
    for (const double bad : {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
      sq[0] = bad;
      HostBackend::run(ops::update_factors{.squares = sq.data(),
                                           .max_norm = 1.0,
                                           .inv_loss_scale = inv,
                                           .skip_nonfinite = true,
                                           .norm = norm.data(),
                                           .factors = f.data()});
      CHECK_FALSE(std::isfinite(norm[0]));
      CHECK(f[0].skip == 1.0f);
      CHECK(f[0].grad_scale == inv);
      HostBackend::run(ops::update_factors{.squares = sq.data(),
                                           .max_norm = 1.0,
                                           .inv_loss_scale = 1.0f,
                                           .skip_nonfinite = false,
                                           .norm = norm.data(),
                                           .factors = f.data()});  // fp32: no skip
      CHECK(f[0].skip == 0.0f);
      CHECK(f[0].grad_scale == 1.0f);
    }
  }
  SECTION("a skip flag leaves weights and states untouched; the scale multiplies the gradient") {
    std::vector<float> w{1.0f, -0.5f}, g{0.25f, 2.0f}, m{0.1f, 0.2f}, v{0.3f, 0.4f}, buf{0.5f, 0.6f};
    const auto w0 = w, m0 = m, v0 = v, b0 = buf;
    Buffer<UpdateFactors> f{UpdateFactors{0.5f, 1.0f}};
    HostBackend::run(ops::adamw_update{.n = 2,
                                       .w = w.data(),
                                       .g = g.data(),
                                       .m = m.data(),
                                       .v = v.data(),
                                       .beta1 = 0.9f,
                                       .beta2 = 0.99f,
                                       .eps = 1e-8f,
                                       .weight_decay = 0.01f,
                                       .lr = 0.1f,
                                       .bias_correction1 = 0.1f,
                                       .bias_correction2 = 0.01f,
                                       .factors = f.data()});
    HostBackend::run(ops::sgd_update{.n = 2,
                                     .w = w.data(),
                                     .g = g.data(),
                                     .buf = buf.data(),
                                     .momentum = 0.9f,
                                     .dampening = 0.0f,
                                     .nesterov = false,
                                     .lr = 0.1f,
                                     .weight_decay = 0.01f,
                                     .first = false,
                                     .factors = f.data()});
    CHECK(w == w0);
    CHECK(m == m0);
    CHECK(v == v0);
    CHECK(buf == b0);
    f[0].skip = 0.0f;
    HostBackend::run(ops::sgd_update{.n = 2,
                                     .w = w.data(),
                                     .g = g.data(),
                                     .buf = buf.data(),
                                     .momentum = 0.9f,
                                     .dampening = 0.0f,
                                     .nesterov = false,
                                     .lr = 0.1f,
                                     .weight_decay = 0.01f,
                                     .first = false,
                                     .factors = f.data()});
    for (std::size_t i = 0; i < 2; ++i) {
      const float d = g[i] * 0.5f + 0.01f * w0[i];
      const float b = 0.9f * b0[i] + 1.0f * d;
      CHECK(buf[i] == b);
      CHECK(w[i] == w0[i] - 0.1f * b);
    }
  }
}

TEST_CASE("typed optimizer configuration: names are parsed once, unknown ones refused naming the choices",
          "[train][optim][errors]") {
  CHECK(parallel::parse_precision("bf16") == parallel::Precision::bf16);
  CHECK(parallel::parse_precision("f16") == parallel::Precision::f16);
  CHECK(parallel::parse_update_rule("sgd") == parallel::UpdateRule::sgd);
  CHECK_THROWS_WITH(parallel::parse_precision("fp16"), Catch::Contains("'fp16'") && Catch::Contains("fp32, bf16, f16"));
  CHECK_THROWS_WITH(parallel::parse_update_rule("adam"), Catch::Contains("'adam'") && Catch::Contains("adamw, sgd"));
  CHECK_THROWS_WITH(
      [] {
        run_threads(1, [](ThreadsCommunicator& world) {
          auto p = param_with_zero_grad("w", {1.0f});
          parallel::GradBuckets<ThreadsCommunicator, parallel::BucketCollective::all_reduce> b({&p}, world, 64);
          b.mark_ready(std::size_t(3));
        });
      }(),
      Catch::Contains("parameter index 3 is out of range (1 parameters)"));
}

TEST_CASE("DistributedOptimizer on one rank: the global norm, clipping and AdamW equal the hand formulas bit for bit",
          "[train][optim]") {
  const optim::AdamWConfig cfg{.lr = 0.05f,
                               .beta1 = 0.85f,
                               .beta2 = 0.97f,
                               .eps = 1e-7f,
                               .weight_decay = 0.1f,
                               .decays = [](const nn::Parameter& q) { return q.name == "a"; }};
  RankChecks rc;
  run_threads(1, [&](ThreadsCommunicator& world) {
    auto comms = make_mesh_comms(world, DynamicMesh(1, 1, 1, 1));
    auto a = param_with_zero_grad("a", {0.5f, -1.0f, 2.0f}), b = param_with_zero_grad("b", {1.5f, 0.25f}, true);
    parallel::OptimizerConfig oc;
    oc.adamw = cfg;
    oc.clip = 0.4;
    Opt opt({&a, &b}, {&a, &b}, oc, groups_of(comms));
    std::vector<std::vector<float>> w{{0.5f, -1.0f, 2.0f}, {1.5f, 0.25f}}, m{{0, 0, 0}, {0, 0}}, v{{0, 0, 0}, {0, 0}};
    for (int t = 1; t <= 3; ++t) {
      std::vector<std::vector<float>> g(2);
      double squares = 0;
      for (std::size_t k = 0; k < 2; ++k) {
        nn::Parameter& p = k == 0 ? a : b;
        for (std::size_t i = 0; i < p.grad.size(); ++i) {
          p.grad[i] = grad_value(k, i, t, 0) * (t == 2 ? 0.01f : 1.0f);  // step 2 stays below the bound
          g[k].push_back(p.grad[i]);
          squares += double(p.grad[i]) * double(p.grad[i]);
        }
      }
      opt.record_losses(1.5 * t, 0.25);
      const float lr = 0.05f / float(t);
      const parallel::StepStatistics st = opt.step(lr);
      const double norm = std::sqrt(squares);
      const float coef = norm > 0.4 ? float(0.4 / (norm + 1e-6)) : 1.0f;
      // to the rounding of a double sum: the host adds partial sums in another order than this loop
      rc.expect(std::abs(st.grad_norm - norm) <= 1e-15 * norm, "the norm is sqrt of the sum of squares");
      rc.expect(st.loss == 1.5 * t && st.aux_loss == 0.25, "the recorded losses come back");
      rc.expect(!st.found_inf && !st.skipped, "a finite step is taken");
      for (std::size_t k = 0; k < 2; ++k) {
        testing::adamw_by_hand(w[k], g[k], m[k], v[k], cfg, t, lr, coef, k == 0 ? 0.1f : 0.0f);
        const nn::Parameter& p = k == 0 ? a : b;
        for (std::size_t i = 0; i < w[k].size(); ++i)
          rc.expect(p.value[i] == w[k][i], "step " + std::to_string(t) + " " + p.name + "[" + std::to_string(i) + "]");
      }
      opt.zero_grad();
    }
    rc.expect(opt.steps() == 3, "three updates counted");
  });
  rc.assert_all(3 * (3 + 5));
}

TEST_CASE(
    "DistributedOptimizer under f16 on two data ranks: loss-scaled gradients give the fp32 step; an overflow on "
    "one rank skips the update everywhere and lowers the scale",
    "[train][optim][mixed]") {
  for (const bool zero1 : {false, true}) {
    DYNAMIC_SECTION((zero1 ? "ZeRO-1" : "all-reduce")) {
      RankChecks rc;
      run_threads(2, [&](ThreadsCommunicator& world) {
        auto comms = make_mesh_comms(world, DynamicMesh(1, 1, 2, 1));
        const int r = world.rank();
        auto a16 = param_with_zero_grad("a", {0.5f, -1.0f, 2.0f, 0.1f}),
             b16 = param_with_zero_grad("b", {1.5f, 0.25f, -0.75f});
        auto a32 = a16, b32 = b16;
        parallel::OptimizerConfig oc;
        oc.adamw = {.lr = 0.05f, .eps = 1e-3f, .weight_decay = 0.1f};  // a large eps: a wrong unscaling shows
        oc.clip = 0.1;
        oc.bucket_bytes = 8;
        oc.zero = zero1 ? parallel::ZeroStage::optimizer_states : parallel::ZeroStage::none;
        parallel::OptimizerConfig oc16 = oc;
        oc16.precision = parallel::Precision::f16;
        oc16.loss_scaler.initial_scale = 1024.0f;
        Opt half({&a16, &b16}, {&a16, &b16}, oc16, groups_of(comms));
        Opt full({&a32, &b32}, {&a32, &b32}, oc, groups_of(comms));
        auto fill = [&](int t, float scale, nn::Parameter& a, nn::Parameter& b) {
          for (std::size_t i = 0; i < a.grad.size(); ++i) a.grad[i] = grad_value(0, i, t, r) * scale;
          for (std::size_t i = 0; i < b.grad.size(); ++i) b.grad[i] = grad_value(1, i, t, r) * scale;
        };
        auto same = [&](const std::string& what) {
          for (std::size_t i = 0; i < a16.value.size(); ++i) rc.expect(a16.value[i] == a32.value[i], what + " a");
          for (std::size_t i = 0; i < b16.value.size(); ++i) rc.expect(b16.value[i] == b32.value[i], what + " b");
        };
        // Step 1: the scaled gradients (a power of two) give exactly the fp32 step.
        const float s1 = half.loss_scale();
        rc.expect(s1 == 1024.0f, "the initial loss scale");
        fill(1, s1, a16, b16);
        fill(1, 1.0f, a32, b32);
        for (Opt* o : {&half, &full}) o->record_losses(1.0, 0.0);
        const auto h1 = half.step(0.05), f1 = full.step(0.05);
        rc.expect(h1.grad_norm == f1.grad_norm && !h1.skipped, "the unscaled norm equals the fp32 norm");
        rc.expect(f1.grad_norm > 0.1, "clipping is active");
        same("step 1");
        half.zero_grad();
        full.zero_grad();
        // Step 2: an inf on rank 1 only: every rank skips, weights and states stay, the scale halves.
        const std::vector<float> before(a16.value.begin(), a16.value.end());
        fill(2, half.loss_scale(), a16, b16);
        if (r == 1) b16.grad[1] = std::numeric_limits<float>::infinity();
        half.record_losses(1.0, 0.0);
        const auto h2 = half.step(0.05);
        rc.expect(h2.skipped && h2.found_inf, "the overflow skips the step on rank " + std::to_string(r));
        rc.expect(std::vector<float>(a16.value.begin(), a16.value.end()) == before, "skipped: weights unchanged");
        rc.expect(half.loss_scale() == 512.0f, "the scale halves after an overflow");
        rc.expect(half.steps() == 1, "the skipped update is not counted");
        half.zero_grad();
        // Step 3 (AdamW's second update): again the fp32 step, bias corrections of t = 2.
        fill(3, half.loss_scale(), a16, b16);
        fill(3, 1.0f, a32, b32);
        for (Opt* o : {&half, &full}) o->record_losses(1.0, 0.0);
        const auto h3 = half.step(0.05), f3 = full.step(0.05);
        rc.expect(!h3.skipped && h3.grad_norm == f3.grad_norm, "step 3 taken");
        same("step 3");
        rc.expect(half.steps() == 2 && full.steps() == 2, "two updates counted");
      });
      rc.assert_all(2 * 23);
    }
  }
}

TEST_CASE("DistributedOptimizer with SGD: a skipped first step leaves the momentum buffer to be started by the next",
          "[train][optim][mixed]") {
  RankChecks rc;
  run_threads(1, [&](ThreadsCommunicator& world) {
    auto comms = make_mesh_comms(world, DynamicMesh(1, 1, 1, 1));
    auto p = param_with_zero_grad("w", {1.0f, -2.0f});
    parallel::OptimizerConfig oc;
    oc.rule = parallel::UpdateRule::sgd;
    oc.sgd = {.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f};
    oc.precision = parallel::Precision::f16;
    oc.clip = 0.0;
    Opt opt({&p}, {&p}, oc, groups_of(comms));
    p.grad[0] = std::numeric_limits<float>::quiet_NaN();
    opt.record_losses(0, 0);
    rc.expect(opt.step(0.1).skipped, "NaN: skipped");
    rc.expect(p.value[0] == 1.0f && p.value[1] == -2.0f && opt.steps() == 0, "nothing changed");
    const float s = opt.loss_scale();
    p.grad[0] = 0.5f * s;
    p.grad[1] = 1.0f * s;
    opt.record_losses(0, 0);
    rc.expect(!opt.step(0.1).skipped, "finite: taken");
    // The first update: buf = d = g + wd w; w -= lr buf.
    const float d0 = 0.5f + 0.01f * 1.0f, d1 = 1.0f + 0.01f * -2.0f;
    rc.expect(p.value[0] == 1.0f - 0.1f * d0 && p.value[1] == -2.0f - 0.1f * d1, "the first SGD update");
    rc.expect(opt.sgd()->momentum_buffer(0)[0] == d0, "the buffer started with d");
  });
  rc.assert_all(5);
}

TEST_CASE("DistributedOptimizer under bf16: the passes see rounded weights, the update applies to the fp32 masters",
          "[train][optim][mixed]") {
  RankChecks rc;
  run_threads(1, [&](ThreadsCommunicator& world) {
    auto comms = make_mesh_comms(world, DynamicMesh(1, 1, 1, 1));
    const float x = 1.0f + 1.0f / 1024.0f;  // not a bf16 value: rounds to 1
    auto p = param_with_zero_grad("w", {x, -3.0f});
    parallel::OptimizerConfig oc;
    oc.precision = parallel::Precision::bf16;
    Opt opt({&p}, {&p}, oc, groups_of(comms));
    const float* outside = p.value.data();
    opt.begin_compute();
    rc.expect(p.value[0] == float(bf16(x)) && p.value[0] == 1.0f, "the passes see the bf16-rounded weight");
    const float* inside = p.value.data();
    opt.end_compute();
    rc.expect(p.value[0] == x, "the master is back");
    rc.expect(opt.precision_bytes() == 2 * sizeof(float) + 2 * sizeof(bf16), "masters and copies counted");
    // A captured step replays recorded addresses: every step's passes read one buffer, the update another.
    opt.begin_compute();
    rc.expect(p.value.data() == inside, "the passes read the same buffer every step");
    // A step abandoned by an exception in the passes never reaches end_compute; the next step must not take
    // the rounded weights for masters.
    opt.begin_compute();
    opt.end_compute();
    rc.expect(p.value[0] == x && p.value.data() == outside, "after an abandoned step the master is back");
  });
  rc.assert_all(5);
}

// A weight only GEMMs read (the linear layers' weights) needs no widened copy: begin_compute hands the layers
// the 16-bit copy and leaves the master where it is, allocating no scratch for it; the others are as above.
TEST_CASE("DistributedOptimizer under bf16: a GEMM-only weight keeps its master in place, with only the 16-bit copy",
          "[train][optim][mixed]") {
  RankChecks rc;
  run_threads(1, [&](ThreadsCommunicator& world) {
    auto comms = make_mesh_comms(world, DynamicMesh(1, 1, 1, 1));
    const float x = 1.0f + 1.0f / 1024.0f;  // rounds to 1 in bf16
    auto w = param_with_zero_grad("w", {x, -3.0f}), g = param_with_zero_grad("g", {x, 2.0f, 5.0f});
    w.gemm_operand_only = true;
    parallel::OptimizerConfig oc;
    oc.precision = parallel::Precision::bf16;
    Opt opt({&w, &g}, {&w, &g}, oc, groups_of(comms));
    const float* master = w.value.data();
    opt.begin_compute();
    rc.expect(w.value.data() == master && w.value[0] == x, "the GEMM-only weight's value is its master, unrounded");
    rc.expect(w.bf16_copy.size() == 2 && float(w.bf16_copy[0]) == 1.0f && float(w.bf16_copy[1]) == -3.0f,
              "its compute copy is rounded");
    rc.expect(g.value[0] == 1.0f && g.bf16_copy.size() == 3, "the other weight is widened as before");
    rc.expect(opt.precision_bytes() == 3 * sizeof(float) + 5 * sizeof(bf16), "a scratch master for g alone");
    opt.end_compute();
    rc.expect(w.value.data() == master && w.value[0] == x && w.bf16_copy.empty(), "w after end_compute");
    rc.expect(g.value[0] == x && g.bf16_copy.empty(), "g's master is back");
    w.grad[0] = 1.0f;
    opt.record_losses(0, 0);
    rc.expect(!opt.step(0.1).skipped && w.value[0] != x, "the update reaches the GEMM-only master");
  });
  rc.assert_all(7);
}

TEST_CASE(
    "DistributedOptimizer under bf16: rounding the weights and restoring the masters are stream operations "
    "on rank memory, no host access",
    "[train][optim][mixed][discrete]") {
  // DiscreteHostBackend's rank memory faults when the host touches it; the trace records every such access
  // (a device backend's weights are unreachable from the host). Ties round to even: 1 + 2^-8 lies halfway
  // between 1 and 1 + 2^-7 (odd mantissa) and goes to 1; 1 + 3 * 2^-8 goes up to the even 1 + 2^-6.
  using B = DiscreteHostBackend;
  const std::vector<float> w{1.0f + 1.0f / 256.0f + 1.0f / 1024.0f, 1.0f + 1.0f / 256.0f, 1.0f + 3.0f / 256.0f, -0.5f,
                             70000.0f};
  const std::vector<float> rounded{1.0f + 1.0f / 128.0f, 1.0f, 1.0f + 1.0f / 64.0f, -0.5f, 70144.0f};
  // In a child: the trace installs process-wide signal handlers. Exit status 0: no host access, the passes
  // saw the rounded weights and the masters came back; a distinct status for each failure.
  const pid_t pid = fork();
  if (pid == 0) {
    int code = 0;
    stream::HostAccessTrace trace;
    run_threads(1, [&](ThreadsCommunicator& world) {
      B::init_rank();
      auto comms = make_mesh_comms(world, DynamicMesh(1, 1, 1, 1));
      nn::Parameter p;
      p.name = "w";
      p.global_shape = {w.size()};
      p.value = B::allocate<float>(w.size());
      p.grad = B::allocate<float>(w.size());
      B::copy_from_host_async<float>(w.size(), w.data(), p.value.data());
      B::run(ops::zero<float>{.n = w.size(), .x = p.grad.data()});
      parallel::OptimizerConfig oc;
      oc.precision = parallel::Precision::bf16;
      parallel::DistributedOptimizer<ThreadsCommunicator, B> opt({&p}, {&p}, oc, groups_of(comms));
      std::vector<float> seen(w.size()), back(w.size());
      B::synchronize();
      // Only the mixed-precision swap is under test: what the construction touched is counted before it.
      const std::size_t before = trace.accesses(false) + trace.accesses(true);
      opt.begin_compute();
      B::copy_to_host_async<float>(w.size(), p.value.data(), seen.data());
      opt.end_compute();
      B::copy_to_host_async<float>(w.size(), p.value.data(), back.data());
      B::synchronize();
      if (trace.accesses(false) + trace.accesses(true) != before)
        code = 1;
      else if (seen != rounded)
        code = 2;
      else if (back != w)
        code = 3;
    });
    _exit(code);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  const int status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  INFO("1: the host touched rank memory; 2: wrong rounded weights; 3: the masters did not come back");
  CHECK(status == 0);
}

namespace {
/** The host backend, counting the host's waits for rank memory (each host read or write of it goes through one). */
struct SyncCountingBackend : HostBackend {
  static inline int syncs = 0;
  static void synchronize() { ++syncs; }
  static void wait_event(event_type& e) {
    ++syncs;
    HostBackend::wait_event(e);
  }
};
static_assert(backend<SyncCountingBackend>);
}  // namespace

TEST_CASE(
    "DistributedOptimizer::step waits for rank memory once: the statistics read (the norm accumulator is "
    "zeroed by a backend operation)",
    "[train][optim]") {
  int per_step_fp32 = -1, per_step_f16 = -1;
  run_threads(1, [&](ThreadsCommunicator& world) {
    auto comms = make_mesh_comms(world, DynamicMesh(1, 1, 1, 1));
    for (const auto precision : {parallel::Precision::fp32, parallel::Precision::f16}) {
      auto p = param_with_zero_grad("w", {1.0f, -2.0f, 0.5f});
      parallel::OptimizerConfig oc;
      oc.precision = precision;
      parallel::DistributedOptimizer<ThreadsCommunicator, SyncCountingBackend> opt(
          {&p}, {&p}, oc, {&comms.world, &comms.tensor, &comms.pipeline, &comms.data, &comms.data, nullptr});
      for (int t = 0; t < 3; ++t) {
        for (std::size_t i = 0; i < 3; ++i) p.grad[i] = grad_value(0, i, t, 0) * opt.loss_scale();
        opt.record_losses(1.0, 0.0);
        SyncCountingBackend::syncs = 0;
        (void)opt.step(0.01);
        (precision == parallel::Precision::fp32 ? per_step_fp32 : per_step_f16) = SyncCountingBackend::syncs;
        opt.zero_grad();
      }
    }
  });
  CHECK(per_step_fp32 == 1);
  CHECK(per_step_f16 == 1);
}
