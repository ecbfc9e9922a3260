#pragma once
/**
 * @file CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), the checksum of every checkpoint shard.
 *
 * Table-driven, one byte per step; the table is built at compile time. `crc32("123456789") == 0xCBF43926`
 * (the standard check value). Incremental use: `c = crc32_update(c, more)` starting from `crc32_init`,
 * finishing with `crc32_final(c)`.
 */
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace mpar::io {

namespace detail {
inline constexpr std::array<std::uint32_t, 256> crc32_table = [] {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}();
}  // namespace detail

inline constexpr std::uint32_t crc32_init = 0xFFFFFFFFu;

/** @brief Feeds `bytes` into a running (not yet finalised) CRC state. */
[[nodiscard]] constexpr std::uint32_t crc32_update(std::uint32_t state, std::span<const std::byte> bytes) {
  for (std::byte b : bytes) state = detail::crc32_table[(state ^ std::uint32_t(b)) & 0xFFu] ^ (state >> 8);
  return state;
}
[[nodiscard]] constexpr std::uint32_t crc32_final(std::uint32_t state) { return state ^ 0xFFFFFFFFu; }

/** @brief The CRC-32 of a byte range. */
[[nodiscard]] constexpr std::uint32_t crc32(std::span<const std::byte> bytes) {
  return crc32_final(crc32_update(crc32_init, bytes));
}
/** @brief The CRC-32 of a string's characters. */
[[nodiscard]] constexpr std::uint32_t crc32(std::string_view s) {
  std::uint32_t c = crc32_init;
  for (char ch : s) c = detail::crc32_table[(c ^ std::uint32_t(static_cast<unsigned char>(ch))) & 0xFFu] ^ (c >> 8);
  return crc32_final(c);
}

static_assert(crc32(std::string_view("123456789")) == 0xCBF43926u, "CRC-32 check value");

}  // namespace mpar::io
