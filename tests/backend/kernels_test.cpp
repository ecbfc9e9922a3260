// Every host kernel against a naive reference: forward values, and gradients by central finite differences.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <mpar/backend/host/kernels.hpp>
#include <vector>

using namespace mpar;
using Vec = std::vector<double>;

namespace {
Vec random_vec(std::size_t n, std::uint64_t stream, double scale = 1.0) {
  Vec v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = init_value(11, stream, i, InitSpec::uniform(scale));
  return v;
}
double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}
// Checks analytic d(loss)/d(x) where loss(x) = <w, f(x)> against central differences.
void check_gradient(Vec x, const std::function<Vec(const Vec&)>& f, const Vec& analytic, double tol = 1e-6) {
  const Vec w = random_vec(f(x).size(), 99);
  const double h = 1e-6;
  for (std::size_t i = 0; i < x.size(); ++i) {
    Vec xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    const double numeric = (dot(w, f(xp)) - dot(w, f(xm))) / (2 * h);
    REQUIRE(analytic[i] == Approx(numeric).margin(tol).epsilon(1e-5));
  }
}
}  // namespace

TEST_CASE("GeLU forward and backward", "[backend][kernels]") {
  const Vec x = random_vec(50, 1, 4.0);
  Vec y(50);
  host::gelu_forward(50, x.data(), y.data());
  for (std::size_t i = 0; i < 50; ++i) {
    const double v = x[i];
    CHECK(y[i] == Approx(0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)))));
  }
  const Vec w = random_vec(50, 99);
  Vec dx(50);
  host::gelu_backward(50, x.data(), w.data(), dx.data());
  check_gradient(
      x,
      [](const Vec& in) {
        Vec out(in.size());
        host::gelu_forward(in.size(), in.data(), out.data());
        return out;
      },
      dx);
}

TEST_CASE("softmax forward is stable and backward matches finite differences", "[backend][kernels]") {
  const std::size_t rows = 3, cols = 7;
  Vec x = random_vec(rows * cols, 2, 3.0);
  x[0] = 1000.0;  // would overflow without max subtraction
  Vec y(rows * cols);
  host::softmax_forward(rows, cols, x.data(), y.data());
  for (std::size_t r = 0; r < rows; ++r) {
    double s = 0;
    for (std::size_t c = 0; c < cols; ++c) s += y[r * cols + c];
    CHECK(s == Approx(1.0));
  }
  CHECK(y[0] == Approx(1.0));
  x[0] = 0.5;
  host::softmax_forward(rows, cols, x.data(), y.data());
  const Vec w = random_vec(rows * cols, 99);
  Vec dx(rows * cols);
  host::softmax_backward(rows, cols, y.data(), w.data(), dx.data());
  check_gradient(
      x,
      [&](const Vec& in) {
        Vec out(in.size());
        host::softmax_forward(rows, cols, in.data(), out.data());
        return out;
      },
      dx);
}

TEST_CASE("layer norm forward and all three gradients", "[backend][kernels]") {
  const std::size_t rows = 4, cols = 9;
  const Vec x = random_vec(rows * cols, 3, 2.0), gamma = random_vec(cols, 4), beta = random_vec(cols, 5);
  auto run = [&](const Vec& xx, const Vec& g, const Vec& b) {
    Vec y(rows * cols), mean(rows), rstd(rows);
    host::layernorm_forward(rows, cols, xx.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data());
    return y;
  };
  // Forward against the definition.
  const Vec y = run(x, gamma, beta);
  for (std::size_t r = 0; r < rows; ++r) {
    double m = 0, v = 0;
    for (std::size_t c = 0; c < cols; ++c) m += x[r * cols + c] / cols;
    for (std::size_t c = 0; c < cols; ++c) v += (x[r * cols + c] - m) * (x[r * cols + c] - m) / cols;
    for (std::size_t c = 0; c < cols; ++c)
      CHECK(y[r * cols + c] == Approx((x[r * cols + c] - m) / std::sqrt(v + 1e-5) * gamma[c] + beta[c]));
  }
  Vec yy(rows * cols), mean(rows), rstd(rows), dx(rows * cols), dg(cols, 0.0), db(cols, 0.0);
  host::layernorm_forward(rows, cols, x.data(), gamma.data(), beta.data(), yy.data(), mean.data(), rstd.data());
  const Vec w = random_vec(rows * cols, 99);
  host::layernorm_backward(rows, cols, x.data(), mean.data(), rstd.data(), gamma.data(), w.data(), dx.data(), dg.data(),
                           db.data());
  check_gradient(
      x, [&](const Vec& in) { return run(in, gamma, beta); }, dx);
  check_gradient(
      gamma, [&](const Vec& g) { return run(x, g, beta); }, dg);
  check_gradient(
      beta, [&](const Vec& b) { return run(x, gamma, b); }, db);
}

TEST_CASE("cross-entropy forward and backward", "[backend][kernels]") {
  const std::size_t rows = 5, cols = 6;
  const Vec logits = random_vec(rows * cols, 6, 3.0);
  const std::vector<std::int32_t> targets{0, 5, 2, 2, 1};
  Vec probs(rows * cols);
  const double loss = host::cross_entropy_forward(rows, cols, logits.data(), targets.data(), probs.data());
  double ref = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    double lse = 0;
    for (std::size_t c = 0; c < cols; ++c) lse += std::exp(logits[r * cols + c]);
    ref += std::log(lse) - logits[r * cols + std::size_t(targets[r])];
  }
  CHECK(loss == Approx(ref / rows));
  Vec d(rows * cols);
  host::cross_entropy_backward(rows, cols, probs.data(), targets.data(), d.data());
  // loss is a scalar: check d(loss)/d(logits) directly.
  const double h = 1e-6;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    Vec p = logits, m = logits, tmp(rows * cols);
    p[i] += h;
    m[i] -= h;
    const double num = (host::cross_entropy_forward(rows, cols, p.data(), targets.data(), tmp.data()) -
                        host::cross_entropy_forward(rows, cols, m.data(), targets.data(), tmp.data())) /
                       (2 * h);
    REQUIRE(d[i] == Approx(num).margin(1e-7));
  }
  const std::vector<std::int32_t> bad{0, 6, 0, 0, 0};
  CHECK_THROWS_WITH(host::cross_entropy_forward(rows, cols, logits.data(), bad.data(), probs.data()),
                    Catch::Contains("target 6 of row 1"));
}

TEST_CASE("bias, add, scale and axpby", "[backend][kernels]") {
  const std::size_t rows = 3, cols = 4;
  Vec y(rows * cols, 1.0), bias = random_vec(cols, 7), db(cols, 0.0);
  host::bias_add_forward(rows, cols, bias.data(), y.data());
  CHECK(y[5] == Approx(1.0 + bias[1]));
  const Vec dy = random_vec(rows * cols, 8);
  host::bias_add_backward(rows, cols, dy.data(), db.data());
  CHECK(db[2] == Approx(dy[2] + dy[6] + dy[10]));
  Vec a{1, 2, 3}, b{10, 20, 30}, out(3);
  host::add(3, a.data(), b.data(), out.data());
  CHECK(out == Vec{11, 22, 33});
  host::scale(3, 2.0, out.data());
  CHECK(out == Vec{22, 44, 66});
  host::axpby(3, 2.0, a.data(), 0.5, out.data());
  CHECK(out == Vec{13, 26, 39});
}

TEST_CASE("dropout: deterministic, shard-consistent, rate and scaling", "[backend][kernels]") {
  const std::size_t rows = 64, cols = 32;
  const Vec x(rows * cols, 1.0);
  Vec y(rows * cols);
  host::DropoutMask mask{5, 1, 0.25, cols, 0, 0};
  mask.apply(rows, cols, x.data(), y.data());
  std::size_t kept = 0;
  for (double v : y) {
    REQUIRE((v == 0.0 || v == Approx(1.0 / 0.75)));
    kept += v != 0.0;
  }
  CHECK(double(kept) / double(rows * cols) == Approx(0.75).margin(0.03));
  // The right half as a column shard drops exactly the same elements.
  Vec xs(rows * cols / 2, 1.0), ys(rows * cols / 2);
  host::DropoutMask shard{5, 1, 0.25, cols, 0, cols / 2};
  shard.apply(rows, cols / 2, xs.data(), ys.data());
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols / 2; ++c) REQUIRE(ys[r * cols / 2 + c] == y[r * cols + cols / 2 + c]);
  host::DropoutMask bad{5, 1, 1.0, cols, 0, 0};
  CHECK_THROWS_WITH(bad.apply(rows, cols, x.data(), y.data()), Catch::Contains("[0, 1)"));
}

TEST_CASE("row kernels: gather, scatter, weighted scatter-add and its backward move rows by index", "[kernels][rows]") {
  using F = std::vector<float>;
  const std::size_t d = 3;
  const F src{0, 1, 2, 10, 11, 12, 20, 21, 22};  // rows 0, 1, 2
  const std::vector<std::int32_t> index{2, 0, 2, 1};
  F g(4 * d);
  host::gather_rows(4, d, index.data(), src.data(), g.data());
  CHECK(g == F{20, 21, 22, 0, 1, 2, 20, 21, 22, 10, 11, 12});
  F s(9, -1.0f);
  const std::vector<std::int32_t> perm{1, 2, 0};
  host::scatter_rows(3, d, perm.data(), src.data(), s.data());
  CHECK(s == F{20, 21, 22, 0, 1, 2, 10, 11, 12});
  // Token 2 gets two routed rows: 0.5 * g0 + 0.25 * g2; token 0 one; token 1 one; unweighted adds plain rows.
  const F w{0.5f, 2.0f, 0.25f, 1.0f};
  F y(9, 0.0f);
  host::scatter_add_rows(4, d, index.data(), w.data(), g.data(), y.data());
  CHECK(y == F{0, 2, 4, 10, 11, 12, 15, 15.75f, 16.5f});
  host::scatter_add_rows(4, d, index.data(), nullptr, g.data(), y.data());
  CHECK(y == F{0, 3, 6, 20, 22, 24, 55, 57.75f, 60.5f});
  // Backward of y = sum_i w_i scatter(g_i): dg_i = w_i dy[index_i], dw_i = <dy[index_i], g_i>.
  const F dy{1, 0, 0, 0, 1, 0, 0, 0, 1};
  F dg(4 * d), dw(4);
  host::scatter_add_rows_backward(4, d, index.data(), w.data(), dy.data(), g.data(), dg.data(), dw.data());
  CHECK(dg == F{0, 0, 0.5f, 2, 0, 0, 0, 0, 0.25f, 0, 1, 0});
  CHECK(dw == F{22, 0, 22, 11});
}

TEST_CASE("causal softmax: query i of every [s, s] block normalises over keys 0..i only, the rest exactly 0",
          "[backend][kernels][causal]") {
  // Two blocks (heads or sequences) of s = 5 queries: row r is query r % s. Naive reference per row.
  const std::size_t s = 5, rows = 2 * s;
  const Vec x = random_vec(rows * s, 4, 2.0);
  const double scale = 0.7;
  Vec want(rows * s, 0.0);
  for (std::size_t r = 0; r < rows; ++r) {
    const std::size_t i = r % s;
    double z = 0;
    for (std::size_t c = 0; c <= i; ++c) z += std::exp(scale * x[r * s + c]);
    for (std::size_t c = 0; c <= i; ++c) want[r * s + c] = std::exp(scale * x[r * s + c]) / z;
  }
  Vec yd(rows * s, -1.0);
  host::softmax_forward(rows, s, x.data(), yd.data(), true, scale);
  std::vector<float> xf(x.begin(), x.end()), yf(rows * s, -1.0f);
  host::softmax_forward(rows, s, xf.data(), yf.data(), true, float(scale));
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < s; ++c) {
      INFO("row " << r << " (query " << r % s << "), key " << c);
      CHECK(yd[r * s + c] == Approx(want[r * s + c]).margin(1e-15));
      CHECK(yf[r * s + c] == Approx(want[r * s + c]).margin(1e-7).epsilon(1e-5));
      if (c > r % s) {
        CHECK(yd[r * s + c] == 0.0);
        CHECK(yf[r * s + c] == 0.0f);
      }
    }
  // A future key's score changes nothing for the queries before it.
  std::vector<float> xf2 = xf, yf2(rows * s);
  for (std::size_t r = 0; r < rows; ++r) xf2[r * s + s - 1] += 50.0f;
  host::softmax_forward(rows, s, xf2.data(), yf2.data(), true, float(scale));
  for (std::size_t r = 0; r < rows; ++r)
    if (r % s < s - 1)
      for (std::size_t c = 0; c < s; ++c) CHECK(yf2[r * s + c] == yf[r * s + c]);
}

// Rows whose width is a multiple of the kernels' block (attention's s = 32, 48, 64...) are computed over the whole
// width with the future keys masked: each must be, bit for bit, the plain softmax of its valid prefix alone, and
// the masked entries exactly 0 even when their scores are NaN or huge.
TEST_CASE(
    "causal softmax over block-wide rows: each row is the softmax of its prefix bit for bit, NaN future keys "
    "masked",
    "[backend][kernels][causal]") {
  for (std::size_t s : {std::size_t(16), std::size_t(48)}) {
    const std::size_t rows = 2 * s;
    const Vec x = random_vec(rows * s, 9, 3.0);
    std::vector<float> xf(x.begin(), x.end());
    for (std::size_t r = 0; r < rows; ++r)
      if (r % s + 1 < s) xf[r * s + s - 1] = (r % 2) ? std::numeric_limits<float>::quiet_NaN() : 1e30f;
    std::vector<float> y(rows * s, -1.0f);
    const float scale = 0.35f;
    host::softmax_forward(rows, s, xf.data(), y.data(), true, scale);
    for (std::size_t r = 0; r < rows; ++r) {
      const std::size_t valid = r % s + 1;
      INFO("s = " << s << ", row " << r << " (" << valid << " keys)");
      std::vector<float> prefix(valid);
      host::softmax_forward(1, valid, xf.data() + r * s, prefix.data(), false, scale);
      CHECK(std::memcmp(prefix.data(), y.data() + r * s, valid * sizeof(float)) == 0);
      for (std::size_t c = valid; c < s; ++c) CHECK(y[r * s + c] == 0.0f);
    }
  }
}

TEST_CASE("embedding kernels: lookup within a vocabulary block, zeros outside, scatter-add of repeated ids",
          "[backend][kernels][embedding]") {
  const std::size_t vocab = 6, dim = 3;
  const std::vector<std::int32_t> ids{4, 1, 4, 5, 0, 2};
  const Vec table = random_vec(vocab * dim, 5), dout = random_vec(ids.size() * dim, 6);
  for (std::size_t offset : {std::size_t(0), std::size_t(3)}) {
    const std::size_t local = offset == 0 ? vocab : 3;  // the whole table, or rows [3, 6) of it
    INFO("vocabulary block [" << offset << ", " << offset + local << ")");
    const double* block = table.data() + offset * dim;
    Vec out(ids.size() * dim, -1.0), grad(local * dim, 0.5);
    host::embedding_forward(ids.size(), dim, ids.data(), block, out.data(), offset, local);
    host::embedding_backward(ids.size(), dim, ids.data(), dout.data(), grad.data(), offset, local);
    Vec want_grad(local * dim, 0.5);
    for (std::size_t t = 0; t < ids.size(); ++t) {
      const auto id = std::size_t(ids[t]);
      const bool mine = id >= offset && id < offset + local;
      for (std::size_t c = 0; c < dim; ++c) {
        CHECK(out[t * dim + c] == (mine ? table[id * dim + c] : 0.0));
        if (mine) want_grad[(id - offset) * dim + c] += dout[t * dim + c];
      }
    }
    for (std::size_t i = 0; i < grad.size(); ++i) CHECK(grad[i] == Approx(want_grad[i]).margin(1e-15));
  }
}
