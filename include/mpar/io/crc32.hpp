#pragma once
/**
 * @file CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), the checksum of every checkpoint shard.
 *
 * Table-driven with eight tables ("slicing by 8": eight bytes per step, several times faster than one
 * byte per step); the tables are built once, at first use (built at compile time they cost every file
 * that includes this header about 0.2 s of compile time), and a constant expression computes the CRC bit
 * by bit instead. `crc32("123456789") == 0xCBF43926` (the
 * standard check value). Incremental use: `c = crc32_update(c, more)` starting from `crc32_init`,
 * finishing with `crc32_final(c)`. `crc32_combine(crc(A), crc(B), |B|) == crc(A || B)` without
 * touching the bytes again: checkpoints compute each chunk's CRC once and derive the shard's.
 */
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

namespace mpar::io {

namespace detail {
inline constexpr std::uint32_t crc32_poly = 0xEDB88320u;

/** One byte fed into the state bit by bit (what the tables tabulate; used in constant expressions). */
constexpr std::uint32_t crc32_byte(std::uint32_t c, std::uint32_t byte) {
  c ^= byte;
  for (int k = 0; k < 8; ++k) c = (c & 1u) ? crc32_poly ^ (c >> 1) : c >> 1;
  return c;
}

using Crc32Tables = std::array<std::array<std::uint32_t, 256>, 8>;
/** Builds the slicing-by-8 tables. Not constexpr on purpose: the compiler would evaluate it while parsing. */
inline Crc32Tables crc32_build_tables() {
  Crc32Tables t{};
  for (std::uint32_t i = 0; i < 256; ++i) t[0][i] = crc32_byte(0, i);
  // t[k][i]: the CRC state after byte i followed by k zero bytes.
  for (std::size_t k = 1; k < 8; ++k)
    for (std::size_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFu];
  return t;
}
/** The tables, built on first use (thread-safe: a function-local static). */
inline const Crc32Tables& crc32_tables() {
  static const Crc32Tables tables = crc32_build_tables();
  return tables;
}

constexpr std::uint32_t load_le32(const std::byte* p) {
  return std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 | std::uint32_t(p[3]) << 24;
}

/** a * b modulo the CRC polynomial, both reflected (bit 31 is x^0). */
constexpr std::uint32_t crc32_mulmod(std::uint32_t a, std::uint32_t b) {
  std::uint32_t product = 0;
  for (std::uint32_t bit = 0x80000000u; bit != 0; bit >>= 1) {
    if (a & bit) product ^= b;
    b = (b & 1u) ? (b >> 1) ^ crc32_poly : b >> 1;  // b *= x
  }
  return product;
}

/** x^(8 n) modulo the polynomial: the factor that appends n zero bytes to a CRC. */
constexpr std::uint32_t crc32_x8n(std::uint64_t n) {
  std::uint32_t result = 0x80000000u;  // x^0
  std::uint32_t square = 0x00800000u;  // x^8 (one byte)
  while (n != 0) {
    if (n & 1u) result = crc32_mulmod(square, result);
    square = crc32_mulmod(square, square);
    n >>= 1;
  }
  return result;
}
}  // namespace detail

inline constexpr std::uint32_t crc32_init = 0xFFFFFFFFu;

/** @brief Feeds `bytes` into a running (not yet finalised) CRC state. */
[[nodiscard]] constexpr std::uint32_t crc32_update(std::uint32_t state, std::span<const std::byte> bytes) {
  if (std::is_constant_evaluated()) {
    for (std::byte b : bytes) state = detail::crc32_byte(state, std::uint32_t(b));
    return state;
  }
  const auto& t = detail::crc32_tables();
  const std::byte* p = bytes.data();
  std::size_t n = bytes.size();
  while (n >= 8) {
    const std::uint32_t lo = detail::load_le32(p) ^ state, hi = detail::load_le32(p + 4);
    state = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^ t[3][hi & 0xFFu] ^
            t[2][(hi >> 8) & 0xFFu] ^ t[1][(hi >> 16) & 0xFFu] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  for (; n > 0; --n, ++p) state = t[0][(state ^ std::uint32_t(*p)) & 0xFFu] ^ (state >> 8);
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
  if (std::is_constant_evaluated()) {
    for (char ch : s) c = detail::crc32_byte(c, std::uint32_t(static_cast<unsigned char>(ch)));
  } else {
    const auto& t0 = detail::crc32_tables()[0];
    for (char ch : s) c = t0[(c ^ std::uint32_t(static_cast<unsigned char>(ch))) & 0xFFu] ^ (c >> 8);
  }
  return crc32_final(c);
}

/** @brief The CRC-32 of A followed by B, from `crc_a = crc32(A)`, `crc_b = crc32(B)` and `len_b = |B|`. */
[[nodiscard]] constexpr std::uint32_t crc32_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t len_b) {
  // The init and final XORs of A and B cancel except for A's CRC shifted past B's bytes.
  return detail::crc32_mulmod(detail::crc32_x8n(len_b), crc_a) ^ crc_b;
}

static_assert(crc32(std::string_view("123456789")) == 0xCBF43926u, "CRC-32 check value");
static_assert(crc32_combine(crc32(std::string_view("1234")), crc32(std::string_view("56789")), 5) == 0xCBF43926u,
              "CRC-32 combination");

}  // namespace mpar::io
