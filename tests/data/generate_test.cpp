// Generation (models::generate) from a trained model against independent references: greedy picks equal
// the argmax of a full forward of the growing sequence, step by step (padded differently, so causality is
// checked too); tensor-parallel generation equals the single rank; sampling is reproducible by seed and
// only ever picks among the top k; the sampler's frequencies follow the softmax.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <mpar/models/gpt_generate.hpp>
#include <mpar/models/gpt_trainer.hpp>
#include <mpar/mpar.hpp>

#include "models/gpt_test_config.hpp"

using namespace mpar;

namespace {

using Full = std::map<std::string, std::vector<float>>;
using Stage = models::GptPipelinePart<ThreadsCommunicator>;

/** A model trained 200 steps on the default text (single rank), as whole tensors by name. */
const Full& trained() {
  static const Full full = [] {
    Full f;
    run_threads(1, [&](ThreadsCommunicator& world) {
      auto c = testing::small_gpt(1, 1, 1);
      c.model.layers = 2;
      c.steps = 200;
      c.lr = 1e-2;
      models::GptTrainer<ThreadsCommunicator> t(world, c, testing::gpt_dataset());
      for (int s = 0; s < 200; ++s) (void)t.train_step();
      for (auto& [name, p] : t.named_parameters()) f[name].assign(p->value.begin(), p->value.end());
    });
    return f;
  }();
  return full;
}

models::GptConfig model_config() {
  auto c = testing::small_gpt(1, 1, 1).model;
  c.layers = 2;
  return c;  // vocab 76 or so, padded to a multiple of 16: padding columns exist
}

/** Copies each parameter's local block out of the whole tensor (row-major), whatever the tensor layout. */
void load(Stage& stage, const Full& full) {
  for (auto& [name, p] : stage.named_parameters()) {
    const auto& src = full.at(name);
    REQUIRE(src.size() == p->global_size());
    const std::size_t R = p->global_shape.size();
    std::vector<std::size_t> idx(R);
    for (std::size_t k = 0; k < p->value.size(); ++k) {
      std::size_t rem = k, g = 0;
      for (std::size_t d = R; d-- > 0;) {
        idx[d] = rem % p->local_box[d].extent;
        rem /= p->local_box[d].extent;
      }
      for (std::size_t d = 0; d < R; ++d) g = g * p->global_shape[d] + p->local_box[d].offset + idx[d];
      p->value[k] = src[g];
    }
  }
}

/** The reference: one full forward of the last `seq` ids of `s`, padded with id 0 (generate pads with the
 *  last id), returning the logits row of the last real position (all padded-vocabulary columns included). */
std::vector<float> last_logits(Stage& stage, const std::vector<std::int32_t>& s) {
  const auto& c = stage.config();
  const std::size_t n = std::min(s.size(), c.seq);
  std::vector<std::int32_t> seq(s.end() - std::ptrdiff_t(n), s.end());
  seq.resize(c.seq, 0);
  const nn::Act<nn::FeatureShard> logits = stage.forward_to_loss(Stage::tokens_as_activation(seq), 0);
  stage.drop(0);
  const float* row = logits.data() + (n - 1) * logits.extent(1);
  return {row, row + logits.extent(1)};
}

std::size_t argmax_real(const std::vector<float>& row, std::size_t vocab) {
  std::size_t best = 0;
  for (std::size_t v = 1; v < vocab; ++v)
    if (row[v] > row[best]) best = v;
  return best;
}

/** A prompt from the training text (a character model). */
const std::vector<std::int32_t> prompt = [] {
  std::vector<std::int32_t> ids;
  for (char c : std::string("of this Lice")) ids.push_back(testing::gpt_dataset().encode(c));
  return ids;
}();

}  // namespace

TEST_CASE("generate: greedy picks are the argmax of a full forward of the growing sequence, step by step",
          "[data][generate]") {
  const auto cfg = model_config();
  REQUIRE(cfg.padded_vocab() > cfg.vocab);
  run_threads(1, [&](ThreadsCommunicator& world) {
    Stage stage(world, cfg, true, true, 0, cfg.layers);
    load(stage, trained());
    // 20 new ids after 5: the window slides past the context length 16 after 11 of them.
    for (const auto& s : {models::SamplingConfig{0.0, 0, 1}, models::SamplingConfig{0.8, 1, 2}}) {
      INFO("temperature " << s.temperature << ", top-k " << s.top_k);
      const auto got = models::generate(stage, prompt, 20, s);
      REQUIRE(got.size() == 20);
      std::vector<std::int32_t> seq = prompt;
      std::size_t distinct = 0;
      for (std::size_t t = 0; t < got.size(); ++t) {
        INFO("token " << t);
        const auto row = last_logits(stage, seq);
        // The padded columns are masked out of the softmax: they can never win.
        for (std::size_t v = cfg.vocab; v < row.size(); ++v) CHECK(row[v] < -1e29f);
        CHECK(got[t] == std::int32_t(argmax_real(row, cfg.vocab)));
        if (t > 0 && got[t] != got[t - 1]) ++distinct;
        seq.push_back(got[t]);
      }
      CHECK(distinct > 0);  // a trained model does not repeat one id forever
    }
  });
}

TEST_CASE("generate: a tensor-parallel model (tp 2) generates the single rank's ids", "[data][generate]") {
  const auto cfg = model_config();
  std::vector<std::int32_t> single_greedy, single_sampled;
  run_threads(1, [&](ThreadsCommunicator& world) {
    Stage stage(world, cfg, true, true, 0, cfg.layers);
    load(stage, trained());
    single_greedy = models::generate(stage, prompt, 24, {0.0, 0, 1});
    single_sampled = models::generate(stage, prompt, 24, {0.8, 10, 7});
  });
  std::mutex m;
  std::map<int, std::vector<std::int32_t>> greedy, sampled;
  run_threads(2, [&](ThreadsCommunicator& world) {
    Stage stage(world, cfg, true, true, 0, cfg.layers);
    load(stage, trained());
    auto g = models::generate(stage, prompt, 24, {0.0, 0, 1});
    auto s = models::generate(stage, prompt, 24, {0.8, 10, 7});
    std::lock_guard lock(m);
    greedy[world.rank()] = std::move(g);
    sampled[world.rank()] = std::move(s);
  });
  for (int r = 0; r < 2; ++r) {
    INFO("tensor rank " << r);
    CHECK(greedy.at(r) == single_greedy);
    CHECK(sampled.at(r) == single_sampled);
  }
}

TEST_CASE("generate: sampling is reproducible by seed and picks only among the top k", "[data][generate]") {
  const auto cfg = model_config();
  run_threads(1, [&](ThreadsCommunicator& world) {
    Stage stage(world, cfg, true, true, 0, cfg.layers);
    load(stage, trained());
    const models::SamplingConfig s{2.0, 3, 11};  // hot: the second and third choices get picked too
    const auto a = models::generate(stage, prompt, 30, s);
    const auto b = models::generate(stage, prompt, 30, s);
    CHECK(a == b);
    auto other = s;
    other.seed = 12;
    CHECK(models::generate(stage, prompt, 30, other) != a);
    std::vector<std::int32_t> seq = prompt;
    std::size_t not_argmax = 0;
    for (std::size_t t = 0; t < a.size(); ++t) {
      INFO("token " << t);
      auto row = last_logits(stage, seq);
      row.resize(cfg.vocab);
      std::vector<float> sorted = row;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      CHECK(row[std::size_t(a[t])] >= sorted[2]);  // among the 3 largest
      if (std::size_t(a[t]) != argmax_real(row, cfg.vocab)) ++not_argmax;
      seq.push_back(a[t]);
    }
    CHECK(not_argmax > 0);
    // All ids at a temperature that makes every real id likely: never a padding id.
    for (auto id : models::generate(stage, prompt, 200, {100.0, 0, 3})) CHECK(std::size_t(id) < cfg.vocab);
  });
}

TEST_CASE("generate: sample_token's frequencies follow the tempered softmax of the top k", "[data][generate]") {
  // logits ln 1, ln 2, ln 3, ln 4 at temperature 1, top 3: probabilities 2/9, 3/9, 4/9 for ids 1, 2, 3.
  const std::vector<float> logits{0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  const CounterRng rng{5, 9};
  std::vector<double> count(4, 0.0);
  const int n = 40000;
  for (int i = 0; i < n; ++i) count[models::sample_token(logits, 1.0, 3, rng.uniform(std::uint64_t(i)))] += 1;
  CHECK(count[0] == 0);
  CHECK(std::abs(count[1] / n - 2.0 / 9) < 0.01);
  CHECK(std::abs(count[2] / n - 3.0 / 9) < 0.01);
  CHECK(std::abs(count[3] / n - 4.0 / 9) < 0.01);
  // Temperature 0.5 squares the odds: 4, 9, 16 over 29.
  std::fill(count.begin(), count.end(), 0.0);
  for (int i = 0; i < n; ++i) count[models::sample_token(logits, 0.5, 3, rng.uniform(std::uint64_t(i)))] += 1;
  CHECK(std::abs(count[3] / n - 16.0 / 29) < 0.01);
  CHECK(models::sample_token(logits, 0.0, 0, 0.999) == 3);
  CHECK_THROWS_WITH(models::sample_token(logits, -1.0, 0, 0.5), Catch::Contains("temperature -1"));
}

TEST_CASE("generate: a stage without the whole model or a prompt outside the vocabulary is refused",
          "[data][generate]") {
  const auto cfg = model_config();
  run_threads(1, [&](ThreadsCommunicator& world) {
    Stage head_only(world, cfg, true, false, 0, 1);
    CHECK_THROWS_WITH(models::generate(head_only, prompt, 1, {}), Catch::Contains("whole model"));
    Stage stage(world, cfg, true, true, 0, cfg.layers);
    const std::vector<std::int32_t> bad{1, std::int32_t(cfg.vocab)};
    CHECK_THROWS_WITH(models::generate(stage, bad, 1, {}), Catch::Contains("prompt id " + std::to_string(cfg.vocab)));
  });
}

TEST_CASE("generate: sampling runs without dropout and leaves the stage's training setting as it was",
          "[data][generate][dropout]") {
  const auto cfg = model_config();
  auto dropped = cfg;
  dropped.dropout = 0.3;  // no parameters of its own: the same checkpoint loads into both
  run_threads(1, [&](ThreadsCommunicator& world) {
    Stage plain(world, cfg, true, true, 0, cfg.layers), noisy(world, dropped, true, true, 0, dropped.layers);
    load(plain, trained());
    load(noisy, trained());
    for (const auto& s : {models::SamplingConfig{0.0, 0, 1}, models::SamplingConfig{0.8, 3, 2}})
      CHECK(models::generate(noisy, prompt, 12, s) == models::generate(plain, prompt, 12, s));
    CHECK(noisy.training());
    // In training the same forward draws masks: dropout is real there, and only switched off for sampling.
    noisy.set_token_coordinates(0, {0});
    CHECK(last_logits(noisy, prompt) != last_logits(plain, prompt));
    noisy.set_training(false);
    CHECK(last_logits(noisy, prompt) == last_logits(plain, prompt));
  });
}
