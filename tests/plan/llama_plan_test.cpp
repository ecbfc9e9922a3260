// The planner's Llama counts against the Llama model mpar builds: parameters (whole, and per rank against what a
// GptTrainer's ranks hold at tp 1/2 and pp 1/2), FLOPs against the weight matrices, and the search's refusals
// (tp not dividing the key/value heads, context parallelism, experts).
#include <catch2/catch.hpp>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "mpar/comm/threads.hpp"
#include "mpar/models/gpt_trainer.hpp"
#include "mpar/plan.hpp"

namespace {

mpar::models::GptConfig llama_config(std::size_t hidden, std::size_t heads, std::size_t kv_heads, std::size_t ffn) {
  mpar::models::GptConfig g;
  g.family = mpar::models::ModelFamily::llama;
  g.vocab = 100, g.hidden = hidden, g.heads = heads, g.kv_heads = kv_heads, g.ffn = ffn, g.layers = 3, g.seq = 24;
  return g;
}

/** The planner's model of `g`, as train_gpt builds it (`planner_model`): the padded vocabulary. */
mpar::plan::GptModel planned(const mpar::models::GptConfig& g) {
  mpar::plan::GptModel m{g.layers, g.hidden, g.heads, g.seq, g.padded_vocab()};
  m.family = g.family, m.kv_heads = g.kv_heads, m.ffn = g.ffn;
  return m;
}

/** A small text, so the trainer needs no file from the system. */
std::string llama_text_path() {
  static const std::string path = [] {
    const auto p = std::filesystem::temp_directory_path() / "mpar_plan_llama_parameters.txt";
    std::ofstream f(p);
    for (int i = 0; i < 400; ++i) f << "grouped-query attention, SwiGLU; RMSNorm: rotary " << i % 10 << "\n";
    return p.string();
  }();
  return path;
}

}  // namespace

TEST_CASE("Llama: the planner's parameter count is the model's, with grouped-query attention and any SwiGLU width",
          "[plan][llama]") {
  struct Shape {
    std::size_t hidden, heads, kv_heads, ffn;
  };
  for (const Shape s : {Shape{64, 8, 2, 172}, Shape{64, 8, 8, 0}, Shape{96, 6, 1, 256}, Shape{32, 4, 0, 88}}) {
    const mpar::models::GptConfig g = llama_config(s.hidden, s.heads, s.kv_heads, s.ffn);
    const mpar::plan::GptModel m = planned(g);
    INFO("hidden " << s.hidden << ", heads " << s.heads << ", kv_heads " << s.kv_heads << ", ffn " << s.ffn);
    CHECK(m.parameters() == double(g.parameter_count()));
    // The same model counted as GPT-2 differs: positions, biases, a 4h MLP, the tied head.
    mpar::plan::GptModel gpt2 = m;
    gpt2.family = mpar::nn::ModelFamily::gpt2, gpt2.kv_heads = 0, gpt2.ffn = 0;
    CHECK(gpt2.parameters() != m.parameters());
    // FLOPs: every weight matrix of a layer is one product of 2 flops per weight and token (the two gains are
    // not), plus the attention scores 4 B s^2 h; the head's logits 2 B s V h.
    const double B = 3, tokens = B * double(g.seq), h = double(g.hidden);
    const double weights = m.layer_parameters() - 2 * h;
    CHECK(m.layer_forward_flops(0, B) == Approx(2 * tokens * weights + 4 * B * double(g.seq) * double(g.seq) * h));
    CHECK(m.model_flops(B) ==
          Approx(3 * double(g.layers) * m.layer_forward_flops(0, B) + 6 * tokens * h * double(g.padded_vocab())));
  }
}

TEST_CASE("Llama: the planner's per-rank parameters are what the trainer's ranks hold at tp 1/2, pp 1/2",
          "[plan][llama][memory]") {
  using namespace mpar;
  struct Layout {
    std::size_t tp, pp;
  };
  for (const models::ModelFamily family : {models::ModelFamily::llama, models::ModelFamily::gpt2})
    for (const Layout l : {Layout{1, 1}, Layout{2, 1}, Layout{1, 2}, Layout{2, 2}}) {
      models::GptTrainConfig cfg;
      cfg.model.hidden = 32, cfg.model.heads = 4, cfg.model.layers = 4, cfg.model.seq = 16;
      cfg.model.family = family;
      if (family == models::ModelFamily::llama) cfg.model.kv_heads = 2, cfg.model.ffn = 72;
      cfg.tp = l.tp, cfg.pp = l.pp, cfg.microbatches = 2, cfg.global_batch = 4, cfg.steps = 1, cfg.warmup = 0;
      std::vector<double> held(l.tp * l.pp, 0.0);
      std::size_t padded_vocab = 0;
      run_threads(int(l.tp * l.pp), [&](ThreadsCommunicator& world) {
        data::CharDataset ds(llama_text_path(), cfg.model.seq);
        models::GptTrainConfig c = cfg;
        c.model.vocab = ds.vocab_size();
        models::GptTrainer<ThreadsCommunicator> tr(world, c, ds);
        double n = 0;
        for (const nn::Parameter* p : tr.parameters()) n += double(p->value.size());
        held[std::size_t(world.rank())] = n;
        if (world.rank() == 0) padded_vocab = tr.config().model.padded_vocab();
      });
      plan::GptModel m{cfg.model.layers, cfg.model.hidden, cfg.model.heads, cfg.model.seq, padded_vocab};
      if (family == models::ModelFamily::llama) m.family = family, m.kv_heads = 2, m.ffn = 72;
      plan::ParallelConfig c;
      c.tp = l.tp, c.pp = l.pp;
      for (std::size_t r = 0; r < l.pp; ++r)
        for (std::size_t t = 0; t < l.tp; ++t) {
          INFO(models::name_of(family) << " tp=" << l.tp << " pp=" << l.pp << ": pipeline rank " << r
                                       << ", tensor rank " << t);
          CHECK(plan::rank_parameters(m, c, r) == held[r * l.tp + t]);
        }
    }
}

TEST_CASE("Llama: the search refuses tp not dividing the key/value heads and experts; it plans context parallelism",
          "[plan][llama][search]") {
  using namespace mpar::plan;
  Problem p;
  p.model = GptModel{8, 1024, 16, 1024, 32000};
  p.model.family = ModelFamily::llama, p.model.kv_heads = 2, p.model.ffn = 2816;
  p.cluster = a100_selene(8);
  p.global_batch = 16;
  const CostModel cm(p.model, p.cluster);
  SearchSpace s;
  s.tp = 4;
  const Plan four = search(p, cm, s);
  CHECK(four.best.empty());
  REQUIRE(four.rejected_by_kind.count("heads"));
  CHECK(four.rejected_by_kind.at("heads") == four.considered);
  CHECK(four.rejected.front().reason.find("does not divide the 2 key/value heads") != std::string::npos);
  s.tp = 2;  // divides them: plans
  const Plan two = search(p, cm, s);
  REQUIRE(!two.best.empty());
  CHECK(two.best.front().config.tp == 2);
  // The same problem as GPT-2 (16 key/value heads) plans at tp 4.
  Problem gpt2 = p;
  gpt2.model.family = ModelFamily::gpt2, gpt2.model.kv_heads = 0, gpt2.model.ffn = 0;
  s.tp = 4;
  CHECK(!search(gpt2, CostModel(gpt2.model, gpt2.cluster), s).best.empty());

  s.tp.reset();
  s.cp = 2;
  const Plan ring = search(p, cm, s);
  REQUIRE(!ring.best.empty());
  CHECK(ring.best.front().config.cp == 2);
  // Ring grouped-query attention sends only the KV heads: 2 of 16 here, an eighth of the same model's MHA ring.
  ParallelConfig c;
  c.tp = 2, c.cp = 2;
  Problem mha = p;
  mha.model.kv_heads = 16;
  const double gqa_bytes = cm.layer_work(c).ring_block_bytes;
  CHECK(gqa_bytes > 0);
  CHECK(gqa_bytes == Approx(CostModel(mha.model, mha.cluster).layer_work(c).ring_block_bytes / 8));

  Problem moe = p;
  moe.model.experts = 8;
  CHECK_THROWS_WITH(moe.validate(), Catch::Contains("built for GPT-2's blocks only"));
  Problem odd = p;
  odd.model.kv_heads = 3;
  CHECK_THROWS_WITH(odd.validate(), Catch::Contains("--heads 16 is not divisible by --kv-heads 3"));
}

TEST_CASE("Llama: activations per layer count what mpar's Llama block keeps", "[plan][llama][memory]") {
  using namespace mpar::plan;
  GptModel m{4, 64, 8, 32, 128};
  m.family = ModelFamily::llama, m.kv_heads = 2, m.ffn = 160;
  const Precision p = Precision::fp32_host(8);
  const double s = 32, b = 2, h = 64, f = 160, a = 8, e = 4;
  for (const std::size_t t : {std::size_t(1), std::size_t(2)}) {
    // Replicated: two norm inputs and their rstd, the QKV and gate-and-up inputs. Split: q, k, v with the KV heads
    // repeated, the projection's input, SiluGate's [s b, 2f] and the down projection's [s b, f] inputs, the
    // probabilities.
    const double replicated = e * (4 * s * b * h + 2 * s * b);
    const double split = e * (4 * s * b * h + 3 * s * b * f) / double(t), probabilities = e * a * s * s * b / double(t);
    CHECK(layer_activation_bytes(m, 2, t, false, Recompute::none, p) == Approx(replicated + split + probabilities));
    CHECK(layer_activation_bytes(m, 2, t, false, Recompute::selective, p) == Approx(replicated + split));
    CHECK(layer_activation_bytes(m, 2, t, true, Recompute::selective, p) == Approx((replicated + split * t) / t));
    CHECK(layer_activation_bytes(m, 2, t, false, Recompute::full, p) == Approx(e * s * b * h));
  }
  // cp 2 (ring grouped-query attention): s / 2 tokens; q, k, v unrepeated (h + 2 kv d = 96 wide), the core's output
  // and the projection's input, the fp32 log-sum-exp instead of the probabilities, selective recomputation or not.
  const double sc = s / 2, replicated = e * (4 * sc * b * h + 2 * sc * b);
  for (const Recompute r : {Recompute::none, Recompute::selective})
    CHECK(layer_activation_bytes(m, 2, 2, false, r, p, false, 2) ==
          Approx(replicated + e * (sc * b * (96 + 2 * h) + 3 * sc * b * f) / 2 + 4 * a * sc * b / 2));
}
