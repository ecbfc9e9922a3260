// Mixture of experts: expert parallelism (EP = 2, 4 thread ranks) reproduces one rank, and the backward
// matches finite differences.
#include <catch2/catch.hpp>

#include <cmath>
#include <mutex>
#include <vector>

#include "mpar/comm/mesh_comms.hpp"
#include "mpar/comm/threads.hpp"
#include "mpar/optim/clip.hpp"
#include "mpar/parallel/moe.hpp"

using namespace mpar;

namespace {
constexpr std::size_t kTokens = 16, kD = 6, kF = 10;

float x_at(std::size_t g) { return float(CounterRng{11, 1}.normal(g)); }
float dy_at(std::size_t g) { return float(CounterRng{11, 2}.normal(g)); }

parallel::MoeConfig config(std::size_t experts, std::size_t k, double capacity) {
  return {.d_model = kD, .d_ff = kF, .experts = experts, .top_k = k, .capacity_factor = capacity,
          .aux_loss_weight = 0.1f, .seed = 5, .first_id = 100, .init_std = 0.5};
}

/** Everything one run produces, in global coordinates (tokens and experts of the whole group). */
struct Result {
  std::vector<float> y, dx, gate_grad, w1_grad, w2_grad;
  float aux = 0;
  std::size_t dropped = 0;
};

Result run(int ep, const parallel::MoeConfig& cfg) {
  Result res;
  res.y.resize(kTokens * kD);
  res.dx.resize(kTokens * kD);
  res.gate_grad.resize(kD * cfg.experts);
  res.w1_grad.resize(cfg.experts * kD * kF);
  res.w2_grad.resize(cfg.experts * kF * kD);
  std::mutex mu;
  run_threads(ep, [&](ThreadsCommunicator& group) {
    parallel::MoeMlp<ThreadsCommunicator> moe(cfg, group);
    const std::size_t local = kTokens / std::size_t(ep), first = local * std::size_t(group.rank());
    std::vector<float> x(local * kD), dy(local * kD), y(local * kD), dx(local * kD);
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = x_at(first * kD + i);
      dy[i] = dy_at(first * kD + i);
    }
    moe.forward(x, local, y);
    moe.backward(dy, dx, 1.0f);
    // the gate is replicated: sum its per-rank shares, as data parallelism over these ranks would
    group.all_reduce(std::span<float>(moe.gate().grad), ReduceOp::sum);
    std::size_t dropped[1] = {moe.dropped()};
    std::lock_guard l(mu);
    std::copy(y.begin(), y.end(), res.y.begin() + std::ptrdiff_t(first * kD));
    std::copy(dx.begin(), dx.end(), res.dx.begin() + std::ptrdiff_t(first * kD));
    res.gate_grad.assign(moe.gate().grad.begin(), moe.gate().grad.end());
    const std::size_t e0 = moe.w1().local_box[0].offset;
    std::copy(moe.w1().grad.begin(), moe.w1().grad.end(), res.w1_grad.begin() + std::ptrdiff_t(e0 * kD * kF));
    std::copy(moe.w2().grad.begin(), moe.w2().grad.end(), res.w2_grad.begin() + std::ptrdiff_t(e0 * kF * kD));
    res.aux = moe.aux_loss();
    res.dropped += dropped[0];
  });
  return res;
}

void check_close(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO(what << "[" << i << "]");
    CHECK(a[i] == Approx(b[i]).margin(1e-5).epsilon(1e-4));
  }
}
}  // namespace

TEST_CASE("MoE with experts over the expert axis equals one rank", "[train][moe]") {
  for (std::size_t k : {std::size_t(1), std::size_t(2)}) {
    const auto cfg = config(4, k, 0.0);  // no capacity limit: no dropped tokens
    const Result ref = run(1, cfg);
    CHECK(ref.dropped == 0);
    CHECK(ref.aux > 0.0f);
    for (int ep : {2, 4}) {
      DYNAMIC_SECTION("top_k=" << k << " EP=" << ep) {
        const Result got = run(ep, cfg);
        CHECK(got.dropped == 0);
        check_close(got.y, ref.y, "y");
        check_close(got.dx, ref.dx, "dx");
        check_close(got.gate_grad, ref.gate_grad, "gate.grad");
        check_close(got.w1_grad, ref.w1_grad, "w1.grad");
        check_close(got.w2_grad, ref.w2_grad, "w2.grad");
        CHECK(got.aux == Approx(ref.aux).epsilon(1e-5));
      }
    }
  }
  SECTION("eight experts, two per rank on four ranks") {
    const auto cfg = config(8, 2, 0.0);
    const Result ref = run(1, cfg), got = run(4, cfg);
    check_close(got.y, ref.y, "y");
    check_close(got.w1_grad, ref.w1_grad, "w1.grad");
    check_close(got.gate_grad, ref.gate_grad, "gate.grad");
  }
}

TEST_CASE("MoE capacity drops the assignments beyond it", "[train][moe]") {
  // capacity ceil(0.25 * 2 * 16 / 4) = 2 per expert on one rank: at most 8 of the 32 assignments survive
  const Result r = run(1, config(4, 2, 0.25));
  CHECK(r.dropped >= 24);
  std::size_t zero_rows = 0;  // tokens whose every choice was dropped produce exactly zero
  for (std::size_t t = 0; t < kTokens; ++t) {
    bool zero = true;
    for (std::size_t c = 0; c < kD; ++c) zero = zero && r.y[t * kD + c] == 0.0f;
    zero_rows += zero;
  }
  CHECK(zero_rows >= 8);
  CHECK_THROWS_AS(run(1, config(4, 5, 0.0)), rank_failure);  // top_k above the expert count
  CHECK_THROWS_AS(run(4, config(6, 1, 0.0)), rank_failure);  // 6 experts over 4 ranks
}

TEST_CASE("MoE backward matches finite differences of sum(y * dy) + aux", "[train][moe]") {
  auto cfg = config(4, 2, 0.0);
  cfg.aux_loss_weight = 5.0f;  // large enough that a wrong auxiliary gradient shows above the tolerance
  run_threads(1, [&](ThreadsCommunicator& one) {
    parallel::MoeMlp<ThreadsCommunicator> moe(cfg, one);
    std::vector<float> x(kTokens * kD), dy(kTokens * kD), y(kTokens * kD), dx(kTokens * kD);
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = x_at(i);
      dy[i] = dy_at(i);
    }
    auto loss = [&]() {
      moe.forward(x, kTokens, y);
      double s = moe.aux_loss();
      for (std::size_t i = 0; i < y.size(); ++i) s += double(y[i]) * double(dy[i]);
      return s;
    };
    loss();
    moe.backward(dy, dx, 1.0f);
    const float h = 1e-2f;
    auto fd = [&](float& v) {
      const float keep = v;
      v = keep + h;
      const double up = loss();
      v = keep - h;
      const double down = loss();
      v = keep;
      return (up - down) / (2.0 * double(h));
    };
    for (std::size_t i : {std::size_t(0), std::size_t(7), std::size_t(23)}) {
      INFO("gate " << i);
      CHECK(moe.gate().grad[i] == Approx(fd(moe.gate().value[i])).margin(2e-3).epsilon(2e-2));
    }
    for (std::size_t i : {std::size_t(3), std::size_t(77), std::size_t(200)}) {
      INFO("w1 " << i << ", w2 " << i);
      CHECK(moe.w1().grad[i] == Approx(fd(moe.w1().value[i])).margin(2e-3).epsilon(2e-2));
      CHECK(moe.w2().grad[i] == Approx(fd(moe.w2().value[i])).margin(2e-3).epsilon(2e-2));
    }
    for (std::size_t i : {std::size_t(1), std::size_t(50)}) {
      INFO("x " << i);
      CHECK(dx[i] == Approx(fd(x[i])).margin(2e-3).epsilon(2e-2));
    }
  });
}

TEST_CASE("Gradient norm with experts over the expert axis equals one rank", "[train][moe][clip]") {
  const auto cfg = config(4, 2, 0.0);
  double want = 0.0;
  for (int ep : {1, 2, 4}) {
    std::mutex mu;
    std::vector<double> norms;
    const DynamicMesh mesh(std::size_t(1), std::size_t(1), std::size_t(1), std::size_t(ep));
    run_threads(ep, [&](ThreadsCommunicator& world) {
      auto comms = make_mesh_comms(world, mesh);
      parallel::MoeMlp<ThreadsCommunicator> moe(cfg, comms.expert);
      const std::size_t local = kTokens / std::size_t(ep), first = local * std::size_t(world.rank());
      std::vector<float> x(local * kD), dy(local * kD), y(local * kD), dx(local * kD);
      for (std::size_t i = 0; i < x.size(); ++i) {
        x[i] = x_at(first * kD + i);
        dy[i] = dy_at(first * kD + i);
      }
      moe.forward(x, local, y);
      moe.backward(dy, dx, 1.0f);
      comms.expert.all_reduce(std::span<float>(moe.gate().grad), ReduceOp::sum);
      auto ps = moe.parameters();
      const double n = optim::grad_norm(ps, comms.tensor, comms.pipeline, comms.expert);
      const double local_only = optim::grad_norm(ps, comms.tensor, comms.pipeline);
      std::lock_guard l(mu);
      norms.push_back(n);
      if (ep > 1) CHECK(local_only < n);  // without the expert group the other ranks' experts are missing
    });
    if (ep == 1) want = norms[0];
    for (double n : norms) CHECK(n == Approx(want).epsilon(1e-5));
  }
}
