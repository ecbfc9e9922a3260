// The backends' MoE routing operation `moe_route` against a naive model of its rules: sorts and lists
// instead of the reference's sweeps and counters, on inputs with ties, NaN and capacity overflow.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mpar/backend/host/host_backend.hpp>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

namespace {

struct Routing {
  std::vector<std::int32_t> choice, route, route_token, used;
  std::vector<std::uint8_t> accepted;
  std::vector<float> route_weight;
  std::int32_t routed = 0;
};

/** The rules as sorts: stable order by probability (NaN last), then priority lists, then a sorted route. */
Routing naive(std::size_t T, std::size_t E, std::size_t k, std::size_t cap, const std::vector<float>& probs) {
  Routing r;
  r.choice.resize(T * k);
  for (std::size_t t = 0; t < T; ++t) {
    std::vector<std::size_t> ex(E);
    std::iota(ex.begin(), ex.end(), std::size_t(0));
    auto key = [&](std::size_t e) {
      const float p = probs[t * E + e];
      return std::isnan(p) ? -std::numeric_limits<float>::infinity() : p;
    };
    std::stable_sort(ex.begin(), ex.end(), [&](std::size_t a, std::size_t b) { return key(a) > key(b); });
    for (std::size_t j = 0; j < k; ++j) r.choice[t * k + j] = std::int32_t(ex[j]);
  }
  // priority list: (j, t) lexicographic; an expert takes the first `cap` of its entries
  std::vector<std::vector<std::size_t>> takes(E);
  for (std::size_t j = 0; j < k; ++j)
    for (std::size_t t = 0; t < T; ++t) takes[std::size_t(r.choice[t * k + j])].push_back(t * k + j);
  r.accepted.assign(T * k, 0);
  r.used.assign(E, 0);
  std::vector<std::tuple<std::size_t, std::size_t>> routed;  // (expert, assignment)
  for (std::size_t e = 0; e < E; ++e)
    for (std::size_t i = 0; i < takes[e].size() && i < cap; ++i) {
      r.accepted[takes[e][i]] = 1;
      ++r.used[e];
      routed.emplace_back(e, takes[e][i]);
    }
  std::sort(routed.begin(), routed.end());  // by expert, then assignment (= token, as one token picks e once)
  r.routed = std::int32_t(routed.size());
  for (auto [e, a] : routed) {
    r.route.push_back(std::int32_t(a));
    r.route_token.push_back(std::int32_t(a / k));
    r.route_weight.push_back(probs[a / k * E + e]);
  }
  for (std::size_t a = 0; a < T * k; ++a)
    if (!r.accepted[a]) {
      r.route.push_back(std::int32_t(a));
      r.route_token.push_back(-1);
      r.route_weight.push_back(0.0f);
    }
  return r;
}

template <class B>
Routing run(std::size_t T, std::size_t E, std::size_t k, std::size_t cap, const std::vector<float>& probs) {
  Routing r;
  r.choice.assign(T * k, -7);
  r.route.assign(T * k, -7);
  r.route_token.assign(T * k, -7);
  r.route_weight.assign(T * k, -7.0f);
  r.accepted.assign(T * k, 7);
  r.used.assign(E, -7);
  B::run(mpar::ops::moe_route{T, E, k, cap, probs.data(), r.choice.data(), r.accepted.data(), r.route.data(),
                              r.route_token.data(), r.route_weight.data(), r.used.data(), &r.routed});
  return r;
}

void check(std::size_t T, std::size_t E, std::size_t k, std::size_t cap, const std::vector<float>& probs) {
  const Routing want = naive(T, E, k, cap, probs), got = run<mpar::HostBackend>(T, E, k, cap, probs);
  CHECK(got.choice == want.choice);
  CHECK(got.accepted == want.accepted);
  CHECK(got.used == want.used);
  CHECK(got.routed == want.routed);
  CHECK(got.route == want.route);
  CHECK(got.route_token == want.route_token);
  // copies of probabilities: exact, a NaN probability copied as NaN
  REQUIRE(got.route_weight.size() == want.route_weight.size());
  for (std::size_t i = 0; i < want.route_weight.size(); ++i) {
    INFO("route_weight[" << i << "]");
    CHECK((got.route_weight[i] == want.route_weight[i] ||
           (std::isnan(got.route_weight[i]) && std::isnan(want.route_weight[i]))));
  }
}

/** Probabilities drawn from `levels` distinct values, so ties are common. */
std::vector<float> tied_probs(std::size_t T, std::size_t E, int levels, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(1, levels);
  std::vector<float> p(T * E);
  for (auto& v : p) v = float(pick(rng)) / float(levels);
  return p;
}

}  // namespace

TEST_CASE("moe_route: top-k, capacity and routing order as the naive rules", "[backend][moe]") {
  SECTION("ties everywhere, capacity overflow of second choices") { check(40, 8, 2, 12, tied_probs(40, 8, 3, 1)); }
  SECTION("tight capacity: first choices dropped too") { check(64, 4, 1, 5, tied_probs(64, 4, 2, 2)); }
  SECTION("all probabilities equal: every token picks experts 0..k-1") {
    const std::vector<float> p(10 * 6, 0.25f);
    check(10, 6, 3, 4, p);
    const Routing r = run<mpar::HostBackend>(10, 6, 3, 4, p);
    CHECK(r.used == std::vector<std::int32_t>{4, 4, 4, 0, 0, 0});
    CHECK(r.routed == 12);
  }
  SECTION("capacity zero drops everything") {
    const Routing r = run<mpar::HostBackend>(5, 3, 2, 0, tied_probs(5, 3, 4, 3));
    CHECK(r.routed == 0);
    CHECK(r.used == std::vector<std::int32_t>{0, 0, 0});
    check(5, 3, 2, 0, tied_probs(5, 3, 4, 3));
  }
  SECTION("no limit (capacity = tokens): nothing dropped") {
    check(33, 5, 2, 33, tied_probs(33, 5, 7, 4));
    CHECK(run<mpar::HostBackend>(33, 5, 2, 33, tied_probs(33, 5, 7, 4)).routed == 66);
  }
  SECTION("top-k = experts: every expert once per token") { check(9, 4, 4, 6, tied_probs(9, 4, 2, 5)); }
  SECTION("NaN ranks last but still yields k distinct experts") {
    std::vector<float> p = tied_probs(12, 5, 3, 6);
    p[0] = p[7] = p[8] = std::numeric_limits<float>::quiet_NaN();
    for (std::size_t e = 0; e < 5; ++e) p[3 * 5 + e] = std::numeric_limits<float>::quiet_NaN();
    check(12, 5, 3, 7, p);
    const Routing r = run<mpar::HostBackend>(12, 5, 3, 7, p);
    CHECK(r.choice[3 * 3 + 0] == 0);  // all NaN: indices ascending
    CHECK(r.choice[3 * 3 + 2] == 2);
  }
  SECTION("random probabilities, no ties") {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    std::vector<float> p(200 * 16);
    for (auto& v : p) v = u(rng);
    check(200, 16, 2, 30, p);
  }
  SECTION("no tokens") { check(0, 4, 2, 3, {}); }
}

TEST_CASE("moe_gate_stats, moe_aux_loss: the load-balancing statistics and the Switch loss", "[backend][moe]") {
  const std::size_t T = 30, E = 6, k = 2, cap = 7;
  const std::vector<float> p = tied_probs(T, E, 4, 8);
  const Routing r = run<mpar::HostBackend>(T, E, k, cap, p);
  std::vector<float> stats(2 * E + 2, -1.0f);
  mpar::HostBackend::run(mpar::ops::moe_gate_stats{T, E, k, p.data(), r.choice.data(), &r.routed, stats.data()});
  for (std::size_t e = 0; e < E; ++e) {
    INFO("expert " << e);
    CHECK(stats[e] == float(std::count(r.choice.begin(), r.choice.end(), std::int32_t(e))));
    float sum = 0.0f;
    for (std::size_t t = 0; t < T; ++t) sum += p[t * E + e];
    CHECK(stats[E + e] == sum);
  }
  CHECK(stats[2 * E] == float(T));
  CHECK(stats[2 * E + 1] == float(T * k - std::size_t(r.routed)));
  CHECK(stats[2 * E + 1] > 0.0f);  // the capacity dropped some

  // By hand: 4 tokens, top-1 of 2, counts {3, 1}, probability sums {2.5, 1.5}: f = {3/4, 1/4}, P = {5/8, 3/8},
  // aux = 0.1 * 2 * (15/32 + 3/32) = 0.1125.
  const std::vector<float> hand{3.0f, 1.0f, 2.5f, 1.5f, 4.0f, 0.0f};
  float aux = -1.0f;
  mpar::HostBackend::run(mpar::ops::moe_aux_loss{2, 1, 0.1f, hand.data(), &aux});
  CHECK(aux == Approx(0.1125f).epsilon(1e-6));
  const std::vector<float> none(6, 0.0f);  // no tokens in the group: no loss
  mpar::HostBackend::run(mpar::ops::moe_aux_loss{2, 1, 0.1f, none.data(), &aux});
  CHECK(aux == 0.0f);
}

TEST_CASE("moe_slots and moe_gate_backward: the capacity-bounded exchange's slots and the gate gradient",
          "[backend][moe]") {
  const std::size_t T = 25, E = 5, k = 2, cap = 6;
  const std::vector<float> p = tied_probs(T, E, 3, 9);
  const Routing r = run<mpar::HostBackend>(T, E, k, cap, p);
  std::vector<std::int32_t> slot_token(E * cap, -7);
  std::vector<float> slot_weight(E * cap, -7.0f);
  mpar::HostBackend::run(mpar::ops::moe_slots{E, cap, r.used.data(), r.route_token.data(), r.route_weight.data(),
                                              slot_token.data(), slot_weight.data()});
  // naive: expert e's slots list the tokens whose accepted assignment chose e, ascending, then empty ones
  for (std::size_t e = 0; e < E; ++e) {
    std::vector<std::int32_t> want_t;
    std::vector<float> want_w;
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t j = 0; j < k; ++j)
        if (r.accepted[t * k + j] && std::size_t(r.choice[t * k + j]) == e) {
          want_t.push_back(std::int32_t(t));
          want_w.push_back(p[t * E + e]);
        }
    want_t.resize(cap, -1);
    want_w.resize(cap, 0.0f);
    INFO("expert " << e);
    CHECK(std::vector<std::int32_t>(slot_token.begin() + std::ptrdiff_t(e * cap),
                                    slot_token.begin() + std::ptrdiff_t((e + 1) * cap)) == want_t);
    CHECK(std::vector<float>(slot_weight.begin() + std::ptrdiff_t(e * cap),
                             slot_weight.begin() + std::ptrdiff_t((e + 1) * cap)) == want_w);
  }
  CHECK(std::count(slot_token.begin(), slot_token.end(), -1) == std::ptrdiff_t(E * cap) - r.routed);

  // gate gradient: each filled slot's dot at (token, its expert), plus alpha E f_e aux_grad / G everywhere
  std::vector<float> stats(2 * E + 2);
  mpar::HostBackend::run(mpar::ops::moe_gate_stats{T, E, k, p.data(), r.choice.data(), &r.routed, stats.data()});
  std::vector<float> dot(E * cap);
  for (std::size_t s = 0; s < dot.size(); ++s) dot[s] = 0.25f * float(s % 7) - 0.5f;
  const float aux_grad = 2.0f, alpha = 0.3f;
  std::vector<float> dprobs(T * E, -7.0f);
  mpar::HostBackend::run(mpar::ops::moe_gate_backward{T, E, k, cap, slot_token.data(), dot.data(), aux_grad, alpha,
                                                      stats.data(), dprobs.data()});
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t e = 0; e < E; ++e) {
      float want = 0.0f;
      for (std::size_t i = 0; i < cap; ++i)
        if (slot_token[e * cap + i] == std::int32_t(t)) want += dot[e * cap + i];
      want += aux_grad * alpha * float(E) * (stats[e] / (float(T) * float(k))) / float(T);
      INFO("token " << t << " expert " << e);
      CHECK(dprobs[t * E + e] == Approx(want).epsilon(1e-6).margin(1e-7));
    }
}

TEST_CASE("Row kernels: a negative index is an empty slot", "[backend][moe]") {
  const std::size_t d = 3;
  const std::vector<float> src{1, 2, 3, 4, 5, 6};  // two rows
  const std::vector<std::int32_t> index{1, -1, 0};
  std::vector<float> dst(3 * d, -7.0f);
  mpar::HostBackend::run(mpar::ops::gather_rows{3, d, index.data(), src.data(), dst.data()});
  CHECK(dst == std::vector<float>{4, 5, 6, 0, 0, 0, 1, 2, 3});
  std::vector<float> acc(2 * d, 1.0f);
  const std::vector<float> w{2.0f, 100.0f, 0.5f};
  mpar::HostBackend::run(mpar::ops::scatter_add_rows{3, d, index.data(), w.data(), dst.data(), acc.data()});
  CHECK(acc == std::vector<float>{1.5f, 2.0f, 2.5f, 9.0f, 11.0f, 13.0f});
  std::vector<float> rows(2 * d, -7.0f);
  mpar::HostBackend::run(mpar::ops::scatter_rows{3, d, index.data(), dst.data(), rows.data()});
  CHECK(rows == std::vector<float>{1, 2, 3, 4, 5, 6});
  std::vector<float> dsrc(3 * d, -7.0f), dots(3, -7.0f);
  mpar::HostBackend::run(mpar::ops::scatter_add_rows_backward{3, d, index.data(), w.data(), src.data(), dst.data(),
                                                              dsrc.data(), dots.data()});
  CHECK(dsrc == std::vector<float>{8, 10, 12, 0, 0, 0, 0.5f, 1.0f, 1.5f});
  CHECK(dots == std::vector<float>{4 * 4 + 5 * 5 + 6 * 6, 0.0f, 1 + 4 + 9});
}
