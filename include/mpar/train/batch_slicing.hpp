#pragma once
/**
 * @file `BatchSlicing`: which samples of a step's global batch a rank of the mesh trains on, micro-batch after
 * micro-batch — the trainer component that makes every layout train on the same sequences (docs/training.md).
 */
#include <cstddef>
#include <cstdint>
#include <vector>

#include "mpar/core/layout.hpp"
#include "mpar/data/token_source.hpp"

namespace mpar::train {

/**
 * @brief The batch split of one rank: `global_batch` sequences per step over `dp` data ranks (x `ep` expert ranks,
 * which take different samples too), each rank's share in `microbatches` micro-batches, each sequence split over `cp`
 * context ranks in zig-zag chunks.
 *
 * - Dense: data rank d takes its contiguous block of the global batch (`block_of`, as the sources cut it).
 * - `routed` (a model whose MoE routing statistics must cover the same tokens under every layout): micro-batch m
 *   of the step is the same sequences — global rows [m G/M, (m+1) G/M) — under every layout, of which token-group
 *   rank q = data x ep + expert takes the q-th micro-batch-size slice.
 * - Context parallel: of every sequence, chunk `context` then chunk 2 cp - 1 - `context` of its 2 cp equal chunks
 *   (nn::ContextShard's placement), tokens and targets alike, `seq` kept global.
 */
struct BatchSlicing {
  std::size_t global_batch = 1;
  std::size_t microbatches = 1;
  std::size_t dp = 1, cp = 1, ep = 1;
  bool routed = false;
  std::size_t data = 0, context = 0, expert = 0;  ///< this rank's coordinates on the three axes

  /** Ranks that take different samples: data x expert. */
  [[nodiscard]] std::size_t batch_ranks() const { return dp * ep; }
  [[nodiscard]] std::size_t microbatch_size() const { return global_batch / batch_ranks() / microbatches; }

  /** This rank's tokens and targets of step `step` of `src` (batches drawn with `seed`), micro-batch after
   * micro-batch. */
  [[nodiscard]] data::TokenBatch local_batch(const data::SourceRef& src, std::uint64_t seed, std::size_t step) const {
    if (cp > 1) return context_chunks(src.batch(seed, step, global_batch, dp, data));
    if (!routed) return src.batch(seed, step, global_batch, dp, data);
    const auto full = src.batch(seed, step, global_batch, 1, 0);
    const std::size_t mbs = microbatch_size(), seq = full.seq;
    data::TokenBatch b;
    b.batch = microbatches * mbs;
    b.seq = seq;
    for (std::size_t m = 0; m < microbatches; ++m) {
      const auto first = std::ptrdiff_t(first_sequence(m) * seq), count = std::ptrdiff_t(mbs * seq);
      b.tokens.insert(b.tokens.end(), full.tokens.begin() + first, full.tokens.begin() + first + count);
      b.targets.insert(b.targets.end(), full.targets.begin() + first, full.targets.begin() + first + count);
    }
    return b;
  }

  /** The step-batch index of the first sequence of this rank's micro-batch `m` (dropout's masks are keyed by it). */
  [[nodiscard]] std::size_t first_sequence(std::size_t m) const {
    const std::size_t mbs = microbatch_size();
    if (routed) return (m * batch_ranks() + data * ep + expert) * mbs;
    return block_of(global_batch, dp, data).offset + m * mbs;
  }
  /** `first_sequence` of every micro-batch. */
  [[nodiscard]] std::vector<std::size_t> first_sequences() const {
    std::vector<std::size_t> first(microbatches);
    for (std::size_t m = 0; m < microbatches; ++m) first[m] = first_sequence(m);
    return first;
  }

  /** This context rank's zig-zag chunks of every sequence of a data rank's batch. */
  [[nodiscard]] data::TokenBatch context_chunks(const data::TokenBatch& full) const {
    const std::size_t seq = full.seq, c = seq / (2 * cp);
    data::TokenBatch b;
    b.batch = full.batch;
    b.seq = seq;
    for (std::size_t s = 0; s < full.batch; ++s)
      for (std::size_t chunk : {context, 2 * cp - 1 - context}) {
        const auto first = std::ptrdiff_t(s * seq + chunk * c), count = std::ptrdiff_t(c);
        b.tokens.insert(b.tokens.end(), full.tokens.begin() + first, full.tokens.begin() + first + count);
        b.targets.insert(b.targets.end(), full.targets.begin() + first, full.targets.begin() + first + count);
      }
    return b;
  }
};

}  // namespace mpar::train
