// The fused CUDA kernels (classifier, residual + layer norm, flash attention) and the device MoE
// routing against naive host loops (double precision where it matters), written here independently of
// mpar::host and of the unfused device kernels. Skipped without a GPU (cuda_main.cpp exits 77).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "cuda_test_support.hpp"
#include "mpar/cuda.hpp"

using namespace mpar;
using namespace mpar::cuda_testing;

namespace {

/** Deterministic values in [-scale, scale), already rounded to T. */
template <class T>
std::vector<T> values(std::size_t n, std::uint64_t seed, double scale) {
  return uniform_values<T>(n, CounterRng{seed, 11}, scale);
}
/** Largest |got - want| / (atol + rtol |want|) over the elements; <= 1 is within tolerance. */
template <class A>
double worst(const std::vector<A>& got, const std::vector<double>& want, double atol, double rtol) {
  REQUIRE(got.size() == want.size());
  double w = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    w = std::max(w, std::abs(as_double(got[i]) - want[i]) / (atol + rtol * std::abs(want[i])));
  return w;
}

// ---- fused classifier --------------------------------------------------------------------------

/**
 * rows x vocab real logits in rows of ld (padding filled with large values that would dominate the
 * softmax if they were read), checked against a double-precision softmax cross-entropy.
 */
template <class T>
void check_classifier(std::size_t rows, std::size_t vocab, std::size_t ld, bool in_place, double loss_tol,
                      double grad_rtol, std::size_t masked = 0) {
  CudaBackend::init_rank(0);
  auto x = values<T>(rows * ld, 3, 8.0);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = vocab; c < ld; ++c) x[r * ld + c] = convert<T>(50.0);
  std::vector<std::int32_t> t(rows);
  for (std::size_t r = 0; r < rows; ++r) t[r] = std::int32_t((r * 7919 + 13) % vocab);
  t[0] = std::int32_t(vocab - 1);  // the last real column
  // Masked words (-inf logits, as a vocabulary mask writes them): no probability, no gradient.
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < masked; ++c) x[r * ld + c] = convert<T>(-INFINITY);
    if (std::size_t(t[r]) < masked) t[r] = std::int32_t(masked);
  }
  const float scale = 0.5f;

  std::vector<double> loss_row(rows), lse(rows), grad(rows * ld, 0.0);
  double loss = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, sum = 0;
    for (std::size_t c = 0; c < vocab; ++c) mx = std::max(mx, as_double(x[r * ld + c]));
    for (std::size_t c = 0; c < vocab; ++c) sum += std::exp(as_double(x[r * ld + c]) - mx);
    lse[r] = mx + std::log(sum);
    loss_row[r] = lse[r] - as_double(x[r * ld + std::size_t(t[r])]);
    loss += loss_row[r] / double(rows);
    for (std::size_t c = 0; c < vocab; ++c)
      grad[r * ld + c] = double(scale) / double(rows) *
                         (std::exp(as_double(x[r * ld + c]) - lse[r]) - (std::int32_t(c) == t[r] ? 1.0 : 0.0));
  }

  auto dx = upload(x);
  auto dt = upload(t);
  gpu::DeviceBuffer<T> dg(in_place ? 0 : rows * ld, S());
  gpu::DeviceBuffer<float> drow(rows, S()), dlse(rows, S()), dloss(1, S());
  T* out = in_place ? dx.data() : dg.data();
  gpu::fused_classifier(rows, vocab, ld, dx.data(), dt.data(), out, drow.data(), dloss.data(), scale, dlse.data());
  const auto g = in_place ? download(dx) : download(dg);
  CHECK(std::abs(double(download(dloss)[0]) - loss) <= loss_tol * loss);
  CHECK(worst(download(drow), loss_row, 1e-5, loss_tol) <= 1.0);
  CHECK(worst(download(dlse), lse, 1e-5, loss_tol) <= 1.0);
  // Gradients are tiny (scale / rows · p): the absolute tolerance is relative to the largest entry.
  CHECK(worst(g, grad, grad_rtol * double(scale) / double(rows) * 1e-3, grad_rtol) <= 1.0);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = vocab; c < ld; ++c) REQUIRE(as_double(g[r * ld + c]) == 0.0);

  // Loss only (no gradient): the same loss, the logits untouched.
  auto dx2 = upload(x);
  gpu::fused_classifier<T>(rows, vocab, ld, dx2.data(), dt.data(), nullptr, drow.data(), dloss.data());
  CHECK(std::abs(double(download(dloss)[0]) - loss) <= loss_tol * loss);
  const auto x2 = download(dx2);
  for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(as_double(x2[i]) == as_double(x[i]));
}

/** Naive double-precision residual + layer norm, forward and backward, on the inputs as stored. */
struct ResidualLnReference {
  std::vector<double> h, y, mean, rstd, dh, dgamma, dbeta;
};
template <class T>
ResidualLnReference residual_ln_reference(std::size_t rows, std::size_t cols, const std::vector<T>& x,
                                          const std::vector<T>& b, const std::vector<T>& gamma,
                                          const std::vector<T>& beta, const std::vector<T>& dy,
                                          const std::vector<T>& dres, double eps) {
  ResidualLnReference ref{std::vector<double>(rows * cols), std::vector<double>(rows * cols),
                          std::vector<double>(rows),        std::vector<double>(rows),
                          std::vector<double>(rows * cols), std::vector<double>(cols, 0.0),
                          std::vector<double>(cols, 0.0)};
  for (std::size_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (std::size_t c = 0; c < cols; ++c) {
      // The residual stream is stored in T: the layer norm sees the rounded sum.
      ref.h[r * cols + c] = as_double(convert<T>(as_double(x[r * cols + c]) + as_double(b[r * cols + c])));
      m += ref.h[r * cols + c];
    }
    m /= double(cols);
    for (std::size_t c = 0; c < cols; ++c) v += (ref.h[r * cols + c] - m) * (ref.h[r * cols + c] - m);
    const double rs = 1.0 / std::sqrt(v / double(cols) + eps);
    ref.mean[r] = m;
    ref.rstd[r] = rs;
    // dL/dh_c = rs (g_c - mean(g) - xhat_c mean(g xhat)), g = dy * gamma; plus the residual's gradient.
    double sg = 0, sgx = 0;
    for (std::size_t c = 0; c < cols; ++c) {
      const double xhat = (ref.h[r * cols + c] - m) * rs, g = as_double(dy[r * cols + c]) * as_double(gamma[c]);
      ref.y[r * cols + c] = xhat * as_double(gamma[c]) + as_double(beta[c]);
      sg += g;
      sgx += g * xhat;
      ref.dgamma[c] += as_double(dy[r * cols + c]) * xhat;
      ref.dbeta[c] += as_double(dy[r * cols + c]);
    }
    for (std::size_t c = 0; c < cols; ++c) {
      const double xhat = (ref.h[r * cols + c] - m) * rs, g = as_double(dy[r * cols + c]) * as_double(gamma[c]);
      ref.dh[r * cols + c] = as_double(dres[r * cols + c]) + rs * (g - sg / double(cols) - xhat * sgx / double(cols));
    }
  }
  return ref;
}

template <class T>
void check_residual_layernorm(std::size_t rows, std::size_t cols, double tol) {
  CudaBackend::init_rank(0);
  const auto x = values<T>(rows * cols, 21, 2.0), b = values<T>(rows * cols, 22, 1.0);
  auto gamma = values<T>(cols, 23, 1.0), beta = values<T>(cols, 24, 0.5);
  for (auto& g : gamma) g = convert<T>(1.0 + as_double(g));
  const auto dy = values<T>(rows * cols, 25, 1.0), dres = values<T>(rows * cols, 26, 1.0);
  const double eps = 1e-5;
  const auto ref = residual_ln_reference(rows, cols, x, b, gamma, beta, dy, dres, eps);

  auto dx = upload(x);
  auto db = upload(b);
  auto dgam = upload(gamma);
  auto dbet = upload(beta);
  gpu::DeviceBuffer<T> dyv(rows * cols, S());
  gpu::DeviceBuffer<float> mean(rows, S()), rstd(rows, S());
  // h replaces x in place (the residual stream updated where it lives).
  gpu::residual_layernorm_forward(rows, cols, dx.data(), db.data(), dgam.data(), dbet.data(), dx.data(), dyv.data(),
                                  mean.data(), rstd.data(), float(eps));
  const auto h = download(dx);
  for (std::size_t i = 0; i < h.size(); ++i) REQUIRE(as_double(h[i]) == ref.h[i]);  // one rounding, the same one
  CHECK(worst(download(mean), ref.mean, 1e-5, 1e-5) <= 1.0);
  CHECK(worst(download(rstd), ref.rstd, 1e-5, 1e-4) <= 1.0);
  CHECK(worst(download(dyv), ref.y, tol, tol) <= 1.0);

  // Backward: dgamma/dbeta accumulate onto what is there (start from 1), dh replaces dres in place.
  auto ddy = upload(dy);
  auto dh = upload(dres);
  std::vector<float> ones(cols, 1.0f);
  auto dgamma = upload(ones);
  auto dbeta = upload(ones);
  gpu::residual_layernorm_backward(rows, cols, dx.data(), mean.data(), rstd.data(), dgam.data(), ddy.data(), dh.data(),
                                   dh.data(), dgamma.data(), dbeta.data());
  std::vector<double> want_g(cols), want_b(cols);
  for (std::size_t c = 0; c < cols; ++c) want_g[c] = 1.0 + ref.dgamma[c], want_b[c] = 1.0 + ref.dbeta[c];
  CHECK(worst(download(dh), ref.dh, tol, tol) <= 1.0);
  // Column sums over `rows` terms: the absolute error grows with the square root of the row count.
  CHECK(worst(download(dgamma), want_g, tol * std::sqrt(double(rows)), tol) <= 1.0);
  CHECK(worst(download(dbeta), want_b, tol * std::sqrt(double(rows)), tol) <= 1.0);

  // Without a residual gradient: dh is the layer norm's gradient alone.
  gpu::DeviceBuffer<T> dh2(rows * cols, S());
  gpu::residual_layernorm_backward<T>(rows, cols, dx.data(), mean.data(), rstd.data(), dgam.data(), ddy.data(), nullptr,
                                      dh2.data(), dgamma.data(), dbeta.data());
  std::vector<double> want(rows * cols);
  for (std::size_t i = 0; i < want.size(); ++i) want[i] = ref.dh[i] - as_double(dres[i]);
  CHECK(worst(download(dh2), want, tol, tol) <= 1.0);
}

}  // namespace

TEST_CASE("fused classifier: loss, log-sum-exp and gradient equal a double-precision softmax cross-entropy",
          "[cuda][fused][classifier]") {
  SECTION("fp32, vocabulary padded from 1000 to 1024, separate gradient") {
    check_classifier<float>(37, 1000, 1024, false, 1e-5, 1e-4);
  }
  SECTION("fp32, GPT-2's 50257 padded to 50304, gradient in place of the logits") {
    check_classifier<float>(9, 50257, 50304, true, 1e-5, 1e-4);
  }
  SECTION("bf16 logits, fp32 statistics") { check_classifier<bf16>(21, 3000, 3072, true, 1e-5, 1e-2); }
  SECTION("no padding, at most one column per thread, the first ten masked with -inf") {
    check_classifier<float>(5, 100, 100, false, 1e-5, 1e-4, 10);
  }
}

TEST_CASE("fused classifier: a target outside the vocabulary makes the loss NaN; a bad stride names the fix",
          "[cuda][fused][classifier]") {
  CudaBackend::init_rank(0);
  const std::size_t rows = 3, vocab = 10, ld = 16;
  auto x = upload(values<float>(rows * ld, 5, 1.0));
  auto t = upload(std::vector<std::int32_t>{1, 12, 3});  // 12 is a padding column, not a word
  gpu::DeviceBuffer<float> row(rows, S()), loss(1, S());
  gpu::fused_classifier<float>(rows, vocab, ld, x.data(), t.data(), nullptr, row.data(), loss.data());
  const auto r = download(row);
  CHECK(std::isfinite(r[0]));
  CHECK(std::isnan(r[1]));
  CHECK(std::isnan(download(loss)[0]));
  CHECK_THROWS_WITH(gpu::fused_classifier<float>(rows, vocab, 8, x.data(), t.data(), nullptr, row.data(), loss.data()),
                    Catch::Contains("ld >= vocab") && Catch::Contains("ld = 8"));
}

TEST_CASE("fused residual + layer norm: forward and backward equal a double-precision reference",
          "[cuda][fused][layernorm]") {
  SECTION("fp32, more rows than blocks") { check_residual_layernorm<float>(700, 768, 1e-4); }
  SECTION("fp32, wide rows (partials above 48 KiB of shared memory)") {
    check_residual_layernorm<float>(40, 8192, 1e-4);
  }
  SECTION("bf16 storage, fp32 statistics") { check_residual_layernorm<bf16>(64, 1000, 3e-2); }
}

// ---- MoE routing ---------------------------------------------------------------------------------

namespace {

/** The routing rules of parallel::MoeMlp, written out naively (a full sort per token, counters, three loops). */
struct HostRouting {
  std::vector<std::int32_t> choice, route, route_token, used;
  std::vector<std::uint8_t> accepted;
  std::vector<float> route_weight;
};
HostRouting host_route(std::size_t T, std::size_t E, std::size_t k, std::size_t cap, const std::vector<float>& p) {
  HostRouting h;
  h.choice.resize(T * k);
  h.accepted.assign(T * k, 0);
  h.used.assign(E, 0);
  for (std::size_t t = 0; t < T; ++t) {
    std::vector<std::size_t> order(E);
    for (std::size_t e = 0; e < E; ++e) order[e] = e;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return p[t * E + a] > p[t * E + b] || (p[t * E + a] == p[t * E + b] && a < b);
    });
    for (std::size_t j = 0; j < k; ++j) h.choice[t * k + j] = std::int32_t(order[j]);
  }
  for (std::size_t j = 0; j < k; ++j)
    for (std::size_t t = 0; t < T; ++t) {
      const auto e = std::size_t(h.choice[t * k + j]);
      if (std::size_t(h.used[e]) < cap) ++h.used[e], h.accepted[t * k + j] = 1;
    }
  for (std::size_t e = 0; e < E; ++e)
    for (std::size_t t = 0; t < T; ++t)
      for (std::size_t j = 0; j < k; ++j)
        if (std::size_t(h.choice[t * k + j]) == e && h.accepted[t * k + j]) {
          h.route.push_back(std::int32_t(t * k + j));
          h.route_token.push_back(std::int32_t(t));
          h.route_weight.push_back(p[t * E + e]);
        }
  return h;
}

void check_moe_route(std::size_t T, std::size_t E, std::size_t k, std::size_t cap) {
  CudaBackend::init_rank(0);
  // Probabilities on a coarse grid, so ties (broken towards the lower expert) are frequent.
  std::vector<float> p(T * E);
  const CounterRng rng{99, 3};
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = float(std::floor(rng.uniform(i) * 6.0)) / 8.0f;
  const auto want = host_route(T, E, k, cap, p);

  auto dp = upload(p);
  const std::size_t n = T * k;
  gpu::DeviceBuffer<std::int32_t> choice(n, S()), route(n, S()), token(n, S()), used(E, S()), routed(1, S());
  gpu::DeviceBuffer<std::uint8_t> accepted(n, S());
  gpu::DeviceBuffer<float> weight(n, S());
  gpu::moe_route(
      T, E, k, cap, dp.data(),
      {choice.data(), accepted.data(), route.data(), token.data(), weight.data(), used.data(), routed.data()});
  const auto m = std::size_t(download(routed)[0]);
  REQUIRE(m == want.route.size());
  CHECK(download(choice) == want.choice);
  CHECK(download(accepted) == want.accepted);
  CHECK(download(used) == want.used);
  const auto r = download(route), tk = download(token);
  const auto w = download(weight);
  CHECK(std::vector<std::int32_t>(r.begin(), r.begin() + std::ptrdiff_t(m)) == want.route);
  CHECK(std::vector<std::int32_t>(tk.begin(), tk.begin() + std::ptrdiff_t(m)) == want.route_token);
  CHECK(std::vector<float>(w.begin(), w.begin() + std::ptrdiff_t(m)) == want.route_weight);
}

}  // namespace

TEST_CASE("MoE routing on the device: top-k, capacity and permutation equal the host rules", "[cuda][fused][moe]") {
  SECTION("top-2 of 8, capacity 1.25 k T / E") { check_moe_route(1000, 8, 2, 313); }
  SECTION("top-2 of 8, tight capacity: most second choices dropped") { check_moe_route(1000, 8, 2, 130); }
  SECTION("top-1 of 64, no capacity limit") { check_moe_route(3000, 64, 1, 3000); }
  SECTION("more experts than assignments") { check_moe_route(1, 16, 2, 1); }
  SECTION("top-k = E: every expert once per token") { check_moe_route(50, 4, 4, 20); }
}

// ---- flash attention ---------------------------------------------------------------------------

namespace {

template <class T>
void check_flash_attention(std::size_t bh, std::size_t s, std::size_t d, bool causal, double tol) {
  CudaBackend::init_rank(0);
  const std::size_t n = bh * s * d;
  const auto q = values<T>(n, 31, 1.0), k = values<T>(n, 32, 1.0), v = values<T>(n, 33, 1.0),
             dout = values<T>(n, 34, 1.0);
  const double scale = 1.0 / std::sqrt(double(d));
  const auto ref = attention_reference(bh, s, d, q, k, v, dout, scale, causal);
  auto dq_ = upload(q), dk_ = upload(k), dv_ = upload(v), ddo = upload(dout);
  gpu::DeviceBuffer<T> o(n, S()), gq(n, S()), gk(n, S()), gv(n, S());
  gpu::DeviceBuffer<float> lse(bh * s, S());
  gpu::flash_attention_forward(bh, s, d, dq_.data(), dk_.data(), dv_.data(), o.data(), lse.data(), float(scale),
                               causal);
  gpu::flash_attention_backward(bh, s, d, dq_.data(), dk_.data(), dv_.data(), o.data(), lse.data(), ddo.data(),
                                gq.data(), gk.data(), gv.data(), float(scale), causal);
  CHECK(worst(download(o), ref.o, tol, tol) <= 1.0);
  CHECK(worst(download(lse), ref.lse, 1e-5, 1e-5) <= 1.0);
  CHECK(worst(download(gq), ref.dq, tol, tol) <= 1.0);
  CHECK(worst(download(gk), ref.dk, tol, tol) <= 1.0);
  CHECK(worst(download(gv), ref.dv, tol, tol) <= 1.0);
}

}  // namespace

TEST_CASE("flash attention: forward, log-sum-exp and backward equal naive double-precision attention",
          "[cuda][fused][attention]") {
  SECTION("fp32, d 64, causal, a sequence not a multiple of the tile") {
    check_flash_attention<float>(3, 77, 64, true, 1e-4);
  }
  SECTION("fp32, d 128, full attention") { check_flash_attention<float>(2, 130, 128, false, 1e-4); }
  SECTION("fp32, d 32, causal, one row") { check_flash_attention<float>(1, 1, 32, true, 1e-4); }
  SECTION("bf16, d 96, causal") { check_flash_attention<bf16>(2, 65, 96, true, 2e-2); }
}

TEST_CASE("flash attention: an unsupported head dimension names the supported ones", "[cuda][fused][attention]") {
  CudaBackend::init_rank(0);
  gpu::DeviceBuffer<float> x(2 * 48, S()), lse(2, S());
  CHECK_THROWS_WITH(
      gpu::flash_attention_forward(1, 2, 48, x.data(), x.data(), x.data(), x.data(), lse.data(), 1.0f, false),
      Catch::Contains("head dimension 48") && Catch::Contains("32, 64, 96 or 128"));
}
