#pragma once
// The small GPT configuration the model tests train: 4 blocks of width 32 on the default text.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <mpar/models/gpt_trainer.hpp>

namespace mpar::testing {

inline const data::CharDataset& gpt_dataset() {
  static const data::CharDataset ds(data::default_text_path, 16);
  return ds;
}

/** 4 blocks, width 32, 4 heads, sequences of 16, 8 sequences per step in 2 micro-batches, 20 AdamW steps. */
/** `schedule`: a name as `--schedule` takes it, so that test cases read and print as users write them. */
inline models::GptTrainConfig small_gpt(std::size_t tp, std::size_t pp, std::size_t dp,
                                        std::string_view schedule = "1f1b") {
  models::GptTrainConfig c;
  c.model.vocab = gpt_dataset().vocab_size();
  c.model.hidden = 32;
  c.model.heads = 4;
  c.model.layers = 4;
  c.model.seq = 16;
  c.tp = tp;
  c.pp = pp;
  c.dp = dp;
  c.schedule = pipeline::schedule_kind(schedule);
  c.microbatches = 2;
  c.global_batch = 8;
  c.steps = 20;
  c.warmup = 2;
  c.lr = 3e-3;
  return c;
}

/**
 * `count` training plans drawn from `seed` around `small_gpt`: tp in {1, 2}, pp in {2, 4}, every synchronous
 * schedule (interleaved with 2 chunks), ZeRO 0, 1 or 3 (with dp 2 and AdamW; SGD without ZeRO, so every
 * parameter's update can be compared), pp x chunks + 1 to + 3 blocks split at random into stages of at least
 * one block (uneven but for chance), and a random recomputation per stage (none, selective or full). About one
 * plan in three then empties a stage, its blocks moved to a neighbour (a stage with the embedding or the head
 * alone, or a pass-through stage; drawn from a second generator, so the other draws stay as they were), and about
 * one in two gives some stages of two or more blocks a mode per block (a third generator). At most 8 ranks each. Drawn from the generators' raw output, so every standard library draws the same plans.
 */
inline std::vector<std::pair<std::string, models::GptTrainConfig>> drawn_plans(std::size_t count, std::uint32_t seed) {
  std::mt19937 rng(seed), empties(seed + 1), masks(seed + 2);
  const auto pick = [&](std::size_t n) { return std::size_t(rng() % n); };
  const char* const schedules[] = {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zb_h2"};
  const int zeros[] = {0, 1, 3};
  std::vector<std::pair<std::string, models::GptTrainConfig>> out;
  for (std::size_t i = 0; i < count; ++i) {
    std::size_t tp = 1 + pick(2);
    const std::size_t pp = pick(2) ? 4 : 2;
    const int zero = zeros[pick(3)];
    const std::string schedule = schedules[pick(5)];
    const std::size_t dp = zero > 0 ? 2 : 1;
    if (tp * pp * dp > 8) tp = 1;  // at most 8 thread ranks: seconds on two cores
    models::GptTrainConfig c = small_gpt(tp, pp, dp, schedule);
    c.chunks = schedule == "interleaved_1f1b" ? 2 : 1;
    c.microbatches = int(pp * (1 + pick(2)));  // at least one per stage; interleaved needs a multiple of pp
    if (c.local_batch() % std::size_t(c.microbatches) != 0) c.microbatches = int(pp);
    c.zero = parallel::zero_stage_from_number(zero);
    if (zero > 0) {
      c.bucket_bytes = 4096;  // several buckets per stage: reductions overlap the backward
    } else {
      c.optimizer = parallel::UpdateRule::sgd;
      c.lr = 0.05;
    }
    const std::size_t stages = c.stages();
    c.model.layers = stages + 1 + pick(3);
    c.stage_layers.assign(stages, 1);
    for (std::size_t extra = stages; extra < c.model.layers; ++extra) ++c.stage_layers[pick(stages)];
    if (empties() % 3 == 0) {
      const std::size_t s = empties() % stages, to = s + 1 < stages ? s + 1 : s - 1;
      c.stage_layers[to] += c.stage_layers[s];
      c.stage_layers[s] = 0;
    }
    const nn::Recompute modes[] = {nn::Recompute::none, nn::Recompute::selective, nn::Recompute::full};
    for (std::size_t s = 0; s < stages; ++s) c.recompute_stages.push_back(modes[pick(3)]);
    // About one plan in two gives some stages of two or more blocks a mode per block, the stage's mode the most
    // of them (drawn from a third generator, so the other draws stay as they were).
    if (masks() % 2 == 0) {
      c.recompute_blocks.assign(stages, {});
      for (std::size_t s = 0; s < stages; ++s) {
        if (c.stage_layers[s] < 2 || masks() % 2 == 0) continue;
        for (std::size_t b = 0; b < c.stage_layers[s]; ++b) c.recompute_blocks[s].push_back(modes[masks() % 3]);
        c.recompute_stages[s] = *std::max_element(c.recompute_blocks[s].begin(), c.recompute_blocks[s].end());
      }
    }
    const std::string flags = models::GptTrainConfig::join_recompute(c.recompute_stages, c.recompute_blocks);
    out.emplace_back("plan " + std::to_string(i) + ": tp=" + std::to_string(tp) + " pp=" + std::to_string(pp) +
                         " dp=" + std::to_string(dp) + " " + schedule + " v=" + std::to_string(c.chunks) +
                         " M=" + std::to_string(c.microbatches) + " zero" + std::to_string(zero) + " layers " +
                         models::GptTrainConfig::join_counts(c.stage_layers) + " recompute " + flags,
                     c);
  }
  return out;
}

}  // namespace mpar::testing
