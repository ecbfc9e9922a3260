// The buffer operations (zero, fill, copy, convert) and the strided-batched GEMM of the backend concept,
// on HostBackend and through CountingBackend, against naive loops and hand-worked roundings.
#include <catch2/catch.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

#include <mpar/backend/host/host_backend.hpp>
#include <mpar/core.hpp>
#include <mpar/observe/counting_backend.hpp>

using namespace mpar;

namespace {
/** Row-major C = alpha op(A) op(B) + beta C, summed in double: the reference for one batch entry. */
template <class T>
void naive_gemm_into_float(Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const T* a,
                           std::size_t lda, const T* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::size_t p = 0; p < k; ++p)
        s += double(float(ta == Trans::no ? a[i * lda + p] : a[p * lda + i])) *
             double(float(tb == Trans::no ? b[p * ldb + j] : b[j * ldb + p]));
      c[i * ldc + j] = float(alpha * s + beta * double(c[i * ldc + j]));
    }
}
float value(std::size_t i) { return float(int(i * 37 % 23) - 11) / 8.0f; }
}  // namespace

TEMPLATE_TEST_CASE("backend buffer ops: zero, fill and copy write exactly their n elements", "[backend][buffer_ops]",
                   HostBackend, observe::CountingBackend<HostBackend>) {
  std::vector<float> x(10, 7.0f), y(10, -1.0f);
  TestType::run(ops::zero<float>{.n = std::size_t(4), .x = x.data() + 3});
  CHECK(x == std::vector<float>{7, 7, 7, 0, 0, 0, 0, 7, 7, 7});
  TestType::run(ops::fill<float>{.n = std::size_t(3), .value = 2.5f, .x = x.data() + 1});
  CHECK(x == std::vector<float>{7, 2.5f, 2.5f, 2.5f, 0, 0, 0, 7, 7, 7});
  TestType::run(ops::copy<float>{.n = std::size_t(5), .src = x.data(), .dst = y.data() + 2});
  CHECK(y == std::vector<float>{-1, -1, 7, 2.5f, 2.5f, 2.5f, 0, -1, -1, -1});
  std::vector<std::int32_t> ids(4, 9);
  TestType::run(ops::zero<std::int32_t>{.n = std::size_t(4), .x = ids.data()});
  CHECK(ids == std::vector<std::int32_t>(4, 0));
}

TEMPLATE_TEST_CASE("backend buffer ops: convert rounds fp32 to bf16 and f16 to nearest even, back exactly",
                   "[backend][buffer_ops]", HostBackend, observe::CountingBackend<HostBackend>) {
  // 1 + 2^-8 is halfway between the bf16 neighbours 1 and 1 + 2^-7: ties to even gives 1.
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): gives 1 + 2^-6.
  const std::vector<float> src{1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -2.0f, 0x1p-20f};
  std::vector<bf16> h(4);
  TestType::run(ops::convert<float, bf16>{.n = src.size(), .src = src.data(), .dst = h.data()});
  CHECK(h[0].bits == 0x3f80);
  CHECK(h[1].bits == 0x3f82);
  CHECK(h[2].bits == 0xc000);
  CHECK(h[3].bits == std::uint16_t(std::bit_cast<std::uint32_t>(0x1p-20f) >> 16));
  std::vector<float> back(4, 0.0f);
  TestType::run(ops::convert<bf16, float>{.n = h.size(), .src = h.data(), .dst = back.data()});
  CHECK(back == std::vector<float>{1.0f, 1.0f + 0x1p-6f, -2.0f, 0x1p-20f});
  // f16: 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even gives 1.
  const std::vector<float> s16{1.0f + 0x1p-11f, 65504.0f};
  std::vector<f16> g(2);
  TestType::run(ops::convert<float, f16>{.n = s16.size(), .src = s16.data(), .dst = g.data()});
  std::vector<float> g_back(2);
  TestType::run(ops::convert<f16, float>{.n = g.size(), .src = g.data(), .dst = g_back.data()});
  CHECK(g_back == std::vector<float>{1.0f, 65504.0f});
}

TEMPLATE_TEST_CASE(
    "backend gemm_strided_batched: every batch entry equals a naive GEMM, strides and transposes honoured",
    "[backend][buffer_ops]", HostBackend, observe::CountingBackend<HostBackend>) {
  // Attention's shape: per entry an [s, d] block of a wider matrix (ld > d), entries d columns apart.
  const std::size_t batch = 3, m = 5, n = 4, k = 6, pad = 2;
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes})
      for (float beta : {0.0f, 0.5f}) {
        const std::size_t a_rows = ta == Trans::no ? m : k, a_cols = ta == Trans::no ? k : m;
        const std::size_t b_rows = tb == Trans::no ? k : n, b_cols = tb == Trans::no ? n : k;
        const std::size_t lda = batch * a_cols + pad, ldb = b_cols + pad, ldc = n + 1;
        const std::size_t sa = a_cols, sb = b_rows * ldb, sc = m * ldc;  // A interleaved by columns, B and C stacked
        std::vector<float> a(a_rows * lda), b(batch * sb), c(batch * sc), ref;
        for (std::size_t i = 0; i < a.size(); ++i) a[i] = value(i);
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = value(i + 5);
        for (std::size_t i = 0; i < c.size(); ++i) c[i] = value(i + 11);
        ref = c;
        for (std::size_t e = 0; e < batch; ++e)
          naive_gemm_into_float<float>(ta, tb, m, n, k, 0.75f, a.data() + e * sa, lda, b.data() + e * sb, ldb, beta,
                                       ref.data() + e * sc, ldc);
        TestType::run(ops::gemm_strided_batched<float>{.ta = ta,
                                                       .tb = tb,
                                                       .m = m,
                                                       .n = n,
                                                       .k = k,
                                                       .alpha = 0.75f,
                                                       .a = a.data(),
                                                       .lda = lda,
                                                       .stride_a = BatchStrides{0, sa},
                                                       .b = b.data(),
                                                       .ldb = ldb,
                                                       .stride_b = BatchStrides{0, sb},
                                                       .beta = beta,
                                                       .c = c.data(),
                                                       .ldc = ldc,
                                                       .stride_c = BatchStrides{0, sc},
                                                       .batch = BatchExtents{1, batch}});
        for (std::size_t i = 0; i < c.size(); ++i) REQUIRE(c[i] == Approx(ref[i]).margin(1e-5));
      }
  // bf16 A and B into an fp32 C (the mixed-precision form).
  std::vector<bf16> a(batch * m * k), b(batch * k * n);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = bf16(value(i));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = bf16(value(i + 3));
  std::vector<float> c(batch * m * n, 1.0f), ref = c;
  for (std::size_t e = 0; e < batch; ++e)
    naive_gemm_into_float<bf16>(Trans::no, Trans::no, m, n, k, 1.0f, a.data() + e * m * k, k, b.data() + e * k * n, n,
                                1.0f, ref.data() + e * m * n, n);
  TestType::run(ops::gemm_strided_batched<bf16, float>{.ta = Trans::no,
                                                       .tb = Trans::no,
                                                       .m = m,
                                                       .n = n,
                                                       .k = k,
                                                       .alpha = 1.0f,
                                                       .a = a.data(),
                                                       .lda = k,
                                                       .stride_a = BatchStrides{0, m * k},
                                                       .b = b.data(),
                                                       .ldb = n,
                                                       .stride_b = BatchStrides{0, k * n},
                                                       .beta = 1.0f,
                                                       .c = c.data(),
                                                       .ldc = n,
                                                       .stride_c = BatchStrides{0, m * n},
                                                       .batch = BatchExtents{1, batch}});
  for (std::size_t i = 0; i < c.size(); ++i) REQUIRE(c[i] == Approx(ref[i]).margin(1e-5));
}

namespace {
/**
 * One two-level batched GEMM of `TIn` operands against a naive loop per entry, in attention's arrangement but
 * with odd sizes: A's entries interleaved by columns inside rows of a wider matrix (inner stride = its stored
 * row length, outer stride = a block of rows plus a gap), B's stacked with gaps, C's interleaved like A's, so
 * no stride is the packed one. Elements outside every entry of C must stay untouched.
 */
template <class B, class TIn>
void check_two_level_batch(Trans ta, Trans tb, float alpha, float beta, BatchExtents batch) {
  const std::size_t m = 5, n = 3, k = 7, pad = 3;
  const std::size_t a_rows = ta == Trans::no ? m : k, a_cols = ta == Trans::no ? k : m;
  const std::size_t b_rows = tb == Trans::no ? k : n, b_cols = tb == Trans::no ? n : k;
  const std::size_t lda = batch.inner * a_cols + pad, ldb = b_cols + 1, ldc = batch.inner * n + 2;
  const BatchStrides sa{a_rows * lda + 4, a_cols}, sb{batch.inner * b_rows * ldb + 5, b_rows * ldb}, sc{m * ldc + 1, n};
  std::vector<TIn> a(batch.outer * sa.outer), b(batch.outer * sb.outer);
  std::vector<float> c(batch.outer * sc.outer), ref;
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = TIn(value(i));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = TIn(value(i + 5));
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = value(i + 11);
  ref = c;
  for (std::size_t i = 0; i < batch.outer; ++i)
    for (std::size_t j = 0; j < batch.inner; ++j)
      naive_gemm_into_float<TIn>(ta, tb, m, n, k, alpha, a.data() + i * sa.outer + j * sa.inner, lda,
                                 b.data() + i * sb.outer + j * sb.inner, ldb, beta,
                                 ref.data() + i * sc.outer + j * sc.inner, ldc);
  B::run(ops::gemm_strided_batched<TIn, float>{.ta = ta,
                                               .tb = tb,
                                               .m = m,
                                               .n = n,
                                               .k = k,
                                               .alpha = alpha,
                                               .a = a.data(),
                                               .lda = lda,
                                               .stride_a = sa,
                                               .b = b.data(),
                                               .ldb = ldb,
                                               .stride_b = sb,
                                               .beta = beta,
                                               .c = c.data(),
                                               .ldc = ldc,
                                               .stride_c = sc,
                                               .batch = batch});
  INFO("ta=" << (ta == Trans::yes) << " tb=" << (tb == Trans::yes) << " alpha=" << alpha << " beta=" << beta
             << " batch=" << batch.outer << "x" << batch.inner);
  for (std::size_t i = 0; i < c.size(); ++i) REQUIRE(c[i] == Approx(ref[i]).margin(1e-5));
}
}  // namespace

TEMPLATE_TEST_CASE(
    "backend gemm_strided_batched, two-level batch: every (outer, inner) entry equals a naive GEMM, fp32 and 16-bit",
    "[backend][buffer_ops][batched]", HostBackend, observe::CountingBackend<HostBackend>) {
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes})
      for (float beta : {0.0f, 0.5f}) {
        check_two_level_batch<TestType, float>(ta, tb, 0.75f, beta, {3, 2});
        check_two_level_batch<TestType, bf16>(ta, tb, 0.75f, beta, {2, 3});
        check_two_level_batch<TestType, f16>(ta, tb, 1.0f, beta, {2, 2});
      }
  // Degenerate levels: one sequence, one head, a single entry.
  for (BatchExtents e : {BatchExtents{1, 4}, BatchExtents{4, 1}, BatchExtents{1, 1}}) {
    check_two_level_batch<TestType, float>(Trans::no, Trans::yes, 0.5f, 0.0f, e);
    check_two_level_batch<TestType, bf16>(Trans::yes, Trans::no, 1.0f, 1.0f, e);
  }
}

TEST_CASE("backend gemm_strided_batched, two-level batch: one launch per call; empty batches and k = 0",
          "[backend][buffer_ops][batched]") {
  using Cb = observe::CountingBackend<HostBackend>;
  const auto before = Cb::counts();
  check_two_level_batch<Cb, float>(Trans::no, Trans::no, 1.0f, 0.0f, {4, 3});
  CHECK((Cb::counts() - before)[observe::Op::gemm_strided_batched] == 1);
  // An empty level touches nothing; k = 0 makes every entry beta C.
  std::vector<float> c(12, 2.0f);
  HostBackend::run(ops::gemm_strided_batched<float>{.ta = Trans::no,
                                                    .tb = Trans::no,
                                                    .m = 2,
                                                    .n = 2,
                                                    .k = 3,
                                                    .alpha = 1.0f,
                                                    .a = nullptr,
                                                    .lda = 3,
                                                    .stride_a = {0, 0},
                                                    .b = nullptr,
                                                    .ldb = 2,
                                                    .stride_b = {0, 0},
                                                    .beta = 0.0f,
                                                    .c = c.data(),
                                                    .ldc = 2,
                                                    .stride_c = {6, 4},
                                                    .batch = BatchExtents{0, 3}});
  CHECK(c == std::vector<float>(12, 2.0f));
  HostBackend::run(ops::gemm_strided_batched<float>{.ta = Trans::no,
                                                    .tb = Trans::no,
                                                    .m = 2,
                                                    .n = 2,
                                                    .k = 0,
                                                    .alpha = 1.0f,
                                                    .a = nullptr,
                                                    .lda = 1,
                                                    .stride_a = {0, 0},
                                                    .b = nullptr,
                                                    .ldb = 2,
                                                    .stride_b = {0, 0},
                                                    .beta = 0.5f,
                                                    .c = c.data(),
                                                    .ldc = 2,
                                                    .stride_c = {6, 4},
                                                    .batch = BatchExtents{2, 1}});
  CHECK(c == std::vector<float>{1, 1, 1, 1, 2, 2, 1, 1, 1, 1, 2, 2});
  // Too small a leading dimension is named, batched or not.
  std::vector<float> a(64), b(64);
  CHECK_THROWS_WITH(HostBackend::run(ops::gemm_strided_batched<float>{.ta = Trans::no,
                                                                      .tb = Trans::no,
                                                                      .m = 3,
                                                                      .n = 4,
                                                                      .k = 4,
                                                                      .alpha = 1.0f,
                                                                      .a = a.data(),
                                                                      .lda = 3,
                                                                      .stride_a = {16, 4},
                                                                      .b = b.data(),
                                                                      .ldb = 4,
                                                                      .stride_b = {16, 4},
                                                                      .beta = 0.0f,
                                                                      .c = c.data(),
                                                                      .ldc = 4,
                                                                      .stride_c = {16, 4},
                                                                      .batch = BatchExtents{2, 2}}),
                    Catch::Contains("lda=3") && Catch::Contains("k=4"));
}

TEST_CASE("HostBackend::init_rank keeps freed memory mapped: a reallocated activation faults no pages again",
          "[backend][memory]") {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // Under AddressSanitizer or ThreadSanitizer malloc is the sanitizer's allocator, which takes no mallopt
  // settings and keeps its own shadow memory: the page counts below describe glibc's allocator, which the
  // README's test suite (no sanitizer) checks.
  (void)host::retain_freed_memory();
  WARN("page-fault check skipped: malloc is the sanitizer's allocator in this build");
#elif defined(__GLIBC__)
  // On a rank thread, as in training; page faults counted for this thread only, asserted on the main thread.
  long first = -1, again = -1;
  std::thread([&] {
    HostBackend::init_rank();
    auto faults = [] {
      rusage u{};
      getrusage(RUSAGE_THREAD, &u);
      return long(u.ru_minflt);
    };
    const std::size_t n = std::size_t(4) << 20;  // 16 MiB, an activation of the largest size kept mapped
    long f0 = faults();
    {
      Buffer<float> x = uninitialized_buffer<float>(n);
      std::fill(x.begin(), x.end(), 1.0f);
    }
    first = faults() - f0;  // fresh memory faults its pages in (unless an earlier rank of this process left it)
    f0 = faults();
    for (int step = 0; step < 3; ++step) {
      Buffer<float> x = uninitialized_buffer<float>(n);
      std::fill(x.begin(), x.end(), float(step));
    }
    again = faults() - f0;
  }).join();
  // Returned to the kernel on free, each reallocation would fault all its 4 KiB pages in again (3 x 4,096).
  const long pages = long((std::size_t(4) << 20) * sizeof(float) / 4096);
  INFO("page faults: first allocation " << first << ", three reallocations " << again);
  CHECK(again <= first);
  CHECK(again * 16 < 3 * pages);
  CHECK(host::retain_freed_memory());
#else
  CHECK_FALSE(host::retain_freed_memory());
#endif
}

TEST_CASE("CountingBackend counts one launch per call, by kind, on the calling thread", "[backend][buffer_ops]") {
  using Cb = observe::CountingBackend<HostBackend>;
  const auto before = Cb::counts();
  std::vector<float> x(8, 1.0f), y(8);
  Cb::run(ops::zero<float>{.n = x.size(), .x = x.data()});
  Cb::run(ops::copy<float>{.n = x.size(), .src = x.data(), .dst = y.data()});
  Cb::run(ops::copy<float>{.n = x.size(), .src = y.data(), .dst = x.data()});
  Cb::run(ops::gemm<float>{.ta = Trans::no,
                           .tb = Trans::no,
                           .m = 2,
                           .n = 2,
                           .k = 2,
                           .alpha = 1.0f,
                           .a = x.data(),
                           .lda = 2,
                           .b = x.data(),
                           .ldb = 2,
                           .beta = 0.0f,
                           .c = y.data(),
                           .ldc = 2});
  Cb::synchronize();
  const auto d = Cb::counts() - before;
  CHECK(d[observe::Op::zero] == 1);
  CHECK(d[observe::Op::copy] == 2);
  CHECK(d[observe::Op::gemm] == 1);
  CHECK(d.total_launches() == 4);
  CHECK(d.synchronize_calls == 1);
  CHECK(d.host_syncs() ==
        5);  // HostBackend returns when done: every launch is a synchronisation, plus the explicit one
  CHECK(d.by_kind() == "gemm=1 zero=1 copy=2");
  // Another thread's work is its own.
  std::thread([] { Cb::run(ops::zero<float>{.n = std::size_t(0), .x = static_cast<float*>(nullptr)}); }).join();
  CHECK((Cb::counts() - before).total_launches() == 4);
  // Host bytes: a value-initialised tensor is written by the host, an uninitialised one is not.
  const auto h0 = Cb::counts().host_bytes;
  Tensor<float, 2> t({4, 8});
  CHECK(Cb::counts().host_bytes - h0 == 4 * 8 * sizeof(float));
  Tensor<float, 2> u({4, 8}, uninitialized);
  CHECK(Cb::counts().host_bytes - h0 == 4 * 8 * sizeof(float));
  Tensor<float, 2> copy = t;  // read and written
  CHECK(Cb::counts().host_bytes - h0 == 3 * 4 * 8 * sizeof(float));
  Tensor<float, 2> moved = std::move(copy);
  CHECK(Cb::counts().host_bytes - h0 == 3 * 4 * 8 * sizeof(float));
}

TEST_CASE("backend vocab_parallel_loss: the mean of log(sumexp) + max - target logit, into rank memory",
          "[backend][buffer_ops]") {
  const std::vector<float> mx{1.0f, -2.0f, 0.5f}, se{1.0f, 2.0f, 3.0f}, tl{0.25f, -3.0f, 1.5f};
  // By hand: (0 + 1 - 0.25) + (ln 2 - 2 + 3) + (ln 3 + 0.5 - 1.5), over 3 rows.
  const double want = (0.75 + (std::log(2.0) + 1.0) + (std::log(3.0) - 1.0)) / 3.0;
  float loss = -1.0f;
  HostBackend::run(ops::vocab_parallel_loss{mx.size(), mx.data(), se.data(), tl.data(), &loss});
  CHECK(loss == Approx(want).epsilon(1e-6));
  using Cb = observe::CountingBackend<HostBackend>;
  const auto before = Cb::counts();
  float again = 0.0f;
  Cb::run(ops::vocab_parallel_loss{mx.size(), mx.data(), se.data(), tl.data(), &again});
  CHECK(again == loss);
  CHECK((Cb::counts() - before)[observe::Op::vocab_parallel_loss] == 1);
}

namespace {
/** GeLU (tanh form) in double: the hand formula. */
double gelu_by_hand(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

/**
 * One `gemm_bias_gelu` of `TIn` operands against (1) a naive loop in double and (2) the unfused composition
 * `gemm`, `bias_add_forward`, `gelu_forward` (what CBLAS and portable builds run, and the MLP's layer chain).
 * Tolerances, relative to s = Σ_p |a_ip w_pj| + |b_j| (the size of the sum being rounded): against the naive
 * loop 1e-5 s + 1e-6 (fp32 summation over k, GeLU's float kernel); against the composition 4e-7 s + 1e-7
 * (oneDNN may add the bias to the accumulator in another order than after the product: a few ulps of s).
 */
template <class B, class TIn>
void check_gemm_bias_gelu(std::size_t m, std::size_t n, std::size_t k, std::size_t pad) {
  const std::size_t lda = k + pad, ldw = n + pad;
  std::vector<TIn> a(m * lda), w(k * ldw);
  std::vector<float> bias(n);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = TIn(value(i) * 0.25f);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = TIn(value(i + 7) * 0.2f);
  for (std::size_t j = 0; j < n; ++j) bias[j] = value(j + 3) * 0.5f;
  std::vector<float> pre(m * n, -7.0f), y(m * n, -7.0f), pre_unfused(m * n), y_unfused(m * n);
  B::run(ops::gemm_bias_gelu<TIn>{.m = m,
                                  .n = n,
                                  .k = k,
                                  .a = static_cast<const TIn*>(a.data()),
                                  .lda = lda,
                                  .w = static_cast<const TIn*>(w.data()),
                                  .ldw = ldw,
                                  .bias = static_cast<const float*>(bias.data()),
                                  .pre = pre.data(),
                                  .y = y.data()});
  B::run(ops::gemm<TIn, float>{.ta = Trans::no,
                               .tb = Trans::no,
                               .m = m,
                               .n = n,
                               .k = k,
                               .alpha = 1.0f,
                               .a = a.data(),
                               .lda = lda,
                               .b = w.data(),
                               .ldb = ldw,
                               .beta = 0.0f,
                               .c = pre_unfused.data(),
                               .ldc = n});
  B::run(ops::bias_add_forward{
      .rows = m, .cols = n, .bias = static_cast<const float*>(bias.data()), .y = pre_unfused.data()});
  B::run(ops::gelu_forward{.n = m * n, .x = static_cast<const float*>(pre_unfused.data()), .y = y_unfused.data()});
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double ref = bias[j], s = std::fabs(double(bias[j]));
      for (std::size_t p = 0; p < k; ++p) {
        const double prod = double(float(a[i * lda + p])) * double(float(w[p * ldw + j]));
        ref += prod;
        s += std::fabs(prod);
      }
      const std::size_t e = i * n + j;
      INFO("m=" << m << " n=" << n << " k=" << k << " element (" << i << ", " << j << "), s=" << s);
      REQUIRE(std::fabs(pre[e] - ref) <= 1e-5 * s + 1e-6);
      REQUIRE(std::fabs(y[e] - gelu_by_hand(ref)) <= 1e-5 * s + 1e-6);
      REQUIRE(std::fabs(pre[e] - pre_unfused[e]) <= 4e-7 * s + 1e-7);
      REQUIRE(std::fabs(y[e] - y_unfused[e]) <= 4e-7 * s + 1e-7);
    }
}
}  // namespace

TEMPLATE_TEST_CASE("backend gemm_bias_gelu: the pre-activation and GeLU match a naive loop and the unfused composition",
                   "[backend][buffer_ops][fused]", HostBackend, observe::CountingBackend<HostBackend>) {
  INFO("host GEMM: " << host_gemm_library << (host::gemm_bias_fused ? " (bias inside the GEMM)" : " (unfused)"));
  for (auto [m, n, k, pad] : {std::array<std::size_t, 4>{37, 70, 129, 0}, {1, 33, 17, 3}, {64, 256, 64, 0}}) {
    check_gemm_bias_gelu<TestType, float>(m, n, k, pad);
    check_gemm_bias_gelu<TestType, bf16>(m, n, k, pad);
  }
  if constexpr (!std::is_same_v<TestType, HostBackend>) {
    const auto before = TestType::counts();
    std::vector<float> a(4, 1.0f), b(2, 0.5f), pre(4), y(4);
    TestType::run(ops::gemm_bias_gelu<float>{.m = std::size_t(2),
                                             .n = std::size_t(2),
                                             .k = std::size_t(2),
                                             .a = static_cast<const float*>(a.data()),
                                             .lda = std::size_t(2),
                                             .w = static_cast<const float*>(a.data()),
                                             .ldw = std::size_t(2),
                                             .bias = static_cast<const float*>(b.data()),
                                             .pre = pre.data(),
                                             .y = y.data()});
    const auto d = TestType::counts() - before;
    CHECK(d[observe::Op::gemm_bias_gelu] == 1);
    CHECK(d.gemms() == 1);
    CHECK(pre == std::vector<float>(4, 2.5f));
  }
}

TEST_CASE("backend gemm_bias_gelu: a missing bias is refused, naming the sizes", "[backend][buffer_ops][fused]") {
  std::vector<float> a(6, 1.0f), pre(4), y(4);
  CHECK_THROWS_WITH(HostBackend::run(ops::gemm_bias_gelu<float>{.m = std::size_t(2),
                                                                .n = std::size_t(2),
                                                                .k = std::size_t(3),
                                                                .a = static_cast<const float*>(a.data()),
                                                                .lda = std::size_t(3),
                                                                .w = static_cast<const float*>(a.data()),
                                                                .ldw = std::size_t(2),
                                                                .bias = static_cast<const float*>(nullptr),
                                                                .pre = pre.data(),
                                                                .y = y.data()}),
                    Catch::Contains("bias is required") && Catch::Contains("2x2x3"));
}
