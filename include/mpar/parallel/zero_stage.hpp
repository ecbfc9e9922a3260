#pragma once
/**
 * @file `ZeroStage`: how much of the training state is sharded over the data-parallel group — the one
 * encoding the optimizer, the trainer's configuration and the planner share.
 */
#include <string_view>

#include "mpar/core/error.hpp"

namespace mpar::parallel {

/**
 * @brief The ZeRO stage (Rajbhandari et al. 2020). Each stage shards what the one before it does, and more:
 * its underlying value is the stage's number, so stages compare in that order.
 */
enum class ZeroStage {
  none = 0,              ///< every data-parallel rank holds the whole state
  optimizer_states = 1,  ///< ZeRO-1: reduce-scatter, AdamW on this rank's blocks, all-gather of the weights
  gradients = 2,         ///< ZeRO-2: as ZeRO-1, holding only this rank's gradient shards (full ones freed per bucket)
  parameters = 3,        ///< ZeRO-3: as ZeRO-2, and the weights sharded at rest (gathered per unit by the passes)
};

/** The stage's number, 0 to 3, as users and papers write it (`--zero N`, "ZeRO-2"). */
[[nodiscard]] constexpr int stage_number(ZeroStage z) { return static_cast<int>(z); }

/** Whether stage `z` shards (at least) what stage `at_least` does. */
[[nodiscard]] constexpr bool shards(ZeroStage z, ZeroStage at_least) {
  return stage_number(z) >= stage_number(at_least);
}

/** "none", "ZeRO-1", "ZeRO-2" or "ZeRO-3". */
[[nodiscard]] constexpr std::string_view name_of(ZeroStage z) {
  switch (z) {
    case ZeroStage::none:
      return "none";
    case ZeroStage::optimizer_states:
      return "ZeRO-1";
    case ZeroStage::gradients:
      return "ZeRO-2";
    case ZeroStage::parameters:
      return "ZeRO-3";
  }
  return "?";
}

/** The stage numbered `n`, parsed once at the edge (`--zero N`, a plan file); throws config_error naming the choices. */
[[nodiscard]] inline ZeroStage zero_stage_from_number(long long n) {
  if (n < 0 || n > 3)
    throw config_error(mpar::detail::cat("ZeRO stage ", n, " is not one mpar runs; use 0, 1, 2 or 3"));
  return static_cast<ZeroStage>(n);
}

}  // namespace mpar::parallel
