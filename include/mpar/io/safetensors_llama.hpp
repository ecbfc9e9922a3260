#pragma once
/**
 * @file mpar's Llama-family GPT (`ModelFamily::llama`) under Hugging Face `LlamaForCausalLM`'s tensor names and
 * shapes, both ways, and the `config.json` that `LlamaForCausalLM.from_pretrained(dir)` reads.
 *
 * | mpar                                   | LlamaForCausalLM                                    | conversion |
 * |----------------------------------------|-----------------------------------------------------|------------|
 * | `embed.token.weight` [Vp, h]           | `model.embed_tokens.weight` [V, h]                  | padding rows dropped |
 * | `blockN.ln1.weight` [h]                | `model.layers.N.input_layernorm.weight`             | — |
 * | `blockN.attn.qkv.weight` [h, (H+2K)d]  | `model.layers.N.self_attn.{q,k,v}_proj.weight`      | split, transposed |
 * | `blockN.attn.proj.weight` [Hd, h]      | `model.layers.N.self_attn.o_proj.weight` [h, Hd]    | transposed |
 * | `blockN.ln2.weight` [h]                | `model.layers.N.post_attention_layernorm.weight`    | — |
 * | `blockN.mlp.gate_up.weight` [h, 2, f]  | `model.layers.N.mlp.{gate,up}_proj.weight` [f, h]   | split, transposed |
 * | `blockN.mlp.down.weight` [f, h]        | `model.layers.N.mlp.down_proj.weight` [h, f]        | transposed |
 * | `final_norm.weight` [h]                | `model.norm.weight`                                 | — |
 * | `head.weight` [Vp, h]                  | `lm_head.weight` [V, h]                             | padding rows dropped |
 *
 * mpar stores weights [in, out] (y = x W), PyTorch's `Linear` [out, in]: every matrix is transposed. mpar's fused
 * QKV orders its columns by key/value head j — its g = H/K query heads, then k_j, then v_j — so query head
 * j·g + r uses KV head j, which is Hugging Face's `repeat_kv` pairing; the split gathers the q columns of every
 * group in head order into `q_proj`'s rows. Both rotate q and k in the rotate-half convention, so no permutation
 * of q and k rows is needed (the permutation of Meta's original checkpoints does not apply).
 */
#include <charconv>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mpar/core/error.hpp"
#include "mpar/io/box.hpp"
#include "mpar/io/safetensors.hpp"

namespace mpar::io {

/**
 * @brief The sizes a Llama conversion needs and `config.json` records. `vocab` is the real vocabulary (the
 * tokenizer's; mpar's embedding and head have the padded `Vp` rows); `kv_heads` divides `heads`.
 */
struct HfLlamaConfig {
  std::size_t vocab = 0, hidden = 0, ffn = 0, heads = 0, kv_heads = 0, layers = 0, seq = 0;
  double rope_theta = 10000.0;
  float norm_eps = 1e-5f;

  [[nodiscard]] std::size_t head_dim() const { return heads ? hidden / heads : 0; }
  [[nodiscard]] std::size_t group() const { return kv_heads ? heads / kv_heads : 0; }
  /** Throws unless the head counts describe grouped-query attention of this width. */
  void validate(std::string_view who) const {
    require(heads > 0 && kv_heads > 0 && hidden % heads == 0 && heads % kv_heads == 0, who,
            ": Llama names need the head counts: heads ", heads, " and kv_heads ", kv_heads, " of width ", hidden,
            " (heads dividing the width, kv_heads dividing heads; give --heads and --kv-heads)");
  }
};

namespace detail::llama {

/** `blockN.rest` -> (N, rest); nothing for any other name. */
inline std::optional<std::pair<std::string, std::string_view>> block_part(std::string_view n) {
  if (n.substr(0, 5) != "block") return std::nullopt;
  const auto dot = n.find('.');
  if (dot == std::string_view::npos || dot == 5) return std::nullopt;
  const std::string_view index = n.substr(5, dot - 5);
  for (char c : index)
    if (c < '0' || c > '9') return std::nullopt;
  return std::pair{std::string(index), n.substr(dot + 1)};
}

/** out[c * rows + r] = in[r * cols + c] for the columns [c0, c0 + count) of a row-major [rows, cols] matrix. */
inline void transpose_columns(std::span<const float> in, std::size_t rows, std::size_t cols, std::size_t c0,
                              std::size_t count, float* out) {
  for (std::size_t c = 0; c < count; ++c)
    for (std::size_t r = 0; r < rows; ++r) out[c * rows + r] = in[r * cols + c0 + c];
}

/** The inverse: the columns [c0, c0 + count) of the [rows, cols] matrix `out` from the [count, rows] matrix `in`. */
inline void untranspose_columns(const float* in, std::size_t rows, std::size_t cols, std::size_t c0, std::size_t count,
                                std::span<float> out) {
  for (std::size_t c = 0; c < count; ++c)
    for (std::size_t r = 0; r < rows; ++r) out[r * cols + c0 + c] = in[c * rows + r];
}

/** Shortest text that reads back as `v` (a JSON number); whole numbers without an exponent (500000, not 5e+05). */
template <class T>
std::string number(T v) {
  char buf[64];
  const bool whole = v == std::floor(v) && std::fabs(v) < T(1e15);
  const auto [end, ec] = whole ? std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed)
                               : std::to_chars(buf, buf + sizeof buf, v);
  require(ec == std::errc(), "config.json: cannot format a number");
  return std::string(buf, end);
}

}  // namespace detail::llama

/**
 * @brief The `LlamaForCausalLM` name of an mpar tensor that converts one to one (the embedding, the head and the
 * norms); nothing for the fused QKV and gate/up, the transposed matrices, and names Llama has none for.
 */
[[nodiscard]] inline std::optional<std::string> hf_llama_name(std::string_view n) {
  if (n == "embed.token.weight") return "model.embed_tokens.weight";
  if (n == "head.weight") return "lm_head.weight";
  if (n == "final_norm.weight") return "model.norm.weight";
  const auto b = detail::llama::block_part(n);
  if (!b) return std::nullopt;
  const std::string layer = "model.layers." + b->first + ".";
  if (b->second == "ln1.weight") return layer + "input_layernorm.weight";
  if (b->second == "ln2.weight") return layer + "post_attention_layernorm.weight";
  return std::nullopt;
}

/** @brief A converted tensor that owns its values. */
struct OwnedTensor {
  std::string name;
  std::vector<std::size_t> shape;
  std::vector<float> values;
};

/**
 * @brief The `LlamaForCausalLM` tensors of mpar parameter `name` (global `shape`, row-major `values`): one, or for
 * the fused QKV and gate/up two or three. The embedding and head keep their first `c.vocab` rows. Throws for a
 * name Llama has none for, or a shape that does not fit `c`.
 */
[[nodiscard]] inline std::vector<OwnedTensor> to_hf_llama(const std::string& name,
                                                          const std::vector<std::size_t>& shape,
                                                          std::span<const float> values, const HfLlamaConfig& c) {
  c.validate("safetensors export");
  const auto need = [&](const std::vector<std::size_t>& want) {
    require(shape == want, "safetensors export: '", name, "' has shape ", shape_string(shape), " but Llama of width ",
            c.hidden, ", ", c.heads, " heads, ", c.kv_heads, " key/value heads and MLP width ", c.ffn, " needs ",
            shape_string(want));
  };
  std::vector<OwnedTensor> out;
  if (name == "embed.token.weight" || name == "head.weight") {
    require(shape.size() == 2 && shape[1] == c.hidden && c.vocab > 0 && c.vocab <= shape[0], "safetensors export: '",
            name, "' has shape ", shape_string(shape), "; the vocabulary ", c.vocab,
            " must be between 1 and its rows, of width ", c.hidden);
    out.push_back({*hf_llama_name(name),
                   {c.vocab, c.hidden},
                   std::vector<float>(values.begin(), values.begin() + std::ptrdiff_t(c.vocab * c.hidden))});
    return out;
  }
  if (auto n = hf_llama_name(name)) {
    need(std::vector<std::size_t>{c.hidden});
    out.push_back({*n, shape, std::vector<float>(values.begin(), values.end())});
    return out;
  }
  const auto b = detail::llama::block_part(name);
  require(b.has_value() && (b->second == "attn.qkv.weight" || b->second == "attn.proj.weight" ||
                            b->second == "mlp.gate_up.weight" || b->second == "mlp.down.weight"),
          "safetensors export: parameter '", name,
          "' has no LlamaForCausalLM name (it holds no biases, position table or experts); export with mpar names");
  const std::string layer = "model.layers." + b->first + ".";
  const std::size_t h = c.hidden, d = c.head_dim(), g = c.group(), f = c.ffn;
  if (b->second == "attn.qkv.weight") {
    const std::size_t cols = (c.heads + 2 * c.kv_heads) * d;
    need(std::vector<std::size_t>{h, cols});
    OwnedTensor q{layer + "self_attn.q_proj.weight", {c.heads * d, h}, std::vector<float>(c.heads * d * h)};
    OwnedTensor k{layer + "self_attn.k_proj.weight", {c.kv_heads * d, h}, std::vector<float>(c.kv_heads * d * h)};
    OwnedTensor v{layer + "self_attn.v_proj.weight", {c.kv_heads * d, h}, std::vector<float>(c.kv_heads * d * h)};
    for (std::size_t j = 0; j < c.kv_heads; ++j) {  // KV head j's columns: g query heads, k_j, v_j
      const std::size_t base = j * (g + 2) * d;
      detail::llama::transpose_columns(values, h, cols, base, g * d, q.values.data() + j * g * d * h);
      detail::llama::transpose_columns(values, h, cols, base + g * d, d, k.values.data() + j * d * h);
      detail::llama::transpose_columns(values, h, cols, base + (g + 1) * d, d, v.values.data() + j * d * h);
    }
    out.push_back(std::move(q));
    out.push_back(std::move(k));
    out.push_back(std::move(v));
  } else if (b->second == "attn.proj.weight") {
    need(std::vector<std::size_t>{c.heads * d, h});
    OwnedTensor o{layer + "self_attn.o_proj.weight", {h, c.heads * d}, std::vector<float>(values.size())};
    detail::llama::transpose_columns(values, c.heads * d, h, 0, h, o.values.data());
    out.push_back(std::move(o));
  } else if (b->second == "mlp.gate_up.weight") {
    need(std::vector<std::size_t>{h, 2, f});
    OwnedTensor gate{layer + "mlp.gate_proj.weight", {f, h}, std::vector<float>(f * h)};
    OwnedTensor up{layer + "mlp.up_proj.weight", {f, h}, std::vector<float>(f * h)};
    detail::llama::transpose_columns(values, h, 2 * f, 0, f, gate.values.data());
    detail::llama::transpose_columns(values, h, 2 * f, f, f, up.values.data());
    out.push_back(std::move(gate));
    out.push_back(std::move(up));
  } else {
    need(std::vector<std::size_t>{f, h});
    OwnedTensor down{layer + "mlp.down_proj.weight", {h, f}, std::vector<float>(values.size())};
    detail::llama::transpose_columns(values, f, h, 0, h, down.values.data());
    out.push_back(std::move(down));
  }
  return out;
}

/**
 * @brief Reads mpar parameter `name` of global `shape` from the `LlamaForCausalLM` tensors of `file`, converted to
 * mpar's layout (the embedding and head padded with zero rows up to `shape[0]`). Nothing when the file holds none
 * of its tensors; throws when it holds only some (naming the missing one) or one of another shape (naming it and
 * both shapes).
 */
[[nodiscard]] inline std::optional<std::vector<float>> read_hf_llama(SafetensorsFile& file, const std::string& name,
                                                                     const std::vector<std::size_t>& shape,
                                                                     const HfLlamaConfig& c) {
  c.validate("safetensors import");
  const std::string where = "safetensors " + file.path().string();
  // The file's tensors for `name`, each checked against the shape this model needs.
  const auto fetch = [&](const std::vector<std::pair<std::string, std::vector<std::size_t>>>& parts) {
    std::vector<std::vector<float>> got;
    std::size_t present = 0;
    for (const auto& [n, want] : parts) present += file.find(n) != nullptr;
    if (present == 0) return got;
    for (const auto& [n, want] : parts) {
      const SafetensorsEntry* e = file.find(n);
      require(e != nullptr, where, ": tensor '", n, "' is missing (the file has ", parts.front().first, "); mpar's '",
              name, "' needs all of its LlamaForCausalLM tensors — is the file damaged or cut?");
      require(e->shape == want, where, ": tensor '", n, "' has shape ", shape_string(e->shape), " but the model's '",
              name, "' needs ", shape_string(want), "; was it saved from a model of other sizes (--hidden, --heads, ",
              "--kv-heads, --ffn)?");
      got.push_back(file.read(n));
    }
    return got;
  };
  std::size_t elements = 1;
  for (auto e : shape) elements *= e;
  std::vector<float> out(elements, 0.0f);
  if (name == "embed.token.weight" || name == "head.weight") {
    const std::string n = *hf_llama_name(name);
    const SafetensorsEntry* e = file.find(n);
    if (e == nullptr) return std::nullopt;
    require(shape.size() == 2 && e->shape.size() == 2 && e->shape[1] == shape[1] && e->shape[0] <= shape[0], where,
            ": tensor '", n, "' has shape ", shape_string(e->shape), " but the model's '", name, "' is ",
            shape_string(shape), " (at most that many vocabulary rows); was it saved from a model of other sizes?");
    const std::vector<float> v = file.read(n);
    std::copy(v.begin(), v.end(), out.begin());  // the padding rows stay zero
    return out;
  }
  if (auto n = hf_llama_name(name)) {
    auto got = fetch({{*n, shape}});
    if (got.empty()) return std::nullopt;
    return std::move(got[0]);
  }
  const auto b = detail::llama::block_part(name);
  require(b.has_value() && (b->second == "attn.qkv.weight" || b->second == "attn.proj.weight" ||
                            b->second == "mlp.gate_up.weight" || b->second == "mlp.down.weight"),
          where, ": the model's parameter '", name, "' has no LlamaForCausalLM name");
  const std::string layer = "model.layers." + b->first + ".";
  const std::size_t h = c.hidden, d = c.head_dim(), g = c.group(), f = c.ffn;
  if (b->second == "attn.qkv.weight") {
    const std::size_t cols = (c.heads + 2 * c.kv_heads) * d;
    require(shape == std::vector<std::size_t>{h, cols}, where, ": the model's '", name, "' is ", shape_string(shape),
            ", not the ", shape_string({h, cols}), " of ", c.heads, " heads and ", c.kv_heads, " key/value heads");
    auto got = fetch({{layer + "self_attn.q_proj.weight", {c.heads * d, h}},
                      {layer + "self_attn.k_proj.weight", {c.kv_heads * d, h}},
                      {layer + "self_attn.v_proj.weight", {c.kv_heads * d, h}}});
    if (got.empty()) return std::nullopt;
    for (std::size_t j = 0; j < c.kv_heads; ++j) {
      const std::size_t base = j * (g + 2) * d;
      detail::llama::untranspose_columns(got[0].data() + j * g * d * h, h, cols, base, g * d, out);
      detail::llama::untranspose_columns(got[1].data() + j * d * h, h, cols, base + g * d, d, out);
      detail::llama::untranspose_columns(got[2].data() + j * d * h, h, cols, base + (g + 1) * d, d, out);
    }
  } else if (b->second == "attn.proj.weight") {
    require(shape == std::vector<std::size_t>{c.heads * d, h}, where, ": the model's '", name, "' is ",
            shape_string(shape), ", not [heads x head_dim, hidden]");
    auto got = fetch({{layer + "self_attn.o_proj.weight", {h, c.heads * d}}});
    if (got.empty()) return std::nullopt;
    detail::llama::untranspose_columns(got[0].data(), c.heads * d, h, 0, h, out);
  } else if (b->second == "mlp.gate_up.weight") {
    require(shape == std::vector<std::size_t>{h, 2, f}, where, ": the model's '", name, "' is ", shape_string(shape),
            ", not ", shape_string({h, 2, f}), " (MLP width ", f, ")");
    auto got = fetch({{layer + "mlp.gate_proj.weight", {f, h}}, {layer + "mlp.up_proj.weight", {f, h}}});
    if (got.empty()) return std::nullopt;
    detail::llama::untranspose_columns(got[0].data(), h, 2 * f, 0, f, out);
    detail::llama::untranspose_columns(got[1].data(), h, 2 * f, f, f, out);
  } else {
    require(shape == std::vector<std::size_t>{f, h}, where, ": the model's '", name, "' is ", shape_string(shape),
            ", not ", shape_string({f, h}), " (MLP width ", f, ")");
    auto got = fetch({{layer + "mlp.down_proj.weight", {h, f}}});
    if (got.empty()) return std::nullopt;
    detail::llama::untranspose_columns(got[0].data(), f, h, 0, h, out);
  }
  return out;
}

/**
 * @brief Writes the `config.json` of `c` to `path`: with the safetensors file beside it, a directory that
 * `LlamaForCausalLM.from_pretrained` (and `AutoModelForCausalLM`) reads. The rotary base is written both as
 * `rope_theta` and in `rope_parameters` (the key newer transformers versions read).
 */
inline void write_hf_llama_config(const std::filesystem::path& path, const HfLlamaConfig& c) {
  c.validate("config.json");
  using detail::llama::number;
  const std::string theta = number(c.rope_theta);
  std::ofstream f(path, std::ios::trunc);
  require(bool(f), "config.json: cannot write ", path.string());
  f << "{\n"
    << "  \"architectures\": [\"LlamaForCausalLM\"],\n"
    << "  \"model_type\": \"llama\",\n"
    << "  \"hidden_size\": " << c.hidden << ",\n"
    << "  \"intermediate_size\": " << c.ffn << ",\n"
    << "  \"num_attention_heads\": " << c.heads << ",\n"
    << "  \"num_key_value_heads\": " << c.kv_heads << ",\n"
    << "  \"head_dim\": " << c.head_dim() << ",\n"
    << "  \"num_hidden_layers\": " << c.layers << ",\n"
    << "  \"vocab_size\": " << c.vocab << ",\n"
    << "  \"max_position_embeddings\": " << c.seq << ",\n"
    << "  \"rms_norm_eps\": " << number(c.norm_eps) << ",\n"
    << "  \"rope_theta\": " << theta << ",\n"
    << "  \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": " << theta << "},\n"
    << "  \"hidden_act\": \"silu\",\n"
    << "  \"attention_bias\": false,\n"
    << "  \"attention_dropout\": 0.0,\n"
    << "  \"mlp_bias\": false,\n"
    << "  \"tie_word_embeddings\": false,\n"
    << "  \"torch_dtype\": \"float32\"\n"
    << "}\n";
  require(bool(f.flush()), "config.json: writing ", path.string(), " failed");
}

}  // namespace mpar::io
