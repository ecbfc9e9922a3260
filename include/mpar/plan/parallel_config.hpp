#pragma once
/** @file One point of the planner's search space: how a model is split over a cluster. */
#include <algorithm>
#include <cstddef>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "mpar/nn/recompute.hpp"
#include "mpar/parallel/zero_stage.hpp"
#include "mpar/pipeline/schedule_kind.hpp"

namespace mpar::plan {

/// Activation recomputation (keep everything, recompute attention's core, keep only layer inputs): the type the
/// layers and the trainer take, so a plan's choice is the one that runs.
using nn::parse_recompute;
using nn::Recompute;
using nn::recompute_name;

/** The pipeline schedules the planner chooses among: every schedule type of mpar/pipeline. */
using parallel::ZeroStage;
using pipeline::all_schedules;
using pipeline::parse_schedule;
using pipeline::schedule_name;
using pipeline::ScheduleKind;
using pipeline::splits_backward;

/**
 * @brief A parallel configuration: tp x cp x pp x dp ranks (cp: context parallelism, each sequence split
 * over cp ranks with ring attention; ranks ordered tensor, context, data, pipeline from the innermost out), `microbatches` micro-batches of
 * `microbatch_size` sequences per pipeline per step, `virtual_stages` model chunks per pipeline rank.
 */
struct ParallelConfig {
  std::size_t tp = 1, pp = 1, dp = 1;
  /// Context-parallel ranks per (tensor, data, pipeline) coordinate: each holds 1/cp of every sequence's tokens
  /// and a replica of every parameter, so its gradients are reduced with the data-parallel ones (over dp x cp).
  std::size_t cp = 1;
  /// Expert-parallel ranks inside the data-parallel ones (a divisor of dp): each holds 1/ep of every MoE layer's
  /// experts, which reduce (and shard under ZeRO) over the dp / ep ranks holding the same ones.
  std::size_t ep = 1;
  std::size_t microbatch_size = 1, microbatches = 1;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  std::size_t virtual_stages = 1;  ///< V: model chunks per pipeline rank (interleaved only)
  Recompute recompute = Recompute::none;
  ZeroStage zero = ZeroStage::none;  ///< what is sharded over the data-parallel group
  bool sequence_parallel = false;    ///< activations outside the tensor-parallel GEMMs sharded over tp
  /// The experts' tensor-parallel size: 1 (every tensor rank computes whole experts) or tp (each expert's width
  /// split over the tensor group, its outputs and input gradients all-reduced over it; parallel::MoeMlp).
  std::size_t etp = 1;
  /// Transformer blocks per global pipeline stage (stage chunk * pp + rank, pp * V entries summing to the
  /// model's layers); a stage may hold none, next to a heavy embedding or head. Empty: the even split.
  std::vector<std::size_t> stage_layers;
  /// What each global stage recomputes in backward (same order as `stage_layers`, pp * V entries): a per-stage
  /// mix, e.g. the first ranks of a 1F1B pipeline, which hold the most micro-batches in flight, recomputing while
  /// the last ones do not. `recompute` then names the most any stage recomputes. Empty: `recompute` everywhere.
  std::vector<Recompute> recompute_stages;
  /// Optionally, what each block of a stage recomputes (Galvatron's inner level): empty, or pp * V entries (stage
  /// order), each empty (every block as the stage: `recompute_of`) or one mode per block of the stage. A stage whose
  /// blocks differ recomputes block by block: a full block keeps only its input and reruns its own forward, instead
  /// of the whole chunk being rerun. `recompute_of(stage)` then names the most its blocks recompute.
  std::vector<std::vector<Recompute>> recompute_blocks;

  /** What global stage `stage` (chunk * pp + rank) recomputes (with per-block modes: the most any block does). */
  [[nodiscard]] Recompute recompute_of(std::size_t stage) const {
    return recompute_stages.empty() ? recompute : recompute_stages.at(stage);
  }
  /** What block `block` (counted from the stage's first) of global stage `stage` recomputes. */
  [[nodiscard]] Recompute block_recompute_of(std::size_t stage, std::size_t block) const {
    if (recompute_blocks.empty() || recompute_blocks.at(stage).empty()) return recompute_of(stage);
    return recompute_blocks[stage].at(block);
  }
  /** Whether the blocks of global stage `stage` recompute differently (it then recomputes block by block). */
  [[nodiscard]] bool mixed_blocks(std::size_t stage) const {
    if (recompute_blocks.empty()) return false;
    const std::vector<Recompute>& b = recompute_blocks.at(stage);
    return std::any_of(b.begin(), b.end(), [&](Recompute r) { return r != b.front(); });
  }
  /** Whether some stage's blocks recompute differently. */
  [[nodiscard]] bool mixed_block_recompute() const {
    for (std::size_t s = 0; s < recompute_blocks.size(); ++s)
      if (mixed_blocks(s)) return true;
    return false;
  }
  /** Whether the stages, or the blocks of some stage, recompute differently. */
  [[nodiscard]] bool mixed_recompute() const {
    for (Recompute r : recompute_stages)
      if (r != recompute_stages.front()) return true;
    return mixed_block_recompute();
  }

  /**
   * The recomputation as the plan prints it: one mode, or the stages' modes in order with a run of three or more
   * written once with its length ("full,selective,none*6"); a stage whose blocks differ as its blocks' modes joined
   * by ':', runs shortened alike ("full:none*3,none*7").
   */
  [[nodiscard]] std::string recompute_layout() const {
    if (!mixed_recompute()) return std::string(recompute_name(recompute_of(0)));
    std::vector<std::string> tokens(stages());
    for (std::size_t s = 0; s < tokens.size(); ++s) {
      if (!mixed_blocks(s)) {
        tokens[s] = recompute_name(recompute_of(s));
        continue;
      }
      std::vector<std::string> names;
      for (Recompute r : recompute_blocks[s]) names.emplace_back(recompute_name(r));
      tokens[s] = runs(names, ":");
    }
    return runs(tokens, ",");
  }

  [[nodiscard]] std::size_t gpus() const { return tp * cp * pp * dp; }
  /** The ranks that hold replicas of each parameter and reduce its gradient (and shard it under ZeRO): dp x cp. */
  [[nodiscard]] std::size_t data_group() const { return dp * cp; }
  /** The ranks that hold the same experts and reduce (shard) their gradients: dp / ep. */
  [[nodiscard]] std::size_t expert_data_group() const { return dp / (ep ? ep : 1); }
  [[nodiscard]] std::size_t stages() const { return pp * virtual_stages; }

  /** `items` joined by `sep`, a run of three or more written once with its length ("none*6"). */
  [[nodiscard]] static std::string runs(const std::vector<std::string>& items, const char* sep) {
    std::string out;
    for (std::size_t i = 0; i < items.size();) {
      std::size_t j = i;
      while (j < items.size() && items[j] == items[i]) ++j;
      out += (i ? sep : "") + (j - i > 2 ? items[i] + "*" + std::to_string(j - i) : items[i]);
      for (std::size_t k = i + 1; k < j && j - i <= 2; ++k) out += sep + items[i];
      i = j;
    }
    return out;
  }

  friend std::ostream& operator<<(std::ostream& os, const ParallelConfig& c) {
    os << "tp=" << c.tp << " pp=" << c.pp << " dp=" << c.dp;
    if (c.cp > 1) os << " cp=" << c.cp;
    if (c.ep > 1) os << " ep=" << c.ep;
    if (c.etp > 1) os << " etp=" << c.etp;
    os << " mbs=" << c.microbatch_size << " m=" << c.microbatches << " schedule=" << schedule_name(c.schedule);
    if (c.virtual_stages > 1) os << " v=" << c.virtual_stages;
    os << " recompute=" << c.recompute_layout();
    if (c.zero != parallel::ZeroStage::none) os << " zero" << parallel::stage_number(c.zero);
    os << (c.sequence_parallel ? " sp" : "");
    if (!c.stage_layers.empty()) {
      os << " stages=";
      for (std::size_t i = 0; i < c.stage_layers.size(); ++i) os << (i ? "," : "") << c.stage_layers[i];
    }
    return os;
  }
};

}  // namespace mpar::plan
