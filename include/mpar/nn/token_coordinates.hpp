#pragma once
/**
 * @file `TokenCoordinates`: where the rows of each micro-batch sit in the training step's batch, and which step
 * runs. A dropout mask keyed by them instead of by the micro-batch id is the same under every layout — tensor,
 * sequence, data, pipeline and context parallelism, any micro-batch size — because it names each element by
 * what it is (sequence, position, feature), not by where a rank happens to hold it; and it is new every step.
 */
#include <cstddef>
#include <cstdint>
#include <vector>

#include "mpar/core/error.hpp"

namespace mpar::nn {

/**
 * @brief The step and the global place of each micro-batch's tokens, filled by the trainer before the passes
 * (`GptPipelinePart::set_token_coordinates`) and read by the layers that draw per-token randomness (Dropout).
 *
 * A micro-batch holds whole sequences `first_sequence[mb]`, `first_sequence[mb] + 1`, ... of the step's batch,
 * each `seq` tokens long; its row `r` is token `r % seq` of its `r / seq`-th sequence. Under context parallelism
 * (`cp > 1`) a rank holds of every sequence chunk `cp_rank` and then chunk `2 cp - 1 - cp_rank` of its `2 cp` equal
 * chunks (the zig-zag placement of nn::ContextShard), so its rows map to global rows in runs of `seq / (2 cp)`.
 */
struct TokenCoordinates {
  std::uint64_t step = 0;                   ///< the optimizer step (a fresh mask every step)
  std::size_t seq = 0;                      ///< tokens of one whole sequence
  std::size_t cp = 1, cp_rank = 0;          ///< context-parallel size and this rank's place in the ring
  std::vector<std::size_t> first_sequence;  ///< by micro-batch id: the step-batch index of its first sequence
  /// A program of several steps (PipeDream-2BW without a flush): micro-batch id `mb` belongs to step
  /// `step + mb / microbatches_per_step` and sits where id `mb % microbatches_per_step` does. 0: one step.
  std::size_t microbatches_per_step = 0;
  bool training = true;  ///< false: evaluation or generation, where dropout is the identity

  /** Whether the trainer filled them in (else a layer falls back to keying by micro-batch id). */
  [[nodiscard]] bool known() const { return !first_sequence.empty(); }

  /** The global row of micro-batch `mb`'s first token: its first sequence times `seq`. */
  [[nodiscard]] std::size_t first_row(int mb) const {
    const auto id = microbatches_per_step ? std::size_t(mb) % microbatches_per_step : std::size_t(mb);
    require(mb >= 0 && id < first_sequence.size(), "token coordinates: micro-batch ", mb, " has no entry (",
            first_sequence.size(), " micro-batches set for step ", step,
            "); set them for every micro-batch of the step before the passes");
    return first_sequence[id] * seq;
  }
  /** The step micro-batch `mb` belongs to. */
  [[nodiscard]] std::uint64_t step_of(int mb) const {
    return microbatches_per_step ? step + std::uint64_t(mb) / microbatches_per_step : step;
  }

  /**
   * Calls `f(local_row, global_row, rows)` for each run of consecutive local rows of micro-batch `mb` that are
   * consecutive in the step's batch (global row = sequence * seq + position): one run without context
   * parallelism, two per sequence with it. `rows` is the micro-batch's local row count.
   */
  template <class F>
  void for_each_run(int mb, std::size_t rows, F&& f) const {
    const std::size_t base = first_row(mb);
    if (cp <= 1) {
      f(std::size_t(0), base, rows);
      return;
    }
    const std::size_t chunk = seq / (2 * cp), per_sequence = 2 * chunk;
    require(chunk > 0 && rows % per_sequence == 0, "token coordinates: ", rows,
            " rows are not whole sequences of this context rank's ", per_sequence, " tokens (seq ", seq, ", cp ", cp,
            ")");
    for (std::size_t s = 0; s < rows / per_sequence; ++s) {
      f(s * per_sequence, base + s * seq + cp_rank * chunk, chunk);
      f(s * per_sequence + chunk, base + s * seq + (2 * cp - 1 - cp_rank) * chunk, chunk);
    }
  }
};

}  // namespace mpar::nn
