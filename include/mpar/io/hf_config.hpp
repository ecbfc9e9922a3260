#pragma once
/**
 * @file `read_hf_config`: the family and sizes of a Hugging Face model from its `config.json` (GPT-2's `gpt2` and
 * Llama's `llama` model types), so that a program loading `model.safetensors` takes its sizes from the file beside
 * it instead of a command line the user must copy them into. A configuration mpar's blocks cannot reproduce (another
 * activation, biases on Llama, tied Llama embeddings, scaled rotary positions) is refused by name, never loaded into
 * a model that computes something else.
 */
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "mpar/core/error.hpp"
#include "mpar/core/json.hpp"
#include "mpar/nn/model_family.hpp"

namespace mpar::io {

/**
 * @brief What a `config.json` says of a decoder: its family and sizes. `vocab` is the tokenizer's vocabulary;
 * `seq` the position table's rows (GPT-2) or the longest context the model was trained for (Llama, which has no
 * table); `kv_heads`, `rope_theta` and `norm_eps` are Llama's (GPT-2's layer norm epsilon is checked to be mpar's
 * 1e-5, and `norm_eps` holds it).
 */
struct HfModelConfig {
  nn::ModelFamily family = nn::ModelFamily::gpt2;
  std::size_t vocab = 0, hidden = 0, ffn = 0, heads = 0, kv_heads = 0, layers = 0, seq = 0;
  double rope_theta = 10000.0;
  float norm_eps = 1e-5f;
};

namespace detail::hf {

/** Reads the keys of one `config.json` object, each error naming the file, the key and what it should be. */
class ConfigKeys {
 public:
  ConfigKeys(const JsonValue::Object& object, std::string where) : object_(object), where_(std::move(where)) {}

  [[nodiscard]] const JsonValue* find(std::string_view key) const {
    for (const auto& [k, v] : object_)
      if (k == key) return &v;
    return nullptr;
  }
  /** A whole number >= 1 under `key` (absent or null: `fallback`, or an error when there is none). */
  [[nodiscard]] std::size_t count(std::string_view key, std::size_t fallback = 0) const {
    const JsonValue* v = find(key);
    if (!v || std::holds_alternative<std::nullptr_t>(v->value)) {
      require(fallback > 0, where_, ": the key \"", key, "\" is missing; a ", kind_, " config.json must give it");
      return fallback;
    }
    const double* d = v->number();
    require(d && *d >= 1 && *d <= 1e12 && *d == double(std::size_t(*d)), where_, ": \"", key,
            "\" must be a whole number of at least 1, found ", d ? std::to_string(*d) : std::string(v->kind()));
    return std::size_t(*d);
  }
  /** A positive number under `key` (absent or null: `fallback`). */
  [[nodiscard]] double positive(std::string_view key, double fallback) const {
    const JsonValue* v = find(key);
    if (!v || std::holds_alternative<std::nullptr_t>(v->value)) return fallback;
    const double* d = v->number();
    require(d && *d > 0, where_, ": \"", key, "\" must be a positive number, found ",
            d ? std::to_string(*d) : std::string(v->kind()));
    return *d;
  }
  /** The string under `key`, or "" when absent. */
  [[nodiscard]] std::string text(std::string_view key) const {
    const JsonValue* v = find(key);
    if (!v) return {};
    require(v->string(), where_, ": \"", key, "\" must be a string, found ", v->kind());
    return *v->string();
  }
  /** Throws unless `key` is absent, null or `expected` (a boolean), naming `why` mpar needs that value. */
  void require_flag(std::string_view key, bool expected, std::string_view why) const {
    const JsonValue* v = find(key);
    if (!v || std::holds_alternative<std::nullptr_t>(v->value)) return;
    require(v->boolean() && *v->boolean() == expected, where_, ": \"", key, "\" is ",
            v->boolean() ? (*v->boolean() ? "true" : "false") : v->kind(), "; mpar loads only ",
            expected ? "true" : "false", " here: ", why);
  }
  void set_kind(std::string kind) { kind_ = std::move(kind); }
  [[nodiscard]] const std::string& where() const { return where_; }

 private:
  const JsonValue::Object& object_;
  std::string where_;
  std::string kind_ = "model";
};

inline HfModelConfig gpt2(const ConfigKeys& k) {
  HfModelConfig c;
  c.family = nn::ModelFamily::gpt2;
  c.vocab = k.count("vocab_size");
  c.hidden = k.count("n_embd");
  c.heads = k.count("n_head");
  c.kv_heads = c.heads;
  c.layers = k.count("n_layer");
  c.seq = k.count("n_positions", k.count("n_ctx", 1024));
  c.ffn = k.count("n_inner", 4 * c.hidden);
  const std::string act = k.text("activation_function");
  require(act.empty() || act == "gelu_new" || act == "gelu_pytorch_tanh", k.where(), ": \"activation_function\" is \"",
          act, "\"; mpar's GPT-2 MLP uses the tanh form of GeLU (\"gelu_new\")");
  const double eps = k.positive("layer_norm_epsilon", 1e-5);
  require(eps == double(1e-5f) || eps == 1e-5, k.where(), ": \"layer_norm_epsilon\" is ", eps,
          "; mpar's GPT-2 layer norm uses 1e-5");
  k.require_flag("tie_word_embeddings", true, "mpar's GPT-2 head is the token embedding");
  return c;
}

inline HfModelConfig llama(const ConfigKeys& k) {
  HfModelConfig c;
  c.family = nn::ModelFamily::llama;
  c.vocab = k.count("vocab_size");
  c.hidden = k.count("hidden_size");
  c.ffn = k.count("intermediate_size");
  c.heads = k.count("num_attention_heads");
  c.kv_heads = k.count("num_key_value_heads", c.heads);
  c.layers = k.count("num_hidden_layers");
  c.seq = k.count("max_position_embeddings", 2048);
  c.norm_eps = float(k.positive("rms_norm_eps", 1e-6));
  c.rope_theta = k.positive("rope_theta", 10000.0);
  // Newer transformers write the rotary settings as `rope_parameters`; older ones as `rope_scaling` (null when
  // positions are not scaled). Only unscaled ("default") rotary positions are what mpar's rotary layer computes.
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const JsonValue* v = k.find(key);
    if (!v || std::holds_alternative<std::nullptr_t>(v->value)) continue;
    require(v->object(), k.where(), ": \"", key, "\" must be an object or null, found ", v->kind());
    const ConfigKeys rope(*v->object(), k.where() + " (" + key + ")");
    const std::string type = rope.text("rope_type").empty() ? rope.text("type") : rope.text("rope_type");
    require(type.empty() || type == "default", k.where(), ": \"", key, "\" has rope_type \"", type,
            "\"; mpar's rotary embedding is the unscaled (\"default\") one, so this model's positions would differ");
    c.rope_theta = rope.positive("rope_theta", c.rope_theta);
  }
  const std::string act = k.text("hidden_act");
  require(act.empty() || act == "silu", k.where(), ": \"hidden_act\" is \"", act,
          "\"; mpar's Llama MLP is SwiGLU (\"silu\")");
  k.require_flag("attention_bias", false, "mpar's Llama attention has no biases");
  k.require_flag("mlp_bias", false, "mpar's Llama MLP has no biases");
  k.require_flag("tie_word_embeddings", false, "mpar's Llama head is its own matrix, not the token embedding");
  require(c.hidden % c.heads == 0 && c.heads % c.kv_heads == 0, k.where(), ": num_attention_heads ", c.heads,
          " must divide hidden_size ", c.hidden, " and num_key_value_heads ", c.kv_heads,
          " must divide num_attention_heads");
  const std::size_t head_dim = k.count("head_dim", c.hidden / c.heads);
  require(head_dim == c.hidden / c.heads, k.where(), ": \"head_dim\" is ", head_dim, ", not hidden_size / ",
          "num_attention_heads = ", c.hidden / c.heads, "; mpar's heads split the width evenly");
  return c;
}

}  // namespace detail::hf

/** @brief Parses `text`, a `config.json` named `where` in errors: a GPT-2 or Llama model's family and sizes. */
[[nodiscard]] inline HfModelConfig parse_hf_config(std::string_view text, const std::string& where) {
  const JsonValue doc = [&] {
    try {
      return parse_json(text);
    } catch (const config_error& e) {
      throw config_error(mpar::detail::cat(where, ": ", e.what()));
    }
  }();
  require(doc.object(), where, ": a config.json holds one JSON object, found ", doc.kind());
  detail::hf::ConfigKeys keys(*doc.object(), where);
  const std::string type = keys.text("model_type");
  keys.set_kind(type);
  if (type == "gpt2") return detail::hf::gpt2(keys);
  if (type == "llama") return detail::hf::llama(keys);
  throw config_error(
      mpar::detail::cat(where, ": \"model_type\" is \"", type,
                        "\"; mpar loads \"gpt2\" (GPT2LMHeadModel) and \"llama\" (LlamaForCausalLM) models"));
}

/** @brief Reads the `config.json` at `path` (see `parse_hf_config`); throws when it cannot be read. */
[[nodiscard]] inline HfModelConfig read_hf_config(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  require(bool(f), path.string(), ": cannot open the model's config.json");
  std::ostringstream text;
  text << f.rdbuf();
  require(!f.bad(), path.string(), ": reading failed");
  return parse_hf_config(text.str(), path.string());
}

}  // namespace mpar::io
