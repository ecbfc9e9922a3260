#pragma once
/**
 * @file `ModelFamily`: which decoder a `models::GptConfig` builds — GPT-2's blocks or Llama's — with its command-line
 * names. It sits with the layers (not in models/) so that the planner, below the models, counts the family that runs.
 */
#include <optional>
#include <string_view>

namespace mpar::nn {

/**
 * @brief The decoder family. `gpt2`: learned position embedding, LayerNorm, multi-head attention and a GELU MLP with
 * biases, dropout, the head tied to the token embedding. `llama`: rotary positions, RMSNorm, grouped-query attention,
 * a SwiGLU MLP, no biases and no dropout, an untied output head.
 */
enum class ModelFamily { gpt2, llama };

[[nodiscard]] constexpr std::string_view name_of(ModelFamily f) { return f == ModelFamily::llama ? "llama" : "gpt2"; }
/** The family named `s` (`gpt2`, `llama`), or nothing. */
[[nodiscard]] constexpr std::optional<ModelFamily> model_family(std::string_view s) {
  if (s == "gpt2") return ModelFamily::gpt2;
  if (s == "llama") return ModelFamily::llama;
  return std::nullopt;
}

}  // namespace mpar::nn
