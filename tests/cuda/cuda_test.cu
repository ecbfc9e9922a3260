// CUDA backend tests: cuBLAS/cuBLASLt GEMM and every device kernel against the host backend, and the
// device-memory and NCCL communicators with several thread-ranks. Catch2 is not thread-safe, so rank
// threads only compute; all checks run on the main thread.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_test_support.hpp"
#include "mpar/cuda.hpp"

using namespace mpar;
using namespace mpar::cuda_testing;

namespace {

/** Deterministic test data in [-scale, scale). */
template <class T>
std::vector<T> random_vec(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  return uniform_values<T>(n, CounterRng{seed, 7}, scale);
}
template <class T>
std::vector<float> to_float(const std::vector<T>& v) {
  std::vector<float> f(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) f[i] = float(v[i]);
  return f;
}
/** Largest |a - b| / (atol + rtol |b|); <= 1 means within tolerance. */
template <class A, class B>
double worst(const std::vector<A>& a, const std::vector<B>& b, double atol, double rtol) {
  REQUIRE(a.size() == b.size());
  double w = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = double(float(a[i])), y = double(float(b[i]));
    w = std::max(w, std::abs(x - y) / (atol + rtol * std::abs(y)));
  }
  return w;
}

/** Runs fn(rank) on n threads bound to `device` and rethrows the first exception. */
void run_ranks(int n, const std::function<void(int)>& fn, int device = 0) {
  std::vector<std::exception_ptr> errs(static_cast<std::size_t>(n));
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r)
    th.emplace_back([&, r] {
      try {
        CudaBackend::init_rank(device);
        fn(r);
        CudaBackend::synchronize();
      } catch (...) {
        errs[std::size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : th) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

}  // namespace

// ---- GEMM --------------------------------------------------------------------------------------

template <class TIn, class TOut>
void check_gemm(Trans ta, Trans tb, double rtol) {
  const std::size_t m = 67, n = 45, k = 129;
  const std::size_t lda = ta == Trans::no ? k + 3 : m + 3, ldb = tb == Trans::no ? n + 1 : k + 1, ldc = n + 5;
  const auto a = random_vec<TIn>((ta == Trans::no ? m : k) * lda, 1);
  const auto b = random_vec<TIn>((tb == Trans::no ? k : n) * ldb, 2);
  const auto c0 = random_vec<TOut>(m * ldc, 3);
  // Reference in fp32 on the inputs exactly as stored (bf16/f16 rounding already applied).
  std::vector<float> ref = to_float(c0);
  gemm<float>(ta, tb, m, n, k, 0.5f, to_float(a).data(), lda, to_float(b).data(), ldb, 0.25f, ref.data(), ldc);
  auto da = upload(a);
  auto db = upload(b);
  auto dc = upload(c0);
  gpu::gemm<TIn, TOut>(ta, tb, m, n, k, 0.5f, da.data(), lda, db.data(), ldb, 0.25f, dc.data(), ldc);
  auto got = download(dc);
  for (std::size_t i = 0; i < m; ++i)  // padding columns must be untouched
    for (std::size_t j = n; j < ldc; ++j) REQUIRE(got[i * ldc + j] == c0[i * ldc + j]);
  CHECK(worst(got, ref, 1e-4, rtol) <= 1.0);
}

TEST_CASE("gemm: fp32 matches the host GEMM for every transpose combination", "[cuda][gemm]") {
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes}) check_gemm<float, float>(ta, tb, 1e-4);
}
TEST_CASE("gemm: bf16 and f16 inputs accumulate in fp32 (fp32 and 16-bit outputs)", "[cuda][gemm]") {
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes}) {
      check_gemm<bf16, float>(ta, tb, 1e-4);  // products of 8-bit mantissas are exact in fp32
      check_gemm<f16, float>(ta, tb, 1e-4);
      check_gemm<bf16, bf16>(ta, tb, 1e-2);  // one bf16 rounding of the result: 2^-8 relative
      check_gemm<f16, f16>(ta, tb, 2e-3);
    }
}
TEST_CASE("gemm: CudaBackend satisfies the backend concept and forwards to cuBLAS", "[cuda][gemm]") {
  STATIC_REQUIRE(backend<CudaBackend>);
  const auto a = random_vec<double>(6, 4), b = random_vec<double>(6, 5);
  auto da = upload(a), db = upload(b);
  gpu::DeviceBuffer<double> dc(4, S());
  CudaBackend::run(ops::gemm<double>{.ta = Trans::no,
                                     .tb = Trans::no,
                                     .m = 2,
                                     .n = 2,
                                     .k = 3,
                                     .alpha = 1.0,
                                     .a = da.data(),
                                     .lda = 3,
                                     .b = db.data(),
                                     .ldb = 2,
                                     .beta = 0.0,
                                     .c = dc.data(),
                                     .ldc = 2});
  std::vector<double> ref(4);
  gemm<double>(Trans::no, Trans::no, 2, 2, 3, 1.0, a.data(), 3, b.data(), 2, 0.0, ref.data(), 2);
  CHECK(worst(download(dc), ref, 1e-12, 1e-12) <= 1.0);
}
TEST_CASE("gemm: strided batched GEMM equals one GEMM per batch entry", "[cuda][gemm]") {
  const std::size_t m = 32, n = 24, k = 16, batch = 3;
  const auto a = random_vec<float>(batch * m * k, 6), b = random_vec<float>(batch * n * k, 7);
  auto da = upload(a), db = upload(b);
  gpu::DeviceBuffer<float> dc(batch * m * n, S());
  gpu::gemm_strided_batched<float>(Trans::no, Trans::yes, m, n, k, 1.0f, da.data(), k, std::int64_t(m * k), db.data(),
                                   k, std::int64_t(n * k), 0.0f, dc.data(), n, std::int64_t(m * n), batch);
  std::vector<float> ref(batch * m * n);
  for (std::size_t i = 0; i < batch; ++i)
    gemm<float>(Trans::no, Trans::yes, m, n, k, 1.0f, a.data() + i * m * k, k, b.data() + i * n * k, k, 0.0f,
                ref.data() + i * m * n, n);
  CHECK(worst(download(dc), ref, 1e-4, 1e-4) <= 1.0);
}
TEST_CASE("CudaBackend buffer ops and batched GEMM match their host references", "[cuda][buffer_ops]") {
  const std::size_t n = 1000;
  const auto x = random_vec<float>(n, 21);
  auto dx = upload(x);
  gpu::DeviceBuffer<float> dy(n, S());
  CudaBackend::run(ops::fill<float>{.n = n, .value = 2.5f, .x = dy.data()});
  CHECK(download(dy) == std::vector<float>(n, 2.5f));
  CudaBackend::run(ops::zero<float>{.n = n / 2, .x = dy.data() + 1});
  std::vector<float> zf(n, 2.5f);
  std::fill(zf.begin() + 1, zf.begin() + 1 + n / 2, 0.0f);
  CHECK(download(dy) == zf);
  CudaBackend::run(ops::copy<float>{.n = n, .src = dx.data(), .dst = dy.data()});
  CHECK(download(dy) == x);
  gpu::DeviceBuffer<bf16> dh(n, S());
  CudaBackend::run(ops::convert<float, bf16>{.n = n, .src = dx.data(), .dst = dh.data()});
  std::vector<bf16> href(n);
  host::convert(n, x.data(), href.data());
  const auto h = download(dh);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(h[i].bits == href[i].bits);
  CudaBackend::run(ops::convert<bf16, float>{.n = n, .src = dh.data(), .dst = dy.data()});
  std::vector<float> back(n);
  host::convert(n, href.data(), back.data());
  CHECK(download(dy) == back);
  // Attention's shape: heads of width d inside rows of length ld, batched over the sequences.
  const std::size_t s = 16, d = 8, heads = 4, nb = 3, ld = 3 * heads * d;
  const auto qkv = random_vec<float>(nb * s * ld, 22);
  auto dq = upload(qkv);
  gpu::DeviceBuffer<float> dp(nb * heads * s * s, S());
  std::vector<float> ref(nb * heads * s * s);
  for (std::size_t hh = 0; hh < heads; ++hh) {
    CudaBackend::run(ops::gemm_strided_batched<float>{.ta = Trans::no,
                                                      .tb = Trans::yes,
                                                      .m = s,
                                                      .n = s,
                                                      .k = d,
                                                      .alpha = 0.5f,
                                                      .a = dq.data() + hh * d,
                                                      .lda = ld,
                                                      .stride_a = BatchStrides{0, s * ld},
                                                      .b = dq.data() + heads * d + hh * d,
                                                      .ldb = ld,
                                                      .stride_b = BatchStrides{0, s * ld},
                                                      .beta = 0.0f,
                                                      .c = dp.data() + hh * s * s,
                                                      .ldc = s,
                                                      .stride_c = BatchStrides{0, heads * s * s},
                                                      .batch = BatchExtents{1, nb}});
    host::gemm_strided_batched<float>(Trans::no, Trans::yes, s, s, d, 0.5f, qkv.data() + hh * d, ld, s * ld,
                                      qkv.data() + heads * d + hh * d, ld, s * ld, 0.0f, ref.data() + hh * s * s, s,
                                      heads * s * s, nb);
  }
  CHECK(worst(download(dp), ref, 1e-4, 1e-4) <= 1.0);
  // The loss reduction from cross-entropy statistics.
  const std::size_t rows = 300;
  auto mx = random_vec<float>(rows, 23), tl = random_vec<float>(rows, 24), se = random_vec<float>(rows, 25);
  for (auto& v : se) v = 1.5f + std::abs(v);
  auto dmx = upload(mx), dtl = upload(tl), dse = upload(se);
  gpu::DeviceBuffer<float> dl(1, S());
  CudaBackend::run(ops::vocab_parallel_loss{rows, dmx.data(), dse.data(), dtl.data(), dl.data()});
  float lref = 0;
  host::vocab_parallel_loss(rows, mx.data(), se.data(), tl.data(), &lref);
  CHECK(worst(download(dl), std::vector<float>{lref}, 1e-5, 1e-5) <= 1.0);
}
TEST_CASE("CudaBackend copy_2d (cudaMemcpy2DAsync) equals a naive element loop; bad leading dimensions throw",
          "[cuda][buffer_ops][copy_2d]") {
  // rows, cols, src_ld, dst_ld, offsets into the source and destination matrices: packed, strided with odd
  // sizes, a sub-block of a larger matrix, ring attention's K/V columns and back, no rows, no columns.
  struct Shape {
    std::size_t rows, cols, src_ld, dst_ld, src_offset, dst_offset;
  };
  for (const Shape& c :
       {Shape{7, 13, 13, 13, 0, 0}, Shape{7, 13, 17, 19, 0, 0}, Shape{5, 3, 11, 4, 27, 5}, Shape{9, 6, 18, 12, 6, 0},
        Shape{9, 6, 12, 18, 0, 6}, Shape{0, 5, 7, 5, 0, 0}, Shape{3, 0, 4, 4, 0, 0}}) {
    INFO(c.rows << " x " << c.cols << ", src_ld " << c.src_ld << ", dst_ld " << c.dst_ld);
    const std::size_t src_n = c.src_offset + c.rows * c.src_ld + c.cols, dst_n = c.dst_offset + c.rows * c.dst_ld + 3;
    const auto src = random_vec<float>(src_n, 31), dst = random_vec<float>(dst_n, 32);
    auto want = dst;
    for (std::size_t r = 0; r < c.rows; ++r)
      for (std::size_t k = 0; k < c.cols; ++k)
        want[c.dst_offset + r * c.dst_ld + k] = src[c.src_offset + r * c.src_ld + k];
    auto dsrc = upload(src), ddst = upload(dst);
    CudaBackend::run(ops::copy_2d<float>{.rows = c.rows,
                                         .cols = c.cols,
                                         .src = dsrc.data() + c.src_offset,
                                         .src_ld = c.src_ld,
                                         .dst = ddst.data() + c.dst_offset,
                                         .dst_ld = c.dst_ld});
    CHECK(download(ddst) == want);
    // 16-bit elements: the pitch is in bytes, two per element.
    std::vector<bf16> src16(src_n), dst16(dst_n);
    host::convert(src_n, src.data(), src16.data());
    host::convert(dst_n, dst.data(), dst16.data());
    auto want16 = dst16;
    for (std::size_t r = 0; r < c.rows; ++r)
      for (std::size_t k = 0; k < c.cols; ++k)
        want16[c.dst_offset + r * c.dst_ld + k] = src16[c.src_offset + r * c.src_ld + k];
    auto dsrc16 = upload(src16), ddst16 = upload(dst16);
    CudaBackend::run(ops::copy_2d<bf16>{.rows = c.rows,
                                        .cols = c.cols,
                                        .src = dsrc16.data() + c.src_offset,
                                        .src_ld = c.src_ld,
                                        .dst = ddst16.data() + c.dst_offset,
                                        .dst_ld = c.dst_ld});
    const auto got16 = download(ddst16);
    for (std::size_t i = 0; i < dst_n; ++i) REQUIRE(got16[i].bits == want16[i].bits);
  }
  gpu::DeviceBuffer<float> a(64, S()), b(64, S());
  CHECK_THROWS_WITH(CudaBackend::run(ops::copy_2d<float>{.rows = std::size_t(4),
                                                         .cols = std::size_t(5),
                                                         .src = a.data(),
                                                         .src_ld = std::size_t(3),
                                                         .dst = b.data(),
                                                         .dst_ld = std::size_t(5)}),
                    Catch::Contains("CudaBackend::copy_2d of 4 x 5") && Catch::Contains("src_ld = 3"));
  CHECK_THROWS_AS(CudaBackend::run(ops::copy_2d<float>{.rows = std::size_t(2),
                                                       .cols = std::size_t(6),
                                                       .src = a.data(),
                                                       .src_ld = std::size_t(6),
                                                       .dst = b.data(),
                                                       .dst_ld = std::size_t(4)}),
                  config_error);
  CudaBackend::synchronize();  // the rejected calls issued nothing: the stream has no error to report
}

TEST_CASE("CudaBackend copy_2d_batched: attention's heads rearranged equal the host reference bit for bit",
          "[cuda][buffer_ops][copy_2d]") {
  // The q, k, v columns of a [tokens, 3 * heads * d] matrix into dense [batch, heads, seq, d] blocks, as the
  // unfused 16-bit attention issues it; then three dense blocks interleaved back (its dQ, dK, dV).
  const std::size_t batch = 3, heads = 2, seq = 5, d = 4, hl = heads * d, ld = 3 * hl, tokens = batch * seq;
  const auto src = random_vec<float>(tokens * ld, 33);
  std::vector<bf16> src16(src.size());
  host::convert(src.size(), src.data(), src16.data());
  std::vector<bf16> want(3 * tokens * hl + 1, bf16(0.5f));
  auto dst16 = upload(want);
  const auto dsrc16 = upload(src16);
  for (std::size_t part = 0; part < 3; ++part) {
    host::copy_2d_batched(seq, d, src16.data() + part * hl, ld, BatchStrides{seq * ld, d},
                          want.data() + part * tokens * hl, d, BatchStrides{heads * seq * d, seq * d},
                          BatchExtents{batch, heads});
    CudaBackend::run(ops::copy_2d_batched<bf16>{.rows = seq,
                                                .cols = d,
                                                .src = dsrc16.data() + part * hl,
                                                .src_ld = ld,
                                                .src_stride = BatchStrides{seq * ld, d},
                                                .dst = dst16.data() + part * tokens * hl,
                                                .dst_ld = d,
                                                .dst_stride = BatchStrides{heads * seq * d, seq * d},
                                                .batch = BatchExtents{batch, heads}});
  }
  const auto got16 = download(dst16);
  for (std::size_t i = 0; i < want.size(); ++i) REQUIRE(got16[i].bits == want[i].bits);
  const auto parts = random_vec<float>(3 * tokens * hl, 34);
  std::vector<float> interleaved(tokens * ld, 0.0f);
  host::copy_2d_batched(tokens, hl, parts.data(), hl, BatchStrides{0, tokens * hl}, interleaved.data(), ld,
                        BatchStrides{0, hl}, BatchExtents{1, 3});
  auto dparts = upload(parts), dout = upload(std::vector<float>(tokens * ld, 0.0f));
  CudaBackend::run(ops::copy_2d_batched<float>{.rows = tokens,
                                               .cols = hl,
                                               .src = dparts.data(),
                                               .src_ld = hl,
                                               .src_stride = BatchStrides{0, tokens * hl},
                                               .dst = dout.data(),
                                               .dst_ld = ld,
                                               .dst_stride = BatchStrides{0, hl},
                                               .batch = BatchExtents{1, 3}});
  CHECK(download(dout) == interleaved);
  CHECK_THROWS_WITH(CudaBackend::run(ops::copy_2d_batched<float>{.rows = std::size_t(2),
                                                                 .cols = std::size_t(6),
                                                                 .src = dparts.data(),
                                                                 .src_ld = std::size_t(4),
                                                                 .src_stride = BatchStrides{0, 0},
                                                                 .dst = dout.data(),
                                                                 .dst_ld = std::size_t(6),
                                                                 .dst_stride = BatchStrides{0, 0},
                                                                 .batch = BatchExtents{1, 1}}),
                    Catch::Contains("CudaBackend::copy_2d of 2 x 6") && Catch::Contains("src_ld = 4"));
  CudaBackend::synchronize();
}

TEST_CASE("gemm_lt: bias and GeLU fused in the epilogue match GEMM + host bias + host GeLU", "[cuda][gemm]") {
  const std::size_t m = 64, n = 96, k = 128;  // multiples of 8/16 as cuBLASLt's 16-bit kernels prefer
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes}) {
      const auto a = random_vec<bf16>(m * k, 8), b = random_vec<bf16>(k * n, 9), bias = random_vec<bf16>(n, 10);
      const std::size_t lda = ta == Trans::no ? k : m, ldb = tb == Trans::no ? n : k;
      std::vector<float> pre(m * n);
      gemm<float>(ta, tb, m, n, k, 1.0f, to_float(a).data(), lda, to_float(b).data(), ldb, 0.0f, pre.data(), n);
      host::bias_add_forward(m, n, to_float(bias).data(), pre.data());
      std::vector<float> post(m * n);
      host::gelu_forward(m * n, pre.data(), post.data());
      auto da = upload(a), db = upload(b), dbias = upload(bias);
      gpu::DeviceBuffer<bf16> c(m * n, S()), aux(m * n, S());
      gpu::gemm_lt<bf16>(ta, tb, m, n, k, 1.0f, da.data(), lda, db.data(), ldb, 0.0f, c.data(), n, gpu::Epilogue::bias,
                         dbias.data());
      CHECK(worst(download(c), pre, 2e-2, 1e-2) <= 1.0);
      gpu::gemm_lt<bf16>(ta, tb, m, n, k, 1.0f, da.data(), lda, db.data(), ldb, 0.0f, c.data(), n,
                         gpu::Epilogue::gelu_bias, dbias.data(), aux.data(), n);
      CHECK(worst(download(c), post, 2e-2, 1e-2) <= 1.0);
      CHECK(worst(download(aux), pre, 2e-2, 1e-2) <= 1.0);
    }
  // fp32 with a bias: the plain epilogue path
  const auto a = random_vec<float>(m * k, 11), b = random_vec<float>(k * n, 12), bias = random_vec<float>(n, 13);
  std::vector<float> ref(m * n);
  gemm<float>(Trans::no, Trans::no, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, ref.data(), n);
  host::bias_add_forward(m, n, bias.data(), ref.data());
  auto da = upload(a), db = upload(b), dbias = upload(bias);
  gpu::DeviceBuffer<float> c(m * n, S());
  gpu::gemm_lt<float>(Trans::no, Trans::no, m, n, k, 1.0f, da.data(), k, db.data(), n, 0.0f, c.data(), n,
                      gpu::Epilogue::bias, dbias.data());
  CHECK(worst(download(c), ref, 1e-4, 1e-4) <= 1.0);
}
TEST_CASE("gemm: bad leading dimensions throw naming the sizes", "[cuda][gemm]") {
  gpu::DeviceBuffer<float> x(16, S());
  CHECK_THROWS_WITH(gpu::gemm<float>(Trans::no, Trans::no, 4, 4, 4, 1.0f, x.data(), 2, x.data(), 4, 0.0f, x.data(), 4),
                    Catch::Contains("lda=2"));
}

// ---- kernels vs host ---------------------------------------------------------------------------

template <class T>
void check_gelu(double tol) {
  const std::size_t n = 5000;
  const auto x = random_vec<T>(n, 20, 4.0), dy = random_vec<T>(n, 21);
  std::vector<float> y(n), dx(n);
  host::gelu_forward(n, to_float(x).data(), y.data());
  host::gelu_backward(n, to_float(x).data(), to_float(dy).data(), dx.data());
  auto dX = upload(x), dDY = upload(dy);
  gpu::DeviceBuffer<T> dY(n, S()), dDX(n, S());
  gpu::gelu_forward(n, dX.data(), dY.data());
  gpu::gelu_backward(n, dX.data(), dDY.data(), dDX.data());
  CHECK(worst(download(dY), y, tol, tol) <= 1.0);
  CHECK(worst(download(dDX), dx, tol, tol) <= 1.0);
}
TEST_CASE("kernels: GeLU forward and backward match the host", "[cuda][kernels]") {
  check_gelu<float>(1e-5);
  check_gelu<bf16>(1e-2);
  check_gelu<f16>(2e-3);
}

TEST_CASE("kernels: softmax forward/backward match the host, and causal rows equal the host softmax of their prefix",
          "[cuda][kernels]") {
  const std::size_t rows = 37, cols = 300;
  const auto x = random_vec<float>(rows * cols, 30, 5.0), dy = random_vec<float>(rows * cols, 31);
  std::vector<float> y(rows * cols), dx(rows * cols);
  host::softmax_forward(rows, cols, x.data(), y.data());
  host::softmax_backward(rows, cols, y.data(), dy.data(), dx.data());
  auto dX = upload(x), dDY = upload(dy);
  gpu::DeviceBuffer<float> dY(rows * cols, S()), dDX(rows * cols, S());
  gpu::softmax_forward(rows, cols, dX.data(), dY.data());
  gpu::softmax_backward(rows, cols, dY.data(), dDY.data(), dDX.data());
  CHECK(worst(download(dY), y, 1e-6, 1e-5) <= 1.0);
  CHECK(worst(download(dDX), dx, 1e-6, 1e-4) <= 1.0);

  // causal: [2 heads, s, s] scores with scale 0.5; row r keeps columns <= r % s
  const std::size_t s = 64, heads = 2;
  const auto sc = random_vec<float>(heads * s * s, 32, 3.0);
  auto dS = upload(sc);
  gpu::DeviceBuffer<float> dP(heads * s * s, S());
  gpu::softmax_forward(heads * s, s, dS.data(), dP.data(), true, 0.5f);
  const auto p = download(dP);
  std::vector<float> ref(heads * s * s, 0.0f);
  for (std::size_t r = 0; r < heads * s; ++r) {
    const std::size_t valid = r % s + 1;
    std::vector<float> row(valid);
    for (std::size_t c = 0; c < valid; ++c) row[c] = 0.5f * sc[r * s + c];
    host::softmax_forward(1, valid, row.data(), ref.data() + r * s);
  }
  CHECK(worst(p, ref, 1e-6, 1e-5) <= 1.0);
}

template <class T>
void check_layernorm(double tol) {
  const std::size_t rows = 19, cols = 777;
  const auto x = random_vec<T>(rows * cols, 40, 3.0), g = random_vec<T>(cols, 41), b = random_vec<T>(cols, 42),
             dy = random_vec<T>(rows * cols, 43);
  const auto xf = to_float(x), gf = to_float(g), bf = to_float(b), dyf = to_float(dy);
  std::vector<float> y(rows * cols), mean(rows), rstd(rows), dx(rows * cols), dg(cols, 0.5f), db(cols, -0.5f);
  host::layernorm_forward(rows, cols, xf.data(), gf.data(), bf.data(), y.data(), mean.data(), rstd.data());
  host::layernorm_backward(rows, cols, xf.data(), mean.data(), rstd.data(), gf.data(), dyf.data(), dx.data(), dg.data(),
                           db.data());
  auto dX = upload(x), dG = upload(g), dB = upload(b), dDY = upload(dy);
  gpu::DeviceBuffer<T> dY(rows * cols, S()), dDX(rows * cols, S());
  gpu::DeviceBuffer<float> dM(rows, S()), dR(rows, S());
  auto dDG = upload(std::vector<float>(cols, 0.5f)), dDB = upload(std::vector<float>(cols, -0.5f));
  gpu::layernorm_forward(rows, cols, dX.data(), dG.data(), dB.data(), dY.data(), dM.data(), dR.data());
  gpu::layernorm_backward(rows, cols, dX.data(), dM.data(), dR.data(), dG.data(), dDY.data(), dDX.data(), dDG.data(),
                          dDB.data());
  CHECK(worst(download(dY), y, tol, tol) <= 1.0);
  CHECK(worst(download(dM), mean, 1e-5, 1e-5) <= 1.0);
  CHECK(worst(download(dR), rstd, 1e-5, 1e-5) <= 1.0);
  CHECK(worst(download(dDX), dx, tol, tol) <= 1.0);
  CHECK(worst(download(dDG), dg, 1e-4, 1e-4) <= 1.0);  // accumulated onto the initial 0.5
  CHECK(worst(download(dDB), db, 1e-4, 1e-4) <= 1.0);
}
TEST_CASE("kernels: layer norm forward and backward match the host (gradients accumulate)", "[cuda][kernels]") {
  check_layernorm<float>(1e-4);
  check_layernorm<bf16>(2e-2);
}

TEST_CASE("kernels: cross-entropy forward/backward match the host, and vocab-parallel partials reproduce it",
          "[cuda][kernels]") {
  const std::size_t rows = 23, cols = 1000;
  const auto logits = random_vec<float>(rows * cols, 50, 6.0);
  std::vector<std::int32_t> targets(rows);
  for (std::size_t r = 0; r < rows; ++r) targets[r] = std::int32_t((r * 389) % cols);
  std::vector<float> probs(rows * cols), dl(rows * cols);
  const float loss = host::cross_entropy_forward(rows, cols, logits.data(), targets.data(), probs.data());
  host::cross_entropy_backward(rows, cols, probs.data(), targets.data(), dl.data(), 2.0f);
  auto dL = upload(logits);
  auto dT = upload(targets);
  gpu::DeviceBuffer<float> dP(rows * cols, S()), dDL(rows * cols, S()), dLoss(1, S());
  gpu::cross_entropy_forward(rows, cols, dL.data(), dT.data(), dP.data(), dLoss.data());
  gpu::cross_entropy_backward(rows, cols, dP.data(), dT.data(), dDL.data(), 2.0f);
  CHECK(download(dLoss)[0] == Approx(loss).epsilon(1e-5));
  CHECK(worst(download(dP), probs, 1e-7, 1e-5) <= 1.0);
  CHECK(worst(download(dDL), dl, 1e-7, 1e-4) <= 1.0);

  // Two vocabulary shards of 600 and 400 columns; the all-reduces are done here by hand.
  const std::size_t split = 600, widths[2] = {split, cols - split}, offs[2] = {0, split};
  std::vector<float> shard_max[2], gmax(rows, -INFINITY), gsum(rows, 0.0f), gtgt(rows, 0.0f);
  std::vector<gpu::DeviceBuffer<float>> shards;
  for (int s = 0; s < 2; ++s) {
    std::vector<float> h(rows * widths[s]);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < widths[s]; ++c) h[r * widths[s] + c] = logits[r * cols + offs[s] + c];
    shards.push_back(upload(h));
    gpu::DeviceBuffer<float> mx(rows, S());
    gpu::vocab_parallel_max(rows, widths[s], shards.back().data(), mx.data());
    const auto m = download(mx);
    for (std::size_t r = 0; r < rows; ++r) gmax[r] = std::max(gmax[r], m[r]);
  }
  auto dMax = upload(gmax);
  for (int s = 0; s < 2; ++s) {
    gpu::DeviceBuffer<float> se(rows, S()), tl(rows, S());
    gpu::vocab_parallel_sumexp(rows, widths[s], offs[s], shards[std::size_t(s)].data(), dT.data(), dMax.data(),
                               se.data(), tl.data());
    const auto a = download(se), b = download(tl);
    for (std::size_t r = 0; r < rows; ++r) gsum[r] += a[r], gtgt[r] += b[r];
  }
  auto dSum = upload(gsum), dTgt = upload(gtgt);
  gpu::vocab_parallel_loss(rows, dMax.data(), dSum.data(), dTgt.data(), dLoss.data());
  CHECK(download(dLoss)[0] == Approx(loss).epsilon(1e-5));
  for (int s = 0; s < 2; ++s) {
    gpu::DeviceBuffer<float> g(rows * widths[s], S());
    gpu::vocab_parallel_backward(rows, widths[s], offs[s], shards[std::size_t(s)].data(), dT.data(), dMax.data(),
                                 dSum.data(), g.data(), 2.0f);
    std::vector<float> ref(rows * widths[s]);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < widths[s]; ++c) ref[r * widths[s] + c] = dl[r * cols + offs[s] + c];
    CHECK(worst(download(g), ref, 1e-7, 1e-4) <= 1.0);
  }
}

TEST_CASE("kernels: dropout keeps exactly the elements host::DropoutMask keeps, on a shard too", "[cuda][kernels]") {
  const std::size_t rows = 33, cols = 70;
  const host::DropoutMask mask{1234, 5, 0.3, 200, 17, 40};  // a block at (17, 40) of a [*, 200] activation
  const auto x = random_vec<float>(rows * cols, 60);
  std::vector<float> y(rows * cols);
  mask.apply(rows, cols, x.data(), y.data());
  auto dX = upload(x);
  gpu::DeviceBuffer<float> dY(rows * cols, S());
  gpu::dropout_apply(mask, rows, cols, dX.data(), dY.data());
  const auto got = download(dY);
  std::size_t dropped = 0;
  for (std::size_t i = 0; i < rows * cols; ++i) {
    REQUIRE((got[i] == 0.0f) == (y[i] == 0.0f));
    dropped += y[i] == 0.0f;
  }
  CHECK(worst(got, y, 0.0, 1e-6) <= 1.0);
  CHECK(dropped > rows * cols / 5);
  CHECK(dropped < rows * cols * 2 / 5);
  // bf16 activations: the same mask (host::DropoutMask::keep), values scaled in float and rounded once
  const auto xb = random_vec<bf16>(rows * cols, 61);
  auto dXB = upload(xb);
  gpu::DeviceBuffer<bf16> dYB(rows * cols, S());
  gpu::dropout_apply(mask, rows, cols, dXB.data(), dYB.data());
  const auto gb = download(dYB);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) {
      const std::size_t i = r * cols + c;
      const bf16 expect = mask.keep(r, c) ? bf16(float(xb[i]) * float(1.0 / 0.7)) : bf16(0.0f);
      REQUIRE(gb[i] == expect);
    }
}

TEST_CASE("kernels: embedding forward/backward, vocabulary-parallel shards sum to the full lookup", "[cuda][kernels]") {
  const std::size_t vocab = 50, dim = 24, tokens = 40;
  const auto table = random_vec<float>(vocab * dim, 70);
  std::vector<std::int32_t> ids(tokens);
  for (std::size_t t = 0; t < tokens; ++t) ids[t] = std::int32_t((t * 7) % vocab);
  ids[3] = ids[5];  // a repeated id: its gradient rows add up
  const auto dout = random_vec<float>(tokens * dim, 71);
  std::vector<float> out(tokens * dim), dtab(vocab * dim, 0.0f);
  for (std::size_t t = 0; t < tokens; ++t)
    for (std::size_t d = 0; d < dim; ++d) {
      out[t * dim + d] = table[std::size_t(ids[t]) * dim + d];
      dtab[std::size_t(ids[t]) * dim + d] += dout[t * dim + d];
    }
  auto dIds = upload(ids);
  auto dDout = upload(dout);
  std::vector<float> sum(tokens * dim, 0.0f), gsum(vocab * dim, 0.0f);
  for (std::size_t off : {std::size_t(0), std::size_t(20)}) {
    const std::size_t local = off == 0 ? 20 : vocab - 20;
    std::vector<float> part(table.begin() + std::ptrdiff_t(off * dim),
                            table.begin() + std::ptrdiff_t((off + local) * dim));
    auto dTab = upload(part);
    gpu::DeviceBuffer<float> o(tokens * dim, S());
    auto g = upload(std::vector<float>(local * dim, 0.0f));
    gpu::embedding_forward(tokens, dim, dIds.data(), dTab.data(), o.data(), off, local);
    gpu::embedding_backward(tokens, dim, dIds.data(), dDout.data(), g.data(), off, local);
    const auto oh = download(o), gh = download(g);
    for (std::size_t i = 0; i < tokens * dim; ++i) sum[i] += oh[i];
    for (std::size_t i = 0; i < local * dim; ++i) gsum[off * dim + i] = gh[i];
  }
  CHECK(worst(sum, out, 0.0, 0.0) <= 1.0);
  CHECK(worst(gsum, dtab, 1e-6, 1e-6) <= 1.0);
}

TEST_CASE("kernels: AdamW step, sum of squares, bias gradient, convert and add", "[cuda][kernels]") {
  const std::size_t n = 3001;
  auto p = random_vec<float>(n, 80), m = random_vec<float>(n, 81, 0.1), v = random_vec<float>(n, 82, 0.01);
  for (auto& x : v) x = std::abs(x);
  const auto g = random_vec<bf16>(n, 83);
  auto dp = upload(p), dm = upload(m), dv = upload(v);
  auto dg = upload(g);
  const gpu::AdamWConfig cfg{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  gpu::adamw_update(n, dp.data(), dg.data(), dm.data(), dv.data(), cfg, 3, 0.5f);
  for (std::size_t i = 0; i < n; ++i) {
    const double gi = 0.5 * double(float(g[i]));
    const double mi = 0.9 * m[i] + 0.1 * gi, vi = 0.95 * v[i] + 0.05 * gi * gi;
    const double mh = mi / (1 - std::pow(0.9, 3)), vh = vi / (1 - std::pow(0.95, 3));
    p[i] = float(p[i] - 1e-2 * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * p[i]));
    m[i] = float(mi);
    v[i] = float(vi);
  }
  CHECK(worst(download(dp), p, 1e-6, 1e-5) <= 1.0);
  CHECK(worst(download(dm), m, 1e-7, 1e-5) <= 1.0);
  CHECK(worst(download(dv), v, 1e-9, 1e-5) <= 1.0);

  double ss = 0;
  for (auto x : g) ss += double(float(x)) * double(float(x));
  auto acc = upload(std::vector<float>{1.0f});
  gpu::sum_squares_accumulate(n, dg.data(), acc.data());
  CHECK(download(acc)[0] == Approx(1.0 + ss).epsilon(1e-4));

  const std::size_t rows = 300, cols = 70;
  const auto dy = random_vec<float>(rows * cols, 84);
  std::vector<float> db(cols, 1.0f);
  host::bias_add_backward(rows, cols, dy.data(), db.data());
  auto dDY = upload(dy);
  auto dDB = upload(std::vector<float>(cols, 1.0f));
  gpu::bias_add_backward(rows, cols, dDY.data(), dDB.data());
  CHECK(worst(download(dDB), db, 1e-4, 1e-4) <= 1.0);

  const auto f = random_vec<float>(n, 85);
  auto dF = upload(f);
  gpu::DeviceBuffer<bf16> dB16(n, S());
  gpu::convert(n, dF.data(), dB16.data());
  const auto b16 = download(dB16);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(b16[i] == bf16(f[i]));  // same rounding as the host type
  gpu::add(n, dF.data(), dF.data(), dF.data());
  gpu::scale(n, 0.25f, dF.data());
  const auto half = download(dF);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(half[i] == 0.5f * f[i]);
}

TEST_CASE("kernels: block reductions count every warp once (exact sums of ones, uniform softmax rows)",
          "[cuda][kernels]") {
  // Sizes below, at and above one block of 256 threads (8 warps), and one that leaves warps idle.
  for (const std::size_t n :
       {std::size_t(1), std::size_t(31), std::size_t(256), std::size_t(1000), std::size_t(70000)}) {
    auto ones = upload(std::vector<float>(n, 1.0f));
    auto acc = upload(std::vector<float>{0.0f});
    gpu::sum_squares_accumulate(n, ones.data(), acc.data());
    CHECK(download(acc)[0] == float(n));

    auto zeros = upload(std::vector<float>(n, 0.0f));
    gpu::DeviceBuffer<float> y(n, S());
    gpu::softmax_forward(1, n, zeros.data(), y.data());
    for (float v : download(y)) REQUIRE(v == Approx(1.0 / double(n)).epsilon(1e-6));
  }
}

TEST_CASE("CudaBackend row kernels (MoE dispatch and combine) equal the host backend", "[cuda][kernels][moe]") {
  const std::size_t tokens = 57, d = 129, routed = 2 * tokens;  // each token routed twice (top-2)
  const auto x = random_vec<float>(tokens * d, 80), rows = random_vec<float>(routed * d, 81);
  const auto w = random_vec<float>(routed, 82), dy = random_vec<float>(tokens * d, 83);
  std::vector<std::int32_t> index(routed), perm(tokens);
  for (std::size_t i = 0; i < routed; ++i) index[i] = std::int32_t((i * 7) % tokens);  // every token twice
  for (std::size_t t = 0; t < tokens; ++t) perm[t] = std::int32_t((t * 5 + 3) % tokens);
  auto di = upload(index), dp = upload(perm);
  auto dx = upload(x), drows = upload(rows), dw = upload(w), ddy = upload(dy);
  {
    gpu::DeviceBuffer<float> out(routed * d, S());
    CudaBackend::run(ops::gather_rows{routed, d, di.data(), dx.data(), out.data()});
    std::vector<float> h(routed * d);
    HostBackend::run(ops::gather_rows{routed, d, index.data(), x.data(), h.data()});
    CHECK(download(out) == h);
  }
  {
    gpu::DeviceBuffer<float> out(tokens * d, S());
    CudaBackend::run(ops::scatter_rows{tokens, d, dp.data(), dx.data(), out.data()});
    std::vector<float> h(tokens * d);
    HostBackend::run(ops::scatter_rows{tokens, d, perm.data(), x.data(), h.data()});
    CHECK(download(out) == h);
  }
  for (const bool weighted : {true, false}) {
    auto out = upload(x);  // accumulates onto x
    CudaBackend::run(
        ops::scatter_add_rows{routed, d, di.data(), weighted ? dw.data() : nullptr, drows.data(), out.data()});
    auto h = x;
    HostBackend::run(
        ops::scatter_add_rows{routed, d, index.data(), weighted ? w.data() : nullptr, rows.data(), h.data()});
    INFO("weighted " << weighted);
    CHECK(worst(download(out), h, 1e-6, 1e-6) <= 1.0);  // atomics add the two rows of a token in either order
  }
  {
    gpu::DeviceBuffer<float> dsrc(routed * d, S()), dot(routed, S());
    CudaBackend::run(ops::scatter_add_rows_backward{routed, d, di.data(), dw.data(), ddy.data(), drows.data(),
                                                    dsrc.data(), dot.data()});
    std::vector<float> hs(routed * d), hd(routed);
    HostBackend::run(ops::scatter_add_rows_backward{routed, d, index.data(), w.data(), dy.data(), rows.data(),
                                                    hs.data(), hd.data()});
    CHECK(download(dsrc) == hs);
    CHECK(worst(download(dot), hd, 1e-5, 1e-5) <= 1.0);  // a tree over the block, not column order
  }
}

TEST_CASE("CudaBackend optimizer operations: AdamW, SGD, sum of squares and scale equal the host backend",
          "[cuda][kernels][optim]") {
  const std::size_t n = 3001;
  const auto w0 = random_vec<float>(n, 90), g = random_vec<float>(n, 91);
  auto m0 = random_vec<float>(n, 92, 0.1), v0 = random_vec<float>(n, 93, 0.01);
  for (auto& x : v0) x = std::abs(x);
  // Direct calls: the device kernels compute host::adamw_update / host::sgd_update operation for operation.
  // The per-step factors live in rank memory (device) for the device, in host memory for the host reference.
  const UpdateFactors half{0.5f, 0.0f}, three_quarters{0.75f, 0.0f}, one{1.0f, 0.0f};
  // One AdamW update with this test's hyper-parameters and step constants, over the operands given.
  const auto adamw = [n](float* w, const float* grad, float* m, float* v, const UpdateFactors* factors) {
    return ops::adamw_update{.n = n,
                             .w = w,
                             .g = grad,
                             .m = m,
                             .v = v,
                             .beta1 = 0.9f,
                             .beta2 = 0.95f,
                             .eps = 1e-8f,
                             .weight_decay = 0.1f,
                             .lr = 1e-2f,
                             .bias_correction1 = 0.271f,
                             .bias_correction2 = 0.142625f,
                             .factors = factors};
  };
  const auto with_runs = [](ops::adamw_update op, const DecayRun* runs, std::size_t count) {
    op.decay_runs = runs;
    op.runs = count;
    return op;
  };
  {
    auto dw = upload(w0), dg = upload(g), dm = upload(m0), dv = upload(v0);
    auto df = upload(std::vector<UpdateFactors>{half});
    CudaBackend::run(adamw(dw.data(), dg.data(), dm.data(), dv.data(), df.data()));
    auto w = w0, m = m0, v = v0;
    HostBackend::run(adamw(w.data(), g.data(), m.data(), v.data(), &half));
    CHECK(worst(download(dw), w, 1e-12, 1e-6) <= 1.0);
    CHECK(worst(download(dm), m, 1e-12, 1e-6) <= 1.0);
    CHECK(worst(download(dv), v, 1e-12, 1e-6) <= 1.0);
  }
  {
    // One launch over a flat range with the weight decay per run (a rank's parameter arena): the host reference
    // takes the same table.
    const std::vector<DecayRun> runs{{1000, 1}, {1003, 0}, {2500, 1}, {n, 0}};
    auto dw = upload(w0), dg = upload(g), dm = upload(m0), dv = upload(v0);
    auto df = upload(std::vector<UpdateFactors>{half});
    auto dr = upload(runs);
    CudaBackend::run(with_runs(adamw(dw.data(), dg.data(), dm.data(), dv.data(), df.data()), dr.data(), runs.size()));
    auto w = w0, m = m0, v = v0;
    HostBackend::run(with_runs(adamw(w.data(), g.data(), m.data(), v.data(), &half), runs.data(), runs.size()));
    CHECK(worst(download(dw), w, 1e-12, 1e-6) <= 1.0);
    CHECK(worst(download(dm), m, 1e-12, 1e-6) <= 1.0);
    CHECK(worst(download(dv), v, 1e-12, 1e-6) <= 1.0);
  }
  for (const bool nesterov : {false, true})
    for (const bool first : {true, false}) {
      auto dw = upload(w0), dg = upload(g), db = upload(m0);
      auto df = upload(std::vector<UpdateFactors>{three_quarters});
      CudaBackend::run(ops::sgd_update{.n = n,
                                       .w = dw.data(),
                                       .g = static_cast<const float*>(dg.data()),
                                       .buf = db.data(),
                                       .momentum = 0.9f,
                                       .dampening = nesterov ? 0.0f : 0.1f,
                                       .nesterov = nesterov,
                                       .lr = 0.05f,
                                       .weight_decay = 0.01f,
                                       .first = first,
                                       .factors = static_cast<const UpdateFactors*>(df.data())});
      auto w = w0, b = m0;
      HostBackend::run(ops::sgd_update{.n = n,
                                       .w = w.data(),
                                       .g = g.data(),
                                       .buf = b.data(),
                                       .momentum = 0.9f,
                                       .dampening = nesterov ? 0.0f : 0.1f,
                                       .nesterov = nesterov,
                                       .lr = 0.05f,
                                       .weight_decay = 0.01f,
                                       .first = first,
                                       .factors = &three_quarters});
      INFO("nesterov " << nesterov << " first " << first);
      CHECK(worst(download(dw), w, 1e-12, 1e-6) <= 1.0);
      CHECK(worst(download(db), b, 1e-12, 1e-6) <= 1.0);
    }
  {
    auto dw = upload(w0), dg = upload(g);
    auto df = upload(std::vector<UpdateFactors>{one});
    CudaBackend::run(ops::sgd_update{.n = n,
                                     .w = dw.data(),
                                     .g = static_cast<const float*>(dg.data()),
                                     .buf = static_cast<float*>(nullptr),
                                     .momentum = 0.0f,
                                     .dampening = 0.0f,
                                     .nesterov = false,
                                     .lr = 0.05f,
                                     .weight_decay = 0.01f,
                                     .first = true,
                                     .factors = static_cast<const UpdateFactors*>(df.data())});  // no buffer
    auto w = w0;
    HostBackend::run(ops::sgd_update{.n = n,
                                     .w = w.data(),
                                     .g = g.data(),
                                     .buf = nullptr,
                                     .momentum = 0.0f,
                                     .dampening = 0.0f,
                                     .nesterov = false,
                                     .lr = 0.05f,
                                     .weight_decay = 0.01f,
                                     .first = true,
                                     .factors = &one});
    CHECK(worst(download(dw), w, 1e-12, 1e-6) <= 1.0);
    // A skip flag in rank memory: nothing changes on the device either.
    auto skip = upload(std::vector<UpdateFactors>{UpdateFactors{1.0f, 1.0f}});
    auto dw2 = upload(w0), dm = upload(m0), dv = upload(v0);
    CudaBackend::run(adamw(dw2.data(), dg.data(), dm.data(), dv.data(), skip.data()));
    CHECK(download(dw2) == w0);
    CHECK(download(dm) == m0);
  }
  {
    auto dg = upload(g);
    // The device accumulates in float per block into a double in rank memory, the host in double.
    auto dacc = upload(std::vector<double>{0.25});
    CudaBackend::run(ops::sum_squares{.n = n, .x = dg.data(), .acc = dacc.data()});
    CudaBackend::run(ops::sum_squares{.n = 0, .x = dg.data(), .acc = dacc.data()});
    double hacc = 0.25;
    HostBackend::run(ops::sum_squares{.n = n, .x = g.data(), .acc = &hacc});
    CHECK(download(dacc)[0] == Approx(hacc).epsilon(1e-5));
    // The step's factors from the reduced sum of squares: the device computes host::update_factors.
    for (const double squares : {hacc, 1e-4, std::numeric_limits<double>::infinity()}) {
      auto dsq = upload(std::vector<double>{squares}), dnorm = upload(std::vector<double>{0.0});
      auto df = upload(std::vector<UpdateFactors>{one});
      CudaBackend::run(ops::update_factors{.squares = static_cast<const double*>(dsq.data()),
                                           .max_norm = 1.0,
                                           .inv_loss_scale = 1.0f / 1024.0f,
                                           .skip_nonfinite = true,
                                           .norm = dnorm.data(),
                                           .factors = df.data()});
      double hnorm = 0;
      UpdateFactors hf;
      HostBackend::run(ops::update_factors{.squares = &squares,
                                           .max_norm = 1.0,
                                           .inv_loss_scale = 1.0f / 1024.0f,
                                           .skip_nonfinite = true,
                                           .norm = &hnorm,
                                           .factors = &hf});
      INFO("squares " << squares);
      CHECK((download(dnorm)[0] == hnorm || (std::isinf(hnorm) && std::isinf(download(dnorm)[0]))));
      CHECK(download(df)[0].grad_scale == hf.grad_scale);
      CHECK(download(df)[0].skip == hf.skip);
    }
    CudaBackend::run(ops::scale{.n = n, .factor = 0.375f, .x = dg.data()});
    auto h = g;
    HostBackend::run(ops::scale{.n = n, .factor = 0.375f, .x = h.data()});
    CHECK(download(dg) == h);
  }

  // The optimizers on a CUDA rank (parameters and states in device memory, filled and read by staged copies) against
  // the host optimizers.
  const auto make = [&]<class B>(std::string name) {
    nn::Parameter p;
    p.name = std::move(name);
    p.global_shape = {n};
    p.local_box = {Block{0, n}};
    p.layout = "Replicate";
    p.value = rank_buffer<B>(w0);
    p.grad = rank_buffer<B>(g);
    return p;
  };
  const optim::AdamWConfig acfg{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  const optim::SgdConfig scfg{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = true};
  std::vector<float> adam_w, adam_m, adam_v, sgd_w, sgd_buf, scaled;
  double norm = 0;
  run_ranks(1, [&](int) {
    auto pa = make.operator()<CudaBackend>("a"), ps = make.operator()<CudaBackend>("s");
    optim::AdamW<CudaBackend> adam({&pa}, acfg);
    optim::Sgd<CudaBackend> sgd({&ps}, scfg);
    for (int t = 0; t < 3; ++t) {
      adam.step(acfg.lr, 0.5f);
      sgd.step(scfg.lr, 0.5f);
    }
    std::vector<nn::Parameter*> both{&pa, &ps};
    norm = optim::grad_norm<CudaBackend>(both);
    optim::scale_grads<CudaBackend>(both, 0.25f);
    adam_w = rank_values<CudaBackend>(std::span<const float>(pa.value));
    adam_m = rank_values<CudaBackend>(adam.first_moment(0));
    adam_v = rank_values<CudaBackend>(adam.second_moment(0));
    sgd_w = rank_values<CudaBackend>(std::span<const float>(ps.value));
    sgd_buf = rank_values<CudaBackend>(sgd.momentum_buffer(0));
    scaled = rank_values<CudaBackend>(std::span<const float>(ps.grad));
  });
  auto ha = make.operator()<HostBackend>("a"), hs = make.operator()<HostBackend>("s");
  optim::AdamW adam({&ha}, acfg);
  optim::Sgd sgd({&hs}, scfg);
  for (int t = 0; t < 3; ++t) {
    adam.step(acfg.lr, 0.5f);
    sgd.step(scfg.lr, 0.5f);
  }
  std::vector<nn::Parameter*> both{&ha, &hs};
  CHECK(norm == Approx(optim::grad_norm(both)).epsilon(1e-5));
  optim::scale_grads(both, 0.25f);
  const auto vec = [](std::span<const float> s) { return std::vector<float>(s.begin(), s.end()); };
  CHECK(worst(adam_w, vec(ha.value), 1e-12, 1e-6) <= 1.0);
  CHECK(worst(adam_m, vec(adam.first_moment(0)), 1e-12, 1e-6) <= 1.0);
  CHECK(worst(adam_v, vec(adam.second_moment(0)), 1e-12, 1e-6) <= 1.0);
  CHECK(worst(sgd_w, vec(hs.value), 1e-12, 1e-6) <= 1.0);
  CHECK(worst(sgd_buf, vec(sgd.momentum_buffer(0)), 1e-12, 1e-6) <= 1.0);
  CHECK(scaled == vec(hs.grad));
}

// ---- communicators ------------------------------------------------------------------------------

namespace {
/** Rank r's contribution: element i is (r + 1) * (i % 13) - 3r, exact in bf16 for small values. */
template <class T>
std::vector<T> contribution(int r, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = convert<T>(double((r + 1) * int(i % 13) - 3 * r));
  return v;
}
template <class T>
double reduced(int p, std::size_t i, ReduceOp op) {
  double acc = op == ReduceOp::max ? -1e30 : op == ReduceOp::min ? 1e30 : 0.0;
  for (int r = 0; r < p; ++r) {
    const double v = double((r + 1) * int(i % 13) - 3 * r);
    acc = op == ReduceOp::max ? std::max(acc, v) : op == ReduceOp::min ? std::min(acc, v) : acc + v;
  }
  return op == ReduceOp::avg ? acc / p : acc;
}

/** Runs the same collective checks over any communicator type; returns per-rank failure messages. */
template <class Comm>
std::vector<std::string> collective_suite(std::vector<Comm>& comms, const std::vector<int>& devices) {
  const int p = int(comms.size());
  std::vector<std::string> failures;
  std::mutex mu;
  auto fail = [&](int r, const std::string& what) {
    std::lock_guard lk(mu);
    failures.push_back("rank " + std::to_string(r) + ": " + what);
  };
  std::vector<std::thread> th;
  std::vector<std::exception_ptr> errs(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r)
    th.emplace_back([&, r] {
      try {
        CudaBackend::init_rank(devices[std::size_t(r)]);
        Comm& c = comms[std::size_t(r)];
        const std::size_t n = 1001;  // not divisible by 2, 3 or 4: uneven blocks
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min, ReduceOp::avg}) {
          auto d = upload(contribution<float>(r, n));
          c.all_reduce(d.span(), op);
          const auto h = download(d);
          for (std::size_t i = 0; i < n; ++i)
            if (std::abs(h[i] - reduced<float>(p, i, op)) > 1e-4) {
              fail(r, std::string("all_reduce ") + reduce_op_name(op) + " at " + std::to_string(i));
              break;
            }
        }
        {
          auto d = upload(contribution<bf16>(r, n));
          auto req = c.iall_reduce(d.span(), ReduceOp::sum);
          req.wait();
          const auto h = download(d);
          for (std::size_t i = 0; i < n; ++i)
            if (float(h[i]) != float(bf16(float(reduced<bf16>(p, i, ReduceOp::sum))))) {
              fail(r, "iall_reduce bf16 at " + std::to_string(i));
              break;
            }
        }
        {
          auto d = upload(contribution<float>(r, n));
          c.broadcast(d.span(), p - 1);
          if (download(d) != contribution<float>(p - 1, n)) fail(r, "broadcast");
        }
        {
          const Block b = block_of(n, std::size_t(p), std::size_t(r));
          const auto full = contribution<float>(7, n);
          auto mine = upload(std::vector<float>(full.begin() + std::ptrdiff_t(b.offset),
                                                full.begin() + std::ptrdiff_t(b.offset + b.extent)));
          gpu::DeviceBuffer<float> all(n, S());
          c.all_gather(std::span<const float>(mine.data(), mine.size()), all.span());
          if (download(all) != full) fail(r, "all_gather (uneven)");
          gpu::DeviceBuffer<float> g(r == 0 ? n : 0, S());
          c.gather(std::span<const float>(mine.data(), mine.size()), g.span(), 0);
          if (r == 0 && download(g) != full) fail(r, "gather");
          auto src = upload(r == 1 % p ? full : std::vector<float>{});
          gpu::DeviceBuffer<float> part(b.extent, S());
          c.scatter(std::span<const float>(src.data(), src.size()), part.span(), 1 % p);
          if (download(part) != std::vector<float>(full.begin() + std::ptrdiff_t(b.offset),
                                                   full.begin() + std::ptrdiff_t(b.offset + b.extent)))
            fail(r, "scatter");
          auto contrib = upload(contribution<float>(r, n));
          gpu::DeviceBuffer<float> rs(b.extent, S());
          c.reduce_scatter(std::span<const float>(contrib.data(), n), rs.span(), ReduceOp::sum);
          const auto h = download(rs);
          for (std::size_t i = 0; i < b.extent; ++i)
            if (h[i] != float(reduced<float>(p, b.offset + i, ReduceOp::sum))) {
              fail(r, "reduce_scatter (uneven)");
              break;
            }
          gpu::DeviceBuffer<float> red(r == 0 ? n : 0, S());
          c.reduce(std::span<const float>(contrib.data(), n), red.span(), ReduceOp::max, 0);
          if (r == 0) {
            const auto hr = download(red);
            for (std::size_t i = 0; i < n; ++i)
              if (hr[i] != float(reduced<float>(p, i, ReduceOp::max))) {
                fail(r, "reduce max");
                break;
              }
          }
        }
        {
          // all_to_all: rank r sends value 100 r + q (block of 3) to rank q
          std::vector<float> s(std::size_t(3 * p)), expect(std::size_t(3 * p));
          for (int q = 0; q < p; ++q)
            for (int j = 0; j < 3; ++j) {
              s[std::size_t(3 * q + j)] = float(100 * r + q);
              expect[std::size_t(3 * q + j)] = float(100 * q + r);
            }
          auto ds = upload(s);
          gpu::DeviceBuffer<float> dr(s.size(), S());
          c.all_to_all(std::span<const float>(ds.data(), ds.size()), dr.span());
          if (download(dr) != expect) fail(r, "all_to_all");
          // all_to_all_v: rank r sends q + 1 copies of r to rank q
          std::vector<std::size_t> sc(static_cast<std::size_t>(p)), rc(static_cast<std::size_t>(p));
          std::vector<float> sv, ev;
          for (int q = 0; q < p; ++q) {
            sc[std::size_t(q)] = std::size_t(q + 1);
            rc[std::size_t(q)] = std::size_t(r + 1);
            sv.insert(sv.end(), std::size_t(q + 1), float(r));
            ev.insert(ev.end(), std::size_t(r + 1), float(q));
          }
          auto dsv = upload(sv);
          gpu::DeviceBuffer<float> drv(ev.size(), S());
          c.all_to_all_v(std::span<const float>(dsv.data(), dsv.size()), std::span<const std::size_t>(sc), drv.span(),
                         std::span<const std::size_t>(rc));
          if (download(drv) != ev) fail(r, "all_to_all_v");
        }
        if (p > 1) {  // ring: post the receive first, then send (no deadlock either way)
          auto out = upload(contribution<float>(r, 10));
          gpu::DeviceBuffer<float> in(10, S());
          const int next = (r + 1) % p, prev = (r + p - 1) % p;
          auto rq = c.irecv(in.span(), prev, 42);
          auto sq = c.isend(std::span<const float>(out.data(), 10), next, 42);
          rq.wait();
          sq.wait();
          if (download(in) != contribution<float>(prev, 10)) fail(r, "isend/irecv ring");
          // blocking pairs: even ranks send first, odd ranks receive first (a send may wait for its receiver)
          if (r % 2 == 0) {
            c.send(std::span<const float>(out.data(), 10), next, 43);
            c.recv(in.span(), prev, 43);
          } else {
            c.recv(in.span(), prev, 43);
            c.send(std::span<const float>(out.data(), 10), next, 43);
          }
          if (download(in) != contribution<float>(prev, 10)) fail(r, "send/recv ring");
        }
        c.barrier();
        {                                 // split into even and odd ranks; sum within each
          Comm sub = c.split(r % 2, -r);  // key -r: reversed order
          auto d = upload(std::vector<float>{float(r)});
          sub.all_reduce(d.span(), ReduceOp::sum);
          float expect = 0;
          int members = 0;
          for (int q = r % 2; q < p; q += 2) expect += float(q), ++members;
          if (download(d)[0] != expect || sub.size() != members) fail(r, "split + all_reduce");
          int higher = 0;
          for (int q = r % 2; q < p; q += 2) higher += q > r;
          if (sub.rank() != higher) fail(r, "split rank order by key");
        }
        CudaBackend::synchronize();
      } catch (...) {
        errs[std::size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : th) t.join();
  for (int r = 0; r < p; ++r)
    if (errs[std::size_t(r)]) {
      try {
        std::rethrow_exception(errs[std::size_t(r)]);
      } catch (const std::exception& e) {
        failures.push_back("rank " + std::to_string(r) + " threw: " + e.what());
      }
    }
  return failures;
}
}  // namespace

TEST_CASE("DeviceCommunicator: every collective with 1, 3 and 4 thread-ranks on one GPU", "[cuda][comm]") {
  for (int p : {1, 3, 4}) {
    auto comms = gpu::DeviceCommunicator::create(p, 0);
    const auto failures = collective_suite(comms, std::vector<int>(std::size_t(p), 0));
    INFO("ranks: " << p);
    for (const auto& f : failures) FAIL_CHECK(f);
    CHECK(failures.empty());
  }
}

TEST_CASE("DeviceCommunicator: mismatched calls and missing ranks raise comm_error on every rank", "[cuda][comm]") {
  auto comms = gpu::DeviceCommunicator::create(3, 0, "tensor", std::chrono::milliseconds(500));
  std::vector<std::string> msgs(3);
  run_ranks(3, [&](int r) {
    try {
      gpu::DeviceBuffer<float> d(r == 2 ? 5 : 4, S());
      comms[std::size_t(r)].all_reduce(d.span(), ReduceOp::sum);
    } catch (const comm_error& e) {
      msgs[std::size_t(r)] = e.what();
    }
  });
  for (const auto& m : msgs) {
    CHECK_THAT(m, Catch::Contains("all_reduce") && Catch::Contains("'tensor'") && Catch::Contains("count 5"));
  }
  // rank 1 never arrives: the other two time out with a message naming it
  auto comms2 = gpu::DeviceCommunicator::create(3, 0, "pipe", std::chrono::milliseconds(300));
  std::vector<std::string> msgs2(3);
  run_ranks(3, [&](int r) {
    if (r == 1) return;
    try {
      comms2[std::size_t(r)].barrier();
    } catch (const comm_error& e) {
      msgs2[std::size_t(r)] = e.what();
    }
  });
  CHECK_THAT(msgs2[0], Catch::Contains("rank(s) 1 did not arrive"));
  CHECK_THAT(msgs2[2], Catch::Contains("barrier"));
}

TEST_CASE("NcclCommunicator: every collective with one rank per visible GPU (up to 4)", "[cuda][comm][nccl]") {
  const int p = std::min(gpu::device_count(), 4);
  const ncclUniqueId id = NcclCommunicator::make_unique_id();
  std::vector<NcclCommunicator> comms;
  std::vector<std::exception_ptr> errs(static_cast<std::size_t>(p));
  std::vector<std::optional<NcclCommunicator>> made(static_cast<std::size_t>(p));
  {
    std::vector<std::thread> th;  // NCCL initialisation is collective: all ranks at once
    for (int r = 0; r < p; ++r)
      th.emplace_back([&, r] {
        try {
          made[std::size_t(r)].emplace(id, r, p, r, NcclOptions{"world", std::chrono::seconds(60)});
        } catch (...) {
          errs[std::size_t(r)] = std::current_exception();
        }
      });
    for (auto& t : th) t.join();
  }
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
  for (auto& m : made) comms.push_back(std::move(*m));
  std::vector<int> devices(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) devices[std::size_t(r)] = r;
  INFO("ranks (one per GPU): " << p);
  const auto failures = collective_suite(comms, devices);
  for (const auto& f : failures) FAIL_CHECK(f);
  CHECK(failures.empty());
}
