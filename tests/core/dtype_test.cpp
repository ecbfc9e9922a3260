#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <mpar/core.hpp>

using namespace mpar;

namespace {
// Reference rounding: the exact nearest representable value, ties to the even bit pattern.
template <class H>
std::uint16_t nearest_even(float f) {
  // Search the two candidates bracketing f among all finite 16-bit patterns of f's sign.
  std::uint16_t best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const float v = float(H::from_bits(std::uint16_t(b)));
    if (!std::isfinite(v) || std::signbit(v) != std::signbit(f)) continue;
    const double err = std::fabs(double(v) - double(f));
    if (err < best_err || (err == best_err && (b & 1u) == 0)) {
      best_err = err;
      best = std::uint16_t(b);
    }
  }
  return best;
}
}  // namespace

TEST_CASE("bf16 and f16 round-trip every representable value", "[core][dtype]") {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto h = f16::from_bits(std::uint16_t(b));
    const float v = float(h);
    if (std::isnan(v)) {
      CHECK(std::isnan(float(f16(v))));
      continue;
    }
    REQUIRE(f16(v).bits == h.bits);
    const auto g = bf16::from_bits(std::uint16_t(b));
    if (!std::isnan(float(g))) REQUIRE(bf16(float(g)).bits == g.bits);
  }
}

TEST_CASE("float to 16-bit rounds to nearest, ties to even", "[core][dtype]") {
  // Exact ties: 1 + 2^-11 is halfway between f16 1.0 and 1.0 + 2^-10 -> rounds to 1.0 (even).
  CHECK(f16(1.0f + 0x1.0p-11f).bits == 0x3c00);
  CHECK(f16(1.0f + 3 * 0x1.0p-11f).bits == 0x3c02);  // halfway, rounds up to the even pattern
  CHECK(bf16(1.0f + 0x1.0p-8f).bits == 0x3f80);
  CHECK(bf16(1.0f + 3 * 0x1.0p-8f).bits == 0x3f82);
  // Overflow, subnormals, NaN.
  CHECK(f16(70000.0f).bits == 0x7c00);
  CHECK(f16(65504.0f).bits == 0x7bff);
  CHECK(float(f16(0x1.0p-24f)) == 0x1.0p-24f);
  CHECK(f16(0x1.0p-26f).bits == 0);
  CHECK(std::isnan(float(bf16(std::numeric_limits<float>::quiet_NaN()))));
  // Random floats against an exhaustive nearest-value search.
  CounterRng rng{7, 0};
  for (int i = 0; i < 40; ++i) {
    const float f = float((rng.uniform(std::uint64_t(i)) - 0.5) * std::pow(2.0, double(i % 30) - 20));
    CHECK(f16(f).bits == nearest_even<f16>(f));
    CHECK(bf16(f).bits == nearest_even<bf16>(f));
  }
}
