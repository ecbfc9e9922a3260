// mpar's device GEMM wrappers (backend/gpu/gemm.hpp: gemm, gemm_strided_batched, gemm_lt with its epilogues) run
// on the emulated cuBLAS and cuBLASLt against naive row-major loops in double on host data, with padded leading
// dimensions and batch strides, every transpose pair and every type combination the library uses; and the
// emulated cuBLAS refuses what cuBLAS refuses, naming the call.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "device_array.hpp"
#include "mpar/backend/gpu/gemm.hpp"
#include "mpar/core/init.hpp"

namespace mpar::gemm_emulation_test {

using emulation_test::DeviceArray;
using gpu::emulation::emulation_error;

/** Random values in [-2, 2), exactly representable in T. */
template <class T>
std::vector<T> values(std::size_t n, std::uint64_t seed) {
  const CounterRng rng{seed, 3};
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = T(float(-2.0 + 4.0 * rng.uniform(i)));
  return v;
}

/** One row-major operand: `rows x cols` stored with leading dimension `ld`, `batch` times `stride` apart. */
struct Shape {
  std::size_t rows, cols, ld;
  std::size_t stride = 0, batch = 1;
  [[nodiscard]] std::size_t elements() const { return (batch - 1) * stride + (rows - 1) * ld + cols; }
};

/**
 * The reference: `C_b = alpha op(A_b) op(B_b) + beta C_b` in double, row-major, over every batch b; elements of
 * C outside the `m x n` blocks keep their value. `scale` receives, per element of a block, the sum of the magnitudes
 * of its terms (the scale of the rounding error of any summation order), and -1 outside the blocks.
 */
template <class TIn, class TOut>
std::vector<double> reference(Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, double alpha,
                              const std::vector<TIn>& a, const Shape& sa, const std::vector<TIn>& b, const Shape& sb,
                              double beta, const std::vector<TOut>& c, const Shape& sc, std::vector<double>* scale) {
  std::vector<double> out(c.size());
  for (std::size_t i = 0; i < c.size(); ++i) out[i] = double(c[i]);
  scale->assign(c.size(), -1.0);
  for (std::size_t l = 0; l < sc.batch; ++l)
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        double s = 0, mag = 0;
        for (std::size_t p = 0; p < k; ++p) {
          const double x = double(a[l * sa.stride + (ta == Trans::no ? i * sa.ld + p : p * sa.ld + i)]);
          const double y = double(b[l * sb.stride + (tb == Trans::no ? p * sb.ld + j : j * sb.ld + p)]);
          s += x * y;
          mag += std::abs(x * y);
        }
        const std::size_t at = l * sc.stride + i * sc.ld + j;
        const double cv = beta != 0 ? beta * double(c[at]) : 0.0;
        out[at] = alpha * s + cv;
        (*scale)[at] = std::abs(alpha) * mag + std::abs(cv);
      }
  return out;
}

/** Relative error allowed: the accumulation's (k terms in float, or double) plus the rounding of C's type. */
template <class TIn, class TOut>
double tolerance() {
  if constexpr (std::is_same_v<TIn, double>) return 1e-13;
  if constexpr (std::is_same_v<TOut, bf16>) return 1.0 / 128;  // one bf16 ulp (8 significant bits)
  if constexpr (std::is_same_v<TOut, f16>) return 1.0 / 1024;  // one f16 ulp (11 significant bits)
  return 1e-5;
}

/** Inside the blocks (scale >= 0) within `rel` of the terms' scale; outside them unchanged, bit for bit. */
template <class TOut>
void require_matches(const std::vector<TOut>& got, const std::vector<double>& want, const std::vector<double>& scale,
                     double rel) {
  REQUIRE(got.size() == want.size());
  std::size_t inside = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << double(got[i]) << ", want " << want[i]);
    if (scale[i] < 0) {
      REQUIRE((double(got[i]) == want[i] || (std::isnan(want[i]) && std::isnan(double(got[i])))));
      continue;
    }
    ++inside;
    REQUIRE(std::abs(double(got[i]) - want[i]) <= rel * (scale[i] + std::abs(want[i])) + 1e-30);
  }
  REQUIRE(inside > 0);
}

/** Operand shapes for row-major `m x k` by `k x n` with every leading dimension padded by `pad`. */
struct Problem {
  Shape a, b, c;
};
Problem problem(Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, std::size_t pad,
                std::size_t batch = 1) {
  Shape a{ta == Trans::no ? m : k, ta == Trans::no ? k : m, 0}, b{tb == Trans::no ? k : n, tb == Trans::no ? n : k, 0},
      c{m, n, n + pad};
  a.ld = a.cols + pad + 1;
  b.ld = b.cols + pad + 2;
  for (Shape* s : {&a, &b, &c}) {
    s->batch = batch;
    s->stride = s->rows * s->ld + 3;  // batches apart by more than one block, as attention's heads are
  }
  return {a, b, c};
}

template <class TIn, class TOut>
void check_gemm(std::size_t batch) {
  const std::size_t m = 5, n = 7, k = 9;
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes})
      for (double beta : {0.0, 0.5}) {
        INFO("ta = " << (ta == Trans::yes) << ", tb = " << (tb == Trans::yes) << ", beta = " << beta
                     << ", batch = " << batch);
        const Problem p = problem(ta, tb, m, n, k, 2, batch);
        const auto a = values<TIn>(p.a.elements(), 1), b = values<TIn>(p.b.elements(), 2);
        auto c = values<TOut>(p.c.elements(), 3);
        DeviceArray<TIn> da(a), db(b);
        DeviceArray<TOut> dc(p.c.elements());
        if (beta != 0)
          dc.upload(c);
        else  // with beta zero C is never read: it stays NaN (fresh device memory), as outside the blocks
          for (std::size_t i = 0; i < c.size(); ++i) c[i] = TOut(NAN);
        const gpu::gemm_scalar_t<TIn> alpha = 1.25f, be = gpu::gemm_scalar_t<TIn>(beta);
        if (batch == 1)
          gpu::gemm<TIn, TOut>(ta, tb, m, n, k, alpha, da, p.a.ld, db, p.b.ld, be, dc, p.c.ld);
        else
          gpu::gemm_strided_batched<TIn, TOut>(ta, tb, m, n, k, alpha, da, p.a.ld, std::int64_t(p.a.stride), db, p.b.ld,
                                               std::int64_t(p.b.stride), be, dc, p.c.ld, std::int64_t(p.c.stride),
                                               batch);
        std::vector<double> scale;
        const auto want = reference(ta, tb, m, n, k, 1.25, a, p.a, b, p.b, beta, c, p.c, &scale);
        require_matches(dc.host(), want, scale, tolerance<TIn, TOut>());
      }
}

TEST_CASE("cuda gemm on the emulation: gpu::gemm equals naive loops for every transpose pair and type") {
  check_gemm<float, float>(1);
  check_gemm<double, double>(1);
  check_gemm<bf16, bf16>(1);
  check_gemm<f16, f16>(1);
  check_gemm<bf16, float>(1);
  check_gemm<f16, float>(1);
}

TEST_CASE("cuda gemm on the emulation: gpu::gemm_strided_batched equals naive loops per batch") {
  check_gemm<float, float>(3);
  check_gemm<bf16, float>(3);
  check_gemm<bf16, bf16>(2);
  check_gemm<double, double>(2);
}

template <class TIn, class TOut>
void check_gemm_lt(gpu::Epilogue epilogue, bool with_aux) {
  const std::size_t m = 6, n = 8, k = 7;
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes}) {
      INFO("epilogue " << int(epilogue) << ", aux " << with_aux << ", ta = " << (ta == Trans::yes)
                       << ", tb = " << (tb == Trans::yes));
      const Problem p = problem(ta, tb, m, n, k, 3);
      const auto a = values<TIn>(p.a.elements(), 4), b = values<TIn>(p.b.elements(), 5);
      const auto c = values<TOut>(p.c.elements(), 6), bias = values<TOut>(n, 7);
      const float alpha = 0.75f, beta = epilogue == gpu::Epilogue::none ? 0.5f : 0.0f;
      DeviceArray<TIn> da(a), db(b);
      DeviceArray<TOut> dc(c), dbias(bias), daux(m * 16);
      const bool use_bias = epilogue != gpu::Epilogue::none;
      gpu::gemm_lt<TIn, TOut>(ta, tb, m, n, k, alpha, da, p.a.ld, db, p.b.ld, beta, dc, p.c.ld, epilogue,
                              use_bias ? dbias.get() : nullptr, with_aux ? daux.get() : nullptr, with_aux ? 16 : 0);
      std::vector<double> scale;
      auto want = reference(ta, tb, m, n, k, alpha, a, p.a, b, p.b, beta, c, p.c, &scale);
      std::vector<double> pre(m * 16, NAN);
      for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < n; ++j) {
          double& v = want[i * p.c.ld + j];
          if (use_bias) {
            v += double(bias[j]);
            scale[i * p.c.ld + j] += std::abs(double(bias[j]));
          }
          pre[i * 16 + j] = v;
          if (epilogue == gpu::Epilogue::gelu_bias)
            v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
        }
      // Outside the m x n block C is untouched; in it, the epilogue's rounding adds one more ulp of C's type.
      require_matches(dc.host(), want, scale, 2 * tolerance<TIn, TOut>());
      if (with_aux) {
        const auto got = daux.host();
        for (std::size_t i = 0; i < m; ++i)
          for (std::size_t j = 0; j < n; ++j) {
            INFO("aux[" << i << "][" << j << "]");
            REQUIRE(std::abs(double(got[i * 16 + j]) - pre[i * 16 + j]) <=
                    2 * tolerance<TIn, TOut>() * (1 + std::abs(pre[i * 16 + j])));
          }
      }
    }
}

TEST_CASE("cuda gemm on the emulation: gpu::gemm_lt and its bias and GeLU epilogues equal naive loops") {
  for (bool aux : {false, true}) {
    if (!aux) {
      check_gemm_lt<float, float>(gpu::Epilogue::none, false);
      check_gemm_lt<bf16, bf16>(gpu::Epilogue::none, false);
      check_gemm_lt<bf16, float>(gpu::Epilogue::bias, false);
      check_gemm_lt<float, float>(gpu::Epilogue::bias, false);
    }
    check_gemm_lt<float, float>(gpu::Epilogue::gelu_bias, aux);
    check_gemm_lt<bf16, bf16>(gpu::Epilogue::gelu_bias, aux);
    check_gemm_lt<f16, f16>(gpu::Epilogue::gelu_bias, aux);
  }
}

/** The message of the emulation_error `f` throws (fails the test when it throws nothing). */
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const emulation_error& e) {
    return e.what();
  }
  FAIL("no emulation_error thrown");
  return {};
}

TEST_CASE("cuda gemm on the emulation: cuBLAS calls cuBLAS would refuse are errors that name the call") {
  DeviceArray<float> a(64), b(64), c(64);
  DeviceArray<bf16> h(64);
  cublasHandle_t handle = gpu::this_thread().blas();
  const float one = 1, zero = 0;
  using Catch::Matchers::Contains;
  // A leading dimension below the rows it must span.
  REQUIRE_THAT(error_of([&] {
                 (void)cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, a, CUDA_R_32F, 4, b, CUDA_R_32F, 4,
                                    &zero, c, CUDA_R_32F, 3, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
               }),
               Contains("cublasGemmEx") && Contains("ldc=3"));
  REQUIRE_THAT(error_of([&] {
                 (void)cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, 4, 4, 5, &one, a, CUDA_R_32F, 4, b, CUDA_R_32F, 5,
                                    &zero, c, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
               }),
               Contains("lda=4"));
  // Types cuBLAS has no GEMM for: bf16 in, f16 out; fp32 in with fp64 compute.
  REQUIRE_THAT(error_of([&] {
                 (void)cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, h, CUDA_R_16BF, 4, h, CUDA_R_16BF,
                                    4, &zero, h, CUDA_R_16F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
               }),
               Contains("unsupported combination"));
  REQUIRE_THROWS_AS(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, a, CUDA_R_32F, 4, b, CUDA_R_32F, 4,
                                 &zero, c, CUDA_R_32F, 4, CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT),
                    emulation_error);
  // A host pointer, and operands whose extent (ld, stride, batch) leaves the allocation.
  std::vector<float> host(64);
  REQUIRE_THAT(error_of([&] {
                 (void)cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, host.data(), CUDA_R_32F, 4, b,
                                    CUDA_R_32F, 4, &zero, c, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
               }),
               Contains("not device memory"));
  REQUIRE_THAT(error_of([&] {
                 gpu::gemm<float>(Trans::no, Trans::no, 4, 4, 4, 1.0f, a.get(), 21, b.get(), 4, 0.0f, c.get(), 4);
               }),
               Contains("cublasGemmEx") && Contains("beyond its device allocation"));
  REQUIRE_THAT(error_of([&] {
                 gpu::gemm_strided_batched<float>(Trans::no, Trans::no, 4, 4, 4, 1.0f, a.get(), 4, 16, b.get(), 4, 16,
                                                  0.0f, c.get(), 4, 16, 5);
               }),
               Contains("cublasGemmStridedBatchedEx") && Contains("batch 5"));
  REQUIRE_THAT(error_of([&] {
                 gpu::gemm_lt<float>(Trans::no, Trans::no, 4, 4, 4, 1.0f, a.get(), 4, b.get(), 4, 0.0f, c.get(), 21);
               }),
               Contains("cublasLtMatmul") && Contains("beyond its device allocation"));
}

}  // namespace mpar::gemm_emulation_test
