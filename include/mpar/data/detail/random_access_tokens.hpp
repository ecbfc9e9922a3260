#pragma once
/**
 * @file The `random_access_tokens` concept: a token stream read by index.
 */
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>

namespace mpar::data::detail {

/** @brief A stream whose token i is `s[i]`, with `size()`, `vocab_size()` and `describe()`. */
template <class S>
concept random_access_tokens = requires(const S& s, std::size_t i) {
  { s[i] } -> std::convertible_to<std::int32_t>;
  { s.size() } -> std::convertible_to<std::size_t>;
  { s.vocab_size() } -> std::convertible_to<std::size_t>;
  { s.describe() } -> std::convertible_to<std::string>;
};

}  // namespace mpar::data::detail
