// The vectorized float exp/tanh (backend/host/fast_math.hpp) against the correctly rounded double
// results over their whole float range, and the float kernels that use them against double references.
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <mpar/backend/host/kernels.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace mpar;
namespace fm = mpar::host::fast;

namespace {
constexpr float kInf = std::numeric_limits<float>::infinity();

/** Error of `got` in units of the last place of the float nearest to `ref` (ref a normal float; at a
 * power of two the smaller of the two neighbouring ulps, so the figure is never flattering). */
double ulp_error(float got, double ref) {
  const float r = std::fabs(float(ref));
  const float ulp = r - std::nextafter(r, 0.0f);
  return std::fabs(double(got) - ref) / double(ulp);
}

/** Every `stride`-th float bit pattern with a value in [lo, hi] (both signs handled by the caller). */
std::vector<float> float_sweep(float lo, float hi, std::uint32_t stride) {
  std::vector<float> xs;
  for (float x = lo; x <= hi;) {
    xs.push_back(x);
    // Step in bit-pattern space: negative floats move towards zero as the pattern decreases.
    std::uint32_t b = std::bit_cast<std::uint32_t>(x);
    if (x < 0.0f) {
      if ((b & 0x7fffffffu) <= stride) break;
      b -= stride;
    } else {
      if (b >= 0x7f800000u - stride) break;
      b += stride;
    }
    x = std::bit_cast<float>(b);
  }
  return xs;
}

// The double references in the sigmoid form of 0.5 (1 + tanh u): mathematically the same, but without
// the cancellation of 1 + tanh u that makes the tanh form useless in the far negative tail even in double.
double gelu_u(double v) { return 0.7978845608028654 * (v + 0.044715 * v * v * v); }
double gelu_ref(double v) { return v / (1.0 + std::exp(-2.0 * gelu_u(v))); }
double gelu_grad_ref(double v) {
  const double s = 1.0 / (1.0 + std::exp(-2.0 * gelu_u(v))), sm = 1.0 / (1.0 + std::exp(2.0 * gelu_u(v)));
  return s * (1.0 + 2.0 * v * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * v * v) * sm);
}
}  // namespace

TEST_CASE("fast_exp: <= 2 ulp over the normal range, exact limits at underflow and overflow",
          "[backend][fast_math][sweep]") {
  // Every instruction-set level this CPU runs, each pinned explicitly (not only the one dispatched).
  for (const host::Isa isa : host::supported_isas()) {
    host::ScopedIsa pin(isa);
    INFO("instruction set " << host::isa_name(isa));
    double worst = 0, worst_x = 0;
    for (const float lo : {-87.3f, 0.0f}) {
      const std::vector<float> xs = lo < 0 ? float_sweep(-87.3f, -1e-30f, 97) : float_sweep(0.0f, 88.72f, 97);
      std::vector<float> ys(xs.size());
      fm::exp_n(xs.size(), xs.data(), ys.data());  // the vectorized path
      // The scalar and the blocked form must agree bit for bit on the baseline; the AVX2 / AVX-512 copies
      // may fuse a multiply and an add (FMA), so there only the ulp bound below applies.
      std::size_t differ = 0;
      for (std::size_t i = 0; i < xs.size(); ++i) {
        differ += ys[i] != fm::fast_exp(xs[i]) ? 1 : 0;
        const double e = ulp_error(ys[i], std::exp(double(xs[i])));
        if (e > worst) worst = e, worst_x = xs[i];
      }
      if (isa == host::Isa::baseline) CHECK(differ == 0);
    }
    std::printf("fast_exp (%s): max error %.3f ulp (at x = %.9g)\n", host::isa_name(isa), worst, worst_x);
    CHECK(worst <= 2.0);
    // Subnormal results: within one subnormal step of the exact value, and 0 beyond exp(-103.97).
    const double denorm = double(std::numeric_limits<float>::denorm_min());
    for (float x = -87.4f; x > -103.0f; x -= 0.01f)
      CHECK(std::fabs(double(fm::fast_exp(x)) - std::exp(double(x))) <= denorm);
    for (const float x : {-103.98f, -104.0f, -150.0f, -1e30f, -kInf}) CHECK(fm::fast_exp(x) == 0.0f);
    for (const float x : {88.73f, 89.0f, 100.0f, 1e30f, kInf}) CHECK(fm::fast_exp(x) == kInf);
    CHECK(fm::fast_exp(0.0f) == 1.0f);
    CHECK(std::isnan(fm::fast_exp(std::numeric_limits<float>::quiet_NaN())));
  }
}

TEST_CASE("fast_tanh: <= 3 ulp over all floats, odd, saturates to exactly +-1", "[backend][fast_math][sweep]") {
  // Every instruction-set level this CPU runs, each pinned explicitly (not only the one dispatched).
  for (const host::Isa isa : host::supported_isas()) {
    host::ScopedIsa pin(isa);
    INFO("instruction set " << host::isa_name(isa));
    double worst = 0, worst_x = 0;
    std::vector<float> xs = float_sweep(1e-30f, 12.0f, 61);
    for (const float x : float_sweep(1e-30f, 12.0f, 61)) xs.push_back(-x);
    std::vector<float> ys(xs.size());
    fm::tanh_n(xs.size(), xs.data(), ys.data());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      differ += ys[i] != fm::fast_tanh(xs[i]) ? 1 : 0;
      const double e = ulp_error(ys[i], std::tanh(double(xs[i])));
      if (e > worst) worst = e, worst_x = xs[i];
    }
    if (isa == host::Isa::baseline) CHECK(differ == 0);
    std::printf("fast_tanh (%s): max error %.3f ulp (at x = %.9g)\n", host::isa_name(isa), worst, worst_x);
    CHECK(worst <= 3.0);
    for (const float x : {9.1f, 20.0f, 44.0f, 100.0f, 1e30f, kInf}) {
      CHECK(fm::fast_tanh(x) == 1.0f);
      CHECK(fm::fast_tanh(-x) == -1.0f);
    }
    CHECK(fm::fast_tanh(1e-40f) == 1e-40f);  // subnormal: tanh x = x
    CHECK(std::signbit(fm::fast_tanh(-0.0f)));
    CHECK(std::isnan(fm::fast_tanh(std::numeric_limits<float>::quiet_NaN())));
  }
}

TEST_CASE("float GeLU forward and backward against the double-precision formula", "[backend][fast_math]") {
  // Every instruction-set level this CPU runs, each pinned explicitly (not only the one dispatched).
  for (const host::Isa isa : host::supported_isas()) {
    host::ScopedIsa pin(isa);
    INFO("instruction set " << host::isa_name(isa));
    // Every 7th float in [-30, 30] (includes the far negative tail where gelu underflows).
    std::vector<float> xs = float_sweep(-30.0f, -1e-20f, 4099);
    for (const float x : float_sweep(0.0f, 30.0f, 4099)) xs.push_back(x);
    std::vector<float> y(xs.size()), g(xs.size(), 1.0f);
    host::gelu_forward(xs.size(), xs.data(), y.data());
    host::gelu_backward(xs.size(), xs.data(), g.data(), g.data());  // in place, as the layers may call it
    double worst_f = 0, worst_b = 0, worst_tiny = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const double rf = gelu_ref(xs[i]), rb = gelu_grad_ref(xs[i]);
      // In the tails gelu ~ v e^{2u} is ill-conditioned: rounding u to float alone moves the result by
      // |2u| eps relative (std::tanh in float does no better). The error is therefore measured relative to
      // that conditioning, cond = 1 + |2u| (1 + 3 c v^2) / (1 + c v^2).
      const double v = xs[i], u = gelu_u(v);
      const double cond = 1.0 + std::fabs(2.0 * u) * (1.0 + 3 * 0.044715 * v * v) / (1.0 + 0.044715 * v * v);
      // gelu' = s (1 + 2 v u' (1 - s)) also has a zero near x = -0.75 where the two terms cancel, so its
      // error is taken relative to the size of the terms, s (1 + |2 v u' (1 - s)|).
      const double sg = 1.0 / (1.0 + std::exp(-2.0 * u)), sgm = 1.0 / (1.0 + std::exp(2.0 * u));
      const double terms = sg * (1.0 + std::fabs(2.0 * v * 0.7978845608028654 * (1.0 + 3 * 0.044715 * v * v) * sgm));
      // Results below the normal float range are compared absolutely.
      const double min_normal = double(std::numeric_limits<float>::min());
      if (std::fabs(rf) >= min_normal)
        worst_f = std::max(worst_f, std::fabs(y[i] - rf) / std::fabs(rf) / cond);
      else
        worst_tiny = std::max(worst_tiny, std::fabs(y[i] - rf));
      if (terms >= min_normal)
        worst_b = std::max(worst_b, std::fabs(g[i] - rb) / terms / cond);
      else
        worst_tiny = std::max(worst_tiny, std::fabs(g[i] - rb));
    }
    CHECK(worst_tiny <= double(std::numeric_limits<float>::min()));
    std::printf("gelu float (%s): max relative error / conditioning: forward %.3g, backward %.3g\n",
                host::isa_name(isa), worst_f, worst_b);
    CHECK(worst_f <= 5e-7);
    CHECK(worst_b <= 5e-7);
  }
}

TEST_CASE("float softmax (plain and causal), layer norm and vocabulary statistics against double",
          "[backend][fast_math]") {
  // Every instruction-set level this CPU runs, each pinned explicitly (not only the one dispatched).
  for (const host::Isa isa : host::supported_isas()) {
    host::ScopedIsa pin(isa);
    INFO("instruction set " << host::isa_name(isa));
    // Widths with and without a partial last block.
    for (const std::size_t cols : {std::size_t(1), std::size_t(7), std::size_t(16), std::size_t(67)}) {
      const std::size_t rows = 2 * cols + 3;
      std::vector<float> x(rows * cols), dy(rows * cols), gamma(cols), beta(cols);
      std::vector<double> xd(rows * cols), dyd(rows * cols), gd(cols), bd(cols);
      for (std::size_t i = 0; i < x.size(); ++i) {
        x[i] = float(init_value(3, 1, i, InitSpec::uniform(12.0)));
        dy[i] = float(init_value(3, 2, i, InitSpec::uniform(1.0)));
        xd[i] = x[i];
        dyd[i] = dy[i];
      }
      for (std::size_t c = 0; c < cols; ++c) {
        gd[c] = gamma[c] = float(1.0 + init_value(3, 3, c, InitSpec::uniform(0.5)));
        bd[c] = beta[c] = float(init_value(3, 4, c, InitSpec::uniform(0.5)));
      }
      // Element-wise relative error (softmax probabilities: no cancellation, so every element must be close).
      auto close = [](const std::vector<float>& a, const std::vector<double>& b, double tol) {
        double w = 0;
        for (std::size_t i = 0; i < a.size(); ++i) w = std::max(w, std::fabs(a[i] - b[i]) / (std::fabs(b[i]) + 1e-30));
        if (w > tol) std::printf("relative error %.3g > %.3g\n", w, tol);
        return w <= tol;
      };
      // Norm-wise error max|a - b| / max|b| (gradients and normalised values: elements near zero cancel).
      auto close_norm = [](const std::vector<float>& a, const std::vector<double>& b, double tol) {
        double w = 0, m = 0;
        for (std::size_t i = 0; i < a.size(); ++i)
          w = std::max(w, std::fabs(a[i] - b[i])), m = std::max(m, std::fabs(b[i]));
        if (w > tol * m) std::printf("norm-wise error %.3g > %.3g\n", w / m, tol);
        return w <= tol * m;
      };
      for (const bool causal : {false, true}) {
        std::vector<float> y(x.size()), dx(x.size());
        std::vector<double> yd(x.size()), dxd(x.size());
        host::softmax_forward(rows, cols, x.data(), y.data(), causal, 0.7f);
        host::softmax_forward(rows, cols, xd.data(), yd.data(), causal, 0.7);
        CHECK(close(y, yd, 2e-6));
        host::softmax_backward(rows, cols, y.data(), dy.data(), dx.data());
        host::softmax_backward(rows, cols, yd.data(), dyd.data(), dxd.data());
        CHECK(close_norm(dx, dxd, 1e-6));
      }
      std::vector<float> y(x.size()), mean(rows), rstd(rows), dx(x.size()), dg(cols, 0.5f), db(cols, 0.25f);
      std::vector<double> yd(x.size()), meand(rows), rstdd(rows), dxd(x.size()), dgd(cols, 0.5), dbd(cols, 0.25);
      host::layernorm_forward(rows, cols, x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data());
      host::layernorm_forward(rows, cols, xd.data(), gd.data(), bd.data(), yd.data(), meand.data(), rstdd.data());
      if (cols > 1) CHECK(close_norm(y, yd, 1e-6));
      host::layernorm_backward(rows, cols, x.data(), mean.data(), rstd.data(), gamma.data(), dy.data(), dx.data(),
                               dg.data(), db.data());
      host::layernorm_backward(rows, cols, xd.data(), meand.data(), rstdd.data(), gd.data(), dyd.data(), dxd.data(),
                               dgd.data(), dbd.data());
      if (cols > 1) CHECK(close_norm(dx, dxd, 1e-5));
      CHECK(close_norm(dg, dgd, 1e-6));
      CHECK(close_norm(db, dbd, 1e-6));
      // Vocabulary-parallel statistics and gradient: the float kernels against the double ones.
      std::vector<std::int32_t> targets(rows);
      for (std::size_t r = 0; r < rows; ++r) targets[r] = std::int32_t((r * 5) % (cols + 2));  // some outside the block
      std::vector<float> mx(rows), se(rows), tl(rows), mxd(rows), sed(rows), tld(rows);
      host::vocab_parallel_max(rows, cols, x.data(), mx.data());
      host::vocab_parallel_max(rows, cols, xd.data(), mxd.data());
      CHECK(mx == mxd);
      host::vocab_parallel_sumexp(rows, cols, 1, x.data(), targets.data(), mx.data(), se.data(), tl.data());
      host::vocab_parallel_sumexp(rows, cols, 1, xd.data(), targets.data(), mxd.data(), sed.data(), tld.data());
      CHECK(close(se, std::vector<double>(sed.begin(), sed.end()), 2e-6));
      CHECK(tl == tld);
      host::vocab_parallel_backward(rows, cols, 1, x.data(), targets.data(), mx.data(), se.data(), dx.data(), 2.0f);
      host::vocab_parallel_backward(rows, cols, 1, xd.data(), targets.data(), mxd.data(), sed.data(), dxd.data(), 2.0f);
      CHECK(close_norm(dx, dxd, 1e-6));
    }
  }
}

TEST_CASE("the kernels' instruction set is the best one /proc/cpuinfo lists, and can be pinned lower",
          "[backend][fast_math]") {
  // The CPU's flags as the kernel reports them: an independent account of what the CPU and OS support.
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::set<std::string> flags;
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      for (std::string w; words >> w;) flags.insert(w);
      break;
    }
  if (flags.empty()) {
    WARN("no /proc/cpuinfo flags here: the detection is not cross-checked");
  } else {
#if defined(__x86_64__) && defined(__GNUC__)
    auto has = [&](std::initializer_list<const char*> names) {
      for (const char* n : names)
        if (!flags.count(n)) return false;
      return true;
    };
    const bool v3 = has({"avx2", "fma", "bmi2"});
    const host::Isa expected = v3 && has({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})
                                   ? host::Isa::avx512
                               : v3 ? host::Isa::avx2
                                    : host::Isa::baseline;
#else
    const host::Isa expected = host::Isa::baseline;
#endif
    CHECK(host::isa_name(host::detected_isa()) == std::string(host::isa_name(expected)));
  }
  CHECK(host::active_isa() == host::detected_isa());
  {
    host::ScopedIsa outer(host::Isa::baseline);
    CHECK(host::active_isa() == host::Isa::baseline);
    {
      host::ScopedIsa inner(host::detected_isa());
      CHECK(host::active_isa() == host::detected_isa());
    }
    CHECK(host::active_isa() == host::Isa::baseline);
    // The pin is per thread: another thread still runs the detected level.
    host::Isa other = host::Isa::baseline;
    std::thread([&] { other = host::active_isa(); }).join();
    CHECK(other == host::detected_isa());
  }
  CHECK(host::active_isa() == host::detected_isa());
  if (host::detected_isa() != host::Isa::avx512)
    CHECK_THROWS_WITH(host::ScopedIsa(host::Isa::avx512),
                      Catch::Contains("avx512") && Catch::Contains("not supported by this CPU"));
}
