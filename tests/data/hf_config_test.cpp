// Hugging Face config.json read into a GptConfig: Llama's and GPT-2's keys as transformers writes them, mpar's own
// export read back, every configuration mpar's blocks cannot reproduce refused by name, and sizes given on a command
// line checked against the file.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>

#include <mpar/io/hf_config.hpp>
#include <mpar/io/safetensors_llama.hpp>
#include <mpar/models/gpt_config_from_hf.hpp>

using namespace mpar;

namespace hf_config_test {

// What transformers' LlamaConfig.save_pretrained writes for a small model (keys mpar does not use included).
constexpr std::string_view llama_json = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 512,
  "initializer_range": 0.02,
  "intermediate_size": 1376,
  "max_position_embeddings": 4096,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 8,
  "num_hidden_layers": 6,
  "num_key_value_heads": 2,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "float32",
  "transformers_version": "4.46.0",
  "use_cache": true,
  "vocab_size": 32000
})";

// Hugging Face's gpt2 config.json, abridged to the keys that matter and one nested object of the real file.
constexpr std::string_view gpt2_json = R"({
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
  "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
  "n_inner": null, "n_layer": 12, "n_positions": 1024,
  "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}}, "vocab_size": 50257
})";

/** `json` with the text `from` replaced by `to` (which must occur). */
std::string edited(std::string_view json, std::string_view from, std::string_view to) {
  std::string s(json);
  const auto at = s.find(from);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}

io::HfModelConfig parsed(std::string_view json) { return io::parse_hf_config(json, "dir/config.json"); }

}  // namespace hf_config_test

using namespace hf_config_test;

TEST_CASE("config.json: Llama's and GPT-2's sizes as transformers writes them", "[data][hf_config]") {
  const io::HfModelConfig l = parsed(llama_json);
  CHECK(l.family == nn::ModelFamily::llama);
  CHECK((l.vocab == 32000 && l.hidden == 512 && l.ffn == 1376 && l.heads == 8 && l.kv_heads == 2 && l.layers == 6 &&
         l.seq == 4096));
  CHECK(l.rope_theta == 500000.0);
  CHECK(l.norm_eps == 1e-6f);

  // Defaults of transformers' LlamaConfig where a key is absent: as many KV heads as heads, epsilon 1e-6, base 1e4.
  std::string bare = edited(llama_json, R"("num_key_value_heads": 2,)", "");
  bare = edited(bare, R"("rms_norm_eps": 1e-06,)", "");
  bare = edited(bare, R"("rope_theta": 500000.0,)", "");
  const io::HfModelConfig d = parsed(bare);
  CHECK((d.kv_heads == 8 && d.norm_eps == 1e-6f && d.rope_theta == 10000.0));

  // Newer transformers keep the base in rope_parameters.
  const io::HfModelConfig r = parsed(edited(llama_json, R"("rope_scaling": null,)",
                                            R"("rope_parameters": {"rope_type": "default", "rope_theta": 250000},)"));
  CHECK(r.rope_theta == 250000.0);

  const io::HfModelConfig g = parsed(gpt2_json);
  CHECK(g.family == nn::ModelFamily::gpt2);
  CHECK((g.vocab == 50257 && g.hidden == 768 && g.heads == 12 && g.kv_heads == 12 && g.layers == 12 && g.seq == 1024 &&
         g.ffn == 3072));
}

TEST_CASE("config.json: mpar's Llama export reads back as the sizes it was written from", "[data][hf_config]") {
  const auto dir = std::filesystem::temp_directory_path() / "mpar-test-hf-config";
  std::filesystem::create_directories(dir);
  const io::HfLlamaConfig written{80, 48, 96, 6, 3, 5, 24, 50000.0, 2e-6f};
  io::write_hf_llama_config(dir / "config.json", written);
  const io::HfModelConfig c = io::read_hf_config(dir / "config.json");
  CHECK(c.family == nn::ModelFamily::llama);
  CHECK((c.vocab == 80 && c.hidden == 48 && c.ffn == 96 && c.heads == 6 && c.kv_heads == 3 && c.layers == 5 &&
         c.seq == 24));
  CHECK(c.rope_theta == 50000.0);
  CHECK(c.norm_eps == 2e-6f);
  std::filesystem::remove_all(dir);
  CHECK_THROWS_WITH(io::read_hf_config(dir / "config.json"), Catch::Contains("cannot open the model's config.json"));
}

TEST_CASE("config.json: what mpar's blocks cannot compute is refused by name", "[data][hf_config]") {
  using Catch::Contains;
  const std::map<std::string, std::pair<std::string, std::string>> damaged = {
      {"not JSON", {std::string(llama_json.substr(0, 40)), "dir/config.json: "}},
      {"an array", {"[1, 2]", "holds one JSON object, found an array"}},
      {"another model", {edited(llama_json, R"("llama")", R"("mistral")"), R"("model_type" is "mistral")"}},
      {"scaled rotary positions",
       {edited(llama_json, R"("rope_scaling": null)", R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})"),
        R"(rope_type "llama3")"}},
      {"tied Llama embeddings",
       {edited(llama_json, R"("tie_word_embeddings": false)", R"("tie_word_embeddings": true)"),
        "\"tie_word_embeddings\" is true"}},
      {"another activation", {edited(llama_json, R"("silu")", R"("gelu")"), R"("hidden_act" is "gelu")"}},
      {"attention biases",
       {edited(llama_json, R"("attention_bias": false)", R"("attention_bias": true)"), "\"attention_bias\" is true"}},
      {"a missing size", {edited(llama_json, R"("hidden_size": 512,)", ""), "\"hidden_size\" is missing"}},
      {"a fractional size",
       {edited(llama_json, R"("num_hidden_layers": 6)", R"("num_hidden_layers": 6.5)"), "\"num_hidden_layers\""}},
      {"heads not grouping",
       {edited(llama_json, R"("num_key_value_heads": 2)", R"("num_key_value_heads": 3)"),
        "num_key_value_heads 3 must divide num_attention_heads"}},
      {"another head width", {edited(llama_json, R"("head_dim": 64)", R"("head_dim": 128)"), "\"head_dim\" is 128"}},
      {"GPT-2 with ReLU", {edited(gpt2_json, R"("gelu_new")", R"("relu")"), R"("activation_function" is "relu")"}},
      {"GPT-2 with another epsilon",
       {edited(gpt2_json, R"("layer_norm_epsilon": 1e-05)", R"("layer_norm_epsilon": 1e-06)"),
        "\"layer_norm_epsilon\""}},
  };
  for (const auto& [what, fault] : damaged) {
    INFO(what);
    CHECK_THROWS_WITH(parsed(fault.first), Contains(fault.second) && Contains("dir/config.json"));
  }
}

TEST_CASE("config.json: sizes given on the command line must agree with the file", "[data][hf_config]") {
  using Catch::Contains;
  const io::HfModelConfig llama = parsed(llama_json);
  const auto given = [](std::map<std::string, bool> flags) {
    return [flags](std::string_view f) { return flags.contains(std::string(f)); };
  };
  models::GptConfig mc;
  models::apply_hf_config(mc, llama, "dir/config.json", given({}), "prog");
  CHECK((mc.is_llama() && mc.vocab == 32000 && mc.hidden == 512 && mc.ffn_size() == 1376 && mc.heads == 8 &&
         mc.kv_head_count() == 2 && mc.layers == 6 && mc.seq == 4096 && mc.norm_eps == 1e-6f &&
         mc.rope_theta == 500000.0));

  models::GptConfig shorter;  // a shorter context than the model's: Llama has no position table to match
  shorter.seq = 256;
  models::apply_hf_config(shorter, llama, "dir/config.json", given({{"seq", true}}), "prog");
  CHECK(shorter.seq == 256);
  shorter.seq = 8192;
  CHECK_THROWS_WITH(models::apply_hf_config(shorter, llama, "dir/config.json", given({{"seq", true}}), "prog"),
                    Contains("--seq 8192 is longer than the 4096 positions"));

  models::GptConfig wrong;
  wrong.hidden = 64;
  CHECK_THROWS_WITH(models::apply_hf_config(wrong, llama, "dir/config.json", given({{"hidden", true}}), "prog"),
                    Contains("prog: --hidden 64 differs from dir/config.json's hidden_size 512"));
  models::GptConfig family;  // gpt2 by default, and said so on the command line
  CHECK_THROWS_WITH(models::apply_hf_config(family, llama, "dir/config.json", given({{"model", true}}), "prog"),
                    Contains("--model gpt2 differs from dir/config.json's model_type llama"));

  models::GptConfig gpt;  // GPT-2's position table has n_positions rows: --seq must be that
  gpt.seq = 512;
  CHECK_THROWS_WITH(models::apply_hf_config(gpt, parsed(gpt2_json), "g/config.json", given({{"seq", true}}), "prog"),
                    Contains("--seq 512 differs from g/config.json's n_positions 1024"));
}
