// The online-softmax operations (backend/ops/online_softmax.hpp) against softmax over the concatenation of
// the key blocks computed at once by naive loops in double: blocks of odd sizes, a causal diagonal inside a
// block, a block the causal mask hides entirely, rows that see no key at all, padded strides.
// Tolerance as everywhere in the nn tests: ||ops - reference||_2 <= 1e-5 ||reference||_2.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include <mpar/backend/detail/online_softmax_backend.hpp>
#include <mpar/backend/host/host_backend.hpp>

#include "nn_test_support.hpp"

using namespace mpar;
using namespace mpar::testing;

namespace {

/**
 * `rows` queries at global positions `query_pos, query_pos + 1, ...` attending over consecutive key blocks of
 * the given sizes (keys at positions 0, 1, ...): key `k` is visible to query `q` iff `k <= q`.
 */
struct OnlineSoftmaxCase {
  std::string name;
  std::size_t heads, rows, head_dim;
  std::ptrdiff_t query_pos;
  std::vector<std::size_t> block_cols;
  [[nodiscard]] std::size_t keys() const {
    std::size_t n = 0;
    for (std::size_t c : block_cols) n += c;
    return n;
  }
  // Padded layouts, so that a kernel mixing up rows, heads and strides is caught.
  [[nodiscard]] std::size_t stat_stride() const { return rows + 3; }
  [[nodiscard]] std::size_t out_ld() const { return heads * head_dim + 2; }
};

/** Deterministic inputs: scores [heads, rows, keys], values [keys, heads * d], output gradient, dP blocks. */
struct OnlineSoftmaxInputs {
  std::vector<float> scores, values, dout, dp;
  explicit OnlineSoftmaxInputs(const OnlineSoftmaxCase& c) {
    const std::size_t k = c.keys();
    const auto draw = [](std::size_t n, std::uint64_t stream) {
      std::vector<float> v(n);
      const CounterRng rng{777, stream};
      for (std::size_t i = 0; i < n; ++i) v[i] = float(2.0 * rng.normal(i));
      return v;
    };
    scores = draw(c.heads * c.rows * k, 1);
    values = draw(k * c.heads * c.head_dim, 2);
    dout = draw(c.rows * c.out_ld(), 3);
    dp = draw(c.heads * c.rows * k, 4);
  }
};

/** Softmax over all the keys at once, in double: probabilities, output, log-sum-exp, delta and dS. */
struct OnlineSoftmaxReference {
  std::vector<double> p, out, lse, delta,
      ds;  // p, ds: [heads, rows, keys]; out: [rows, heads * d]; lse, delta: [heads, rows]
  OnlineSoftmaxReference(const OnlineSoftmaxCase& c, const OnlineSoftmaxInputs& in) {
    const std::size_t k = c.keys(), hd = c.heads * c.head_dim;
    p.assign(c.heads * c.rows * k, 0.0), ds = p, out.assign(c.rows * hd, 0.0);
    lse.assign(c.heads * c.rows, -std::numeric_limits<double>::infinity()), delta.assign(c.heads * c.rows, 0.0);
    for (std::size_t h = 0; h < c.heads; ++h)
      for (std::size_t i = 0; i < c.rows; ++i) {
        const std::ptrdiff_t q = c.query_pos + std::ptrdiff_t(i);
        double mx = -std::numeric_limits<double>::infinity();
        for (std::size_t j = 0; j < k && std::ptrdiff_t(j) <= q; ++j)
          mx = std::max(mx, double(in.scores[(h * c.rows + i) * k + j]));
        if (mx == -std::numeric_limits<double>::infinity()) continue;  // no visible key: p = 0, out = 0, lse = -inf
        double sum = 0;
        for (std::size_t j = 0; j < k && std::ptrdiff_t(j) <= q; ++j)
          sum += std::exp(double(in.scores[(h * c.rows + i) * k + j]) - mx);
        lse[h * c.rows + i] = mx + std::log(sum);
        for (std::size_t j = 0; j < k && std::ptrdiff_t(j) <= q; ++j)
          p[(h * c.rows + i) * k + j] = std::exp(double(in.scores[(h * c.rows + i) * k + j]) - mx) / sum;
        for (std::size_t x = 0; x < c.head_dim; ++x) {
          double o = 0;
          for (std::size_t j = 0; j < k; ++j) o += p[(h * c.rows + i) * k + j] * in.values[j * hd + h * c.head_dim + x];
          out[i * hd + h * c.head_dim + x] = o;
        }
      }
    for (std::size_t h = 0; h < c.heads; ++h)
      for (std::size_t i = 0; i < c.rows; ++i) {
        double d = 0;
        for (std::size_t x = 0; x < c.head_dim; ++x)
          d += double(in.dout[i * c.out_ld() + h * c.head_dim + x]) * out[i * hd + h * c.head_dim + x];
        delta[h * c.rows + i] = d;
        for (std::size_t j = 0; j < k; ++j) {
          const std::size_t e = (h * c.rows + i) * k + j;
          ds[e] = p[e] * (double(in.dp[e]) - d);
        }
      }
  }
};

/** What the operations of backend B computed, gathered into the reference's layouts. */
struct OnlineSoftmaxResult {
  std::vector<float> p, out, lse, delta, ds;
};

/** The forward over the blocks in order (update, then P V added by plain loops), finish, delta, each block's backward. */
template <class B>
OnlineSoftmaxResult run_online_softmax(const OnlineSoftmaxCase& c, const OnlineSoftmaxInputs& in) {
  const std::size_t k = c.keys(), hd = c.heads * c.head_dim, ss = c.stat_stride(), ld = c.out_ld();
  std::vector<float> row_max(c.heads * ss, -std::numeric_limits<float>::infinity()), row_sum(c.heads * ss, 0.0f),
      acc(c.rows * ld, 0.0f), delta(c.heads * ss, 0.0f);
  auto block_of = [&](std::size_t k0, std::size_t cols) {
    return SoftmaxBlock{c.heads, c.rows, cols, c.head_dim, ss, ld, c.query_pos - std::ptrdiff_t(k0)};
  };
  auto slice = [&](const std::vector<float>& full, std::size_t k0, std::size_t cols) {
    std::vector<float> s(c.heads * c.rows * cols);
    for (std::size_t r = 0; r < c.heads * c.rows; ++r)
      for (std::size_t j = 0; j < cols; ++j) s[r * cols + j] = full[r * k + k0 + j];
    return s;
  };
  std::size_t k0 = 0;
  for (std::size_t cols : c.block_cols) {
    std::vector<float> sc = slice(in.scores, k0, cols);
    B::run(ops::online_softmax_update{.block = block_of(k0, cols),
                                      .scores = sc.data(),
                                      .row_max = row_max.data(),
                                      .row_sum = row_sum.data(),
                                      .out = acc.data()});
    for (std::size_t h = 0; h < c.heads; ++h)  // acc += P V, the caller's GEMM
      for (std::size_t i = 0; i < c.rows; ++i)
        for (std::size_t x = 0; x < c.head_dim; ++x) {
          float s = 0;
          for (std::size_t j = 0; j < cols; ++j)
            s += sc[(h * c.rows + i) * cols + j] * in.values[(k0 + j) * hd + h * c.head_dim + x];
          acc[i * ld + h * c.head_dim + x] += s;
        }
    k0 += cols;
  }
  B::run(ops::online_softmax_finish{.heads = c.heads,
                                    .rows = c.rows,
                                    .head_dim = c.head_dim,
                                    .stat_stride = ss,
                                    .out_ld = ld,
                                    .row_max = row_max.data(),
                                    .row_sum = row_sum.data(),
                                    .out = acc.data()});
  B::run(ops::online_softmax_delta{.heads = c.heads,
                                   .rows = c.rows,
                                   .head_dim = c.head_dim,
                                   .stat_stride = ss,
                                   .out_ld = ld,
                                   .dout = in.dout.data(),
                                   .out = acc.data(),
                                   .delta = delta.data()});
  OnlineSoftmaxResult res;
  res.p.assign(c.heads * c.rows * k, 0.0f), res.ds = res.p;
  k0 = 0;
  for (std::size_t cols : c.block_cols) {
    std::vector<float> p = slice(in.scores, k0, cols), dp = slice(in.dp, k0, cols);
    B::run(ops::online_softmax_backward{
        .block = block_of(k0, cols), .lse = row_max.data(), .delta = delta.data(), .p = p.data(), .dp = dp.data()});
    for (std::size_t r = 0; r < c.heads * c.rows; ++r)
      for (std::size_t j = 0; j < cols; ++j)
        res.p[r * k + k0 + j] = p[r * cols + j], res.ds[r * k + k0 + j] = dp[r * cols + j];
    k0 += cols;
  }
  for (std::size_t i = 0; i < c.rows; ++i)
    for (std::size_t x = 0; x < hd; ++x) res.out.push_back(acc[i * ld + x]);
  for (std::size_t h = 0; h < c.heads; ++h)
    for (std::size_t i = 0; i < c.rows; ++i) {
      res.lse.push_back(row_max[h * ss + i]);
      res.delta.push_back(delta[h * ss + i]);
    }
  return res;
}

std::vector<float> online_softmax_floats(const std::vector<double>& v) { return {v.begin(), v.end()}; }

template <class B>
void check_online_softmax(const OnlineSoftmaxCase& c) {
  INFO(c.name);
  const OnlineSoftmaxInputs in(c);
  const OnlineSoftmaxReference ref(c, in);
  const OnlineSoftmaxResult got = run_online_softmax<B>(c, in);
  CHECK(rel_err(got.out, online_softmax_floats(ref.out)) <= rel_tol);
  CHECK(rel_err(got.p, online_softmax_floats(ref.p)) <= rel_tol);
  CHECK(rel_err(got.delta, online_softmax_floats(ref.delta)) <= rel_tol);
  CHECK(rel_err(got.ds, online_softmax_floats(ref.ds)) <= rel_tol);
  // The log-sum-exp: finite where the row saw a key, -inf (and its output 0) where it saw none.
  std::vector<float> lse_got, lse_want;
  for (std::size_t e = 0; e < ref.lse.size(); ++e) {
    if (std::isinf(ref.lse[e])) {
      CHECK(got.lse[e] == -std::numeric_limits<float>::infinity());
      continue;
    }
    lse_got.push_back(got.lse[e]), lse_want.push_back(float(ref.lse[e]));
  }
  CHECK(rel_err(lse_got, lse_want) <= rel_tol);
}

}  // namespace

TEST_CASE("online softmax over key blocks equals softmax over their concatenation", "[online_softmax]") {
  static_assert(mpar::detail::online_softmax_backend<HostBackend>);
  // Queries at positions 6..10: keys 0..3 all visible, 4..10 the causal diagonal, 11..13 hidden from every row.
  check_online_softmax<HostBackend>({"odd blocks, a diagonal, a fully masked block", 3, 5, 3, 6, {4, 7, 3}});
  check_online_softmax<HostBackend>({"every key visible", 2, 4, 5, 100, {5, 1, 6}});
  // Queries at positions -2..2: rows 0 and 1 see no key at all.
  check_online_softmax<HostBackend>({"rows that see no key", 2, 5, 2, -2, {3, 2}});
  check_online_softmax<HostBackend>({"one block, one head, the diagonal", 1, 7, 4, 0, {7}});
}

TEST_CASE("the block's causal mask is by position: visible keys per row", "[online_softmax]") {
  // Independent count of k <= i + offset over 0 <= k < cols.
  for (std::ptrdiff_t offset : {-9, -3, -1, 0, 2, 6, 40})
    for (std::size_t i = 0; i < 6; ++i) {
      const SoftmaxBlock b{1, 6, 5, 1, 6, 1, offset};
      std::size_t n = 0;
      for (std::ptrdiff_t k = 0; k < 5; ++k) n += k <= std::ptrdiff_t(i) + offset ? 1 : 0;
      CHECK(b.visible(i) == n);
    }
}
