// The trainer's components, each on its own: the batch split every layout shares (train/batch_slicing.hpp),
// PipeDream-2BW's weight lag (train/weight_lag.hpp), the checks a resume makes (train/resume_checks.hpp), the
// embedding tied across the first and last stage (train/tied_across_stages.hpp) and the step's metrics over the world
// (train/step_metrics.hpp). Each is checked against what it promises, written out by hand here.
#include <catch2/catch.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <mpar/backend/host/host_backend.hpp>
#include <mpar/comm/threads.hpp>
#include <mpar/core/layout.hpp>
#include <mpar/data/token_source.hpp>
#include <mpar/io/manifest.hpp>
#include <mpar/nn/parameter.hpp>
#include <mpar/train/batch_slicing.hpp>
#include <mpar/train/resume_checks.hpp>
#include <mpar/train/step_metrics.hpp>
#include <mpar/train/tied_across_stages.hpp>
#include <mpar/train/weight_lag.hpp>

using namespace mpar;

namespace {

/** Row r of step s's global batch holds ids (s G + r) L + j, j < L: every token of a step names its row. */
struct NumberedRows {
  std::size_t seq = 8;
  [[nodiscard]] std::size_t vocab_size() const { return 1u << 30; }
  [[nodiscard]] data::TokenBatch batch(std::uint64_t, std::uint64_t step, std::size_t global, std::size_t parts,
                                       std::size_t index) const {
    const Block rows = block_of(global, parts, index);
    data::TokenBatch b;
    b.batch = rows.extent;
    b.seq = seq;
    for (std::size_t r = rows.offset; r < rows.offset + rows.extent; ++r)
      for (std::size_t j = 0; j < seq; ++j) {
        b.tokens.push_back(std::int32_t((step * global + r) * seq + j));
        b.targets.push_back(std::int32_t((step * global + r) * seq + j + 1));
      }
    return b;
  }
  [[nodiscard]] data::DataFingerprint fingerprint() const { return {vocab_size(), 0, 0}; }
  [[nodiscard]] std::string describe() const { return "numbered rows"; }
};

/** The global row and position of each of a rank's tokens (NumberedRows of step `step`, G rows of `seq`). */
std::vector<std::pair<std::size_t, std::size_t>> rows_and_positions(const data::TokenBatch& b, std::size_t step,
                                                                    std::size_t global, std::size_t seq) {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (auto id : b.tokens) {
    const std::size_t n = std::size_t(id) - step * global * seq;
    out.emplace_back(n / seq, n % seq);
  }
  return out;
}

}  // namespace

TEST_CASE("batch slicing: every layout's ranks together train on each token of the step exactly once",
          "[trainer_components]") {
  const NumberedRows rows;
  const data::SourceRef src(rows);
  const std::size_t G = 8, L = rows.seq, step = 3;
  struct Layout {
    std::size_t dp, cp, ep, microbatches;
    bool routed;
  };
  for (const Layout& l :
       {Layout{1, 1, 1, 2, false}, Layout{2, 1, 1, 2, false}, Layout{4, 1, 1, 1, false}, Layout{2, 2, 1, 2, false},
        Layout{1, 4, 1, 1, false}, Layout{2, 1, 2, 2, true}, Layout{1, 1, 4, 1, true}, Layout{2, 1, 1, 4, true}}) {
    CAPTURE(l.dp, l.cp, l.ep, l.microbatches, l.routed);
    std::map<std::pair<std::size_t, std::size_t>, int> seen;
    for (std::size_t d = 0; d < l.dp; ++d)
      for (std::size_t c = 0; c < l.cp; ++c)
        for (std::size_t e = 0; e < l.ep; ++e) {
          const train::BatchSlicing s{G, l.microbatches, l.dp, l.cp, l.ep, l.routed, d, c, e};
          const data::TokenBatch b = s.local_batch(src, 0, step);
          REQUIRE(b.tokens.size() == G * L / (l.dp * l.ep * l.cp));
          REQUIRE(b.targets.size() == b.tokens.size());
          for (std::size_t i = 0; i < b.tokens.size(); ++i) REQUIRE(b.targets[i] == b.tokens[i] + 1);
          for (const auto& rp : rows_and_positions(b, step, G, L)) ++seen[rp];
        }
    REQUIRE(seen.size() == G * L);
    for (const auto& [rp, n] : seen) REQUIRE(n == 1);
  }
}

TEST_CASE("batch slicing: micro-batch m and first_sequence say which rows a rank's micro-batch holds",
          "[trainer_components]") {
  const NumberedRows rows;
  const data::SourceRef src(rows);
  const std::size_t G = 16, L = rows.seq, M = 2;
  SECTION("dense: the data rank's contiguous block, micro-batch after micro-batch") {
    for (std::size_t d = 0; d < 4; ++d) {
      const train::BatchSlicing s{G, M, 4, 1, 1, false, d, 0, 0};
      const auto got = rows_and_positions(s.local_batch(src, 0, 0), 0, G, L);
      for (std::size_t m = 0; m < M; ++m) {
        REQUIRE(s.first_sequence(m) == d * 4 + m * 2);                   // 4 rows per data rank, 2 per micro-batch
        REQUIRE(got[m * 2 * L].first == s.first_sequence(m));            // the micro-batch's first token
        REQUIRE(got[(m * 2 + 1) * L].first == s.first_sequence(m) + 1);  // its second row
      }
    }
  }
  SECTION("routed: micro-batch m is global rows [m G/M, (m+1) G/M) under every split over data x expert") {
    for (auto [dp, ep] : {std::pair<std::size_t, std::size_t>{1, 1}, {2, 1}, {2, 2}, {1, 4}, {4, 2}}) {
      CAPTURE(dp, ep);
      for (std::size_t m = 0; m < M; ++m) {
        std::set<std::size_t> rows_of_m;
        for (std::size_t d = 0; d < dp; ++d)
          for (std::size_t e = 0; e < ep; ++e) {
            const train::BatchSlicing s{G, M, dp, 1, ep, true, d, 0, e};
            const std::size_t mbs = G / (dp * ep) / M;
            const auto got = rows_and_positions(s.local_batch(src, 0, 0), 0, G, L);
            for (std::size_t t = m * mbs * L; t < (m + 1) * mbs * L; ++t) rows_of_m.insert(got[t].first);
            REQUIRE(got[m * mbs * L].first == s.first_sequence(m));
          }
        std::set<std::size_t> expected;
        for (std::size_t r = m * G / M; r < (m + 1) * G / M; ++r) expected.insert(r);
        REQUIRE(rows_of_m == expected);
      }
    }
  }
  SECTION("context: rank c holds chunk c then chunk 2 cp - 1 - c of every sequence, positions kept") {
    const std::size_t cp = 2, chunk = L / (2 * cp);
    for (std::size_t c = 0; c < cp; ++c) {
      const train::BatchSlicing s{G, M, 1, cp, 1, false, 0, c, 0};
      const data::TokenBatch b = s.local_batch(src, 0, 0);
      REQUIRE(b.seq == L);
      const auto got = rows_and_positions(b, 0, G, L);
      for (std::size_t row = 0; row < G; ++row)
        for (std::size_t j = 0; j < 2 * chunk; ++j) {
          const std::size_t which = j < chunk ? c : 2 * cp - 1 - c;
          REQUIRE(got[row * 2 * chunk + j] == std::pair{row, which * chunk + j % chunk});
        }
    }
  }
}

namespace {
nn::Parameter parameter_of(std::vector<float> v) {
  nn::Parameter p;
  p.value = Buffer<float>(v.begin(), v.end());
  return p;
}
std::vector<float> values_of(const nn::Parameter& p) { return {p.value.begin(), p.value.end()}; }
}  // namespace

TEST_CASE("weight lag: step t's passes see the weights before step t-1's update, each parameter swapped once",
          "[trainer_components]") {
  nn::Parameter a = parameter_of({1, 2, 3}), b = parameter_of({10});
  // `a` listed twice, as a stage sharing a parameter lists it: versioned once.
  train::WeightLag<HostBackend> lag({&a, &b, &a});
  REQUIRE(lag.bytes() == 0);
  std::vector<std::vector<float>> seen_a, seen_b;
  for (int step = 0; step < 4; ++step) {
    const bool swapped = lag.swap_in_previous();
    REQUIRE(swapped == (step > 0));
    seen_a.push_back(values_of(a));  // what the passes read
    seen_b.push_back(values_of(b));
    lag.restore_and_keep(swapped);
    for (auto& x : a.value) x += 1;  // the update
    for (auto& x : b.value) x *= 2;
  }
  // W(0) at steps 0 and 1 (no older version at step 0), then W(t-1).
  CHECK(seen_a == std::vector<std::vector<float>>{{1, 2, 3}, {1, 2, 3}, {2, 3, 4}, {3, 4, 5}});
  CHECK(seen_b == std::vector<std::vector<float>>{{10}, {10}, {20}, {40}});
  CHECK(values_of(a) == std::vector<float>{5, 6, 7});  // the current weights are in place after the passes
  CHECK(lag.bytes() == 4 * sizeof(float));
  lag.forget();  // loaded weights: the next passes run on them
  CHECK_FALSE(lag.swap_in_previous());
  CHECK(values_of(a) == std::vector<float>{5, 6, 7});
}

namespace {
io::Manifest saved_with(std::map<std::string, std::string> user) {
  io::Manifest m;
  m.state.user = std::move(user);
  return m;
}
train::RunIdentity identity_now() {
  train::RunIdentity id;
  id.entries = {{"data.vocab", "65"}, {"data.tokens", "1000"}, {"data.hash", "abc"},
                {"data.seed", "1"},   {"model.seed", "7"},     {"model.layers", "4"}};
  id.options = {{"data.seed", "--data-seed"},
                {"model.seed", "--seed"},
                {"model.layers", "--layers"},
                {"model.family", "--model"}};
  id.defaults = {{"model.family", "gpt2"}};
  return id;
}
}  // namespace

TEST_CASE("resume checks: a checkpoint of another run is refused naming each difference, an older one is not",
          "[trainer_components]") {
  const auto id = identity_now();
  const std::filesystem::path dir = "ckpt/step_00000010";
  // The same run, and an older checkpoint lacking entries, pass.
  CHECK_NOTHROW(id.check_same_run(saved_with(id.entries), dir));
  CHECK_NOTHROW(id.check_same_run(saved_with({{"model.layers", "4"}}), dir));
  auto refused = [&](std::map<std::string, std::string> changes) {
    auto user = id.entries;
    for (auto& [k, v] : changes) user[k] = v;
    try {
      id.check_same_run(saved_with(user), dir);
    } catch (const config_error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  const std::string seeds = refused({{"model.seed", "8"}, {"model.layers", "6"}});
  CHECK_THAT(seeds, Catch::Contains("ckpt/step_00000010 is of another run"));
  CHECK_THAT(seeds, Catch::Contains("--seed 8 in the checkpoint (model.seed), 7 now"));
  CHECK_THAT(seeds, Catch::Contains("--layers 6 in the checkpoint (model.layers), 4 now"));
  CHECK_THAT(refused({{"data.vocab", "50257"}}), Catch::Contains("another vocabulary (50257 token ids"));
  CHECK_THAT(refused({{"data.hash", "def"}}), Catch::Contains("hash def in the checkpoint"));
  // A default compares an entry one side lacks: a Llama checkpoint against this GPT-2 run.
  CHECK_THAT(refused({{"model.family", "llama"}}),
             Catch::Contains("--model llama in the checkpoint (model.family), gpt2"));
}

TEST_CASE("resume checks: a checkpoint holding a tensor no rank loads is refused on every rank",
          "[trainer_components]") {
  io::Manifest saved;
  for (const char* n : {"embed.weight", "block.0.w", "block.1.w", "block.1.w/adamw.m"})
    saved.tensors.push_back(io::TensorRecord{n, "f32", {1}, "replicated", {}});
  // Rank r loads block r: together the ranks load everything but the moments (not loaded: with_states false).
  auto run = [&](int ranks, bool with_states) {
    std::vector<std::string> errors(static_cast<std::size_t>(ranks));
    run_threads(ranks, [&](ThreadsCommunicator& world) {
      std::vector<std::string> names{"embed.weight", "block." + std::to_string(world.rank()) + ".w"};
      try {
        train::check_loads_every_tensor(world, saved, names, with_states, "ckpt");
      } catch (const config_error& e) {
        errors[std::size_t(world.rank())] = e.what();
      }
    });
    return errors;
  };
  for (const auto& e : run(2, false)) CHECK(e.empty());
  for (const auto& e : run(1, false)) CHECK_THAT(e, Catch::Contains("holds 1 tensor(s) this model lacks (block.1.w)"));
  for (const auto& e : run(2, true)) CHECK_THAT(e, Catch::Contains("(block.1.w/adamw.m)"));
}

TEST_CASE("tied across stages: each pair of ends sums its gradients and copies the first end's values to the last",
          "[trainer_components]") {
  // Six ranks as three pipeline stages x two tensor ranks: stage 0 and stage 2 of each tensor rank form a pair, the
  // middle stage holds no end. Rank r = stage * 2 + tensor starts with values {r, r} and gradient {r + 1, 10 r}.
  constexpr int stages = 3, tensor = 2;
  std::vector<std::vector<float>> values(stages * tensor), grads(stages * tensor);
  run_threads(stages * tensor, [&](ThreadsCommunicator& world) {
    const int r = world.rank(), stage = r / tensor;
    const bool end = stage == 0 || stage == stages - 1;
    nn::Parameter p = parameter_of({float(r), float(r)});
    p.grad = Buffer<float>{float(r + 1), float(10 * r)};
    ThreadsCommunicator pair = world.split(end ? r % tensor : tensor + r, stage);
    train::TiedAcrossStages<ThreadsCommunicator> tie;
    if (end) tie = train::TiedAcrossStages<ThreadsCommunicator>(std::move(pair), p);
    CHECK(tie.holds() == end);
    CHECK(tie.parameter() == (end ? &p : nullptr));
    tie.sum_gradients();
    p.value[0] += 0.5f;  // the two ends' updates may differ in the last bit: the copy undoes that
    tie.copy_first_to_last();
    values[std::size_t(r)] = values_of(p);
    grads[std::size_t(r)] = {p.grad.begin(), p.grad.end()};
  });
  for (int t = 0; t < tensor; ++t) {
    INFO("tensor rank " << t);
    const auto first = std::size_t(t), last = std::size_t(2 * tensor + t), middle = std::size_t(tensor + t);
    const std::vector<float> sum{float(first + 1 + last + 1), float(10 * (first + last))};
    CHECK(grads[first] == sum);
    CHECK(grads[last] == sum);
    CHECK(values[first] == std::vector<float>{float(first) + 0.5f, float(first)});
    CHECK(values[last] == values[first]);
    CHECK(grads[middle] == std::vector<float>{float(middle + 1), float(10 * middle)});  // untouched
    CHECK(values[middle] == std::vector<float>{float(middle) + 0.5f, float(middle)});
  }
}

TEST_CASE("tied across stages: the copy runs inside the caller's gather of the first end", "[trainer_components]") {
  std::vector<int> gathered(2, 0);
  std::vector<std::vector<float>> values(2);
  run_threads(2, [&](ThreadsCommunicator& world) {
    const int r = world.rank();
    nn::Parameter p = parameter_of({r == 0 ? 0.0f : 7.0f});  // the first end's full value appears only in the gather
    train::TiedAcrossStages<ThreadsCommunicator> tie(world.split(0, r), p);
    tie.copy_first_to_last([&](nn::Parameter& end, auto&& copy) {
      CHECK(&end == &p);
      if (r == 0) end.value[0] = 3.0f;  // gathered
      copy();
      ++gathered[std::size_t(r)];
      if (r == 0) end.value[0] = 0.0f;  // released
    });
    values[std::size_t(r)] = values_of(p);
  });
  CHECK(gathered == std::vector<int>{1, 1});
  CHECK(values[1] == std::vector<float>{3.0f});
}

TEST_CASE("step metrics: host slots averaged or maximised over the world, an accumulated slot read from rank memory",
          "[trainer_components]") {
  // Three ranks; slots 0 and 1 averaged, slot 2 maximised. Slot 1 is accumulated in rank memory (rank r adds r + 1
  // twice, as two micro-batches would); the host's value there is ignored.
  std::vector<std::array<double, 3>> got(3);
  run_threads(3, [&](ThreadsCommunicator& world) {
    const double r = world.rank();
    train::StepMetrics<HostBackend, 2, 1> metrics;
    std::array<double, 3> first{r, -1.0, 10.0 * r};
    metrics.reduce(world, first);
    CHECK(first == std::array<double, 3>{1.0, -1.0, 20.0});
    double* dropped = metrics.accumulator(1);
    for (int step = 0; step < 2; ++step) {
      HostBackend::run(ops::zero<double>{.n = 1, .x = dropped});
      for (int mb = 0; mb < 2; ++mb) *dropped += r + 1;
      std::array<double, 3> v{2.0 * r + step, 99.0, r == 1 ? 5.0 : 1.0};
      metrics.reduce(world, v);
      got[std::size_t(r)] = v;
    }
  });
  // The last step: slot 0 (1 + 3 + 5) / 3, slot 1 (2 + 4 + 6) / 3, slot 2 the largest.
  for (const auto& v : got) CHECK(v == std::array<double, 3>{3.0, 4.0, 5.0});
  run_threads(1, [](ThreadsCommunicator& world) {
    train::StepMetrics<HostBackend, 1, 1> metrics;
    std::array<double, 2> v{0.25, 2.0};
    metrics.reduce(world, v);  // one rank, nothing accumulated: unchanged
    CHECK(v == std::array<double, 2>{0.25, 2.0});
    CHECK_THROWS_WITH(metrics.accumulator(2), Catch::Contains("slot 2 of 2"));
  });
}
