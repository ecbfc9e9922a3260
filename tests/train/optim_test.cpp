// Optimizers, schedules, clipping and loss scaling on one rank, against hand-computed updates.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "adamw_by_hand.hpp"
#include "mpar/optim.hpp"
#include "vector_parameter.hpp"

using namespace mpar;

namespace {
nn::Parameter make_param(std::string name, std::vector<float> value, std::vector<float> grad, bool sharded = false) {
  return testing::vector_parameter(std::move(name), value, grad, sharded);
}
}  // namespace

TEST_CASE("SGD with momentum matches hand-computed updates", "[train][optim]") {
  auto p = make_param("w", {1.0f, -2.0f}, {0.5f, 1.0f});
  optim::Sgd sgd({&p}, {.lr = 0.1f, .momentum = 0.9f});
  sgd.step();
  // step 1: buf = g, w -= lr * g
  CHECK(p.value[0] == Approx(0.95f));
  CHECK(p.value[1] == Approx(-2.1f));
  sgd.step();
  // step 2: buf = 0.9 * g + g = 1.9 g
  CHECK(p.value[0] == Approx(0.95 - 0.1 * 0.95));
  CHECK(p.value[1] == Approx(-2.1 - 0.1 * 1.9));
  CHECK(sgd.momentum_buffer(0)[0] == Approx(0.95f));

  SECTION("weight decay and Nesterov") {
    auto q = make_param("q", {2.0f}, {1.0f});
    optim::Sgd n({&q}, {.lr = 0.5f, .momentum = 0.5f, .weight_decay = 0.1f, .nesterov = true});
    n.step();  // d = 1 + 0.2 = 1.2; buf = 1.2; step = 1.2 + 0.5 * 1.2 = 1.8; w = 2 - 0.9
    CHECK(q.value[0] == Approx(1.1f));
    n.step();  // d = 1 + 0.11 = 1.11; buf = 0.6 + 1.11 = 1.71; step = 1.11 + 0.855 = 1.965; w = 1.1 - 0.9825
    CHECK(q.value[0] == Approx(0.1175f));
  }
  SECTION("plain SGD without momentum") {
    auto q = make_param("q", {2.0f}, {1.0f});
    optim::Sgd n({&q}, {.lr = 0.5f, .momentum = 0.0f});
    n.step();
    n.step();
    CHECK(q.value[0] == Approx(1.0f));
  }
}

TEST_CASE("AdamW matches hand-computed updates with bias correction and decoupled decay", "[train][optim]") {
  auto p = make_param("w", {1.0f}, {0.5f});
  optim::AdamW adam({&p}, {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f});
  adam.step();
  // step 1: mhat = g, vhat = g^2, so the update is lr * sign(g); decay multiplies w by 1 - 0.001 first
  CHECK(p.value[0] == Approx(0.999 - 0.1).epsilon(1e-6));
  p.grad[0] = 0.25f;
  adam.step();
  // step 2 by hand: m = 0.07, v = 0.00031225, mhat = 0.07/0.19, vhat = 0.00031225/0.001999
  const double mhat = 0.07 / 0.19, vhat = 0.00031225 / (1.0 - 0.999 * 0.999);
  CHECK(adam.first_moment(0)[0] == Approx(0.07).epsilon(1e-6));
  CHECK(adam.second_moment(0)[0] == Approx(0.00031225).epsilon(1e-4));  // 1 - 0.999f is 1e-5 off in float
  CHECK(p.value[0] == Approx(0.899 * 0.999 - 0.1 * mhat / (std::sqrt(vhat) + 1e-8)).epsilon(1e-5));

  SECTION("parameters excluded from decay") {
    auto bias = make_param("b", {1.0f}, {0.0f});
    optim::AdamW a2({&bias},
                    {.lr = 0.1f, .weight_decay = 0.5f, .decays = [](const nn::Parameter& q) { return q.name != "b"; }});
    a2.step();  // zero gradient and no decay: the value does not move
    CHECK(bias.value[0] == 1.0f);
  }
  SECTION("many steps against a double-precision reference") {
    auto q = make_param("q", {0.3f, -0.7f, 1.5f}, {0, 0, 0});
    optim::AdamWConfig cfg{.lr = 0.01f, .beta1 = 0.8f, .beta2 = 0.95f, .eps = 1e-6f, .weight_decay = 0.1f};
    optim::AdamW a({&q}, cfg);
    std::vector<double> w{0.3, -0.7, 1.5}, m(3, 0.0), v(3, 0.0);
    for (int t = 1; t <= 10; ++t) {
      for (std::size_t i = 0; i < 3; ++i) q.grad[i] = float(std::sin(double(t * 3 + int(i))));
      a.step();
      for (std::size_t i = 0; i < 3; ++i) {
        const double g = double(q.grad[i]);
        m[i] = 0.8 * m[i] + 0.2 * g;
        v[i] = 0.95 * v[i] + 0.05 * g * g;
        w[i] = w[i] * (1 - 0.01 * 0.1) -
               0.01 * (m[i] / (1 - std::pow(0.8, t))) / (std::sqrt(v[i] / (1 - std::pow(0.95, t))) + 1e-6);
      }
    }
    for (std::size_t i = 0; i < 3; ++i) CHECK(q.value[i] == Approx(w[i]).epsilon(1e-5));
  }
}

namespace {
/** The host backend, counting the optimizer operations routed through it (one `run` sees every operation object). */
struct CountingBackend : HostBackend {
  static inline int adamw_calls = 0, sgd_calls = 0, sum_squares_calls = 0, scale_calls = 0;
  template <class Op>
    requires supports<HostBackend, Op>
  static void run(const Op& op) {
    if constexpr (std::is_same_v<Op, ops::adamw_update>) ++adamw_calls;
    if constexpr (std::is_same_v<Op, ops::sgd_update>) ++sgd_calls;
    if constexpr (std::is_same_v<Op, ops::sum_squares>) ++sum_squares_calls;
    if constexpr (std::is_same_v<Op, ops::scale>) ++scale_calls;
    HostBackend::run(op);
  }
};
static_assert(backend<CountingBackend>);

/** Host memory that counts the bytes it hands out, to see where optimizer states live. */
class CountingResource final : public MemoryResource {
 public:
  [[nodiscard]] void* allocate(std::size_t bytes) override {
    allocated += bytes;
    return ::operator new(bytes ? bytes : 1);
  }
  void deallocate(void* p, std::size_t) noexcept override { ::operator delete(p); }
  [[nodiscard]] const char* name() const noexcept override { return "counting"; }
  std::size_t allocated = 0;
};

std::vector<float> wave(std::size_t n, int phase, float amplitude) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = amplitude * float(std::sin(0.37 * double(i) + 1.3 * phase));
  return v;
}
}  // namespace

TEST_CASE("AdamW and SGD step through the backend's optimizer operations and equal the float formula bit for bit",
          "[train][optim][backend]") {
  const std::size_t n = 37;
  CountingResource rank_memory;

  SECTION("AdamW: moments in the rank's memory, every step one adamw_update per parameter") {
    auto p = make_param("w", wave(n, 0, 1.0f), std::vector<float>(n, 0.0f));
    auto b = make_param("b", wave(3, 5, 0.5f), std::vector<float>(3, 0.0f));
    const optim::AdamWConfig cfg{.lr = 0.02f,
                                 .beta1 = 0.85f,
                                 .beta2 = 0.97f,
                                 .eps = 1e-7f,
                                 .weight_decay = 0.2f,
                                 .decays = [](const nn::Parameter& q) { return q.name != "b"; }};
    std::size_t before = 0;
    std::optional<optim::AdamW<CountingBackend>> adam;
    {
      ScopedMemoryResource scope(rank_memory);
      adam.emplace(std::vector<nn::Parameter*>{&p, &b}, cfg);
      before = rank_memory.allocated;
    }
    CHECK(before >= 2 * (n + 3) * sizeof(float));  // both moments of both parameters
    std::vector<float> w(p.value.begin(), p.value.end()), m(n, 0.0f), v(n, 0.0f);
    CountingBackend::adamw_calls = 0;
    for (int t = 1; t <= 6; ++t) {
      const auto g = wave(n, t, 0.3f);
      std::copy(g.begin(), g.end(), p.grad.begin());
      const float gs = t % 2 ? 1.0f : 0.5f, lr = 0.02f / float(t);
      adam->step(lr, gs);
      testing::adamw_by_hand(w, g, m, v, cfg, t, lr, gs, 0.2f);
      for (std::size_t i = 0; i < n; ++i) {
        INFO("step " << t << " element " << i);
        REQUIRE(p.value[i] == w[i]);
        REQUIRE(adam->first_moment(0)[i] == m[i]);
        REQUIRE(adam->second_moment(0)[i] == v[i]);
      }
    }
    CHECK(CountingBackend::adamw_calls == 12);
    // Through the default host backend the same steps give the same bits.
    auto q = make_param("w", wave(n, 0, 1.0f), std::vector<float>(n, 0.0f));
    optim::AdamW plain({&q}, cfg);
    for (int t = 1; t <= 6; ++t) {
      const auto g = wave(n, t, 0.3f);
      std::copy(g.begin(), g.end(), q.grad.begin());
      plain.step(0.02f / float(t), t % 2 ? 1.0f : 0.5f);
    }
    CHECK(std::vector<float>(q.value.begin(), q.value.end()) == w);
  }

  SECTION("SGD: momentum buffer in the rank's memory, plain and Nesterov momentum with decay and dampening") {
    for (const bool nesterov : {false, true}) {
      const optim::SgdConfig cfg{.lr = 0.05f,
                                 .momentum = 0.8f,
                                 .dampening = nesterov ? 0.0f : 0.25f,
                                 .weight_decay = 0.01f,
                                 .nesterov = nesterov};
      auto p = make_param("w", wave(n, 2, 1.0f), std::vector<float>(n, 0.0f));
      const std::size_t start = rank_memory.allocated;
      std::optional<optim::Sgd<CountingBackend>> sgd;
      {
        ScopedMemoryResource scope(rank_memory);
        sgd.emplace(std::vector<nn::Parameter*>{&p}, cfg);
      }
      CHECK(rank_memory.allocated - start >= n * sizeof(float));
      std::vector<float> w(p.value.begin(), p.value.end()), buf(n, 0.0f);
      CountingBackend::sgd_calls = 0;
      for (int t = 0; t < 5; ++t) {
        const auto g = wave(n, 10 + t, 0.4f);
        std::copy(g.begin(), g.end(), p.grad.begin());
        sgd->step(0.05f, 0.75f);
        for (std::size_t i = 0; i < n; ++i) {
          float d = g[i] * 0.75f + 0.01f * w[i];
          buf[i] = t == 0 ? d : 0.8f * buf[i] + (1.0f - cfg.dampening) * d;
          d = nesterov ? d + 0.8f * buf[i] : buf[i];
          w[i] -= 0.05f * d;
        }
        INFO("nesterov " << nesterov << " step " << t);
        REQUIRE(std::vector<float>(p.value.begin(), p.value.end()) == w);
        REQUIRE(std::vector<float>(sgd->momentum_buffer(0).begin(), sgd->momentum_buffer(0).end()) == buf);
      }
      CHECK(CountingBackend::sgd_calls == 5);
    }
  }

  SECTION("gradient norm and scaling: sum_squares and scale per parameter, the double sum to its rounding") {
    auto a = make_param("a", {0, 0, 0}, {0.1f, -0.2f, 0.3f});
    auto b = make_param("b", {0, 0}, {1e-3f, 7.0f}, true);
    std::vector<nn::Parameter*> ps{&a, &b};
    double want = 0.0;
    for (const auto* q : ps)
      for (float g : q->grad) want += double(g) * double(g);
    CountingBackend::sum_squares_calls = CountingBackend::scale_calls = 0;
    // The host sums in another order than this loop (partial sums, docs of host::sum_squares): equal to
    // the double sum's rounding, not to its bits.
    const double counted = optim::grad_norm<CountingBackend>(ps);
    CHECK(counted == Approx(std::sqrt(want)).epsilon(1e-15));
    CHECK(CountingBackend::sum_squares_calls == 2);
    CHECK(optim::grad_norm(ps) == counted);  // the default backend: the same bits
    const double norm = optim::clip_grad_norm<CountingBackend>(ps, 1.0);
    CHECK(norm == std::sqrt(want));
    CHECK(CountingBackend::scale_calls == 2);
    const float coef = optim::clip_coefficient(std::sqrt(want), 1.0);
    CHECK(a.grad[2] == 0.3f * coef);
    CHECK(b.grad[1] == 7.0f * coef);
  }
}

TEST_CASE("Warm-up and cosine decay give the documented values", "[train][optim]") {
  optim::WarmupCosine s(1.0, 0.1, 4, 14);
  CHECK(s(0) == Approx(0.25));
  CHECK(s(1) == Approx(0.5));
  CHECK(s(3) == Approx(1.0));
  CHECK(s(4) == Approx(1.0));                                           // decay starts at the peak
  CHECK(s(9) == Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.5))));  // half way: the midpoint 0.55
  CHECK(s(9) == Approx(0.55));
  CHECK(s(14) == Approx(0.1));
  CHECK(s(100) == Approx(0.1));
  for (std::size_t t = 4; t < 14; ++t) CHECK(s(t + 1) <= s(t));
  CHECK_THROWS_WITH(optim::WarmupCosine(1.0, 2.0, 0, 10),
                    Catch::Contains("WarmupCosine") && Catch::Contains("min_lr (2)") && Catch::Contains("peak_lr (1)"));
  CHECK_THROWS_WITH(optim::WarmupCosine(1.0, 0.0, 10, 5),
                    Catch::Contains("total_steps (5)") && Catch::Contains("at least warmup_steps (10)"));
}

TEST_CASE("Clipping by the global norm on one rank", "[train][optim]") {
  auto a = make_param("a", {0, 0}, {3.0f, 0.0f});
  auto b = make_param("b", {0}, {4.0f}, true);
  std::vector<nn::Parameter*> ps{&a, &b};
  CHECK(optim::grad_norm(ps) == Approx(5.0));
  const double n = optim::clip_grad_norm(ps, 1.0);
  CHECK(n == Approx(5.0));
  CHECK(a.grad[0] == Approx(0.6f));
  CHECK(b.grad[0] == Approx(0.8f));
  CHECK(optim::clip_grad_norm(ps, 10.0) == Approx(1.0));  // below the bound: untouched
  CHECK(b.grad[0] == Approx(0.8f));
  CHECK(optim::clip_coefficient(std::numeric_limits<double>::infinity(), 1.0) == 1.0f);
}

TEST_CASE("Dynamic loss scaler skips, lowers and raises", "[train][optim]") {
  optim::DynamicLossScaler s({.initial_scale = 1024.0f, .growth_interval = 3});
  auto p = make_param("w", {1.0f}, {2048.0f});
  std::vector<nn::Parameter*> ps{&p};
  CHECK(s.scale_loss(0.5f) == 512.0f);
  bool ok = s.unscale_and_check(ps);
  CHECK(ok);
  CHECK(p.grad[0] == 2.0f);
  s.update(ok);
  p.grad[0] = std::numeric_limits<float>::infinity();
  ok = s.unscale_and_check(ps);
  CHECK_FALSE(ok);
  s.update(ok);
  CHECK(s.scale() == 512.0f);
  CHECK(s.skipped_steps() == 1);
  p.grad[0] = std::numeric_limits<float>::quiet_NaN();
  CHECK_FALSE(s.unscale_and_check(ps));
  for (int i = 0; i < 3; ++i) s.update(true);
  CHECK(s.scale() == 1024.0f);  // three good steps in a row: doubled
  s.update(true);
  CHECK(s.scale() == 1024.0f);
  optim::DynamicLossScaler low({.initial_scale = 1.0f});
  low.update(false);
  CHECK(low.scale() == 1.0f);  // clamped at min_scale
}
