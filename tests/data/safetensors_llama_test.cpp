// A Llama-family model under Hugging Face LlamaForCausalLM's tensor names: the export from tp 2 checked element by
// element against naive index loops over the gathered mpar tensors, config.json, the import into other layouts bit
// for bit, and damaged or mismatched files refused with the tensor and both shapes named.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <mpar/io/safetensors.hpp>
#include <mpar/io/safetensors_gpt2.hpp>
#include <mpar/io/safetensors_llama.hpp>
#include <mpar/models/gpt_trainer.hpp>
#include <mpar/mpar.hpp>

#include "models/gpt_test_config.hpp"

using namespace mpar;

namespace llama_safetensors_test {

namespace fs = std::filesystem;
using LlamaFull = std::map<std::string, std::vector<float>>;
using TensorShape = std::vector<std::size_t>;

fs::path llama_scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / "mpar-test-safetensors-llama" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void gather_full(LlamaFull& full, const nn::Parameter& p, std::mutex& m) {
  std::lock_guard lock(m);
  auto& dst = full[p.name];
  if (dst.size() != p.global_size()) dst.assign(p.global_size(), std::nanf(""));
  for (std::size_t k = 0; k < p.value.size(); ++k) dst[p.global_index(k)] = p.value[k];
}

bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

/** 2 blocks of width 32, 4 query heads sharing 2 key/value heads, an MLP of 48 (not a multiple of the width). */
models::GptTrainConfig small_llama_train(std::size_t tp, std::size_t pp) {
  auto c = testing::small_gpt(tp, pp, 1);
  c.model.layers = 2;
  c.model.family = models::ModelFamily::llama;
  c.model.kv_heads = 2;
  c.model.ffn = 48;
  c.model.rope_theta = 500000.0;
  return c;
}

io::HfLlamaConfig hf_llama_config_of(const models::GptConfig& m) {
  return {m.vocab, m.hidden, m.ffn_size(), m.heads, m.kv_head_count(), m.layers, m.seq, m.rope_theta, m.norm_eps};
}

/** Writes the tensors of `from` to `to`, leaving out `drop` and giving `reshape`'s tensor the shape and values of
 *  the first rows of its own (a tensor of another size). */
void rewrite_file(const fs::path& from, const fs::path& to, const std::string& drop, const std::string& reshape = "",
                  TensorShape new_shape = {}) {
  io::SafetensorsFile f(from);
  std::vector<std::vector<float>> values;
  std::vector<io::NamedTensor> out;
  values.reserve(f.entries().size());
  for (const auto& e : f.entries()) {
    if (e.name == drop) continue;
    values.push_back(f.read(e.name));
    TensorShape shape = e.shape;
    if (e.name == reshape) {
      shape = new_shape;
      std::size_t n = 1;
      for (auto d : shape) n *= d;
      values.back().resize(n, 0.5f);
    }
    out.push_back({e.name, shape, std::span<const float>(values.back())});
  }
  io::write_safetensors(to, std::span<const io::NamedTensor>(out), {{"format", "pt"}});
}

}  // namespace llama_safetensors_test

using namespace llama_safetensors_test;

TEST_CASE(
    "safetensors: a Llama model exported from tp 2 under LlamaForCausalLM's names, with config.json, imports "
    "into tp 2 and pp 2 bit for bit",
    "[data][io][llama]") {
  const auto c = small_llama_train(2, 1);
  const std::size_t V = c.model.vocab, Vp = c.model.padded_vocab(), h = c.model.hidden, H = c.model.heads,
                    K = c.model.kv_heads, d = h / H, g = H / K, f = c.model.ffn, L = c.model.layers;
  REQUIRE(Vp > V);  // padding rows to drop
  REQUIRE(K < H);   // grouped-query attention
  const fs::path dir = llama_scratch("export"), file = dir / "model.safetensors";
  std::mutex m;
  LlamaFull model;
  run_threads(2, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, c, testing::gpt_dataset());
    (void)t.train_step();
    t.export_safetensors(file, io::WeightNaming::hf_llama);
    for (auto& [n, q] : t.named_parameters()) gather_full(model, *q, m);
  });

  // Names and shapes: LlamaForCausalLM's state dict ([out, in] matrices), unpadded vocabulary, an untied lm_head.
  io::SafetensorsFile st(file);
  std::map<std::string, TensorShape> shapes;
  for (const auto& e : st.entries()) shapes[e.name] = e.shape;
  std::map<std::string, TensorShape> want = {
      {"model.embed_tokens.weight", {V, h}}, {"model.norm.weight", {h}}, {"lm_head.weight", {V, h}}};
  for (std::size_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    want[p + "input_layernorm.weight"] = {h};
    want[p + "post_attention_layernorm.weight"] = {h};
    want[p + "self_attn.q_proj.weight"] = {H * d, h};
    want[p + "self_attn.k_proj.weight"] = {K * d, h};
    want[p + "self_attn.v_proj.weight"] = {K * d, h};
    want[p + "self_attn.o_proj.weight"] = {h, H * d};
    want[p + "mlp.gate_proj.weight"] = {f, h};
    want[p + "mlp.up_proj.weight"] = {f, h};
    want[p + "mlp.down_proj.weight"] = {h, f};
  }
  CHECK(shapes == want);

  // Values, element by element from mpar's documented layouts: qkv [h, K (g + 2) d] with KV head j's g query heads,
  // then k_j, then v_j; gate_up [h, 2, f]; every matrix transposed.
  const auto rows_equal = [&](const std::string& hf, const std::string& ours, std::size_t rows) {
    const auto a = st.read(hf);
    const auto& b = model.at(ours);
    return std::equal(a.begin(), a.end(), b.begin()) && a.size() == rows * h;
  };
  CHECK(rows_equal("model.embed_tokens.weight", "embed.token.weight", V));
  CHECK(rows_equal("lm_head.weight", "head.weight", V));
  CHECK(bits_equal(st.read("model.norm.weight"), model.at("final_norm.weight")));
  for (std::size_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".", b = "block" + std::to_string(l) + ".";
    INFO(p);
    CHECK(bits_equal(st.read(p + "input_layernorm.weight"), model.at(b + "ln1.weight")));
    CHECK(bits_equal(st.read(p + "post_attention_layernorm.weight"), model.at(b + "ln2.weight")));
    const auto q = st.read(p + "self_attn.q_proj.weight"), k = st.read(p + "self_attn.k_proj.weight"),
               v = st.read(p + "self_attn.v_proj.weight"), o = st.read(p + "self_attn.o_proj.weight"),
               gate = st.read(p + "mlp.gate_proj.weight"), up = st.read(p + "mlp.up_proj.weight"),
               down = st.read(p + "mlp.down_proj.weight");
    const auto &qkv = model.at(b + "attn.qkv.weight"), &proj = model.at(b + "attn.proj.weight"),
               &gu = model.at(b + "mlp.gate_up.weight"), &dn = model.at(b + "mlp.down.weight");
    const std::size_t cols = (H + 2 * K) * d;
    std::size_t wrong = 0;
    for (std::size_t x = 0; x < h; ++x) {
      for (std::size_t head = 0; head < H; ++head)  // query head `head` belongs to KV head head / g
        for (std::size_t i = 0; i < d; ++i)
          wrong += q[(head * d + i) * h + x] != qkv[x * cols + (head / g) * (g + 2) * d + (head % g) * d + i];
      for (std::size_t j = 0; j < K; ++j)
        for (std::size_t i = 0; i < d; ++i) {
          wrong += k[(j * d + i) * h + x] != qkv[x * cols + j * (g + 2) * d + g * d + i];
          wrong += v[(j * d + i) * h + x] != qkv[x * cols + j * (g + 2) * d + (g + 1) * d + i];
        }
      for (std::size_t r = 0; r < H * d; ++r) wrong += o[x * H * d + r] != proj[r * h + x];
      for (std::size_t n = 0; n < f; ++n) {
        wrong += gate[n * h + x] != gu[(x * 2 + 0) * f + n];
        wrong += up[n * h + x] != gu[(x * 2 + 1) * f + n];
        wrong += down[x * f + n] != dn[n * h + x];
      }
    }
    CHECK(wrong == 0);
  }

  // config.json beside the file: what LlamaForCausalLM.from_pretrained reads.
  std::ifstream cj(dir / "config.json");
  const std::string json((std::istreambuf_iterator<char>(cj)), std::istreambuf_iterator<char>());
  for (const std::string& line : std::vector<std::string>{
           "\"architectures\": [\"LlamaForCausalLM\"]", "\"hidden_size\": 32", "\"intermediate_size\": 48",
           "\"num_attention_heads\": 4", "\"num_key_value_heads\": 2", "\"num_hidden_layers\": 2",
           "\"vocab_size\": " + std::to_string(V), "\"max_position_embeddings\": 16", "\"rms_norm_eps\": 1e-05",
           "\"rope_theta\": 500000", "\"tie_word_embeddings\": false", "\"attention_bias\": false",
           "\"mlp_bias\": false", "\"hidden_act\": \"silu\"", "\"torch_dtype\": \"float32\""}) {
    INFO(line);
    CHECK(json.find(line) != std::string::npos);
  }

  // Back into tp 2 and into pp 2 (another seed, so nothing is left from the initialisation): every parameter bit
  // for bit, the padding rows of the embedding and the head zero.
  for (const auto& [tp, pp] : {std::pair<std::size_t, std::size_t>{2, 1}, {1, 2}}) {
    auto ci = small_llama_train(tp, pp);
    ci.model.seed = 99;
    LlamaFull loaded;
    std::size_t missing = 0;
    run_threads(int(tp * pp), [&](ThreadsCommunicator& world) {
      models::GptTrainer<ThreadsCommunicator> t(world, ci, testing::gpt_dataset());
      io::SafetensorsWeights w(file, io::WeightNaming::hf_llama, hf_llama_config_of(ci.model));
      (void)t.load_weights(w);
      {
        std::lock_guard lock(m);
        missing += w.missing().size();
      }
      for (auto& [name, q] : t.named_parameters()) gather_full(loaded, *q, m);
    });
    INFO("tp " << tp << " pp " << pp);
    CHECK(missing == 0);
    CHECK(loaded.size() == model.size());
    for (const auto& [n, v] : model) {
      INFO(n);
      const auto& w = loaded.at(n);
      if (n != "embed.token.weight" && n != "head.weight") {
        CHECK(bits_equal(w, v));
        continue;
      }
      REQUIRE(w.size() == Vp * h);
      CHECK(std::memcmp(w.data(), v.data(), 4 * V * h) == 0);
      CHECK(std::all_of(w.begin() + std::ptrdiff_t(V * h), w.end(), [](float x) { return x == 0.0f; }));
    }
  }
}

TEST_CASE("safetensors: a damaged or mismatched LlamaForCausalLM file is refused, naming the tensor and the shapes",
          "[data][io][llama]") {
  const auto c = small_llama_train(1, 1);
  const fs::path dir = llama_scratch("faults"), file = dir / "model.safetensors";
  run_threads(1, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator> t(world, c, testing::gpt_dataset());
    t.export_safetensors(file, io::WeightNaming::hf_llama);
    // A family's names only for that family.
    CHECK_THROWS_WITH(t.export_safetensors(dir / "x.safetensors", io::WeightNaming::hf_gpt2),
                      Catch::Contains("a Llama model has no GPT-2 names"));
  });
  const auto m = c.model;
  const std::size_t h = m.hidden, cols = (m.heads + 2 * m.kv_heads) * (h / m.heads);
  const TensorShape qkv{h, cols};

  SECTION("a missing k_proj") {
    const fs::path cut = dir / "cut.safetensors";
    rewrite_file(file, cut, "model.layers.1.self_attn.k_proj.weight");
    io::SafetensorsWeights w(cut, io::WeightNaming::hf_llama, hf_llama_config_of(m));
    CHECK(w("block0.attn.qkv.weight", qkv).size() == h * cols);  // the intact layer loads
    CHECK_THROWS_WITH(w("block1.attn.qkv.weight", qkv),
                      Catch::Contains("tensor 'model.layers.1.self_attn.k_proj.weight' is missing") &&
                          Catch::Contains("cut.safetensors"));
  }
  SECTION("a k_proj of another size, and a model with fewer key/value heads than the file") {
    const fs::path bad = dir / "bad.safetensors";
    rewrite_file(file, bad, "", "model.layers.0.self_attn.k_proj.weight", {8, h});
    io::SafetensorsWeights w(bad, io::WeightNaming::hf_llama, hf_llama_config_of(m));
    CHECK_THROWS_WITH(w("block0.attn.qkv.weight", qkv),
                      Catch::Contains("tensor 'model.layers.0.self_attn.k_proj.weight' has shape [8, 32]") &&
                          Catch::Contains("needs [16, 32]"));
    auto one_kv = m;
    one_kv.kv_heads = 1;
    io::SafetensorsWeights w1(file, io::WeightNaming::hf_llama, hf_llama_config_of(one_kv));
    CHECK_THROWS_WITH(w1("block0.attn.qkv.weight", {h, (m.heads + 2) * (h / m.heads)}),
                      Catch::Contains("tensor 'model.layers.0.self_attn.k_proj.weight' has shape [16, 32]") &&
                          Catch::Contains("needs [8, 32]"));
  }
  SECTION("a gate_proj of another MLP width") {
    auto wide = m;
    wide.ffn = 64;
    io::SafetensorsWeights w(file, io::WeightNaming::hf_llama, hf_llama_config_of(wide));
    CHECK_THROWS_WITH(w("block1.mlp.gate_up.weight", {h, 2, 64}),
                      Catch::Contains("tensor 'model.layers.1.mlp.gate_proj.weight' has shape [48, 32]") &&
                          Catch::Contains("needs [64, 32]"));
  }
  SECTION("a model with more layers than the file: the absent layer is reported missing, not invented") {
    io::SafetensorsWeights w(file, io::WeightNaming::hf_llama, hf_llama_config_of(m));
    CHECK(w("block2.attn.qkv.weight", qkv).empty());
    CHECK(w.missing() == std::vector<std::string>{"block2.attn.qkv.weight"});
  }
  SECTION("without the head counts, or a GPT-2 model under Llama's names") {
    CHECK_THROWS_WITH(io::SafetensorsWeights(file, io::WeightNaming::hf_llama),
                      Catch::Contains("Llama names need the head counts"));
    run_threads(1, [&](ThreadsCommunicator& world) {
      auto gpt = testing::small_gpt(1, 1, 1);
      gpt.model.layers = 1;
      models::GptTrainer<ThreadsCommunicator> t(world, gpt, testing::gpt_dataset());
      CHECK_THROWS_WITH(t.export_safetensors(dir / "g.safetensors", io::WeightNaming::hf_llama),
                        Catch::Contains("a GPT-2 model has no LlamaForCausalLM names"));
    });
  }
}
