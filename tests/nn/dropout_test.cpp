// Dropout keyed by token coordinates: a new mask every step, and under every placement of a step's tokens —
// micro-batches, feature shards, token shards, zig-zag context chunks — the elements the whole batch drops.
#include <catch2/catch.hpp>

#include <cstddef>
#include <vector>

#include "call_layer.hpp"
#include "nn_test_support.hpp"

// A namespace of its own: the test binaries compile their files as one unity translation unit.
namespace mpar::nn::dropout_keys_test {

using mpar::testing::random_activation;
namespace testing = mpar::testing;

namespace {

constexpr std::uint64_t seed = 42, stream = 1234;
constexpr double p = 0.25;
constexpr std::size_t sequences = 4, seq = 8, hidden = 6;

/** Coordinates of one micro-batch per entry of `first`, for step `step`. */
TokenCoordinates coordinates(std::uint64_t step, std::vector<std::size_t> first, std::size_t cp = 1,
                             std::size_t cp_rank = 0) {
  TokenCoordinates t;
  t.step = step, t.seq = seq, t.cp = cp, t.cp_rank = cp_rank;
  t.first_sequence = std::move(first);
  return t;
}

/** Rows [first, first + n) of `a`. */
Activation rows(const Activation& a, std::size_t first, std::size_t n) {
  Activation out({n, a.extent(1)});
  for (std::size_t i = 0; i < n * a.extent(1); ++i) out.data()[i] = a.data()[first * a.extent(1) + i];
  return out;
}

std::vector<float> values(const Activation& a) { return {a.data(), a.data() + a.size()}; }

/** The whole step's batch (every sequence in one micro-batch) dropped at `step`: what every placement must equal. */
Activation whole(const Activation& x, std::uint64_t step) {
  const TokenCoordinates t = coordinates(step, {0});
  Dropout<Replicate> d(p, seed, stream, 1, 0, &t);
  return testing::forward(d, x, 0);
}

}  // namespace

TEST_CASE("Dropout with token coordinates draws a new mask every step and the same one within a step",
          "[nn][dropout]") {
  const Activation x = random_activation(sequences * seq, hidden, 1);
  const Activation step0 = whole(x, 0), again = whole(x, 0), step1 = whole(x, 1);
  CHECK(values(again) == values(step0));
  std::size_t differ = 0, dropped0 = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    differ += (step0.data()[i] == 0.0f) != (step1.data()[i] == 0.0f);
    dropped0 += step0.data()[i] == 0.0f;
  }
  // 192 elements at p = 1/4: about 48 dropped per step, and the two steps' masks disagree on about 72.
  CHECK(dropped0 > 24);
  CHECK(dropped0 < 72);
  CHECK(differ > 36);
  // Kept elements are scaled by 1 / (1 - p); the backward applies the same mask.
  for (std::size_t i = 0; i < x.size(); ++i)
    if (step0.data()[i] != 0.0f) CHECK(step0.data()[i] == Approx(x.data()[i] / (1 - p)));
  const TokenCoordinates t = coordinates(0, {0});
  Dropout<Replicate> d(p, seed, stream, 1, 0, &t);
  const Activation dx = testing::backward(d, x, 0);
  CHECK(values(dx) == values(step0));
}

TEST_CASE("Dropout with token coordinates drops, under every placement of the tokens, what the whole batch drops",
          "[nn][dropout]") {
  const Activation x = random_activation(sequences * seq, hidden, 2);
  const std::uint64_t step = 3;
  const Activation want = whole(x, step);

  SECTION("micro-batches of one sequence, in any order of ids") {
    // Micro-batch id 0 holds sequence 2, id 1 sequence 0, ...: the mask follows the sequence, not the id.
    const std::vector<std::size_t> first{2, 0, 3, 1};
    const TokenCoordinates t = coordinates(step, first);
    Dropout<Replicate> d(p, seed, stream, 1, 0, &t);
    for (int mb = 0; mb < 4; ++mb) {
      INFO("micro-batch " << mb);
      const std::size_t s = first[std::size_t(mb)];
      CHECK(values(testing::forward(d, rows(x, s * seq, seq), mb)) == values(rows(want, s * seq, seq)));
    }
  }
  SECTION("feature shards and token shards (sequence parallelism) of two ranks") {
    const TokenCoordinates t = coordinates(step, {0});
    for (std::size_t r = 0; r < 2; ++r) {
      INFO("tensor rank " << r);
      Dropout<FeatureShard> f(p, seed, stream, 2, r, &t);
      CHECK(values(testing::forward(f, local_features<HostBackend>(x, 2, r), 0)) ==
            values(local_features<HostBackend>(want, 2, r)));
      Dropout<TokenShard> s(p, seed, stream, 2, r, &t);
      CHECK(values(testing::forward(s, local_tokens(x, 2, r), 0)) == values(local_tokens(want, 2, r)));
    }
  }
  SECTION("zig-zag context chunks: rank r holds chunks r and 2 cp - 1 - r of every sequence") {
    for (std::size_t cp : {2, 4}) {
      const std::size_t chunk = seq / (2 * cp);
      for (std::size_t r = 0; r < cp; ++r) {
        INFO("cp " << cp << ", context rank " << r);
        // Two micro-batches of two sequences each: this rank's rows, chunk by chunk, as the trainer lays them out.
        const TokenCoordinates t = coordinates(step, {0, 2}, cp, r);
        Dropout<Replicate> d(p, seed, stream, 1, 0, &t);
        for (int mb = 0; mb < 2; ++mb) {
          Activation local({2 * 2 * chunk, hidden}), expect({2 * 2 * chunk, hidden});
          std::size_t row = 0;
          for (std::size_t s = 0; s < 2; ++s)
            for (std::size_t c : {r, 2 * cp - 1 - r})
              for (std::size_t i = 0; i < chunk; ++i, ++row) {
                const std::size_t g = (std::size_t(mb) * 2 + s) * seq + c * chunk + i;
                for (std::size_t j = 0; j < hidden; ++j) local(row, j) = x(g, j), expect(row, j) = want(g, j);
              }
          CHECK(values(testing::forward(d, local, mb)) == values(expect));
          CHECK(values(testing::backward(d, local, mb)) == values(expect));
        }
      }
    }
  }
}

TEST_CASE("Dropout under context parallelism without the step's coordinates is refused, naming the fix",
          "[nn][dropout][errors]") {
  TokenCoordinates t = coordinates(0, {}, 2, 1);  // the placement is known, the step's micro-batches are not
  Dropout<Replicate> d(p, seed, stream, 1, 0, &t);
  const Activation x = random_activation(seq, hidden, 3);
  REQUIRE_THROWS_WITH(testing::forward(d, x, 0),
                      Catch::Contains("cp 2") && Catch::Contains("set them before the passes"));
  t.first_sequence = {0};
  REQUIRE_THROWS_WITH(testing::forward(d, x, 1), Catch::Contains("micro-batch 1 has no entry"));
  t.first_sequence = {0, 1};
  REQUIRE_THROWS_WITH(testing::forward(d, rows(x, 0, 3), 0), Catch::Contains("3 rows are not whole sequences"));
}

}  // namespace mpar::nn::dropout_keys_test
