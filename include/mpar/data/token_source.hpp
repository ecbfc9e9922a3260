#pragma once
/**
 * @file The `token_source` concept: what `models::GptTrainer` trains and validates on.
 *
 * A token source is a stream of token ids below `vocab_size()` that hands out deterministic batches.
 * Requirements, for a `const D& d`:
 * - `d.vocab_size()` → `std::size_t`: every id it yields is below it;
 * - `d.batch(seed, step, global_batch, dp_size, dp_rank)` → `TokenBatch`: this data-parallel rank's
 *   block of global batch `step`, a pure function of its arguments (the same sequences under every
 *   layout, see sampler.hpp), `seq` tokens per sample with the next tokens as targets;
 * - `d.fingerprint()` → `DataFingerprint`: vocabulary size and content hash (fingerprint.hpp), the
 *   source's identity for checkpoints;
 * - `d.describe()` → `std::string`: one line for logs (file name, format, size).
 *
 * Models: `CharDataset` (a text file as characters), `TokenFile` (llm.c `.bin` or `.npy` token
 * files, memory-mapped), `TokenVector` (ids a program already holds). `SourceRef` (data/source_ref.hpp,
 * included) refers to any of them without templating its user on the type.
 */
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>

#include "mpar/data/fingerprint.hpp"
#include "mpar/data/token_batch.hpp"

namespace mpar::data {

template <class D>
concept token_source = requires(const D& d, std::uint64_t seed, std::uint64_t step, std::size_t n) {
  { d.vocab_size() } -> std::convertible_to<std::size_t>;
  { d.batch(seed, step, n, n, n) } -> std::same_as<TokenBatch>;
  { d.fingerprint() } -> std::same_as<DataFingerprint>;
  { d.describe() } -> std::convertible_to<std::string>;
};

}  // namespace mpar::data

// `SourceRef`, written against the concept, in its own header; included here so that code including this
// header sees it as it always did.
#include "mpar/data/source_ref.hpp"  // IWYU pragma: export
