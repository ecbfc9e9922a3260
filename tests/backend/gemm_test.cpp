#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <limits>
#include <mpar/backend/host/host_backend.hpp>
#include <mpar/core.hpp>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

using namespace mpar;

namespace {
template <class T>
void naive_gemm(Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a, std::size_t lda,
                const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc) {
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      long double s = 0;
      for (std::size_t p = 0; p < k; ++p)
        s += (long double)(ta == Trans::no ? a[i * lda + p] : a[p * lda + i]) *
             (tb == Trans::no ? b[p * ldb + j] : b[j * ldb + p]);
      c[i * ldc + j] = T(alpha * s + beta * c[i * ldc + j]);
    }
}

/** Every transpose, several shapes with padded leading dimensions, and alpha/beta pairs that take different paths. */
template <class T, class Gemm>
void check_all_transposes(Gemm&& gemm_under_test, double tol) {
  for (auto [alpha, beta] : {std::pair<T, T>{T(0.75), T(-0.5)}, {T(1), T(0)}, {T(1), T(1)}})
    for (auto ta : {Trans::no, Trans::yes})
      for (auto tb : {Trans::no, Trans::yes})
        for (auto [m, n, k] : {std::tuple<std::size_t, std::size_t, std::size_t>{1, 1, 1},
                               {7, 5, 3},
                               {33, 65, 17},
                               {64, 1, 70},
                               {96, 160, 200}}) {
          // Padded leading dimensions exercise strided operands.
          const std::size_t lda = (ta == Trans::no ? k : m) + 3, ldb = (tb == Trans::no ? n : k) + 2, ldc = n + 1;
          std::vector<T> a((ta == Trans::no ? m : k) * lda), b((tb == Trans::no ? k : n) * ldb), c(m * ldc), ref;
          for (std::size_t i = 0; i < a.size(); ++i) a[i] = T(init_value(1, 0, i, InitSpec::uniform(1)));
          for (std::size_t i = 0; i < b.size(); ++i) b[i] = T(init_value(1, 1, i, InitSpec::uniform(1)));
          for (std::size_t i = 0; i < c.size(); ++i) c[i] = T(init_value(1, 2, i, InitSpec::uniform(1)));
          ref = c;
          naive_gemm<T>(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, ref.data(), ldc);
          // beta = 0 must overwrite C without reading it: NaN there must not leak into the result.
          if (beta == T(0)) std::fill(c.begin(), c.end(), std::numeric_limits<T>::quiet_NaN());
          gemm_under_test(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
          for (std::size_t i = 0; i < m; ++i)
            for (std::size_t j = 0; j < n; ++j) {
              const double got = double(c[i * ldc + j]), want = double(ref[i * ldc + j]);
              INFO("m=" << m << " n=" << n << " k=" << k << " ta=" << (ta == Trans::yes) << " tb=" << (tb == Trans::yes)
                        << " alpha=" << alpha << " beta=" << beta << " at (" << i << ", " << j << ")");
              REQUIRE(std::fabs(got - want) <= tol * (1 + std::fabs(want)));
            }
        }
}

/**
 * 16-bit A and B with an fp32 C against a naive loop over the same 16-bit values with fp32 accumulation.
 * Products of 16-bit values are exact in fp32, so the two differ only in summation order: bounded by
 * 2 (k + 2) 2^-24 (|alpha| sum_p |a b| + |beta c|) (twice the fp32 accumulation bound gamma_{k+2}).
 * A wrong transpose, stride, alpha/beta or a 16-bit rounding of C (2^-9 relative) exceeds it.
 */
template <class H>
void check_half_gemm() {
  for (auto [alpha, beta] : {std::pair<float, float>{0.75f, -0.5f}, {1.0f, 0.0f}, {1.0f, 1.0f}})
    for (auto ta : {Trans::no, Trans::yes})
      for (auto tb : {Trans::no, Trans::yes})
        for (auto [m, n, k] : {std::tuple<std::size_t, std::size_t, std::size_t>{1, 1, 1},
                               {7, 5, 3},
                               {33, 65, 17},
                               {64, 1, 70},
                               {96, 160, 200}}) {
          const std::size_t lda = (ta == Trans::no ? k : m) + 3, ldb = (tb == Trans::no ? n : k) + 2, ldc = n + 1;
          std::vector<H> a((ta == Trans::no ? m : k) * lda), b((tb == Trans::no ? k : n) * ldb);
          std::vector<float> c(m * ldc), ref, mag(m * ldc);
          for (std::size_t i = 0; i < a.size(); ++i) a[i] = H(init_value(4, 0, i, InitSpec::uniform(1)));
          for (std::size_t i = 0; i < b.size(); ++i) b[i] = H(init_value(4, 1, i, InitSpec::uniform(1)));
          for (std::size_t i = 0; i < c.size(); ++i) c[i] = init_value(4, 2, i, InitSpec::uniform(1));
          ref = c;
          for (std::size_t i = 0; i < m; ++i)
            for (std::size_t j = 0; j < n; ++j) {
              float s = 0, abs_sum = 0;
              for (std::size_t p = 0; p < k; ++p) {
                const float prod = float(ta == Trans::no ? a[i * lda + p] : a[p * lda + i]) *
                                   float(tb == Trans::no ? b[p * ldb + j] : b[j * ldb + p]);
                s += prod;
                abs_sum += std::fabs(prod);
              }
              mag[i * ldc + j] = std::fabs(alpha) * abs_sum + std::fabs(beta * c[i * ldc + j]);
              ref[i * ldc + j] = alpha * s + (beta == 0.0f ? 0.0f : beta * c[i * ldc + j]);
            }
          if (beta == 0.0f) std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
          HostBackend::run(ops::gemm<H, float>{.ta = ta,
                                               .tb = tb,
                                               .m = m,
                                               .n = n,
                                               .k = k,
                                               .alpha = alpha,
                                               .a = a.data(),
                                               .lda = lda,
                                               .b = b.data(),
                                               .ldb = ldb,
                                               .beta = beta,
                                               .c = c.data(),
                                               .ldc = ldc});
          const double unit = std::ldexp(1.0, -24);
          for (std::size_t i = 0; i < m; ++i)
            for (std::size_t j = 0; j < n; ++j) {
              INFO(dtype_name_v<H> << " m=" << m << " n=" << n << " k=" << k << " ta=" << (ta == Trans::yes)
                                   << " tb=" << (tb == Trans::yes) << " alpha=" << alpha << " beta=" << beta << " at ("
                                   << i << ", " << j << ")");
              const double tol = 2.0 * double(k + 2) * unit * mag[i * ldc + j] + 1e-30;
              REQUIRE(std::fabs(double(c[i * ldc + j]) - double(ref[i * ldc + j])) <= tol);
            }
        }
}
}  // namespace

/** HostBackend's GEMM operation over gemm's positional arguments, so it shares the checks with the fallback. */
template <class T>
void host_backend_gemm(Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, T alpha, const T* a,
                       std::size_t lda, const T* b, std::size_t ldb, T beta, T* c, std::size_t ldc) {
  HostBackend::run(ops::gemm<T>{.ta = ta,
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
}

TEST_CASE("host GEMM matches a naive reference for every transpose, alpha/beta and stride", "[backend][gemm]") {
  INFO("host GEMM library: " << host_gemm_library);
  check_all_transposes<float>([](auto... args) { host_backend_gemm<float>(args...); }, 1e-5);
  check_all_transposes<double>([](auto... args) { host_backend_gemm<double>(args...); }, 1e-12);
}

TEST_CASE("the portable fallback GEMM matches the reference", "[backend][gemm]") {
  check_all_transposes<float>([](auto... args) { detail::gemm_fallback<float>(args...); }, 1e-5);
  check_all_transposes<double>([](auto... args) { detail::gemm_fallback<double>(args...); }, 1e-12);
}

TEST_CASE("bf16 and f16 GEMMs accumulate in fp32: summation-order agreement with a naive loop",
          "[backend][gemm][bf16]") {
  INFO("host GEMM library: " << host_gemm_library);
  check_half_gemm<bf16>();
  check_half_gemm<f16>();
}

TEST_CASE("a bf16 GEMM of fp32 data is within the documented bf16 tolerance of the fp32 GEMM",
          "[backend][gemm][bf16]") {
  // Rounding each input to bf16 changes it by at most 2^-9 relative, so each product by at most
  // 2^-8 + 2^-18: |bf16 gemm - exact| <= (2^-8 + 2^-18 + 2 (k + 2) 2^-24) sum_p |a b|.
  const std::size_t m = 48, n = 80, k = 256;
  std::vector<float> a(m * k), b(k * n), c(m * n);
  std::vector<bf16> ah(a.size()), bh(b.size());
  for (std::size_t i = 0; i < a.size(); ++i) ah[i] = bf16(a[i] = init_value(5, 0, i, InitSpec::uniform(1)));
  for (std::size_t i = 0; i < b.size(); ++i) bh[i] = bf16(b[i] = init_value(5, 1, i, InitSpec::uniform(1)));
  HostBackend::run(ops::gemm<bf16, float>{.ta = Trans::no,
                                          .tb = Trans::no,
                                          .m = m,
                                          .n = n,
                                          .k = k,
                                          .alpha = 1.0f,
                                          .a = ah.data(),
                                          .lda = k,
                                          .b = bh.data(),
                                          .ldb = n,
                                          .beta = 0.0f,
                                          .c = c.data(),
                                          .ldc = n});
  double worst = 0;
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double exact = 0, abs_sum = 0;
      for (std::size_t p = 0; p < k; ++p) {
        exact += double(a[i * k + p]) * b[p * n + j];
        abs_sum += std::fabs(double(a[i * k + p]) * b[p * n + j]);
      }
      const double bound =
          (std::ldexp(1.0, -8) + std::ldexp(1.0, -18) + 2.0 * double(k + 2) * std::ldexp(1.0, -24)) * abs_sum;
      REQUIRE(std::fabs(double(c[i * n + j]) - exact) <= bound);
      worst = std::max(worst, std::fabs(double(c[i * n + j]) - exact) / abs_sum);
    }
  // The operands really were rounded: an fp32 GEMM in disguise would be far more accurate than 2^-12.
  CHECK(worst > std::ldexp(1.0, -12));
}

TEST_CASE("host GEMM names the sizes when leading dimensions are too small", "[backend][gemm]") {
  std::vector<float> a(12), b(12), c(12);
  CHECK_THROWS_WITH(HostBackend::run(ops::gemm<float>{.ta = Trans::no,
                                                      .tb = Trans::no,
                                                      .m = 3,
                                                      .n = 4,
                                                      .k = 4,
                                                      .alpha = 1.0f,
                                                      .a = a.data(),
                                                      .lda = 3,
                                                      .b = b.data(),
                                                      .ldb = 4,
                                                      .beta = 0.0f,
                                                      .c = c.data(),
                                                      .ldc = 4}),
                    Catch::Contains("lda=3") && Catch::Contains("m=3 n=4 k=4"));
}

TEST_CASE("an empty inner dimension gives C = beta C", "[backend][gemm]") {
  std::vector<float> c = {1, 2, 3, 4}, nan(4, std::numeric_limits<float>::quiet_NaN());
  HostBackend::run(ops::gemm<float>{.ta = Trans::no,
                                    .tb = Trans::no,
                                    .m = 2,
                                    .n = 2,
                                    .k = 0,
                                    .alpha = 1.0f,
                                    .a = nullptr,
                                    .lda = 1,
                                    .b = nullptr,
                                    .ldb = 2,
                                    .beta = 0.5f,
                                    .c = c.data(),
                                    .ldc = 2});
  CHECK(c == std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f});
  HostBackend::run(ops::gemm<bf16, float>{.ta = Trans::no,
                                          .tb = Trans::no,
                                          .m = 2,
                                          .n = 2,
                                          .k = 0,
                                          .alpha = 1.0f,
                                          .a = nullptr,
                                          .lda = 1,
                                          .b = nullptr,
                                          .ldb = 2,
                                          .beta = 0.0f,
                                          .c = nan.data(),
                                          .ldc = 2});
  CHECK(nan == std::vector<float>(4, 0.0f));
}

#if defined(MPAR_HAVE_ONEDNN)
TEST_CASE("oneDNN GEMM: one primitive per signature, created once per thread", "[backend][gemm][onednn]") {
  host::ScopedBf16GemmKernel library(host::Bf16GemmKernel::library);  // the bf16 call below goes to oneDNN
  std::vector<float> a(64 * 64, 0.5f), b(64 * 64, 0.25f), c(64 * 64);
  std::vector<bf16> ah(a.size(), bf16(0.5f)), bh(b.size(), bf16(0.25f));
  const std::size_t before = host::onednn::cached_primitives();
  for (int r = 0; r < 3; ++r)
    mpar::gemm<float>(Trans::no, Trans::no, 37, 41, 43, 1.0f, a.data(), 43, b.data(), 41, 0.0f, c.data(), 41);
  CHECK(host::onednn::cached_primitives() == before + 1);
  CHECK(c[0] == Approx(43 * 0.125));
  // Another leading dimension, transpose, type or beta is another primitive.
  mpar::gemm<float>(Trans::no, Trans::no, 37, 41, 43, 1.0f, a.data(), 44, b.data(), 41, 0.0f, c.data(), 41);
  mpar::gemm<float>(Trans::yes, Trans::no, 37, 41, 43, 1.0f, a.data(), 37, b.data(), 41, 0.0f, c.data(), 41);
  mpar::gemm<float>(Trans::no, Trans::no, 37, 41, 43, 1.0f, a.data(), 43, b.data(), 41, 1.0f, c.data(), 41);
  mpar::gemm<bf16, float>(Trans::no, Trans::no, 37, 41, 43, 1.0f, ah.data(), 43, bh.data(), 41, 0.0f, c.data(), 41);
  CHECK(host::onednn::cached_primitives() == before + 5);
  // A new thread starts with its own, empty cache.
  std::size_t in_thread = 99;
  std::thread([&] { in_thread = host::onednn::cached_primitives(); }).join();
  CHECK(in_thread == 0);
}

TEST_CASE("oneDNN GEMM: a two-level batch is one primitive, whatever the strides of a level of one entry",
          "[backend][gemm][onednn][batched]") {
  // Attention's scores for 3 sequences x 2 heads: q and k blocks of a [3 * 5, 3 * 2 * 4] qkv matrix.
  const std::size_t nb = 3, heads = 2, s = 5, d = 4, hl = heads * d, ld = 3 * hl;
  std::vector<float> qkv(nb * s * ld), p(nb * heads * s * s, -1.0f);
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = float(int(i % 13) - 6) / 4.0f;
  const std::size_t before = host::onednn::cached_primitives();
  for (int r = 0; r < 3; ++r)
    host::gemm_strided_batched<float>(Trans::no, Trans::yes, s, s, d, 0.5f, qkv.data(), ld, {s * ld, d},
                                      qkv.data() + hl, ld, {s * ld, d}, 0.0f, p.data(), s, {heads * s * s, s * s},
                                      BatchExtents{nb, heads});
  CHECK(host::onednn::cached_primitives() == before + 1);
  for (std::size_t b = 0; b < nb; ++b)
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t i = 0; i < s; ++i)
        for (std::size_t j = 0; j < s; ++j) {
          double want = 0;
          for (std::size_t x = 0; x < d; ++x)
            want += double(qkv[(b * s + i) * ld + h * d + x]) * double(qkv[(b * s + j) * ld + hl + h * d + x]);
          REQUIRE(p[((b * heads + h) * s + i) * s + j] == Approx(0.5 * want).margin(1e-6));
        }
  // One sequence: the outer stride is irrelevant and selects no new primitive; the one-level form is the same.
  host::gemm_strided_batched<float>(Trans::no, Trans::yes, s, s, d, 0.5f, qkv.data(), ld, {7, d}, qkv.data() + hl, ld,
                                    {9, d}, 0.0f, p.data(), s, {11, s * s}, BatchExtents{1, heads});
  host::gemm_strided_batched<float>(Trans::no, Trans::yes, s, s, d, 0.5f, qkv.data(), ld, d, qkv.data() + hl, ld, d,
                                    0.0f, p.data(), s, s * s, heads);
  CHECK(host::onednn::cached_primitives() == before + 2);
}

namespace {
std::size_t threads_in_process() {
  std::size_t count = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++count;
  return count;
}
}  // namespace

TEST_CASE("oneDNN GEMM runs on the calling thread only and keeps its OpenMP setting", "[backend][gemm][onednn]") {
  const auto& omp = host::onednn::detail::OpenMpThreads::instance();
  if (!omp.set) {
    WARN("this oneDNN does not use OpenMP: nothing to check");
    return;
  }
  // A rank thread whose OpenMP setting asks for 4 threads (as OMP_NUM_THREADS=4 would): the GEMMs must
  // still create no thread (libgomp would start a pool of 3 for a parallel region), and the setting
  // must be the caller's again afterwards.
  std::size_t before = 0, after = 0;
  int setting_after = 0;
  std::thread([&] {
    omp.set(4);
    const std::size_t n = 256;
    std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
    std::vector<bf16> ah(a.size(), bf16(0.5f)), bh(b.size(), bf16(0.25f));
    before = threads_in_process();
    for (int r = 0; r < 2; ++r) {
      mpar::gemm<float>(Trans::no, Trans::no, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
      mpar::gemm<bf16, float>(Trans::no, Trans::yes, n, n, n, 1.0f, ah.data(), n, bh.data(), n, 0.0f, c.data(), n);
    }
    after = threads_in_process();
    setting_after = omp.get();
  }).join();
  CHECK(after == before);
  CHECK(setting_after == 4);
}
#endif
TEST_CASE("matmul on views checks shapes and honours slices", "[backend][gemm]") {
  Tensor<float, 2> a({4, 6}), b({6, 3}), c({4, 3});
  init_full(a, 3, 0, InitSpec::uniform(1));
  init_full(b, 3, 1, InitSpec::uniform(1));
  matmul<float>(a.view(), Trans::no, b.view(), Trans::no, c.view());
  for (std::size_t i = 0; i < 4; ++i)
    for (std::size_t j = 0; j < 3; ++j) {
      double s = 0;
      for (std::size_t p = 0; p < 6; ++p) s += double(a(i, p)) * b(p, j);
      CHECK(c(i, j) == Approx(s).epsilon(1e-5));
    }
  // A column slice of A (strided rows) times the matching row slice of B.
  Tensor<float, 2> c2({4, 3});
  matmul<float>(a.slice(1, 2, 5), Trans::no, b.slice(0, 2, 5), Trans::no, c2.view());
  double s = 0;
  for (std::size_t p = 2; p < 5; ++p) s += double(a(1, p)) * b(p, 2);
  CHECK(c2(1, 2) == Approx(s).epsilon(1e-5));
  CHECK_THROWS_WITH(matmul<float>(a.view(), Trans::yes, b.view(), Trans::no, c.view()),
                    Catch::Contains("op(A) is 6x4") && Catch::Contains("op(B) is 6x3"));
}
