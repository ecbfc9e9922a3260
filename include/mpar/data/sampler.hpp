#pragma once
/**
 * @file Where the sequences of a training step start: a pure function of (seed, step).
 *
 * Sample `b` of global batch `step` starts at `CounterRng{seed, step}.bits(b) % (n - seq)` in a
 * stream of `n` tokens (each sample needs `seq + 1` tokens: inputs and shifted targets). A
 * data-parallel rank takes its block `block_of(global_batch, dp_size, dp_rank)` of the samples, so
 * every (tp, pp, dp) layout trains on exactly the same sequences, and resuming at step `s` needs
 * nothing but `s`. Every token source of mpar (character text, token files, token vectors) draws its
 * batches through `fill_batch`, so they all sample alike.
 */
#include <cstddef>
#include <cstdint>

#include "mpar/core/error.hpp"
#include "mpar/core/init.hpp"
#include "mpar/core/layout.hpp"
#include "mpar/data/token_batch.hpp"

namespace mpar::data {

/** @brief The start of sample `index` of global batch `step` in a stream of `tokens` tokens. */
[[nodiscard]] constexpr std::size_t sample_start(std::uint64_t seed, std::uint64_t step, std::size_t index,
                                                 std::size_t tokens, std::size_t seq) {
  const std::uint64_t starts = tokens - seq - 1;  // the last valid start; the caller checks tokens > seq
  return std::size_t(CounterRng{seed, step}.bits(index) % (starts + 1));
}

/**
 * @brief This data-parallel rank's share of global batch `step` from a stream of `tokens` ids, read
 * through `at(i)` (the id at position i, as int32). Throws when the stream is too short for `seq`.
 */
template <class At>
[[nodiscard]] TokenBatch fill_batch(At&& at, std::size_t tokens, std::size_t seq, std::uint64_t seed,
                                    std::uint64_t step, std::size_t global_batch, std::size_t dp_size,
                                    std::size_t dp_rank) {
  require(seq > 0 && tokens > seq + 1, "data: ", tokens, " tokens are too few for sequences of ", seq,
          " (each sample needs seq + 1 tokens); use a shorter --seq or more data");
  require(dp_size > 0 && dp_rank < dp_size, "data: data-parallel rank ", dp_rank, " of ", dp_size, " does not exist");
  const Block mine = block_of(global_batch, dp_size, dp_rank);
  TokenBatch b;
  b.batch = mine.extent;
  b.seq = seq;
  b.tokens.resize(mine.extent * seq);
  b.targets.resize(mine.extent * seq);
  for (std::size_t s = 0; s < mine.extent; ++s) {
    const std::size_t start = sample_start(seed, step, mine.offset + s, tokens, seq);
    std::int32_t prev = at(start);
    for (std::size_t t = 0; t < seq; ++t) {
      const std::int32_t next = at(start + t + 1);
      b.tokens[s * seq + t] = prev;
      b.targets[s * seq + t] = next;
      prev = next;
    }
  }
  return b;
}

}  // namespace mpar::data
