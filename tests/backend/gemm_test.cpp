#include <catch2/catch.hpp>
#include <cmath>
#include <mpar/backend/host/host_backend.hpp>
#include <mpar/core.hpp>
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

template <class T, class Gemm>
void check_all_transposes(Gemm&& gemm_under_test, double tol) {
  for (auto ta : {Trans::no, Trans::yes})
    for (auto tb : {Trans::no, Trans::yes})
      for (auto [m, n, k] : {std::tuple<std::size_t, std::size_t, std::size_t>{1, 1, 1}, {7, 5, 3}, {33, 65, 17}, {64, 1, 70}}) {
        // Padded leading dimensions exercise strided operands.
        const std::size_t lda = (ta == Trans::no ? k : m) + 3, ldb = (tb == Trans::no ? n : k) + 2, ldc = n + 1;
        std::vector<T> a((ta == Trans::no ? m : k) * lda), b((tb == Trans::no ? k : n) * ldb), c(m * ldc), ref;
        for (std::size_t i = 0; i < a.size(); ++i) a[i] = T(init_value(1, 0, i, InitSpec::uniform(1)));
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = T(init_value(1, 1, i, InitSpec::uniform(1)));
        for (std::size_t i = 0; i < c.size(); ++i) c[i] = T(init_value(1, 2, i, InitSpec::uniform(1)));
        ref = c;
        naive_gemm<T>(ta, tb, m, n, k, T(0.75), a.data(), lda, b.data(), ldb, T(-0.5), ref.data(), ldc);
        gemm_under_test(ta, tb, m, n, k, T(0.75), a.data(), lda, b.data(), ldb, T(-0.5), c.data(), ldc);
        for (std::size_t i = 0; i < c.size(); ++i) REQUIRE(std::fabs(double(c[i] - ref[i])) <= tol * (1 + std::fabs(double(ref[i]))));
      }
}
}  // namespace

TEST_CASE("host GEMM matches a naive reference for every transpose, alpha/beta and stride", "[backend][gemm]") {
  check_all_transposes<float>([](auto... args) { HostBackend::gemm<float>(args...); }, 1e-5);
  check_all_transposes<double>([](auto... args) { HostBackend::gemm<double>(args...); }, 1e-12);
}

TEST_CASE("the portable fallback GEMM matches the reference", "[backend][gemm]") {
  check_all_transposes<float>([](auto... args) { detail::gemm_fallback<float>(args...); }, 1e-5);
  check_all_transposes<double>([](auto... args) { detail::gemm_fallback<double>(args...); }, 1e-12);
}

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
