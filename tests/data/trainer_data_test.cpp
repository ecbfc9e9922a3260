// The trainer's data sources, validation loss, named parameters, weight loading and the decay rule,
// each under several layouts against the single-rank run.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <mpar/data/token_file.hpp>
#include <mpar/data/token_vector.hpp>
#include <mpar/models/gpt_trainer.hpp>
#include <mpar/mpar.hpp>

#include "models/gpt_test_config.hpp"

using namespace mpar;
namespace fs = std::filesystem;

namespace {

/** Validation ids: the text's characters read backwards (other sequences than training sees). */
const data::TokenVector& validation_ids() {
  static const data::TokenVector v = [] {
    const auto& ids = testing::gpt_dataset().ids();
    return data::TokenVector(std::vector<std::int32_t>(ids.rbegin(), ids.rend()), testing::gpt_dataset().vocab_size(),
                             16, "reversed text");
  }();
  return v;
}

struct ValRun {
  std::vector<double> train_losses, val_losses;
};

/** Trains `steps` steps, evaluating 3 validation batches before the first and after every step. */
ValRun run_with_validation(const models::GptTrainConfig& c, std::size_t steps) {
  ValRun res;
  run_threads(int(c.world_size()), [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, c, testing::gpt_dataset());
    const double v0 = t.evaluate(validation_ids(), 3, 11);
    if (world.rank() == 0) res.val_losses.push_back(v0);
    for (std::size_t s = 0; s < steps; ++s) {
      const auto r = t.train_step();
      const double v = t.evaluate(validation_ids(), 3, 11);
      if (world.rank() == 0) {
        res.train_losses.push_back(r.loss);
        res.val_losses.push_back(v);
      }
    }
  });
  return res;
}

}  // namespace

TEST_CASE("validation loss: equal across tp/pp/dp layouts, and evaluating changes nothing", "[data][train]") {
  const std::size_t steps = 3;
  // Reference: single rank, training without any evaluation in between.
  std::vector<double> plain;
  run_threads(1, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, testing::small_gpt(1, 1, 1), testing::gpt_dataset());
    for (std::size_t s = 0; s < steps; ++s) plain.push_back(t.train_step().loss);
  });
  const ValRun ref = run_with_validation(testing::small_gpt(1, 1, 1), steps);
  // Evaluating between steps leaves the training bit-for-bit unchanged.
  REQUIRE(ref.train_losses == plain);
  // An independent value for the initial validation loss: near ln(vocab) for a fresh model.
  CHECK(ref.val_losses[0] == Approx(std::log(double(testing::gpt_dataset().vocab_size()))).epsilon(0.05));
  CHECK(ref.val_losses.back() < ref.val_losses.front());
  struct L {
    std::size_t tp, pp, dp;
    const char* schedule;
    bool zero1 = false;
  };
  for (const L l :
       {L{2, 2, 1, "1f1b"}, L{1, 2, 2, "gpipe"}, L{2, 1, 2, "1f1b"}, L{1, 1, 2, "1f1b", true}, L{1, 2, 1, "zb_h1"}}) {
    INFO("tp " << l.tp << " pp " << l.pp << " dp " << l.dp << " " << l.schedule << (l.zero1 ? " zero1" : ""));
    auto c = testing::small_gpt(l.tp, l.pp, l.dp, l.schedule);
    if (l.zero1) c.zero = parallel::ZeroStage::optimizer_states;
    const ValRun got = run_with_validation(c, steps);
    REQUIRE(got.val_losses.size() == ref.val_losses.size());
    for (std::size_t i = 0; i < ref.val_losses.size(); ++i) {
      INFO("evaluation " << i);
      CHECK(got.val_losses[i] == Approx(ref.val_losses[i]).epsilon(2e-5));
      if (i > 0) CHECK(got.train_losses[i - 1] == Approx(ref.train_losses[i - 1]).epsilon(2e-5));
    }
  }
}

TEST_CASE("validation loss is computed without dropout; evaluating leaves a dropout run's training unchanged",
          "[data][train][dropout]") {
  const std::size_t steps = 3;
  auto dropped = testing::small_gpt(1, 1, 1);
  dropped.model.dropout = 0.3;
  std::vector<double> plain;
  run_threads(1, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, dropped, testing::gpt_dataset());
    for (std::size_t s = 0; s < steps; ++s) plain.push_back(t.train_step().loss);
  });
  const ValRun with = run_with_validation(dropped, steps),
               without = run_with_validation(testing::small_gpt(1, 1, 1), 1);
  // The same initial weights (dropout has none): evaluated without dropout, the same validation loss, bit for bit.
  CHECK(with.val_losses[0] == without.val_losses[0]);
  // Training does drop: its first loss is not the one without dropout.
  CHECK(with.train_losses[0] != without.train_losses[0]);
  // Evaluating in between (dropout off, then on again) leaves the training bit-for-bit unchanged.
  CHECK(with.train_losses == plain);
  // Data parallelism with dropout: the same validation and training losses.
  auto dp2 = dropped;
  dp2.dp = 2;
  const ValRun got = run_with_validation(dp2, steps);
  REQUIRE(got.val_losses.size() == with.val_losses.size());
  for (std::size_t i = 0; i < with.val_losses.size(); ++i) {
    INFO("evaluation " << i);
    CHECK(got.val_losses[i] == Approx(with.val_losses[i]).epsilon(2e-5));
    if (i > 0) CHECK(got.train_losses[i - 1] == Approx(with.train_losses[i - 1]).epsilon(2e-5));
  }
}

TEST_CASE("loss convention: padded vocabulary columns never count (an independent value)", "[data][train]") {
  // The loss of a model whose logits are all zero is ln(vocab) exactly, on any data, when the softmax runs
  // over the real vocabulary only (it would be ln(padded vocabulary) if the padding columns counted):
  // load a zero final layer-norm gain and bias (every logit becomes 0) and evaluate.
  run_threads(4, [&](ThreadsCommunicator& world) {
    auto c = testing::small_gpt(2, 2, 1);
    models::GptTrainer<ThreadsCommunicator> t(world, c, testing::gpt_dataset());
    std::vector<float> zeros;
    t.load_weights([&](const std::string& name, const std::vector<std::size_t>& shape) -> std::span<const float> {
      if (name != "final_norm.weight" && name != "final_norm.bias") return {};
      std::size_t n = 1;
      for (auto d : shape) n *= d;
      zeros.assign(n, 0.0f);
      return zeros;
    });
    const double v = t.evaluate(validation_ids(), 2, 5);
    REQUIRE(t.config().model.padded_vocab() > c.model.vocab);  // there are padding columns to exclude
    if (world.rank() == 0) CHECK(v == Approx(std::log(double(c.model.vocab))).epsilon(1e-6));
  });
}

TEST_CASE("token sources: training on a token file equals training on the same ids in memory", "[data][train]") {
  const auto& ids = testing::gpt_dataset().ids();
  const fs::path p = fs::temp_directory_path() / "mpar-test-data" / "train_ids.bin";
  fs::create_directories(p.parent_path());
  {
    std::vector<unsigned char> b(1024, 0);
    const std::uint32_t head[3] = {20240520u, 1u, std::uint32_t(ids.size())};
    for (int w = 0; w < 3; ++w)
      for (int k = 0; k < 4; ++k) b[std::size_t(4 * w + k)] = static_cast<unsigned char>((head[w] >> (8 * k)) & 0xff);
    for (auto id : ids) {
      b.push_back(static_cast<unsigned char>(id & 0xff));
      b.push_back(static_cast<unsigned char>((id >> 8) & 0xff));
    }
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  }
  const data::TokenFile tf(p.string(), testing::gpt_dataset().vocab_size(), 16);
  auto losses = [&](data::SourceRef src, std::size_t tp, std::size_t pp, std::size_t dp) {
    std::vector<double> l;
    auto c = testing::small_gpt(tp, pp, dp);
    run_threads(int(c.world_size()), [&](ThreadsCommunicator& world) {
      models::GptTrainer<ThreadsCommunicator> t(world, c, src);
      if (world.rank() == 0) CHECK(t.data_fingerprint() == src.fingerprint());
      for (int s = 0; s < 3; ++s) {
        const double loss = t.train_step().loss;
        if (world.rank() == 0) l.push_back(loss);
      }
    });
    return l;
  };
  const auto ref = losses(testing::gpt_dataset(), 1, 1, 1);
  CHECK(losses(tf, 1, 1, 1) == ref);  // the same sequences, the same arithmetic
  const auto par = losses(tf, 2, 1, 2);
  for (std::size_t i = 0; i < ref.size(); ++i) CHECK(par[i] == Approx(ref[i]).epsilon(2e-5));
  // A source with more ids than the model's vocabulary is refused before any work.
  auto c = testing::small_gpt(1, 1, 1);
  c.model.vocab = tf.vocab_size() - 1;
  run_threads(1, [&](ThreadsCommunicator& world) {
    CHECK_THROWS_WITH((models::GptTrainer<ThreadsCommunicator>(world, c, tf)),
                      Catch::Contains("train_ids.bin") && Catch::Contains("--vocab"));
  });
}

TEST_CASE("named parameters: stable names, the same set under every layout", "[data][train]") {
  auto c = testing::small_gpt(1, 1, 1);
  c.model.layers = 2;
  std::map<std::string, std::vector<std::size_t>> single;
  run_threads(1, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, c, testing::gpt_dataset());
    for (auto& [n, p] : t.named_parameters()) single[n] = p->global_shape;
  });
  const std::size_t h = 32, V = c.model.padded_vocab(), f = 4 * h, s = 16;
  using S = std::vector<std::size_t>;
  std::map<std::string, S> want = {
      {"embed.token.weight", {V, h}}, {"embed.position", {s, h}}, {"final_norm.weight", {h}}, {"final_norm.bias", {h}}};
  for (int b = 0; b < 2; ++b) {
    const std::string k = "block" + std::to_string(b);
    want[k + ".ln1.weight"] = {h};
    want[k + ".ln1.bias"] = {h};
    want[k + ".attn.qkv.weight"] = {h, 3, h};
    want[k + ".attn.qkv.bias"] = {3, h};
    want[k + ".attn.proj.weight"] = {h, h};
    want[k + ".attn.proj.bias"] = {h};
    want[k + ".ln2.weight"] = {h};
    want[k + ".ln2.bias"] = {h};
    want[k + ".mlp.fc1.weight"] = {h, f};
    want[k + ".mlp.fc1.bias"] = {f};
    want[k + ".mlp.fc2.weight"] = {f, h};
    want[k + ".mlp.fc2.bias"] = {h};
  }
  CHECK(single == want);
  // tp 2 x pp 2: the union over ranks is the same set, each name on the stages that hold it.
  auto c4 = c;
  c4.tp = 2;
  c4.pp = 2;
  std::mutex m;
  std::map<std::string, S> joined;
  run_threads(4, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, c4, testing::gpt_dataset());
    std::lock_guard lock(m);
    for (auto& [n, p] : t.named_parameters()) joined[n] = p->global_shape;
  });
  CHECK(joined == want);
}

TEST_CASE("load_weights: loaded values survive bf16 training steps (the fp32 masters are updated)", "[data][train]") {
  for (const char* precision : {"bf16", "f16", "fp32"}) {
    INFO(precision);
    auto c = testing::small_gpt(2, 2, 1);
    c.precision = parallel::parse_precision(precision);
    c.lr = 0.0;  // the update leaves every weight as it is...
    c.min_lr = 0.0;
    c.weight_decay = 0.0f;
    // ...so after the steps each weight must still be the loaded value, not the initial one.
    auto loaded_value = [](const std::string& name, std::size_t i) {
      return float(std::ldexp(double(CounterRng{77, std::hash<std::string>{}(name)}.bits(i) % 1024) - 512.0, -10));
    };
    std::mutex m;
    std::size_t checked = 0;
    std::vector<std::string> failures;
    run_threads(4, [&](ThreadsCommunicator& world) {
      models::GptTrainer<ThreadsCommunicator> t(world, c, testing::gpt_dataset());
      std::vector<float> full;
      const std::size_t n = t.load_weights([&](const std::string& name, const std::vector<std::size_t>& shape) {
        std::size_t sz = 1;
        for (auto d : shape) sz *= d;
        full.resize(sz);
        for (std::size_t i = 0; i < sz; ++i) full[i] = loaded_value(name, i);  // exact in bf16 and f16
        return std::span<const float>(full);
      });
      for (int s = 0; s < 3; ++s) (void)t.train_step();
      std::lock_guard lock(m);
      if (n != t.named_parameters().size())
        failures.push_back("rank " + std::to_string(world.rank()) + " loaded " + std::to_string(n));
      for (auto& [name, p] : t.named_parameters()) {
        const std::size_t R = p->global_shape.size();
        for (std::size_t k = 0; k < p->value.size(); ++k) {
          std::size_t rem = k, g = 0;
          std::vector<std::size_t> idx(R);
          for (std::size_t d = R; d-- > 0;) {
            idx[d] = rem % p->local_box[d].extent;
            rem /= p->local_box[d].extent;
          }
          for (std::size_t d = 0; d < R; ++d) g = g * p->global_shape[d] + p->local_box[d].offset + idx[d];
          if (p->value[k] != loaded_value(name, g)) {
            failures.push_back(name + "[" + std::to_string(g) + "]");
            break;
          }
          ++checked;
        }
      }
    });
    CHECK(failures.empty());
    CHECK(checked > 0);
  }
}

TEST_CASE("weight decay: by default weight matrices and embeddings only, by name", "[data][train]") {
  auto c = testing::small_gpt(1, 1, 1);
  c.model.layers = 1;
  run_threads(1, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, c, testing::gpt_dataset());
    std::map<std::string, bool> got;
    for (auto& [n, p] : t.named_parameters()) got[n] = optim::decays_weight_matrices(*p);
    const std::map<std::string, bool> want = {
        {"embed.token.weight", true},      {"embed.position", true},         {"final_norm.weight", false},
        {"final_norm.bias", false},        {"block0.ln1.weight", false},     {"block0.ln1.bias", false},
        {"block0.attn.qkv.weight", true},  {"block0.attn.qkv.bias", false},  // [3, hidden]: a bias all the same
        {"block0.attn.proj.weight", true}, {"block0.attn.proj.bias", false}, {"block0.ln2.weight", false},
        {"block0.ln2.bias", false},        {"block0.mlp.fc1.weight", true},  {"block0.mlp.fc1.bias", false},
        {"block0.mlp.fc2.weight", true},   {"block0.mlp.fc2.bias", false}};
    CHECK(got == want);
  });
  // The rule acts in the trainer: with only weight decay moving weights (gradients zeroed by lr... no:
  // compare one step with decay 0 and with decay 0.5) exactly the decayed parameters change.
  auto changed = [&](float wd) {
    std::map<std::string, std::vector<float>> after;
    auto cc = c;
    cc.weight_decay = wd;
    cc.beta1 = 0.5f;  // the optimizer settings reach AdamW (equal in both runs)
    cc.eps = 1e-6f;
    run_threads(1, [&](ThreadsCommunicator& world) {
      models::GptTrainer<ThreadsCommunicator> t(world, cc, testing::gpt_dataset());
      (void)t.train_step();
      for (auto& [n, p] : t.named_parameters()) after[n].assign(p->value.begin(), p->value.end());
    });
    return after;
  };
  const auto a = changed(0.0f), b = changed(0.5f);
  for (const auto& [n, v] : a) {
    INFO(n);
    const bool differs = v != b.at(n);
    const bool matrix = n.find(".bias") == std::string::npos && n.find("norm") == std::string::npos &&
                        n.find(".ln") == std::string::npos;
    CHECK(differs == matrix);
  }
}

TEST_CASE("vocabulary padding follows the mesh: tp 3 and 6 train like one rank", "[data][train]") {
  // Heads 6 (width 36) divide over 3 and 6; the vocabulary is padded to lcm(16, tp) rows, so tp 1, 3 and 6
  // hold embeddings of different padded sizes, whose real rows start equal; the padding columns are
  // excluded from the loss, so every layout computes the same losses.
  auto cfg = [](std::size_t tp, std::size_t pp) {
    auto c = testing::small_gpt(tp, pp, 1);
    c.model.hidden = 36;
    c.model.heads = 6;
    c.global_batch = 4;
    return c;
  };
  auto losses = [&](const models::GptTrainConfig& c, std::size_t& padded) {
    std::vector<double> l;
    run_threads(int(c.world_size()), [&](ThreadsCommunicator& world) {
      models::GptTrainer<ThreadsCommunicator> t(world, c, testing::gpt_dataset());
      if (world.rank() == 0) padded = t.config().model.padded_vocab();
      for (int s = 0; s < 3; ++s) {
        const double loss = t.train_step().loss;
        if (world.rank() == 0) l.push_back(loss);
      }
      const double v = t.evaluate(validation_ids(), 1, 2);
      if (world.rank() == 0) l.push_back(v);
    });
    return l;
  };
  std::size_t p1 = 0, p3 = 0, p6 = 0, p32 = 0;
  const auto ref = losses(cfg(1, 1), p1);
  const auto tp3 = losses(cfg(3, 1), p3), tp6 = losses(cfg(6, 1), p6), tp3pp2 = losses(cfg(3, 2), p32);
  const std::size_t V = testing::gpt_dataset().vocab_size();
  CHECK(p1 == (V + 15) / 16 * 16);
  CHECK(p3 == (V + 47) / 48 * 48);
  CHECK(p6 == (V + 47) / 48 * 48);
  CHECK(p3 % 3 == 0);
  for (std::size_t i = 0; i < ref.size(); ++i) {
    INFO("loss " << i);
    CHECK(tp3[i] == Approx(ref[i]).epsilon(2e-5));
    CHECK(tp6[i] == Approx(ref[i]).epsilon(2e-5));
    CHECK(tp3pp2[i] == Approx(ref[i]).epsilon(2e-5));
  }
}
