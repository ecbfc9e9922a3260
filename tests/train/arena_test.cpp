// The gradient arena (parallel/gradient_arena.hpp): a rank's gradients as consecutive slices of one
// allocation, zeroed by one backend operation, with the data-parallel buckets reduced in place on ranges
// of it — checked against a hand formula and against the copying path, bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <mpar/comm/threads.hpp>
#include <mpar/observe/counting_backend.hpp>
#include <mpar/optim/adamw.hpp>
#include <mpar/optim/sgd.hpp>
#include <mpar/parallel/data_parallel.hpp>
#include <mpar/parallel/gradient_arena.hpp>
#include <mpar/parallel/parameter_arena.hpp>

#include "adamw_by_hand.hpp"
#include "vector_parameter.hpp"

using namespace mpar;
using Counting = observe::CountingBackend<HostBackend>;

namespace {

std::vector<float> values(std::size_t n, float base) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = base + 0.1f * float(i) + 1.0f / 3.0f;
  return v;
}
std::vector<float> copy_of(const Buffer<float>& b) { return {b.begin(), b.end()}; }

}  // namespace

TEST_CASE(
    "gradient arena: gradients become consecutive slices in the given order, keep their values, zero in one operation",
    "[train][arena]") {
  auto a = testing::vector_parameter("a", values(3, 0), values(3, 1));
  auto b = testing::vector_parameter("b", values(2, 0), values(2, 2));
  auto c = testing::vector_parameter("c", values(4, 0), values(4, 3));
  parallel::GradientArena<Counting> arena({&c, &b, &a});  // the backward's order: the last parameter first
  REQUIRE(arena.size() == 9);
  CHECK(c.grad.data() == arena.data());
  CHECK(b.grad.data() == arena.data() + 4);
  CHECK(a.grad.data() == arena.data() + 6);
  CHECK(copy_of(a.grad) == values(3, 1));
  CHECK(copy_of(b.grad) == values(2, 2));
  CHECK(copy_of(c.grad) == values(4, 3));
  CHECK(arena.intact());

  // Accumulating into a gradient writes the arena (the layers' `grad.data()` is the slice).
  b.grad[1] += 5.0f;
  CHECK(arena.data()[5] == values(2, 2)[1] + 5.0f);

  const auto before = Counting::counts();
  arena.zero();
  const auto d = Counting::counts() - before;
  CHECK(d[observe::Op::zero] == 1);
  CHECK(d.total_launches() == 1);
  for (const auto* p : {&a, &b, &c})
    for (float g : p->grad) CHECK(g == 0.0f);
}

TEST_CASE(
    "gradient arena: a replaced gradient leaves it, a copied parameter owns its gradient, either may outlive the other",
    "[train][arena]") {
  auto a = testing::vector_parameter("a", values(3, 0), values(3, 1));
  auto b = testing::vector_parameter("b", values(2, 0), values(2, 2));
  {
    parallel::GradientArena<HostBackend> arena({&b, &a});
    const nn::Parameter copy = a;  // a checkpoint or reference copy: its own memory, the same values
    CHECK(copy.grad.data() != a.grad.data());
    CHECK(copy_of(copy.grad) == copy_of(a.grad));

    a.grad = uninitialized_buffer<float>(3);  // as ZeRO-2 re-allocates a released gradient
    a.grad.assign(3, 7.0f);
    CHECK_FALSE(arena.holds(a));
    CHECK(arena.holds(b));
    CHECK_FALSE(arena.intact());
    arena.zero();
    CHECK(copy_of(a.grad) == std::vector<float>(3, 7.0f));  // no longer the arena's to zero
    CHECK(copy_of(b.grad) == std::vector<float>(2, 0.0f));
  }
  // The arena is gone; b's slice lives on until b lets it go, and is still b's gradient.
  b.grad[0] = 4.0f;
  b.grad[1] += 1.0f;
  CHECK(copy_of(b.grad) == std::vector<float>{4.0f, 1.0f});
  b.grad = Buffer<float>{};  // the last slice released: the block is freed (a leak or a double free shows under ASan)

  parallel::GradientArena<HostBackend> outer;
  {
    auto e = testing::vector_parameter("e", values(2, 0), values(2, 5));
    parallel::GradientArena<HostBackend> arena({&e});
    CHECK(copy_of(e.grad) == values(2, 5));
  }  // the parameter after the arena: destroyed in the other order
}

TEST_CASE(
    "data parallel over a gradient arena: every bucket is a range of the arena, reduced in place, bit-equal to the "
    "copying path and to the hand formula",
    "[train][arena][dp]") {
  constexpr int dp = 2;
  const std::vector<std::size_t> sizes{5, 3, 8, 2, 6};
  struct RankResult {
    std::vector<std::vector<float>> arena_grads, plain_grads;
    std::vector<bool> aliased;
    std::vector<bool> view_in_arena;
    std::size_t buckets = 0;
  };
  std::vector<RankResult> results(dp);
  auto grad_of = [](std::size_t k, std::size_t n, int rank) {
    return values(n, float(k) * 0.37f + float(rank) * 1.9f);
  };
  run_threads(dp, [&](ThreadsCommunicator& world) {
    std::vector<nn::Parameter> in_arena, plain;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      in_arena.push_back(
          testing::vector_parameter("p" + std::to_string(k), values(sizes[k], 0), grad_of(k, sizes[k], world.rank())));
      plain.push_back(in_arena.back());
    }
    std::vector<nn::Parameter*> pa, pp, backward_order;
    for (auto& p : in_arena) pa.push_back(&p);
    for (auto& p : plain) pp.push_back(&p);
    for (std::size_t k = pa.size(); k-- > 0;) backward_order.push_back(pa[k]);
    parallel::GradientArena<HostBackend> arena(backward_order);
    // 32-byte buckets: several buckets, some holding more than one parameter.
    parallel::DataParallel<ThreadsCommunicator> with_arena(pa, world, {.bucket_bytes = 32});
    parallel::DataParallel<ThreadsCommunicator> copying(pp, world, {.bucket_bytes = 32});
    for (std::size_t k = pa.size(); k-- > 0;) {  // as a backward marks them
      with_arena.mark_ready(k);
      copying.mark_ready(k);
    }
    RankResult& r = results[std::size_t(world.rank())];
    r.buckets = with_arena.bucket_count();
    for (std::size_t b = 0; b < with_arena.bucket_count(); ++b) {
      r.aliased.push_back(with_arena.aliased(b));
      const auto flat = with_arena.flat(b);
      const auto& first = *pa[with_arena.bucket(b).slots.front().param];
      r.view_in_arena.push_back(flat.data() == first.grad.data() && flat.data() >= arena.data() &&
                                flat.data() + flat.size() <= arena.data() + arena.size());
    }
    with_arena.finish();
    copying.finish();
    for (auto* p : pa) r.arena_grads.push_back(copy_of(p->grad));
    for (auto* p : pp) r.plain_grads.push_back(copy_of(p->grad));
  });
  for (int rank = 0; rank < dp; ++rank) {
    const auto& r = results[std::size_t(rank)];
    INFO("rank " << rank);
    REQUIRE(r.buckets > 2);
    for (std::size_t b = 0; b < r.buckets; ++b) {
      CHECK(r.aliased[b]);
      CHECK(r.view_in_arena[b]);
    }
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      // The mean of the two replicas' gradients, in float as the all-reduce and the 1/dp scale compute it.
      const auto g0 = grad_of(k, sizes[k], 0), g1 = grad_of(k, sizes[k], 1);
      std::vector<float> want(sizes[k]);
      for (std::size_t i = 0; i < want.size(); ++i) want[i] = (g0[i] + g1[i]) * float(1.0 / dp);
      CHECK(r.arena_grads[k] == want);
      REQUIRE(r.plain_grads[k].size() == r.arena_grads[k].size());
      CHECK(std::memcmp(r.plain_grads[k].data(), r.arena_grads[k].data(), want.size() * sizeof(float)) == 0);
    }
  }
}

namespace {

/** Parameters of the shapes a transformer block has: matrices decay, biases and layer-norm gains do not. */
std::vector<nn::Parameter> block_parameters() {
  auto matrix = [](std::string name, std::size_t rows, std::size_t cols, float base) {
    auto p = testing::vector_parameter(std::move(name), values(rows * cols, base), values(rows * cols, 0));
    p.global_shape = {rows, cols};
    p.local_box = {Block{0, rows}, Block{0, cols}};
    return p;
  };
  std::vector<nn::Parameter> ps;
  ps.push_back(testing::vector_parameter("ln.weight", values(4, 1), values(4, 0)));
  ps.push_back(testing::vector_parameter("ln.bias", values(4, -1), values(4, 0)));
  ps.push_back(matrix("fc1.weight", 4, 3, 0.5f));
  ps.push_back(testing::vector_parameter("fc1.bias", values(3, 0.25f), values(3, 0)));
  ps.push_back(matrix("fc2.weight", 3, 4, -0.5f));
  ps.push_back(matrix("head.weight", 2, 4, 0.75f));
  return ps;
}

/** The gradient of parameter `k` at step `t`, a different wave each time. */
std::vector<float> grad_at(std::size_t k, std::size_t n, int t) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = 0.3f * float(std::sin(0.41 * double(i) + 1.7 * double(k) + 0.9 * t));
  return g;
}

std::vector<nn::Parameter*> pointers(std::vector<nn::Parameter>& ps) {
  std::vector<nn::Parameter*> out;
  for (auto& p : ps) out.push_back(&p);
  return out;
}
std::vector<nn::Parameter*> reversed(std::vector<nn::Parameter*> ps) { return {ps.rbegin(), ps.rend()}; }

}  // namespace

TEST_CASE("parameter arena: values become consecutive slices in the gradient arena's layout and keep their values",
          "[train][arena]") {
  auto ps = block_parameters();
  const auto before = ps;
  const auto order = reversed(pointers(ps));
  parallel::GradientArena<HostBackend> grads(order);
  parallel::ParameterArena<HostBackend> vals(order);
  REQUIRE(vals.size() == grads.size());
  std::size_t at = 0;
  for (auto* p : order) {
    INFO(p->name);
    CHECK(p->value.data() == vals.data() + at);
    CHECK(p->grad.data() == grads.data() + at);
    at += p->value.size();
  }
  for (std::size_t k = 0; k < ps.size(); ++k) CHECK(copy_of(ps[k].value) == copy_of(before[k].value));
  // A copied parameter (a checkpoint's) owns its values.
  const nn::Parameter copy = ps[2];
  CHECK(copy.value.data() != ps[2].value.data());
  CHECK(copy_of(copy.value) == copy_of(ps[2].value));
}

TEST_CASE(
    "AdamW over parameter and gradient arenas: one adamw_update per step, bit-equal to a naive per-parameter loop "
    "with weight decay only on the matrices",
    "[train][arena][optim]") {
  const optim::AdamWConfig cfg{.lr = 0.02f,
                               .beta1 = 0.85f,
                               .beta2 = 0.97f,
                               .eps = 1e-7f,
                               .weight_decay = 0.2f,
                               .decays = optim::decays_weight_matrices};
  auto ps = block_parameters();
  auto separate = ps;  // the same parameters in separate allocations: one call per parameter
  const auto order = reversed(pointers(ps));
  parallel::GradientArena<Counting> grads(order);
  parallel::ParameterArena<Counting> vals(order);
  optim::AdamW<Counting> adam(pointers(ps), cfg);
  optim::AdamW<Counting> per_param(pointers(separate), cfg);
  CHECK(adam.flat());
  CHECK_FALSE(per_param.flat());

  // The reference: the textbook update in float, one rounding per operation, parameter by parameter.
  std::vector<std::vector<float>> w, m, v;
  for (const auto& p : ps) {
    w.push_back(copy_of(p.value));
    m.emplace_back(p.value.size(), 0.0f);
    v.emplace_back(p.value.size(), 0.0f);
  }
  for (int t = 1; t <= 5; ++t) {
    for (std::size_t k = 0; k < ps.size(); ++k) {
      const auto g = grad_at(k, ps[k].value.size(), t);
      std::copy(g.begin(), g.end(), ps[k].grad.begin());
      std::copy(g.begin(), g.end(), separate[k].grad.begin());
    }
    const float gs = t % 2 ? 1.0f : 0.5f, lr = 0.02f / float(t);
    const auto c0 = Counting::counts();
    adam.step(lr, gs);
    const auto d = Counting::counts() - c0;
    CHECK(d[observe::Op::adamw_update] == 1);
    per_param.step(lr, gs);
    for (std::size_t k = 0; k < ps.size(); ++k) {
      const bool decays = ps[k].global_shape.size() == 2;  // the matrices, by hand
      testing::adamw_by_hand(w[k], grad_at(k, ps[k].value.size(), t), m[k], v[k], cfg, t, lr, gs, decays ? 0.2f : 0.0f);
      INFO("step " << t << ", " << ps[k].name);
      REQUIRE(copy_of(ps[k].value) == w[k]);
      REQUIRE(std::vector<float>(adam.first_moment(k).begin(), adam.first_moment(k).end()) == m[k]);
      REQUIRE(std::vector<float>(adam.second_moment(k).begin(), adam.second_moment(k).end()) == v[k]);
      REQUIRE(copy_of(separate[k].value) == w[k]);
    }
  }

  // A value replaced since binding leaves the arena: the optimizer falls back to one call per parameter, and the
  // moments it restores from a checkpoint (the writable views) are the ones it updates.
  auto& head = ps.back();
  Buffer<float> moved = uninitialized_buffer<float>(head.value.size());
  std::copy(head.value.begin(), head.value.end(), moved.begin());
  head.value = std::move(moved);
  for (std::size_t k = 0; k < ps.size(); ++k) {
    const auto g = grad_at(k, ps[k].value.size(), 6);
    std::copy(g.begin(), g.end(), ps[k].grad.begin());
    std::copy(g.begin(), g.end(), separate[k].grad.begin());
  }
  const auto c0 = Counting::counts();
  adam.step(0.01f);
  CHECK((Counting::counts() - c0)[observe::Op::adamw_update] == ps.size());
  per_param.step(0.01f);
  for (std::size_t k = 0; k < ps.size(); ++k) CHECK(copy_of(ps[k].value) == copy_of(separate[k].value));
}

TEST_CASE(
    "AdamW::step_in_rank over arenas: rate and step count read from rank memory, bit-equal to a naive loop, a skipped "
    "update not counted",
    "[train][arena][optim]") {
  const optim::AdamWConfig cfg{.lr = 0.02f,
                               .beta1 = 0.85f,
                               .beta2 = 0.97f,
                               .eps = 1e-7f,
                               .weight_decay = 0.2f,
                               .decays = optim::decays_weight_matrices};
  auto ps = block_parameters();
  const auto order = reversed(pointers(ps));
  parallel::GradientArena<Counting> grads(order);
  parallel::ParameterArena<Counting> vals(order);
  optim::AdamW<Counting> adam(pointers(ps), cfg);
  REQUIRE(adam.flat());
  Buffer<float> lr_in_rank = Counting::allocate<float>(1);
  Buffer<UpdateFactors> factors = Counting::allocate<UpdateFactors>(1);

  std::vector<std::vector<float>> w, m, v;  // the textbook update, parameter by parameter (as the test above)
  for (const auto& p : ps) {
    w.push_back(copy_of(p.value));
    m.emplace_back(p.value.size(), 0.0f);
    v.emplace_back(p.value.size(), 0.0f);
  }
  int taken = 0;  // updates not skipped: the t of the bias corrections
  for (int step = 1; step <= 5; ++step) {
    for (std::size_t k = 0; k < ps.size(); ++k) {
      const auto g = grad_at(k, ps[k].value.size(), step);
      std::copy(g.begin(), g.end(), ps[k].grad.begin());
    }
    const bool skip = step == 3;
    const float gs = step % 2 ? 1.0f : 0.5f, lr = 0.02f / float(step);
    lr_in_rank[0] = lr;  // HostBackend: rank memory is the host's
    factors[0] = UpdateFactors{gs, skip ? 1.0f : 0.0f};
    const auto c0 = Counting::counts();
    adam.step_in_rank(lr_in_rank.data(), factors.data());
    const auto d = Counting::counts() - c0;
    CHECK(d[observe::Op::adamw_update] == 1);
    CHECK(d[observe::Op::adamw_advance] == 1);
    if (skip) continue;  // the reference leaves everything as it was
    ++taken;
    for (std::size_t k = 0; k < ps.size(); ++k) {
      const float wd = ps[k].global_shape.size() == 2 ? 0.2f : 0.0f;
      testing::adamw_by_hand(w[k], grad_at(k, ps[k].value.size(), step), m[k], v[k], cfg, taken, lr, gs, wd);
    }
  }
  for (std::size_t k = 0; k < ps.size(); ++k) {
    INFO(ps[k].name);
    CHECK(copy_of(ps[k].value) == w[k]);
    CHECK(std::vector<float>(adam.first_moment(k).begin(), adam.first_moment(k).end()) == m[k]);
    CHECK(std::vector<float>(adam.second_moment(k).begin(), adam.second_moment(k).end()) == v[k]);
  }
  CHECK(adam.rank_scalars()->steps == 4);  // five steps, one skipped
  CHECK(adam.rank_scalars()->lr == 0.02f / 5.0f);
}

TEST_CASE("SGD over parameter and gradient arenas: one sgd_update per step, bit-equal to a naive per-parameter loop",
          "[train][arena][optim]") {
  for (const bool nesterov : {false, true}) {
    INFO((nesterov ? "Nesterov" : "plain") << " momentum");
    const optim::SgdConfig cfg{.lr = 0.05f,
                               .momentum = 0.8f,
                               .dampening = nesterov ? 0.0f : 0.25f,
                               .weight_decay = 0.01f,
                               .nesterov = nesterov};
    auto ps = block_parameters();
    const auto order = reversed(pointers(ps));
    parallel::GradientArena<Counting> grads(order);
    parallel::ParameterArena<Counting> vals(order);
    optim::Sgd<Counting> sgd(pointers(ps), cfg);
    CHECK(sgd.flat());
    std::vector<std::vector<float>> w, buf;
    for (const auto& p : ps) {
      w.push_back(copy_of(p.value));
      buf.emplace_back(p.value.size(), 0.0f);
    }
    for (int t = 1; t <= 4; ++t) {
      for (std::size_t k = 0; k < ps.size(); ++k) {
        const auto g = grad_at(k, ps[k].value.size(), t);
        std::copy(g.begin(), g.end(), ps[k].grad.begin());
      }
      const float lr = 0.05f / float(t);
      const auto c0 = Counting::counts();
      sgd.step(lr);
      CHECK((Counting::counts() - c0)[observe::Op::sgd_update] == 1);
      for (std::size_t k = 0; k < ps.size(); ++k) {
        const auto g = grad_at(k, ps[k].value.size(), t);
        for (std::size_t i = 0; i < g.size(); ++i) {
          float d = g[i] * 1.0f + 0.01f * w[k][i];
          buf[k][i] = t == 1 ? d : 0.8f * buf[k][i] + (1.0f - cfg.dampening) * d;
          d = nesterov ? d + 0.8f * buf[k][i] : buf[k][i];
          w[k][i] -= lr * d;
        }
        INFO("step " << t << ", " << ps[k].name);
        REQUIRE(copy_of(ps[k].value) == w[k]);
        REQUIRE(std::vector<float>(sgd.momentum_buffer(k).begin(), sgd.momentum_buffer(k).end()) == buf[k]);
      }
    }
  }
}
