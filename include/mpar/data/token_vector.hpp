#pragma once
/** @file `TokenVector`: token ids a program already holds, as a `token_source` (the user-provided case). */
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mpar/core/error.hpp"
#include "mpar/data/fingerprint.hpp"
#include "mpar/data/sampler.hpp"
#include "mpar/data/token_batch.hpp"

namespace mpar::data {

/** @brief An in-memory token stream (owned); checks every id against the vocabulary at construction. */
class TokenVector {
 public:
  TokenVector(std::vector<std::int32_t> ids, std::size_t vocab, std::size_t seq, std::string name = "token vector")
      : ids_(std::move(ids)), vocab_(vocab), seq_(seq), name_(std::move(name)) {
    require(vocab_ > 0, "data: ", name_, ": the vocabulary size must be positive");
    fp_.vocab = vocab_;
    for (std::size_t i = 0; i < ids_.size(); ++i) {
      require(ids_[i] >= 0 && std::size_t(ids_[i]) < vocab_, "data: ", name_, ": token ", ids_[i], " at index ", i,
              " is outside the vocabulary [0, ", vocab_, ")");
      fp_.add(std::uint32_t(ids_[i]));
    }
    require(ids_.size() > seq_ + 1, "data: ", name_, " holds ", ids_.size(), " tokens, too few for sequences of ", seq_,
            "; use a shorter --seq or more tokens");
  }

  [[nodiscard]] std::size_t vocab_size() const { return vocab_; }
  [[nodiscard]] std::size_t size() const { return ids_.size(); }
  [[nodiscard]] const std::vector<std::int32_t>& ids() const { return ids_; }
  [[nodiscard]] std::int32_t operator[](std::size_t i) const { return ids_.at(i); }
  [[nodiscard]] DataFingerprint fingerprint() const { return fp_; }
  [[nodiscard]] std::string describe() const { return name_ + " (" + std::to_string(ids_.size()) + " tokens)"; }
  [[nodiscard]] TokenBatch batch(std::uint64_t seed, std::uint64_t step, std::size_t global_batch,
                                 std::size_t dp_size = 1, std::size_t dp_rank = 0) const {
    return fill_batch([this](std::size_t i) { return ids_[i]; }, ids_.size(), seq_, seed, step, global_batch, dp_size,
                      dp_rank);
  }

 private:
  std::vector<std::int32_t> ids_;
  std::size_t vocab_, seq_;
  std::string name_;
  DataFingerprint fp_;
};

}  // namespace mpar::data
