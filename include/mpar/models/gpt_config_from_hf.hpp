#pragma once
/**
 * @file `apply_hf_config`: a `GptConfig` takes the family and sizes of a Hugging Face `config.json`, and a size the
 * user also gave on the command line must agree with the file — a program that silently preferred either would
 * load the weights into a model of other shapes or train one the user did not ask for. `hf_llama_config` is the
 * other direction: the sizes a Llama conversion needs, from a `GptConfig`.
 */
#include <filesystem>
#include <string>
#include <string_view>

#include "mpar/cli/parser.hpp"
#include "mpar/core/error.hpp"
#include "mpar/io/hf_config.hpp"
#include "mpar/io/safetensors_llama.hpp"
#include "mpar/models/gpt.hpp"

namespace mpar::models {

/**
 * @brief Sets `mc`'s family and sizes from `hf` (read from `where`). Each of `--model`, `--vocab`, `--hidden`,
 * `--heads`, `--kv-heads`, `--layers`, `--ffn`, `--rope-theta` and `--norm-eps` that `given` says appeared on the
 * command line must equal the file's value (an error names both and the fix); `--seq` may be shorter than a Llama
 * model's context (it has no position table), while GPT-2's `--seq` must equal its position table's rows. Without
 * `--seq` a GPT-2 model takes its table's rows and a Llama model the context it was trained for.
 */
template <class Given>
void apply_hf_config(GptConfig& mc, const io::HfModelConfig& hf, std::string_view where, const Given& given,
                     std::string_view who) {
  const auto agree = [&](std::string_view flag, const auto& ours, const auto& theirs, std::string_view key) {
    require(!given(flag) || ours == theirs, who, ": --", flag, " ", ours, " differs from ", where, "'s ", key, " ",
            theirs, "; drop --", flag, " (the sizes come from config.json) or load another model");
  };
  const bool llama = hf.family == ModelFamily::llama;
  agree("model", name_of(mc.family), name_of(hf.family), "model_type");
  agree("vocab", mc.vocab, hf.vocab, "vocab_size");
  agree("hidden", mc.hidden, hf.hidden, llama ? "hidden_size" : "n_embd");
  agree("heads", mc.heads, hf.heads, llama ? "num_attention_heads" : "n_head");
  agree("layers", mc.layers, hf.layers, llama ? "num_hidden_layers" : "n_layer");
  agree("ffn", mc.ffn_size(), hf.ffn, llama ? "intermediate_size" : "n_inner");
  if (llama) {
    agree("kv-heads", mc.kv_head_count(), hf.kv_heads, "num_key_value_heads");
    agree("rope-theta", mc.rope_theta, hf.rope_theta, "rope_theta");
    agree("norm-eps", mc.norm_eps, hf.norm_eps, "rms_norm_eps");
    require(!given("seq") || mc.seq <= hf.seq, who, ": --seq ", mc.seq, " is longer than the ", hf.seq, " positions ",
            where, " was trained for (max_position_embeddings); give --seq ", hf.seq, " or less");
  } else {
    agree("seq", mc.seq, hf.seq, "n_positions");
  }
  mc.family = hf.family;
  mc.vocab = hf.vocab;
  mc.hidden = hf.hidden;
  mc.heads = hf.heads;
  mc.layers = hf.layers;
  mc.ffn = hf.ffn;
  mc.kv_heads = llama ? hf.kv_heads : 0;
  mc.rope_theta = hf.rope_theta;
  mc.norm_eps = hf.norm_eps;
  if (!given("seq")) mc.seq = hf.seq;
}

/** @brief `apply_hf_config` with the options a `cli::Parser` saw. */
inline void apply_hf_config(GptConfig& mc, const io::HfModelConfig& hf, std::string_view where, const cli::Parser& p,
                            std::string_view who) {
  apply_hf_config(
      mc, hf, where, [&](std::string_view flag) { return p.given(flag); }, who);
}

/**
 * @brief `apply_hf_config` with the `config.json` beside the weights file `weights` (a Hugging Face directory), when
 * there is one: what a program loading Hugging Face names does before it builds the model.
 */
inline void apply_hf_config_beside(GptConfig& mc, const std::filesystem::path& weights, const cli::Parser& p,
                                   std::string_view who) {
  const std::filesystem::path config = weights.parent_path() / "config.json";
  if (std::filesystem::exists(config)) apply_hf_config(mc, io::read_hf_config(config), config.string(), p, who);
}

/** @brief The sizes `LlamaForCausalLM`'s names need (`io::SafetensorsWeights`, `config.json`) of the model `mc`. */
[[nodiscard]] inline io::HfLlamaConfig hf_llama_config(const GptConfig& mc) {
  return {mc.vocab,  mc.hidden, mc.ffn_size(), mc.heads,   mc.kv_head_count(),
          mc.layers, mc.seq,    mc.rope_theta, mc.norm_eps};
}

}  // namespace mpar::models
