#pragma once
/**
 * @file The identity of a token source: its vocabulary size and a hash of its token ids.
 *
 * A checkpoint can record it, so that resuming on different data is noticed. The hash is 64-bit
 * FNV-1a over the ids as little-endian 32-bit integers, whatever their storage (characters, uint16 or
 * uint32 file), so the same token stream has the same fingerprint in every format.
 */
#include <cstdint>
#include <cstdio>
#include <string>

namespace mpar::data {

/** @brief Vocabulary size, token count and content hash of a token stream. */
struct DataFingerprint {
  std::uint64_t vocab = 0, tokens = 0, hash = 0xcbf29ce484222325ull;

  /** Adds one token id to the hash. */
  constexpr void add(std::uint32_t id) {
    for (int i = 0; i < 4; ++i) {
      hash ^= (id >> (8 * i)) & 0xffu;
      hash *= 0x100000001b3ull;
    }
    ++tokens;
  }
  /** `vocab=50257 tokens=1000 fnv1a=0123456789abcdef`: one line for a manifest or a log. */
  [[nodiscard]] std::string str() const {
    char buf[96];
    std::snprintf(buf, sizeof buf, "vocab=%llu tokens=%llu fnv1a=%016llx", static_cast<unsigned long long>(vocab),
                  static_cast<unsigned long long>(tokens), static_cast<unsigned long long>(hash));
    return buf;
  }
  friend constexpr bool operator==(const DataFingerprint&, const DataFingerprint&) = default;
};

}  // namespace mpar::data
