// The avx512_bf16 GEMM kernel (host/avx512_bf16_gemm.hpp) against naive loops in double, and its choice at
// run time. On a CPU without avx512_bf16 the kernel's own cases only warn and return (the library's run).
#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <mpar/backend/host/avx512_bf16_gemm.hpp>  // the kernel is in the program: a oneDNN build leaves it out
#include <mpar/backend/host/host_backend.hpp>
#include <mpar/core.hpp>
#include <utility>
#include <vector>

using namespace mpar;

namespace {

/** Whether this CPU runs the kernel; warns (once per case) where it does not, so the skip is visible. */
bool bf16_kernel_runs_here() {
  if (host::cpu_has_avx512_bf16()) return true;
  WARN("avx512_bf16 GEMM cases skipped: this CPU lacks avx512_bf16 (best isa " << host::isa_name(host::detected_isa())
                                                                               << ")");
  return false;
}

using Bf16Gemm = void (*)(Trans, Trans, std::size_t, std::size_t, std::size_t, float, const bf16*, std::size_t,
                          const bf16*, std::size_t, float, float*, std::size_t);

/**
 * `gemm_under_test` against a naive double loop over the same bf16 values, for one shape, transpose pair and
 * alpha/beta, with leading dimensions `pad` beyond the stored rows. Tolerance: the kernel adds k exact fp32
 * products (one rounding each, 2^-24 relative) to an fp32 accumulator, then scales and adds beta C (two more),
 * so |got - exact| <= (k + 3) 2^-24 (|alpha| sum_p |a b| + |beta c|); the check allows twice that. Beyond it
 * lies any wrong product: one misplaced pair is off by about |a b| >> 2^-24 sum |a b| for these sizes.
 */
void check_bf16_gemm_case(Bf16Gemm gemm_under_test, Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k,
                          float alpha, float beta, std::size_t pad) {
  const std::size_t lda = (ta == Trans::no ? k : m) + pad, ldb = (tb == Trans::no ? n : k) + pad, ldc = n + pad;
  std::vector<bf16> a((ta == Trans::no ? m : k) * lda), b((tb == Trans::no ? k : n) * ldb);
  std::vector<float> c(m * ldc);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = bf16(init_value(7, 0, i, InitSpec::uniform(1)));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = bf16(init_value(7, 1, i, InitSpec::uniform(1)));
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = init_value(7, 2, i, InitSpec::uniform(1));
  const std::vector<float> c0 = c;
  // beta = 0 must overwrite C without reading it: NaN there must not leak into the result.
  if (beta == 0.0f)
    for (std::size_t i = 0; i < m; ++i) std::fill_n(c.begin() + std::ptrdiff_t(i * ldc), n, std::nanf(""));
  gemm_under_test(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < ldc; ++j) {
      const std::size_t e = i * ldc + j;
      INFO("m=" << m << " n=" << n << " k=" << k << " ta=" << (ta == Trans::yes) << " tb=" << (tb == Trans::yes)
                << " alpha=" << alpha << " beta=" << beta << " pad=" << pad << " at (" << i << ", " << j << ")");
      if (j >= n) {  // the padding between rows of C is never written
        REQUIRE(c[e] == c0[e]);
        continue;
      }
      double exact = 0, magnitude = 0;
      for (std::size_t p = 0; p < k; ++p) {
        const double x = float(ta == Trans::no ? a[i * lda + p] : a[p * lda + i]);
        const double y = float(tb == Trans::no ? b[p * ldb + j] : b[j * ldb + p]);
        exact += x * y;
        magnitude += std::fabs(x * y);
      }
      exact = alpha * exact + (beta == 0.0f ? 0.0 : beta * double(c0[e]));
      magnitude = std::fabs(alpha) * magnitude + std::fabs(beta) * std::fabs(double(c0[e]));
      REQUIRE(std::fabs(double(c[e]) - exact) <= 2.0 * double(k + 3) * std::ldexp(1.0, -24) * magnitude + 1e-30);
    }
}

/** Every transpose pair, alpha/beta pairs that take different store paths, and sizes around the tiles. */
void check_bf16_gemm_everywhere(Bf16Gemm gemm_under_test) {
  // 1, 3, 17, 33, 100: below, between and across the 8-row and 32-column tiles; 200 rows cross a 192-row
  // block; 513 = 2 blocks of 256 and a half pair; 2100 columns cross the 2048-column block.
  const std::array<std::array<std::size_t, 3>, 10> shapes = {{{1, 1, 1},
                                                              {3, 17, 33},
                                                              {17, 33, 3},
                                                              {33, 100, 17},
                                                              {100, 3, 100},
                                                              {8, 32, 2},
                                                              {200, 40, 7},
                                                              {9, 33, 513},
                                                              {3, 2100, 5},
                                                              {64, 64, 64}}};
  for (auto [alpha, beta] : {std::array<float, 2>{0.75f, -0.5f}, {1.0f, 0.0f}, {1.0f, 1.0f}})
    for (auto ta : {Trans::no, Trans::yes})
      for (auto tb : {Trans::no, Trans::yes})
        for (const auto& s : shapes)
          for (std::size_t pad : {std::size_t(0), std::size_t(3)})
            check_bf16_gemm_case(gemm_under_test, ta, tb, s[0], s[1], s[2], alpha, beta, pad);
}

}  // namespace

TEST_CASE("avx512_bf16 GEMM kernel matches a naive double loop: every transpose, alpha/beta, edge and ld",
          "[backend][gemm][bf16][avx512_bf16]") {
  if (!bf16_kernel_runs_here()) return;
  check_bf16_gemm_everywhere([](Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, float alpha,
                                const bf16* a, std::size_t lda, const bf16* b, std::size_t ldb, float beta, float* c,
                                std::size_t ldc) {
    host::avx512_bf16::gemm(ta == Trans::yes, tb == Trans::yes, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  });
}

TEST_CASE("HostBackend's bf16 GEMM matches a naive double loop with either kernel pinned",
          "[backend][gemm][bf16][avx512_bf16]") {
  const Bf16Gemm through_backend = [](Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, float alpha,
                                      const bf16* a, std::size_t lda, const bf16* b, std::size_t ldb, float beta,
                                      float* c, std::size_t ldc) {
    HostBackend::run(ops::gemm<bf16, float>{.ta = ta,
                                            .tb = tb,
                                            .m = m,
                                            .n = n,
                                            .k = k,
                                            .alpha = alpha,
                                            .a = a,
                                            .lda = lda,
                                            .b = b,
                                            .ldb = ldb,
                                            .beta = beta,
                                            .c = c,
                                            .ldc = ldc});
  };
  {
    host::ScopedBf16GemmKernel library(host::Bf16GemmKernel::library);
    check_bf16_gemm_everywhere(through_backend);
  }
  if (!bf16_kernel_runs_here()) return;
  host::ScopedBf16GemmKernel fast(host::Bf16GemmKernel::avx512_bf16);
  check_bf16_gemm_everywhere(through_backend);
}

TEST_CASE("avx512_bf16 GEMM: k = 0 stores beta C plus the bias", "[backend][gemm][bf16][avx512_bf16]") {
  if (!bf16_kernel_runs_here()) return;
  std::vector<float> c = {1, 2, 3, 4}, bias = {10, 20};
  host::avx512_bf16::gemm(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, c.data(), 2, bias.data());
  CHECK(c == std::vector<float>{10.5f, 21.0f, 11.5f, 22.0f});
}

TEST_CASE("bf16 GEMM dispatch: avx512_bf16 where the CPU has it and the library has no bf16 kernels, unless pinned",
          "[backend][gemm][bf16][avx512_bf16]") {
  const char* env = std::getenv("MPAR_HOST_BF16_GEMM");
  INFO("CPU avx512_bf16=" << host::cpu_has_avx512_bf16() << ", library " << host_gemm_library
                          << ", MPAR_HOST_BF16_GEMM=" << (env ? env : "(unset)"));
  // The documented rule, spelled out from the build and the CPU.
#if defined(MPAR_HAVE_ONEDNN)
  const auto automatic = host::Bf16GemmKernel::library;
#else
  const auto automatic =
      host::cpu_has_avx512_bf16() ? host::Bf16GemmKernel::avx512_bf16 : host::Bf16GemmKernel::library;
#endif
  CHECK(host::detail::parse_bf16_gemm_kernel("") == automatic);
  CHECK(host::detail::parse_bf16_gemm_kernel("auto") == automatic);
  CHECK(host::detail::parse_bf16_gemm_kernel("onednn") == host::Bf16GemmKernel::library);
  if (!env) CHECK(host::bf16_gemm_kernel() == automatic);
  CHECK_THROWS_WITH(host::detail::parse_bf16_gemm_kernel("avx512"),
                    Catch::Contains("MPAR_HOST_BF16_GEMM=avx512") && Catch::Contains("avx512_bf16, onednn"));
  {
    host::ScopedBf16GemmKernel library(host::Bf16GemmKernel::library);
    CHECK(host::bf16_gemm_kernel() == host::Bf16GemmKernel::library);
  }
  if (!bf16_kernel_runs_here()) {
    CHECK_FALSE(host::avx512_bf16_gemm_available());
    CHECK_THROWS_WITH(host::ScopedBf16GemmKernel(host::Bf16GemmKernel::avx512_bf16), Catch::Contains("lacks"));
    CHECK_THROWS_WITH(host::detail::parse_bf16_gemm_kernel("avx512_bf16"), Catch::Contains("lacks avx512_bf16"));
    return;
  }
  CHECK(host::avx512_bf16_gemm_available());  // this file includes the kernel's header
  {
    // A program without the kernel's header cannot force it, and is told how to get it.
    const auto entry = std::exchange(host::detail::avx512_bf16_gemm_entry, nullptr);
    CHECK_FALSE(host::avx512_bf16_gemm_available());
    CHECK_THROWS_WITH(host::ScopedBf16GemmKernel(host::Bf16GemmKernel::avx512_bf16),
                      Catch::Contains("include <mpar/backend/host/avx512_bf16_gemm.hpp>"));
    CHECK(host::detail::parse_bf16_gemm_kernel("") == host::Bf16GemmKernel::library);
    host::detail::avx512_bf16_gemm_entry = entry;
  }
  host::ScopedBf16GemmKernel fast(host::Bf16GemmKernel::avx512_bf16);
  CHECK(host::bf16_gemm_kernel() == host::Bf16GemmKernel::avx512_bf16);
  {
    // A thread pinned below AVX-512 (as the tests of the lower levels are) gets the library kernel.
    host::ScopedIsa avx2(host::Isa::avx2);
    CHECK(host::bf16_gemm_kernel() == host::Bf16GemmKernel::library);
  }
  std::vector<bf16> a(13 * 11, bf16(0.5f)), b(11 * 7, bf16(0.25f));
  std::vector<float> c(13 * 7), bias(7, 1.0f), pre(13 * 7), y(13 * 7);
#if defined(MPAR_HAVE_ONEDNN)
  // The pinned kernel is really what runs: a bf16 GEMM of a shape this thread never ran creates no oneDNN
  // primitive, while the same call with the library pinned creates one.
  const std::size_t before = host::onednn::cached_primitives();
  HostBackend::run(ops::gemm<bf16, float>{.ta = Trans::no,
                                          .tb = Trans::no,
                                          .m = 13,
                                          .n = 7,
                                          .k = 11,
                                          .alpha = 1.0f,
                                          .a = a.data(),
                                          .lda = 11,
                                          .b = b.data(),
                                          .ldb = 7,
                                          .beta = 0.0f,
                                          .c = c.data(),
                                          .ldc = 7});
  CHECK(host::onednn::cached_primitives() == before);
  CHECK(c == std::vector<float>(c.size(), 11 * 0.125f));
  HostBackend::run(ops::gemm_bias_gelu<bf16>{.m = 13,
                                             .n = 7,
                                             .k = 11,
                                             .a = a.data(),
                                             .lda = 11,
                                             .w = b.data(),
                                             .ldw = 7,
                                             .bias = bias.data(),
                                             .pre = pre.data(),
                                             .y = y.data()});
  CHECK(host::onednn::cached_primitives() == before);
  CHECK(pre == std::vector<float>(pre.size(), 1 + 11 * 0.125f));
  host::ScopedBf16GemmKernel library(host::Bf16GemmKernel::library);
  HostBackend::run(ops::gemm<bf16, float>{.ta = Trans::no,
                                          .tb = Trans::no,
                                          .m = 13,
                                          .n = 7,
                                          .k = 11,
                                          .alpha = 1.0f,
                                          .a = a.data(),
                                          .lda = 11,
                                          .b = b.data(),
                                          .ldb = 7,
                                          .beta = 0.0f,
                                          .c = c.data(),
                                          .ldc = 7});
  CHECK(host::onednn::cached_primitives() == before + 1);
#else
  // The pinned kernel is really what runs: vdpbf16ps flushes a denormal sum to zero, the widened fp32 GEMM
  // of the library path keeps it (2^-70 * 2^-70 = 2^-140, below fp32's smallest normal 2^-126).
  const bf16 tiny(std::ldexp(1.0f, -70));
  float product = -1;
  HostBackend::run(ops::gemm<bf16, float>{.ta = Trans::no,
                                          .tb = Trans::no,
                                          .m = 1,
                                          .n = 1,
                                          .k = 1,
                                          .alpha = 1.0f,
                                          .a = &tiny,
                                          .lda = 1,
                                          .b = &tiny,
                                          .ldb = 1,
                                          .beta = 0.0f,
                                          .c = &product,
                                          .ldc = 1});
  CHECK(product == 0.0f);
  HostBackend::run(ops::gemm_bias_gelu<bf16>{.m = 13,
                                             .n = 7,
                                             .k = 11,
                                             .a = a.data(),
                                             .lda = 11,
                                             .w = b.data(),
                                             .ldw = 7,
                                             .bias = bias.data(),
                                             .pre = pre.data(),
                                             .y = y.data()});
  CHECK(pre == std::vector<float>(pre.size(), 1 + 11 * 0.125f));
  host::ScopedBf16GemmKernel library(host::Bf16GemmKernel::library);
  HostBackend::run(ops::gemm<bf16, float>{.ta = Trans::no,
                                          .tb = Trans::no,
                                          .m = 1,
                                          .n = 1,
                                          .k = 1,
                                          .alpha = 1.0f,
                                          .a = &tiny,
                                          .lda = 1,
                                          .b = &tiny,
                                          .ldb = 1,
                                          .beta = 0.0f,
                                          .c = &product,
                                          .ldc = 1});
  CHECK(product == std::ldexp(1.0f, -140));
#endif
}
