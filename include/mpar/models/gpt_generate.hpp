#pragma once
/**
 * @file Autoregressive generation from a `GptPipelinePart` that holds the whole model (first and last stage),
 * on any backend and over any tensor-parallel group.
 *
 * Each new token takes one forward of the current window (the last `seq` ids, padded on the right to
 * whole sequence length: causal attention makes the logits at the last real position independent of
 * the padding), then the vocabulary shards of that row are gathered over the stage's tensor group and
 * one id is drawn on every rank alike (same logits, same counter-based random numbers), so the ranks
 * of a tensor-parallel model stay in step without a broadcast. The padded vocabulary columns are never
 * candidates: only the first `vocab` columns are read.
 *
 * The host never touches rank memory (a GPU's memory, or `DiscreteHostBackend`'s): the window's ids go to the
 * first stage as host values (`set_tokens`) where the host cannot write rank memory, the last row's logits are
 * copied and gathered in rank memory, and the gathered row comes back by the stream-ordered copy
 * (backend/rank_transfer.hpp).
 */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "mpar/backend/rank_transfer.hpp"
#include "mpar/core/init.hpp"
#include "mpar/models/gpt.hpp"

namespace mpar::models {

/** @brief How the next token is chosen. */
struct SamplingConfig {
  double temperature = 0.8;  ///< softmax temperature; 0 picks the most likely id (greedy)
  std::size_t top_k = 0;     ///< draw among the k most likely ids only (0: all); top_k 1 is greedy
  std::uint64_t seed = 1;    ///< the draws are `CounterRng{seed, stream}.uniform(i)` for token i
  std::uint64_t stream = 0x67656eull;
};

/**
 * @brief One id from `logits` (the real vocabulary only): the `top_k` most likely (ties to the lower id),
 * softmax at `temperature` over them, and the uniform draw `u` in (0, 1) picks one. Temperature 0 or
 * top_k 1 returns the most likely id and ignores `u`.
 */
[[nodiscard]] inline std::size_t sample_token(std::span<const float> logits, double temperature, std::size_t top_k,
                                              double u) {
  const std::size_t vocab = logits.size();
  require(vocab > 0, "sample_token: no logits");
  require(temperature >= 0 && std::isfinite(temperature), "sample_token: temperature ", temperature,
          " must be finite and not negative (0: greedy)");
  const std::size_t k = top_k == 0 ? vocab : std::min(top_k, vocab);
  std::vector<std::size_t> ids(vocab);
  for (std::size_t v = 0; v < vocab; ++v) ids[v] = v;
  std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(k), ids.end(), [&](std::size_t a, std::size_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  if (temperature == 0 || k == 1) return ids[0];
  std::vector<double> p(k);
  double sum = 0;
  for (std::size_t i = 0; i < k; ++i)
    sum += (p[i] = std::exp((double(logits[ids[i]]) - double(logits[ids[0]])) / temperature));
  u *= sum;
  for (std::size_t i = 0; i < k; ++i)
    if ((u -= p[i]) <= 0) return ids[i];
  return ids[k - 1];
}

/** Called after each generated token with (tokens done, tokens asked for): progress reports, cancellation by throwing. */
using GenerateProgress = std::function<void(std::size_t, std::size_t)>;

/**
 * @brief Generates `count` ids after `prompt` with `model`, which must hold the whole model (one pipeline
 * stage, first and last) on the tensor group it was built over; collective over that group (every rank
 * calls it with the same arguments and gets the same ids). Returns the new ids only.
 */
template <communicator C, backend B>
std::vector<std::int32_t> generate(GptPipelinePart<C, B>& model, std::span<const std::int32_t> prompt,
                                   std::size_t count, const SamplingConfig& sampling,
                                   const GenerateProgress& progress = {}) {
  const GptConfig& cfg = model.config();
  require(model.is_first() && model.is_last(), "generate: the stage must hold the whole model (first and last stage, ",
          "all ", cfg.layers, " blocks); load a pipelined checkpoint into one stage (io::load_checkpoint reshards)");
  require(model.block_count() == cfg.layers, "generate: the stage holds ", model.block_count(), " of ", cfg.layers,
          " blocks");
  require(!prompt.empty(), "generate: the prompt is empty; give at least one id");
  for (std::size_t i = 0; i < prompt.size(); ++i)
    require(prompt[i] >= 0 && std::size_t(prompt[i]) < cfg.vocab, "generate: prompt id ", prompt[i], " at position ", i,
            " is outside the vocabulary [0, ", cfg.vocab, ")");
  // No dropout while sampling (PyTorch's `model.eval()`); the stage's setting is restored on return.
  struct TrainingRestore {
    GptPipelinePart<C, B>& model;
    bool was = model.training();
    ~TrainingRestore() { model.set_training(was); }
  } restore{model};
  model.set_training(false);
  C& tp = model.tensor_group();
  const std::size_t padded = cfg.padded_vocab(), local = padded / std::size_t(tp.size());
  const CounterRng rng{sampling.seed, sampling.stream};
  std::vector<std::int32_t> window(prompt.end() - std::ptrdiff_t(std::min(prompt.size(), cfg.seq)), prompt.end());
  std::vector<std::int32_t> out;
  out.reserve(count);
  // Rank memory, uninitialised (a zero fill would be a host write): written by the copy and the gather.
  Buffer<float> mine = B::template allocate<float>(tp.size() > 1 ? local : 0);
  Buffer<float> row = B::template allocate<float>(tp.size() > 1 ? padded : 0);
  std::vector<float> host_row(cfg.vocab);
  for (std::size_t i = 0; i < count; ++i) {
    std::vector<std::int32_t> seq(window);
    seq.resize(cfg.seq, window.back());
    nn::Act<Replicate> input;
    if constexpr (host_reads_rank_memory<B>) {
      input = GptPipelinePart<C, B>::tokens_as_activation(seq);
    } else {  // the host must not write rank memory: the first stage takes the ids as host values
      model.set_tokens(0, seq);
      input = nn::Act<Replicate>(nn::Activation({seq.size(), 1}, uninitialized));
    }
    const nn::Act<nn::FeatureShard> logits = model.forward_to_loss(std::move(input), 0);
    model.drop(0);
    require(logits.extent(1) == local, "generate: the stage's logits have ", logits.extent(1), " columns, expected ",
            local, " (padded vocabulary ", padded, " over ", tp.size(), " tensor ranks)");
    const float* last = logits.data() + (window.size() - 1) * local;
    if (tp.size() > 1) {
      B::run(ops::copy<float>{.n = local, .src = last, .dst = mine.data()});
      tp.all_gather(std::span<const float>(mine), std::span<float>(row));
      last = row.data();
    }
    copy_to_host<B>(last, host_row.data(), cfg.vocab);  // waits for the forward and the gather
    const auto pick = std::int32_t(
        sample_token(std::span<const float>(host_row), sampling.temperature, sampling.top_k, rng.uniform(i)));
    out.push_back(pick);
    if (window.size() == cfg.seq) window.erase(window.begin());
    window.push_back(pick);
    if (progress) progress(i + 1, count);
  }
  return out;
}

}  // namespace mpar::models
