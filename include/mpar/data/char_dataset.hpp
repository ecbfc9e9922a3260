#pragma once
/**
 * @file A character-level language-modelling dataset over a text file, with deterministic,
 * resumable batches.
 *
 * Batch `step` is a pure function of (seed, step): sample `b` of the global batch starts at a
 * position drawn from `CounterRng{seed, step}.bits(b)`. A data-parallel rank takes its block of
 * the global batch, so every (tp, pp, dp) layout trains on exactly the same samples, and resuming
 * at step `s` needs nothing but `s`.
 */
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "mpar/core/error.hpp"
#include "mpar/core/init.hpp"
#include "mpar/core/layout.hpp"
#include "mpar/data/fingerprint.hpp"
#include "mpar/data/sampler.hpp"
#include "mpar/data/token_batch.hpp"

namespace mpar::data {

/** @brief The default training text: present on every Debian/Ubuntu system (package base-files). */
inline constexpr const char* default_text_path = "/usr/share/common-licenses/GPL-3";

/**
 * @brief A text file as a sequence of character ids; the vocabulary is the sorted set of its bytes.
 * A `token_source` (token_source.hpp).
 */
class CharDataset {
 public:
  /** Reads `path`; throws naming the file if it is missing, empty or shorter than `seq_len + 1` characters. */
  CharDataset(const std::string& path, std::size_t seq_len) : path_(path), seq_(seq_len) {
    std::ifstream in(path, std::ios::binary);
    require(bool(in), "dataset: cannot open '", path, "'; pass an existing text file with --data FILE");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    require(!text.empty(), "dataset: '", path, "' is empty; pass a text file with some content");
    require(text.size() > seq_len + 1, "dataset: '", path, "' has ", text.size(),
            " characters, too short for sequence length ", seq_len,
            text.size() > 3 ? mpar::detail::cat("; use --seq below ", text.size() - 1, " or a longer file")
                            : std::string("; a sequence needs at least 3 characters (--seq 2 and its target): "
                                          "give a longer file"));
    std::array<bool, 256> seen{};
    for (unsigned char c : text) seen[c] = true;
    for (int c = 0; c < 256; ++c)
      if (seen[std::size_t(c)]) {
        id_of_[std::size_t(c)] = std::int32_t(chars_.size());
        chars_.push_back(char(c));
      }
    ids_.reserve(text.size());
    for (unsigned char c : text) ids_.push_back(id_of_[c]);
  }

  [[nodiscard]] std::size_t vocab_size() const { return chars_.size(); }
  [[nodiscard]] std::size_t size() const { return ids_.size(); }
  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] char decode(std::int32_t id) const { return chars_.at(std::size_t(id)); }
  [[nodiscard]] std::int32_t encode(char c) const {
    const std::int32_t id = id_of_[static_cast<unsigned char>(c)];
    require(id >= 0, "dataset: character '", c, "' is not in the vocabulary of '", path_, "'");
    return id;
  }
  [[nodiscard]] const std::vector<std::int32_t>& ids() const { return ids_; }

  /**
   * @brief This data-parallel rank's share of global batch `step`: samples
   * `block_of(global_batch, dp_size, dp_rank)`, each `seq` tokens with the next tokens as targets.
   */
  [[nodiscard]] TokenBatch batch(std::uint64_t seed, std::uint64_t step, std::size_t global_batch,
                                 std::size_t dp_size = 1, std::size_t dp_rank = 0) const {
    return fill_batch([this](std::size_t i) { return ids_[i]; }, ids_.size(), seq_, seed, step, global_batch, dp_size,
                      dp_rank);
  }
  /** Vocabulary size, character count and a hash: the vocabulary's characters first (each as 0x100 + byte, since
   *  they give the ids their meaning), then the ids. */
  [[nodiscard]] DataFingerprint fingerprint() const {
    DataFingerprint f;
    f.vocab = vocab_size();
    for (char c : chars_) f.add(0x100u + static_cast<unsigned char>(c));
    f.tokens = 0;
    for (auto id : ids_) f.add(std::uint32_t(id));
    return f;
  }
  [[nodiscard]] std::string describe() const {
    return "text '" + path_ + "' (" + std::to_string(ids_.size()) + " characters, vocabulary " +
           std::to_string(chars_.size()) + ")";
  }

  /** @brief Entropy of the character distribution, in nats: the loss of the best context-free model. */
  [[nodiscard]] double unigram_entropy() const {
    std::vector<double> count(vocab_size(), 0.0);
    for (auto id : ids_) count[std::size_t(id)] += 1.0;
    double h = 0;
    for (double c : count)
      if (c > 0) {
        const double p = c / double(ids_.size());
        h -= p * std::log(p);
      }
    return h;
  }

 private:
  std::string path_;
  std::size_t seq_;
  std::vector<char> chars_;
  std::array<std::int32_t, 256> id_of_ = [] {
    std::array<std::int32_t, 256> a{};
    a.fill(-1);
    return a;
  }();
  std::vector<std::int32_t> ids_;
};

}  // namespace mpar::data
