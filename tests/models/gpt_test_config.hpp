#pragma once
// The small GPT configuration the model tests train: 4 blocks of width 32 on the default text.
#include <cstddef>
#include <string>
#include <utility>

#include <mpar/models/gpt_trainer.hpp>

namespace mpar::testing {

inline const data::CharDataset& gpt_dataset() {
  static const data::CharDataset ds(data::default_text_path, 16);
  return ds;
}

/** 4 blocks, width 32, 4 heads, sequences of 16, 8 sequences per step in 2 micro-batches, 20 AdamW steps. */
inline models::GptTrainConfig small_gpt(std::size_t tp, std::size_t pp, std::size_t dp, std::string schedule = "1f1b") {
  models::GptTrainConfig c;
  c.model.vocab = gpt_dataset().vocab_size();
  c.model.hidden = 32;
  c.model.heads = 4;
  c.model.layers = 4;
  c.model.seq = 16;
  c.tp = tp;
  c.pp = pp;
  c.dp = dp;
  c.schedule = std::move(schedule);
  c.microbatches = 2;
  c.global_batch = 8;
  c.steps = 20;
  c.warmup = 2;
  c.lr = 3e-3;
  return c;
}

}  // namespace mpar::testing
