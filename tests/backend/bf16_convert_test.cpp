// The vectorized fp32 <-> bf16 buffer conversions (backend/host/bf16_convert.hpp) against a reference that
// rounds by the definition (the nearer of the two neighbouring bf16 values, ties to the even one, computed
// in double), at every instruction-set level this CPU runs, for every sign / exponent / upper mantissa
// pattern, with tails of every length and unaligned starts.
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <mpar/backend/host/bf16_convert.hpp>
#include <mpar/backend/host/host_backend.hpp>
#include <vector>

namespace {

/** bf16 bits of `x` by the definition: NaN -> its upper half with the quiet bit set; otherwise the nearer of
 * the bf16 values just below and above |x| (ties: the one with an even last bit), overflow to infinity. */
std::uint16_t bf16_convert_reference_bits(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  if (std::isnan(x)) return std::uint16_t((u >> 16) | 0x0040u);
  const std::uint32_t a = u & 0x7fffffffu;
  const std::uint16_t below = std::uint16_t(a >> 16);  // truncation: the bf16 magnitude just below (or equal)
  if ((a & 0xffffu) == 0) return std::uint16_t(sign | below);
  const std::uint16_t above = std::uint16_t(below + 1);  // 0x7f80 (infinity) above the largest finite
  const double v = double(std::bit_cast<float>(a));
  const double lo = double(std::bit_cast<float>(std::uint32_t(below) << 16));
  // Above the largest finite bf16 the next step would be 2^128; a double holds it exactly.
  const double hi = above == 0x7f80u ? std::ldexp(1.0, 128) : double(std::bit_cast<float>(std::uint32_t(above) << 16));
  const double d_lo = v - lo, d_hi = hi - v;  // exact in double
  std::uint16_t pick;
  if (d_lo < d_hi)
    pick = below;
  else if (d_hi < d_lo)
    pick = above;
  else
    pick = (below & 1u) ? above : below;
  return std::uint16_t(sign | pick);
}

/** Every upper half (sign, exponent, 7 mantissa bits) with lower halves that probe the rounding: exact, the
 * smallest step, just below / at / just above the tie, the largest. NaNs, infinities and subnormals included. */
std::vector<float> bf16_convert_probe_values() {
  const std::uint32_t lows[] = {0x0000u, 0x0001u, 0x3456u, 0x7fffu, 0x8000u, 0x8001u, 0xc3a5u, 0xffffu};
  std::vector<float> v;
  v.reserve(65536 * std::size(lows));
  for (std::uint32_t hi = 0; hi < 65536; ++hi)
    for (std::uint32_t lo : lows) v.push_back(std::bit_cast<float>((hi << 16) | lo));
  return v;
}

}  // namespace

TEST_CASE("host bf16 conversion: fp32 to bf16 rounds to nearest even like the definition, at every level",
          "[backend][bf16_convert]") {
  const std::vector<float> src = bf16_convert_probe_values();
  std::vector<std::uint16_t> want(src.size());
  for (std::size_t i = 0; i < src.size(); ++i) want[i] = bf16_convert_reference_bits(src[i]);
  for (const mpar::host::Isa isa : mpar::host::supported_isas()) {
    mpar::host::ScopedIsa pin(isa);
    INFO("instruction set " << mpar::host::isa_name(isa));
    std::vector<mpar::bf16> got(src.size());
    mpar::host::convert_to_bf16(src.size(), src.data(), got.data());
    std::size_t wrong = 0, first = src.size();
    for (std::size_t i = 0; i < src.size(); ++i)
      if (got[i].bits != want[i] && wrong++ == 0) first = i;
    INFO("first difference at input bits " << std::hex
                                           << (first < src.size() ? std::bit_cast<std::uint32_t>(src[first]) : 0u));
    CHECK(wrong == 0);
    // The scalar rule the rest of mpar uses (bf16::from_float) gives the same bits.
    for (std::size_t i = 0; i < src.size(); i += 97) CHECK(mpar::bf16(src[i]).bits == want[i]);
  }
}

TEST_CASE("host bf16 conversion: bf16 to fp32 is exact, for every bf16 value, at every level",
          "[backend][bf16_convert]") {
  std::vector<mpar::bf16> src(65536);
  for (std::uint32_t b = 0; b < 65536; ++b) src[b] = mpar::bf16::from_bits(std::uint16_t(b));
  for (const mpar::host::Isa isa : mpar::host::supported_isas()) {
    mpar::host::ScopedIsa pin(isa);
    INFO("instruction set " << mpar::host::isa_name(isa));
    std::vector<float> got(src.size());
    mpar::host::convert_from_bf16(src.size(), src.data(), got.data());
    std::size_t wrong = 0;
    for (std::uint32_t b = 0; b < 65536; ++b) wrong += std::bit_cast<std::uint32_t>(got[b]) != (b << 16);
    CHECK(wrong == 0);
  }
}

TEST_CASE("host bf16 conversion: every length and unaligned start writes exactly its n elements",
          "[backend][bf16_convert]") {
  // Lengths around the kernel's block (64) and the vector widths, starting 0..3 elements into the buffer; the
  // elements before and after the range must keep their sentinel.
  std::vector<float> src(300);
  for (std::size_t i = 0; i < src.size(); ++i)
    src[i] = float(std::sin(double(i) * 0.37) * std::ldexp(1.0, int(i % 40) - 20));
  const mpar::bf16 sentinel = mpar::bf16::from_bits(0x7fc1);
  const float fsentinel = -12345.5f;
  for (const mpar::host::Isa isa : mpar::host::supported_isas()) {
    mpar::host::ScopedIsa pin(isa);
    for (std::size_t offset = 0; offset < 4; ++offset)
      for (std::size_t n : {0u, 1u, 7u, 15u, 16u, 17u, 31u, 63u, 64u, 65u, 127u, 128u, 129u, 191u, 255u, 289u}) {
        INFO("instruction set " << mpar::host::isa_name(isa) << ", offset " << offset << ", n " << n);
        std::vector<mpar::bf16> h(n + 8, sentinel);
        mpar::host::convert_to_bf16(n, src.data() + offset, h.data() + offset);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < h.size(); ++i) {
          const bool inside = i >= offset && i < offset + n;
          const std::uint16_t want = inside ? bf16_convert_reference_bits(src[i]) : sentinel.bits;
          wrong += h[i].bits != want;
        }
        CHECK(wrong == 0);
        std::vector<float> back(n + 8, fsentinel);
        mpar::host::convert_from_bf16(n, h.data() + offset, back.data() + offset);
        wrong = 0;
        for (std::size_t i = 0; i < back.size(); ++i) {
          const bool inside = i >= offset && i < offset + n;
          const float want = inside ? std::bit_cast<float>(std::uint32_t(h[i].bits) << 16) : fsentinel;
          wrong += std::bit_cast<std::uint32_t>(back[i]) != std::bit_cast<std::uint32_t>(want);
        }
        CHECK(wrong == 0);
      }
  }
}

TEST_CASE("host bf16 conversion: HostBackend::convert between fp32 and bf16 is the vectorized conversion",
          "[backend][bf16_convert]") {
  // What the mixed-precision step calls: the backend operation, on a length with a tail.
  const std::vector<float> src = bf16_convert_probe_values();
  const std::size_t n = 1000003 < src.size() ? 1000003 : src.size() - 5;
  std::vector<mpar::bf16> h(n);
  mpar::HostBackend::run(mpar::ops::convert<float, mpar::bf16>{.n = n, .src = src.data(), .dst = h.data()});
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += h[i].bits != bf16_convert_reference_bits(src[i]);
  CHECK(wrong == 0);
  std::vector<float> back(n);
  mpar::HostBackend::run(mpar::ops::convert<mpar::bf16, float>{.n = n, .src = h.data(), .dst = back.data()});
  wrong = 0;
  for (std::size_t i = 0; i < n; ++i)
    wrong += std::bit_cast<std::uint32_t>(back[i]) != (std::uint32_t(h[i].bits) << 16);
  CHECK(wrong == 0);
}
