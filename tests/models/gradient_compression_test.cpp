// Top-k gradient compression with error feedback in training (GptTrainConfig::grad_topk_density): at density 1 it is
// the dense data-parallel all-reduce bit for bit; below 1 each step applies what the replicas sent and nothing is
// lost (the updates applied plus the residuals held back are the dense sum of every replica's gradients), and the
// loss still falls; the layouts it does not support are refused, naming the fix.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <mpar/models/gpt_trainer.hpp>
#include <mpar/mpar.hpp>
#include <mutex>
#include <string>
#include <vector>

#include "gpt_test_config.hpp"

using namespace mpar;

namespace grad_topk_test {

struct Trained {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;  ///< every parameter's whole tensor (pp and tp blocks gathered)
  bool replicas_equal = true;                        ///< every copy of an element held the same value
};

Trained train(const models::GptTrainConfig& c, std::size_t steps) {
  Trained out;
  std::mutex m;
  run_threads(int(c.world_size()), [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, c, testing::gpt_dataset());
    std::vector<double> losses;
    for (std::size_t s = 0; s < steps; ++s) losses.push_back(t.train_step().loss);
    std::lock_guard lock(m);
    if (world.rank() == 0) out.losses = losses;
    for (const auto& [name, p] : t.named_parameters()) {
      auto& full = out.params[name];
      if (full.empty()) full.assign(p->global_size(), std::nanf(""));
      for (std::size_t k = 0; k < p->value.size(); ++k) {
        float& dst = full[p->global_index(k)];
        if (!std::isnan(dst) && dst != p->value[k]) out.replicas_equal = false;
        dst = p->value[k];
      }
    }
  });
  return out;
}

}  // namespace grad_topk_test

TEST_CASE("top-k compression at density 1 is the dense data-parallel all-reduce, bit for bit", "[models][gpt][topk]") {
  // Every entry is sent. With two replicas the compressor's average — a + b summed in double, halved, rounded to float
  // — is the dense all-reduce's — a + b rounded to float, times 0.5 — exactly: the sum of two floats is exact in
  // double, and halving is exact in both. pp = 2 includes the tied embedding's sum before the reduction.
  auto dense = testing::small_gpt(1, 2, 2);
  auto every = dense;
  every.grad_topk_density = 1.0;
  const auto a = grad_topk_test::train(dense, 6), b = grad_topk_test::train(every, 6);
  REQUIRE(a.losses.back() < a.losses.front());
  REQUIRE(b.losses == a.losses);
  REQUIRE(b.replicas_equal);
  REQUIRE(b.params == a.params);
}

TEST_CASE(
    "top-k compression below density 1: each step applies what the replicas sent, the residuals hold the "
    "rest, and the loss falls",
    "[models][gpt][topk]") {
  auto c = testing::small_gpt(1, 1, 2);
  c.steps = 30;
  c.grad_topk_density = 0.05;
  constexpr int ranks = 2;
  // Per rank and parameter, summed over the steps: the local gradient before the reduction (after the passes), the
  // gradient the update applied (after the reduction) and its magnitude; the residual after the last step.
  struct PerRank {
    std::vector<std::vector<double>> local, applied, applied_abs, residual;
    double densest = 0;  ///< the largest share of nonzero entries of an applied gradient in any step and tensor
  };
  std::vector<PerRank> seen(ranks);
  std::vector<double> losses;
  std::vector<std::size_t> sizes;
  run_threads(ranks, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, c, testing::gpt_dataset());
    PerRank& mine = seen[std::size_t(world.rank())];
    const auto& params = t.optimizer().params();
    for (auto* v : {&mine.local, &mine.applied, &mine.applied_abs}) {
      v->resize(params.size());
      for (std::size_t i = 0; i < params.size(); ++i) (*v)[i].assign(params[i]->value.size(), 0.0);
    }
    // With top-k nothing reduces during the backward: after the passes each gradient is this replica's own.
    t.on_passes({}, [&] {
      for (std::size_t i = 0; i < params.size(); ++i)
        for (std::size_t k = 0; k < params[i]->grad.size(); ++k) mine.local[i][k] += params[i]->grad[k];
    });
    t.on_gradients_synchronised([&] {
      for (std::size_t i = 0; i < params.size(); ++i) {
        const auto& g = params[i]->grad;
        std::size_t nonzero = 0;
        for (std::size_t k = 0; k < g.size(); ++k) {
          mine.applied[i][k] += g[k];
          mine.applied_abs[i][k] += std::abs(g[k]);
          nonzero += g[k] != 0.0f;
        }
        mine.densest = std::max(mine.densest, double(nonzero) / double(g.size()));
      }
    });
    std::vector<double> l;
    for (std::size_t s = 0; s < c.steps; ++s) l.push_back(t.train_step().loss);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto r = t.optimizer().compression_residual(i);
      mine.residual.emplace_back(r.begin(), r.end());
    }
    if (world.rank() == 0) {
      losses = l;
      for (auto* p : params) sizes.push_back(p->value.size());
    }
  });

  // Both replicas applied the same gradients.
  REQUIRE(seen[0].applied == seen[1].applied);
  // Sparse: each replica sent k = ceil(0.05 n) entries of a tensor of n, so at most 2k of the sum are nonzero; the
  // smallest tensors (32 elements: k = 2) allow 4 / 32.
  CHECK(seen[0].densest <= 4.0 / 32.0);
  // Nothing lost: 2 x (the updates' gradients, averages over the replicas) + both residuals = the sum of both
  // replicas' gradients over every step, within the rounding of each step's average to float (2^-24 of its
  // magnitude, twice); without the residuals it does not hold.
  double residual_squares = 0, worst = 0, worst_without_residuals = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    for (std::size_t k = 0; k < sizes[i]; ++k) {
      const double dense = seen[0].local[i][k] + seen[1].local[i][k];
      const double held = seen[0].residual[i][k] + seen[1].residual[i][k];
      const double applied = ranks * seen[0].applied[i][k];
      const double scale = ranks * seen[0].applied_abs[i][k] + std::abs(held) + 1e-30;
      worst = std::max(worst, std::abs(applied + held - dense) / scale);
      worst_without_residuals = std::max(worst_without_residuals, std::abs(applied - dense) / scale);
      residual_squares += held * held;
    }
  INFO("largest violation " << worst << ", without the residuals " << worst_without_residuals);
  CHECK(worst <= 1e-6);
  CHECK(worst_without_residuals > 0.1);
  CHECK(residual_squares > 0);
  // And it learns: the loss of the last steps well below the first step's.
  INFO("first loss " << losses.front() << ", last " << losses.back());
  CHECK(losses.back() < losses.front() - 0.3);
}

TEST_CASE("top-k compression refuses the layouts it does not support, naming the fix", "[models][gpt][topk][errors]") {
  auto refused = [](models::GptTrainConfig c, const std::string& fix) {
    if (c.grad_topk_density == 0) c.grad_topk_density = 0.01;
    INFO(fix);
    REQUIRE_THROWS_WITH(c.validate(c.world_size()), Catch::Contains(fix));
  };
  auto dp2 = testing::small_gpt(1, 1, 2);
  for (int stage : {1, 2, 3}) {
    auto z = dp2;
    z.zero = parallel::zero_stage_from_number(stage);
    refused(z, "--grad-topk with --zero " + std::to_string(stage) + ": ZeRO reduce-scatters");
  }
  refused(testing::small_gpt(2, 1, 1), "--dp is 1: there is nothing to compress; use --dp 2 or more");
  auto f16 = dp2;
  f16.precision = parallel::Precision::f16;
  refused(f16, "--grad-topk with --precision f16");
  auto moe = dp2;
  moe.model.experts = 2;
  moe.ep = 2;
  moe.microbatches = 1;
  refused(moe, "--grad-topk with --ep 2");
  auto dense_share = dp2;
  dense_share.grad_topk_density = 1.5;
  refused(dense_share, "--grad-topk 1.5 is not a share of the gradient");
  // As a program meets it: the trainer's constructor refuses before any rank allocates.
  auto one = testing::small_gpt(1, 1, 1);
  one.grad_topk_density = 0.5;
  run_threads(1, [&](ThreadsCommunicator& world) {
    REQUIRE_THROWS_WITH((models::GptTrainer<ThreadsCommunicator>(world, one, testing::gpt_dataset())),
                        Catch::Contains("--dp is 1"));
  });
}
