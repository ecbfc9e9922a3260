// Mixture of experts: expert parallelism (EP = 2, 4 thread ranks) reproduces one rank, and the backward
// matches finite differences.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "mpar/comm/mesh_comms.hpp"
#include "mpar/comm/threads.hpp"
#include "mpar/nn/autocast.hpp"
#include "mpar/optim/clip.hpp"
#include "mpar/parallel/moe.hpp"

using namespace mpar;

namespace {
constexpr std::size_t kTokens = 16, kD = 6, kF = 10;

float x_at(std::size_t g) { return float(CounterRng{11, 1}.normal(g)); }
float dy_at(std::size_t g) { return float(CounterRng{11, 2}.normal(g)); }

parallel::MoeConfig config(std::size_t experts, std::size_t k, double capacity) {
  return {.d_model = kD,
          .d_ff = kF,
          .experts = experts,
          .top_k = k,
          .capacity_factor = capacity,
          .aux_loss_weight = 0.1f,
          .seed = 5,
          .first_id = 100,
          .init_std = 0.5};
}

/** Everything one run produces, in global coordinates (tokens and experts of the whole group). */
struct Result {
  std::vector<float> y, dx, gate_grad, w1_grad, w2_grad;
  std::vector<float> gate_value, w1_value, w2_value;  // the initial parameters, for the naive reference
  float aux = 0;
  std::size_t dropped = 0;
};

Result run(int ep, const parallel::MoeConfig& cfg, nn::ComputeType type = nn::ComputeType::fp32) {
  Result res;
  res.y.resize(kTokens * kD);
  res.dx.resize(kTokens * kD);
  res.gate_grad.resize(kD * cfg.experts);
  res.w1_grad.resize(cfg.experts * kD * kF);
  res.w2_grad.resize(cfg.experts * kF * kD);
  res.w1_value.resize(res.w1_grad.size());
  res.w2_value.resize(res.w2_grad.size());
  std::mutex mu;
  run_threads(ep, [&](ThreadsCommunicator& group) {
    parallel::MoeMlp<ThreadsCommunicator> moe(cfg, group);
    const std::size_t local = kTokens / std::size_t(ep), first = local * std::size_t(group.rank());
    std::vector<float> x(local * kD), dy(local * kD), y(local * kD), dx(local * kD);
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = x_at(first * kD + i);
      dy[i] = dy_at(first * kD + i);
    }
    // Through the typed API: this rank's tokens as whole rows, replicated over the (size-1) tensor axis.
    nn::Act<Replicate> xt(nn::Activation({local, kD})), dyt(nn::Activation({local, kD}));
    std::copy(x.begin(), x.end(), xt.data());
    std::copy(dy.begin(), dy.end(), dyt.data());
    nn::Autocast scope(type);  // fp32: the GEMMs as without a scope
    const nn::Act<Replicate> yt = moe.forward(xt);
    const nn::Act<Replicate> dxt = moe.backward(dyt, 1.0f);
    std::copy(yt.data(), yt.data() + yt.size(), y.begin());
    std::copy(dxt.data(), dxt.data() + dxt.size(), dx.begin());
    // the gate is replicated: sum its per-rank shares, as data parallelism over these ranks would
    group.all_reduce(std::span<float>(moe.gate().grad), ReduceOp::sum);
    std::size_t dropped[1] = {moe.dropped()};
    std::lock_guard l(mu);
    std::copy(y.begin(), y.end(), res.y.begin() + std::ptrdiff_t(first * kD));
    std::copy(dx.begin(), dx.end(), res.dx.begin() + std::ptrdiff_t(first * kD));
    res.gate_grad.assign(moe.gate().grad.begin(), moe.gate().grad.end());
    res.gate_value.assign(moe.gate().value.begin(), moe.gate().value.end());
    const std::size_t e0 = moe.w1().local_box[0].offset;
    std::copy(moe.w1().value.begin(), moe.w1().value.end(), res.w1_value.begin() + std::ptrdiff_t(e0 * kD * kF));
    std::copy(moe.w2().value.begin(), moe.w2().value.end(), res.w2_value.begin() + std::ptrdiff_t(e0 * kF * kD));
    std::copy(moe.w1().grad.begin(), moe.w1().grad.end(), res.w1_grad.begin() + std::ptrdiff_t(e0 * kD * kF));
    std::copy(moe.w2().grad.begin(), moe.w2().grad.end(), res.w2_grad.begin() + std::ptrdiff_t(e0 * kF * kD));
    res.aux = moe.aux_loss();
    res.dropped += dropped[0];
  });
  return res;
}

/**
 * The MoE forward written token by token in double, from the documented rules (calling nothing of mpar):
 * p = softmax(x Wg); the k most probable experts (ties: lower index); y = sum_j p[e_j] gelu(x W1[e_j]) W2[e_j]
 * (the gate probabilities themselves, or renormalised over the k choices when `renormalise`); and
 * aux = alpha E sum_e f_e P_e with f_e the share of the k T choices that picked e and P_e the mean of p[., e].
 */
struct Naive {
  std::vector<double> y;
  double aux = 0;
};
Naive naive_moe(const Result& r, const parallel::MoeConfig& cfg, bool renormalise = false) {
  const std::size_t E = cfg.experts, k = cfg.top_k;
  Naive out;
  out.y.assign(kTokens * kD, 0.0);
  std::vector<double> count(E, 0.0), psum(E, 0.0);
  for (std::size_t t = 0; t < kTokens; ++t) {
    std::vector<double> p(E);
    double mx = -1e300, z = 0;
    for (std::size_t e = 0; e < E; ++e) {
      double l = 0;
      for (std::size_t c = 0; c < kD; ++c) l += double(x_at(t * kD + c)) * r.gate_value[c * E + e];
      p[e] = l;
      mx = std::max(mx, l);
    }
    for (double& v : p) z += (v = std::exp(v - mx));
    for (double& v : p) v /= z;
    std::vector<std::size_t> chosen;
    for (std::size_t j = 0; j < k; ++j) {
      std::size_t best = E;
      for (std::size_t e = 0; e < E; ++e)
        if (std::find(chosen.begin(), chosen.end(), e) == chosen.end() && (best == E || p[e] > p[best])) best = e;
      chosen.push_back(best);
    }
    double norm = 0;
    for (std::size_t e : chosen) norm += p[e];
    for (std::size_t e : chosen) {
      count[e] += 1;
      const double weight = renormalise ? p[e] / norm : p[e];
      std::vector<double> a(kF, 0.0);
      for (std::size_t f = 0; f < kF; ++f) {
        double h = 0;
        for (std::size_t c = 0; c < kD; ++c) h += double(x_at(t * kD + c)) * r.w1_value[(e * kD + c) * kF + f];
        a[f] = 0.5 * h * (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (h + 0.044715 * h * h * h)));
      }
      for (std::size_t c = 0; c < kD; ++c) {
        double o = 0;
        for (std::size_t f = 0; f < kF; ++f) o += a[f] * r.w2_value[(e * kF + f) * kD + c];
        out.y[t * kD + c] += weight * o;
      }
    }
    for (std::size_t e = 0; e < E; ++e) psum[e] += p[e];
  }
  for (std::size_t e = 0; e < E; ++e) out.aux += count[e] / double(k * kTokens) * psum[e] / double(kTokens);
  out.aux *= double(cfg.aux_loss_weight) * double(E);
  return out;
}

double rel_err(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return a.size() == b.size() ? std::sqrt(num) / std::max(std::sqrt(den), 1e-30) : 1e30;
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

TEST_CASE("MoE forward and load-balancing loss equal a naive per-token loop (EP = 1, 2, 4)",
          "[train][moe][reference]") {
  // Tolerance: ||y - y_naive||_2 <= 1e-5 ||y_naive||_2; aux within 1e-5 relative.
  for (std::size_t experts : {std::size_t(4), std::size_t(8)})
    for (std::size_t k : {std::size_t(1), std::size_t(2), std::size_t(3)})
      for (int ep : {1, 2, 4}) {
        DYNAMIC_SECTION("experts=" << experts << " top_k=" << k << " EP=" << ep) {
          const auto cfg = config(experts, k, 0.0);
          const Result got = run(ep, cfg);
          const Naive want = naive_moe(got, cfg);
          CHECK(rel_err(got.y, want.y) <= 1e-5);
          CHECK(got.aux == Approx(want.aux).epsilon(1e-5));
          // the reference tells the documented combine (gate probabilities as they are) from a
          // renormalised one, so a change of rule would show
          if (k > 1) CHECK(rel_err(got.y, naive_moe(got, cfg, true).y) > 1e-2);
        }
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
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(run(1, config(4, 5, 0.0)),  // top_k above the expert count
                    Contains("rank 0") && Contains("top_k = 5") && Contains("number of experts (4)"));
  CHECK_THROWS_WITH(run(4, config(6, 1, 0.0)),  // 6 experts over 4 ranks
                    Contains("6 experts do not divide over the 4 ranks") && Contains("multiple of the expert axis"));
}

TEST_CASE("MoE backward matches finite differences of sum(y * dy) + aux", "[train][moe]") {
  auto cfg = config(4, 2, 0.0);
  cfg.aux_loss_weight = 5.0f;  // large enough that a wrong auxiliary gradient shows above the tolerance
  struct Pair {
    std::string what;
    double analytic, numeric;
  };
  std::vector<Pair> pairs;  // filled by the rank, checked on the main thread (Catch2 is not thread-safe)
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
    for (std::size_t i : {std::size_t(0), std::size_t(7), std::size_t(23)})
      pairs.push_back({"gate " + std::to_string(i), moe.gate().grad[i], fd(moe.gate().value[i])});
    for (std::size_t i : {std::size_t(3), std::size_t(77), std::size_t(200)}) {
      pairs.push_back({"w1 " + std::to_string(i), moe.w1().grad[i], fd(moe.w1().value[i])});
      pairs.push_back({"w2 " + std::to_string(i), moe.w2().grad[i], fd(moe.w2().value[i])});
    }
    for (std::size_t i : {std::size_t(1), std::size_t(50)})
      pairs.push_back({"x " + std::to_string(i), dx[i], fd(x[i])});
  });
  REQUIRE(pairs.size() == 11);
  for (const Pair& p : pairs) {
    INFO(p.what);
    CHECK(p.analytic == Approx(p.numeric).margin(2e-3).epsilon(2e-2));
  }
}

TEST_CASE("Gradient norm with experts over the expert axis equals one rank", "[train][moe][clip]") {
  const auto cfg = config(4, 2, 0.0);
  double want = 0.0;
  for (int ep : {1, 2, 4}) {
    std::mutex mu;
    std::vector<double> norms, local_norms;
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
      local_norms.push_back(local_only);
    });
    REQUIRE(norms.size() == std::size_t(ep));
    if (ep == 1) want = norms[0];
    for (std::size_t i = 0; i < norms.size(); ++i) {
      CHECK(norms[i] == Approx(want).epsilon(1e-5));
      if (ep > 1) CHECK(local_norms[i] < norms[i]);  // without the expert group the other ranks' experts are missing
    }
  }
}

TEST_CASE("MoE under Autocast(bf16): the experts' GEMMs take bf16 operands; EP = 2, 4 reproduce one rank",
          "[train][moe][autocast]") {
  // Against the fp32 run: ||bf16 - fp32||_2 <= 1e-2 ||fp32||_2 for the output, the input gradient and the
  // expert weights' gradients (each GEMM operand rounded to 8 significant bits, 2^-9 relative, summed in
  // fp32), and the difference is there (> 1e-5: the operands were rounded). The gate's product and the
  // routing stay fp32, so every layout routes every token as the fp32 run does; the layouts agree with the
  // single-rank bf16 run as closely as in fp32.
  auto rel = [](const std::vector<float>& a, const std::vector<float>& b) {
    return rel_err(a, std::vector<double>(b.begin(), b.end()));
  };
  const auto cfg = config(4, 2, 0.0);
  const Result fp32 = run(1, cfg), ref = run(1, cfg, nn::ComputeType::bf16);
  CHECK(ref.dropped == 0);
  for (const auto& [got, want, what] : {std::tuple{&ref.y, &fp32.y, "y"},
                                        {&ref.dx, &fp32.dx, "dx"},
                                        {&ref.w1_grad, &fp32.w1_grad, "w1.grad"},
                                        {&ref.w2_grad, &fp32.w2_grad, "w2.grad"}}) {
    INFO(what << ": relative difference to fp32 " << rel(*got, *want));
    CHECK(rel(*got, *want) <= 1e-2);
    CHECK(rel(*got, *want) > 1e-5);
  }
  CHECK(ref.aux == Approx(fp32.aux).epsilon(1e-6));  // the gate and the routing stayed fp32
  for (int ep : {2, 4}) {
    DYNAMIC_SECTION("EP=" << ep) {
      const Result got = run(ep, cfg, nn::ComputeType::bf16);
      check_close(got.y, ref.y, "y");
      check_close(got.dx, ref.dx, "dx");
      check_close(got.gate_grad, ref.gate_grad, "gate.grad");
      check_close(got.w1_grad, ref.w1_grad, "w1.grad");
      check_close(got.w2_grad, ref.w2_grad, "w2.grad");
    }
  }
}

namespace {
/**
 * One run on an ep x etp mesh: the experts over the expert axis, each expert's d_ff split over the etp tensor ranks
 * (which route the same tokens: an expert rank's tokens are the same on all its tensor ranks). Results in global
 * coordinates, each weight gradient put together from the ranks' boxes; `norm` is the gradient norm every rank
 * computed (the largest difference between ranks in `norm_spread`).
 */
struct MeshResult {
  Result r;
  double norm = 0, norm_spread = 0;
  std::size_t local_ff = 0;
};
MeshResult run_mesh(int ep, int etp, const parallel::MoeConfig& cfg, nn::ComputeType type = nn::ComputeType::fp32) {
  MeshResult out;
  Result& res = out.r;
  res.y.resize(kTokens * kD);
  res.dx.resize(kTokens * kD);
  res.gate_grad.resize(kD * cfg.experts);
  res.w1_grad.resize(cfg.experts * kD * kF);
  res.w2_grad.resize(cfg.experts * kF * kD);
  std::vector<double> norms;
  std::mutex mu;
  const DynamicMesh mesh(std::size_t(etp), std::size_t(1), std::size_t(1), std::size_t(ep));
  run_threads(ep * etp, [&](ThreadsCommunicator& world) {
    auto comms = make_mesh_comms(world, mesh);
    parallel::MoeMlp<ThreadsCommunicator> moe(cfg, comms.expert, "moe", nullptr, &comms.tensor);
    const std::size_t local = kTokens / std::size_t(ep), first = local * std::size_t(comms.expert.rank());
    nn::Act<Replicate> xt(nn::Activation({local, kD})), dyt(nn::Activation({local, kD}));
    for (std::size_t i = 0; i < local * kD; ++i) {
      xt.data()[i] = x_at(first * kD + i);
      dyt.data()[i] = dy_at(first * kD + i);
    }
    nn::Autocast scope(type);
    const nn::Act<Replicate> yt = moe.forward(xt);
    const nn::Act<Replicate> dxt = moe.backward(dyt, 1.0f);
    comms.expert.all_reduce(std::span<float>(moe.gate().grad), ReduceOp::sum);  // as data parallelism would
    auto ps = moe.parameters();
    const double n = optim::grad_norm(ps, comms.tensor, comms.pipeline, comms.expert);
    std::lock_guard l(mu);
    norms.push_back(n);
    out.local_ff = moe.local_ff();
    if (comms.tensor.rank() == 0) {
      std::copy(yt.data(), yt.data() + yt.size(), res.y.begin() + std::ptrdiff_t(first * kD));
      std::copy(dxt.data(), dxt.data() + dxt.size(), res.dx.begin() + std::ptrdiff_t(first * kD));
      res.gate_grad.assign(moe.gate().grad.begin(), moe.gate().grad.end());
    }
    // w1 [E, d, f] holds box (experts, all d, f slice); w2 [E, f, d] holds (experts, f slice, all d).
    const auto& b1 = moe.w1().local_box;
    for (std::size_t e = 0; e < b1[0].extent; ++e)
      for (std::size_t c = 0; c < kD; ++c)
        for (std::size_t j = 0; j < b1[2].extent; ++j)
          res.w1_grad[((b1[0].offset + e) * kD + c) * kF + b1[2].offset + j] =
              moe.w1().grad[(e * kD + c) * b1[2].extent + j];
    const auto& b2 = moe.w2().local_box;
    for (std::size_t e = 0; e < b2[0].extent; ++e)
      for (std::size_t j = 0; j < b2[1].extent; ++j)
        for (std::size_t c = 0; c < kD; ++c)
          res.w2_grad[((b2[0].offset + e) * kF + b2[1].offset + j) * kD + c] =
              moe.w2().grad[(e * b2[1].extent + j) * kD + c];
  });
  out.norm = norms[0];
  for (const double n : norms) out.norm_spread = std::max(out.norm_spread, std::abs(n - norms[0]));
  return out;
}
}  // namespace

TEST_CASE("MoE with each expert split over the tensor ranks (expert tensor parallelism) equals one rank",
          "[train][moe][etp]") {
  const auto cfg = config(4, 2, 0.0);
  for (const auto type : {nn::ComputeType::fp32, nn::ComputeType::bf16}) {
    const MeshResult ref = run_mesh(1, 1, cfg, type);
    REQUIRE(ref.local_ff == kF);
    for (const auto& [ep, etp] : {std::pair{1, 2}, std::pair{2, 2}, std::pair{1, 5}, std::pair{2, 5}}) {
      DYNAMIC_SECTION((type == nn::ComputeType::fp32 ? "fp32" : "bf16") << " EP=" << ep << " etp=" << etp) {
        const MeshResult got = run_mesh(ep, etp, cfg, type);
        CHECK(got.local_ff == kF / std::size_t(etp));  // each rank keeps its slice of every expert
        check_close(got.r.y, ref.r.y, "y");
        check_close(got.r.dx, ref.r.dx, "dx");
        check_close(got.r.gate_grad, ref.r.gate_grad, "gate.grad");
        check_close(got.r.w1_grad, ref.r.w1_grad, "w1.grad");
        check_close(got.r.w2_grad, ref.r.w2_grad, "w2.grad");
        CHECK(got.norm == Approx(ref.norm).epsilon(1e-5));  // each slice counted once, on its own tensor rank
        CHECK(got.norm_spread <= 1e-9 * ref.norm);
      }
    }
  }
}

TEST_CASE("MoE: an expert width that does not split over the expert tensor group is refused, naming the fix",
          "[train][moe][etp]") {
  const auto cfg = config(4, 2, 0.0);  // d_ff = 10
  std::vector<std::string> errors(3);
  run_threads(3, [&](ThreadsCommunicator& tp) {
    auto solo = tp.split(tp.rank(), 0);
    try {
      parallel::MoeMlp<ThreadsCommunicator> moe(cfg, solo, "moe", nullptr, &tp);
    } catch (const std::exception& e) {
      errors[std::size_t(tp.rank())] = e.what();  // each rank writes its own slot
    }
  });
  for (const auto& e : errors) {
    CHECK_THAT(e, Catch::Contains("d_ff = 10") && Catch::Contains("does not split over the 3 ranks") &&
                      Catch::Contains("multiple of 3"));
  }
}
