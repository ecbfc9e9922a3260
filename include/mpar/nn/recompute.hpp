#pragma once
/**
 * @file `Recompute`: how much of a transformer block's forward its backward recomputes instead of keeping, as
 * Korthikanti et al. (2022, "Reducing Activation Recomputation in Large Transformer Models") name the choices.
 */
#include <optional>
#include <string_view>

namespace mpar::nn {

/**
 * @brief Activation recomputation of a block: `none` keeps every activation its backward reads; `selective`
 * drops the attention core's probabilities (`[b, heads, s, s]` per micro-batch, the part that grows with the
 * square of the sequence) and recomputes them from the kept q and k in backward; `full` keeps only the block
 * input and reruns the whole forward before the backward.
 */
enum class Recompute { none, selective, full };

[[nodiscard]] constexpr std::string_view recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none:
      return "none";
    case Recompute::selective:
      return "selective";
    case Recompute::full:
      return "full";
  }
  return "?";
}
/** "none", "selective" or "full"; anything else: nullopt. */
[[nodiscard]] inline std::optional<Recompute> parse_recompute(std::string_view s) {
  if (s == "none") return Recompute::none;
  if (s == "selective") return Recompute::selective;
  if (s == "full") return Recompute::full;
  return std::nullopt;
}

}  // namespace mpar::nn
