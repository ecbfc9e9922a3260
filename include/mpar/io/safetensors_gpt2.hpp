#pragma once
/**
 * @file Model weights in safetensors files: export of a checkpoint (any layout), import into a trainer
 * (any layout), under mpar's own parameter names, Hugging Face GPT-2's, or `LlamaForCausalLM`'s for the Llama family
 * (their conversion: io/safetensors_llama.hpp).
 *
 * `WeightNaming::hf_gpt2` maps mpar's GPT (docs/train_gpt.md, "Parameter names") onto
 * `transformers.GPT2LMHeadModel`'s state dict:
 *
 * | mpar                          | GPT-2                               | shape change                      |
 * |-------------------------------|-------------------------------------|-----------------------------------|
 * | `embed.token.weight` [Vp, h]  | `transformer.wte.weight` [V, h]     | padded rows dropped (V = vocab)   |
 * | `embed.position` [seq, h]     | `transformer.wpe.weight` [seq, h]   | —                                 |
 * | `blockN.ln1.{weight,bias}`    | `transformer.h.N.ln_1.*`            | —                                 |
 * | `blockN.attn.qkv.weight` [h, 3, h] | `transformer.h.N.attn.c_attn.weight` [h, 3h] (Conv1D: [in, out]) | flattened |
 * | `blockN.attn.qkv.bias` [3, h] | `transformer.h.N.attn.c_attn.bias` [3h] | flattened                     |
 * | `blockN.attn.proj.*`          | `transformer.h.N.attn.c_proj.*`     | —                                 |
 * | `blockN.ln2.*`                | `transformer.h.N.ln_2.*`            | —                                 |
 * | `blockN.mlp.fc1.*`, `fc2.*`   | `transformer.h.N.mlp.c_fc.*`, `c_proj.*` | —                            |
 * | `final_norm.*`                | `transformer.ln_f.*`                | —                                 |
 *
 * The head is tied to `wte` (GPT-2 files carry no `lm_head.weight`). Every mpar weight is stored
 * [in, out] like GPT-2's Conv1D, so no transpose is needed; the q | k | v column groups and the
 * head-major columns inside each are GPT-2's order. MoE parameters have no GPT-2 name: exporting a
 * model with experts under `hf_gpt2` is refused.
 */
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mpar/io/checkpoint.hpp"
#include "mpar/io/safetensors.hpp"
#include "mpar/io/safetensors_llama.hpp"

namespace mpar::io {

/** @brief Whose tensor names a safetensors file uses: mpar's, GPT2LMHeadModel's, or LlamaForCausalLM's. */
enum class WeightNaming { mpar, hf_gpt2, hf_llama };

/** @brief `embed.token.weight` etc.: the name of one tensor in the other convention; nullopt when it has none. */
[[nodiscard]] inline std::optional<std::string> hf_gpt2_name(std::string_view n) {
  static const std::pair<std::string_view, std::string_view> fixed[] = {
      {"embed.token.weight", "transformer.wte.weight"},
      {"embed.position", "transformer.wpe.weight"},
      {"final_norm.weight", "transformer.ln_f.weight"},
      {"final_norm.bias", "transformer.ln_f.bias"}};
  for (auto [a, b] : fixed)
    if (n == a) return std::string(b);
  if (n.substr(0, 5) != "block") return std::nullopt;
  const auto dot = n.find('.');
  if (dot == std::string_view::npos || dot == 5) return std::nullopt;
  const std::string_view index = n.substr(5, dot - 5), rest = n.substr(dot + 1);
  for (char c : index)
    if (c < '0' || c > '9') return std::nullopt;
  static const std::pair<std::string_view, std::string_view> parts[] = {{"ln1.", "ln_1."},
                                                                        {"ln2.", "ln_2."},
                                                                        {"attn.qkv.", "attn.c_attn."},
                                                                        {"attn.proj.", "attn.c_proj."},
                                                                        {"mlp.fc1.", "mlp.c_fc."},
                                                                        {"mlp.fc2.", "mlp.c_proj."}};
  for (auto [a, b] : parts)
    if (rest.substr(0, a.size()) == a) {
      const std::string_view leaf = rest.substr(a.size());
      if (leaf != "weight" && leaf != "bias") return std::nullopt;
      return "transformer.h." + std::string(index) + "." + std::string(b) + std::string(leaf);
    }
  return std::nullopt;
}

/**
 * @brief The shape a tensor has in the file: mpar's `shape` under `mpar` naming; under `hf_gpt2`, the
 * embedding with `vocab` rows and the fused QKV flattened to GPT-2's [h, 3h] and [3h].
 */
[[nodiscard]] inline std::vector<std::size_t> file_shape(std::string_view mpar_name,
                                                         const std::vector<std::size_t>& shape, WeightNaming naming,
                                                         std::size_t vocab) {
  if (naming == WeightNaming::mpar) return shape;
  if (mpar_name == "embed.token.weight") return {vocab, shape.at(1)};
  if (mpar_name.find(".attn.qkv.") != std::string_view::npos) {
    if (shape.size() == 3) return {shape[0], shape[1] * shape[2]};
    if (shape.size() == 2) return {shape[0] * shape[1]};
  }
  return shape;
}

/** @brief The name under `naming`; throws for a tensor GPT-2 has no name for. */
[[nodiscard]] inline std::string file_name(const std::string& mpar_name, WeightNaming naming) {
  if (naming == WeightNaming::mpar) return mpar_name;
  auto n = hf_gpt2_name(mpar_name);
  require(n.has_value(), "safetensors export: parameter '", mpar_name,
          "' has no GPT-2 name (mixture-of-experts models cannot be written as GPT-2); export with mpar names");
  return *n;
}

/**
 * @brief Writes every parameter of the checkpoint `ckpt` (a checkpoint directory or a root with `latest`,
 * saved from any layout) to the safetensors file `out`, whole tensors in fp32; optimizer states are left
 * out. Under `hf_gpt2`, `vocab` (the tokenizer's vocabulary, e.g. 50257) drops the embedding's padding rows.
 * Under `hf_llama`, `llama` gives the sizes (its vocabulary is the one kept), and `config.json` is written beside
 * `out`. Rank-local: one process reads the checkpoint. Returns the number of tensors written.
 */
inline std::size_t export_safetensors(const std::filesystem::path& ckpt, const std::filesystem::path& out,
                                      WeightNaming naming, std::size_t vocab = 0,
                                      std::map<std::string, std::string> metadata = {},
                                      const std::optional<HfLlamaConfig>& llama = std::nullopt) {
  require(naming != WeightNaming::hf_llama || llama.has_value(),
          "safetensors export: LlamaForCausalLM names need the model's sizes (HfLlamaConfig)");
  CheckpointReader reader(ckpt);
  std::vector<std::vector<float>> values;
  std::vector<OwnedTensor> converted;  // hf_llama: the split and transposed tensors
  std::vector<NamedTensor> tensors;
  std::vector<const TensorRecord*> params;
  for (const auto& t : reader.manifest().tensors)
    if (t.name.find('/') == std::string::npos) params.push_back(&t);  // `name/state` entries are optimizer states
  values.reserve(params.size());
  for (const auto* t : params) {
    std::size_t n = 1;
    for (auto e : t->shape) n *= e;
    values.emplace_back(n);
    const LoadBlock b{t->name, t->shape, full_box(t->shape), t->layout, std::span<float>(values.back())};
    reader.read(std::span<const LoadBlock>(&b, 1));
    if (naming == WeightNaming::hf_llama) {
      for (auto& c : to_hf_llama(t->name, t->shape, values.back(), *llama)) converted.push_back(std::move(c));
      values.back() = {};
      continue;
    }
    auto shape = file_shape(t->name, t->shape, naming, vocab);
    std::size_t keep = 1;
    for (auto e : shape) keep *= e;
    if (naming == WeightNaming::hf_gpt2 && t->name == "embed.token.weight")
      require(vocab > 0 && vocab <= t->shape[0], "safetensors export: the vocabulary ", vocab,
              " must be between 1 and the embedding's ", t->shape[0], " rows (pass the tokenizer's vocabulary)");
    values.back().resize(keep);  // the embedding's padding rows are its last rows
    tensors.push_back(NamedTensor{file_name(t->name, naming), std::move(shape), std::span<const float>(values.back())});
  }
  for (const auto& c : converted) tensors.push_back(NamedTensor{c.name, c.shape, std::span<const float>(c.values)});
  metadata.emplace("format", "pt");
  write_safetensors(out, std::span<const NamedTensor>(tensors), metadata);
  if (naming == WeightNaming::hf_llama) write_hf_llama_config(out.parent_path() / "config.json", *llama);
  return tensors.size();
}

/**
 * @brief A safetensors file as the source of `GptTrainer::load_weights` (and of any loader that asks for
 * whole tensors by mpar name and shape): reads each tensor and checks its shape. The token embedding
 * may have another number of rows than the model's (GPT-2's unpadded vocabulary, or an mpar export
 * from a layout padded differently, whose `mpar.vocab` metadata says how many rows are real): its real
 * rows are loaded and the model's padding rows are zero. Under `hf_llama` (which needs the head counts in `llama`)
 * the fused QKV and gate/up are assembled from their `LlamaForCausalLM` tensors, and the matrices transposed.
 */
class SafetensorsWeights {
 public:
  SafetensorsWeights(const std::filesystem::path& path, WeightNaming naming,
                     const std::optional<HfLlamaConfig>& llama = std::nullopt)
      : file_(path), naming_(naming), llama_(llama.value_or(HfLlamaConfig{})) {
    if (naming == WeightNaming::hf_llama) llama_.validate("safetensors " + path.string());
  }

  /** The tensor for mpar parameter `name` of global `shape`; empty when the file has none under that name. */
  std::span<const float> operator()(const std::string& name, const std::vector<std::size_t>& shape) {
    if (naming_ == WeightNaming::hf_llama) {
      auto v = read_hf_llama(file_, name, shape, llama_);
      if (!v) {
        missing_.push_back(name);
        return {};
      }
      buf_ = std::move(*v);
      return buf_;
    }
    const std::string fname = naming_ == WeightNaming::mpar ? name : hf_gpt2_name(name).value_or("");
    const SafetensorsEntry* e = fname.empty() ? nullptr : file_.find(fname);
    if (e == nullptr) {
      missing_.push_back(name);
      return {};
    }
    std::size_t vocab = shape.empty() ? 0 : shape[0];
    if (name == "embed.token.weight" && e->shape.size() == 2 && shape.size() == 2 && e->shape[1] == shape[1]) {
      if (naming_ == WeightNaming::hf_gpt2) {
        vocab = e->shape[0];
      } else if (e->shape[0] != shape[0]) {
        // Padded for another tensor-parallel size: the real rows carry over.
        const auto it = file_.metadata().find("mpar.vocab");
        if (it != file_.metadata().end()) {
          const std::size_t real = std::stoull(it->second);
          require(real <= e->shape[0] && real <= shape[0], "safetensors ", file_.path().string(), ": the vocabulary ",
                  real, " (metadata mpar.vocab) does not fit the embedding's ", e->shape[0], " rows and the model's ",
                  shape[0]);
          buf_ = file_.read(fname);
          buf_.resize(real * shape[1]);
          buf_.resize(shape[0] * shape[1], 0.0f);
          return buf_;
        }
      }
    }
    const auto want = file_shape(name, shape, naming_, vocab);
    require(e->shape == want && vocab <= (shape.empty() ? 0 : shape[0]), "safetensors ", file_.path().string(),
            ": tensor '", fname, "' has shape ", shape_string(e->shape), " but the model's '", name, "' needs ",
            shape_string(want), "; was it saved from a model of other sizes?");
    buf_ = file_.read(fname);
    std::size_t n = 1;
    for (auto d : shape) n *= d;
    buf_.resize(n, 0.0f);  // padding rows of the embedding: zeros
    return buf_;
  }
  /** mpar names asked for that the file did not hold. */
  [[nodiscard]] const std::vector<std::string>& missing() const { return missing_; }
  [[nodiscard]] SafetensorsFile& file() { return file_; }

 private:
  SafetensorsFile file_;
  WeightNaming naming_;
  HfLlamaConfig llama_;
  std::vector<float> buf_;
  std::vector<std::string> missing_;
};

}  // namespace mpar::io
