#pragma once
/**
 * @file `TokenRange`: tokens [begin, end) of a random-access token stream (a `TokenFile`, a
 * `TokenVector`) as a `token_source` of its own — how a corpus is split into training and held-out
 * validation parts without copying. `split_tail` makes the usual split: the last fraction validates.
 */
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "mpar/core/error.hpp"
#include "mpar/data/detail/random_access_tokens.hpp"
#include "mpar/data/fingerprint.hpp"
#include "mpar/data/sampler.hpp"
#include "mpar/data/token_batch.hpp"

namespace mpar::data {

/** @brief Tokens [begin, end) of `stream` (which must outlive it); samples never cross its ends. */
template <mpar::data::detail::random_access_tokens S>
class TokenRange {
 public:
  TokenRange(const S& stream, std::size_t begin, std::size_t end, std::size_t seq)
      : s_(&stream), begin_(begin), end_(end), seq_(seq) {
    require(begin <= end && end <= std::size_t(stream.size()), "data: range [", begin, ", ", end, ") of ",
            stream.describe(), " is outside its ", stream.size(), " tokens");
    require(end - begin > seq + 1, "data: range [", begin, ", ", end, ") of ", stream.describe(), " holds ",
            end - begin, " tokens, too few for sequences of ", seq, "; use a shorter --seq or a larger split");
    fp_.vocab = stream.vocab_size();
    for (std::size_t i = begin; i < end; ++i) fp_.add(std::uint32_t(std::int32_t(stream[i])));
  }

  [[nodiscard]] std::size_t vocab_size() const { return s_->vocab_size(); }
  [[nodiscard]] std::size_t size() const { return end_ - begin_; }
  [[nodiscard]] std::int32_t operator[](std::size_t i) const { return std::int32_t((*s_)[begin_ + i]); }
  [[nodiscard]] DataFingerprint fingerprint() const { return fp_; }
  [[nodiscard]] std::string describe() const {
    return "tokens [" + std::to_string(begin_) + ", " + std::to_string(end_) + ") of " + std::string(s_->describe());
  }
  [[nodiscard]] TokenBatch batch(std::uint64_t seed, std::uint64_t step, std::size_t global_batch,
                                 std::size_t dp_size = 1, std::size_t dp_rank = 0) const {
    return fill_batch([this](std::size_t i) { return std::int32_t((*s_)[begin_ + i]); }, end_ - begin_, seq_, seed,
                      step, global_batch, dp_size, dp_rank);
  }

 private:
  const S* s_;
  std::size_t begin_, end_, seq_;
  DataFingerprint fp_;
};

/**
 * @brief {training, validation}: the first 1 - `fraction` of `stream` and the rest. Throws when the
 * fraction is outside (0, 1) or a part is too short for `seq`.
 */
template <mpar::data::detail::random_access_tokens S>
[[nodiscard]] std::pair<TokenRange<S>, TokenRange<S>> split_tail(const S& stream, double fraction, std::size_t seq) {
  require(fraction > 0.0 && fraction < 1.0, "data: the validation fraction ", fraction,
          " must be between 0 and 1 (--val-split)");
  const std::size_t n = std::size_t(stream.size()), cut = n - std::size_t(double(n) * fraction);
  return {TokenRange<S>(stream, 0, cut, seq), TokenRange<S>(stream, cut, n, seq)};
}

}  // namespace mpar::data
