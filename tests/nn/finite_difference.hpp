#pragma once
// Independent references for the layer tests: naive double-precision loops for every layer's forward
// (written from the formulas, calling nothing of mpar's kernels or layers) and central finite
// differences of the scalar loss sum(y * dy) through them, which give the exact gradients the layers'
// analytic backwards must reproduce.
#include <cmath>
#include <cstddef>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace mpar::testing::ref {

using Vec = std::vector<double>;
/** Parameters by name, flattened row-major in the layer's global shape. */
using Params = std::map<std::string, Vec>;

/** ||a - b||_2 / ||b||_2 of an fp32 result against a double reference. */
inline double rel_err(std::span<const float> a, const Vec& b) {
  if (a.size() != b.size()) return 1e30;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

template <class T>
Vec to_double(std::span<const T> v) {
  return Vec(v.begin(), v.end());
}

/** y[T, out] = x[T, in] w[in, out] (+ b[out]). */
inline Vec linear(const Vec& x, std::size_t t, std::size_t in, std::size_t out, const Vec& w, const Vec* b) {
  Vec y(t * out, 0.0);
  for (std::size_t r = 0; r < t; ++r)
    for (std::size_t j = 0; j < out; ++j) {
      double s = b != nullptr ? (*b)[j] : 0.0;
      for (std::size_t i = 0; i < in; ++i) s += x[r * in + i] * w[i * out + j];
      y[r * out + j] = s;
    }
  return y;
}

/** (x - mean) / sqrt(var + eps) * gamma + beta per row, the biased variance. */
inline Vec layer_norm(const Vec& x, std::size_t t, std::size_t n, const Vec& gamma, const Vec& beta,
                      double eps = 1e-5) {
  Vec y(t * n);
  for (std::size_t r = 0; r < t; ++r) {
    double mean = 0, var = 0;
    for (std::size_t i = 0; i < n; ++i) mean += x[r * n + i];
    mean /= double(n);
    for (std::size_t i = 0; i < n; ++i) var += (x[r * n + i] - mean) * (x[r * n + i] - mean);
    var /= double(n);
    for (std::size_t i = 0; i < n; ++i)
      y[r * n + i] = (x[r * n + i] - mean) / std::sqrt(var + eps) * gamma[i] + beta[i];
  }
  return y;
}

/** GeLU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
inline Vec gelu(Vec x) {
  const double k = std::sqrt(2.0 / 3.14159265358979323846);
  for (double& v : x) v = 0.5 * v * (1.0 + std::tanh(k * (v + 0.044715 * v * v * v)));
  return x;
}

/**
 * Causal multi-head attention core, one loop per (sequence, head, query): qkv [T, 3h] holds (q | k | v),
 * each `heads` blocks of `head_dim` columns; token t = b * seq + s. Query i sees keys j <= i of its own
 * sequence: scores q.k / sqrt(d), softmax over j <= i, output sum_j p_j v_j. `future` > 0 lets each query
 * also see that many later keys (a deliberately wrong mask, to show the tests can tell).
 */
inline Vec attention_core(const Vec& qkv, std::size_t t, std::size_t heads, std::size_t head_dim, std::size_t seq,
                          std::size_t future = 0) {
  const std::size_t h = heads * head_dim, ld = 3 * h;
  Vec o(t * h, 0.0);
  for (std::size_t b = 0; b < t / seq; ++b)
    for (std::size_t hd = 0; hd < heads; ++hd)
      for (std::size_t i = 0; i < seq; ++i) {
        const std::size_t qi = b * seq + i, last = std::min(seq - 1, i + future);
        Vec s(last + 1);
        double mx = -1e300;
        for (std::size_t j = 0; j <= last; ++j) {
          double dot = 0;
          for (std::size_t c = 0; c < head_dim; ++c)
            dot += qkv[qi * ld + hd * head_dim + c] * qkv[(b * seq + j) * ld + h + hd * head_dim + c];
          s[j] = dot / std::sqrt(double(head_dim));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (double& v : s) z += (v = std::exp(v - mx));
        for (std::size_t c = 0; c < head_dim; ++c) {
          double acc = 0;
          for (std::size_t j = 0; j <= last; ++j) acc += s[j] / z * qkv[(b * seq + j) * ld + 2 * h + hd * head_dim + c];
          o[qi * h + hd * head_dim + c] = acc;
        }
      }
  return o;
}

/** Self-attention with parameters `<name>.qkv.{weight,bias}` ([h, 3h], [3h]) and `<name>.proj.{weight,bias}`. */
inline Vec attention(const Vec& x, std::size_t t, std::size_t hidden, std::size_t heads, std::size_t seq,
                     const Params& p, const std::string& name, std::size_t future = 0) {
  const Vec qkv = linear(x, t, hidden, 3 * hidden, p.at(name + ".qkv.weight"), &p.at(name + ".qkv.bias"));
  const Vec o = attention_core(qkv, t, heads, hidden / heads, seq, future);
  return linear(o, t, hidden, hidden, p.at(name + ".proj.weight"), &p.at(name + ".proj.bias"));
}

inline Vec add(Vec a, const Vec& b) {
  for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

/** The pre-LN transformer block without dropout: h = x + attn(ln1(x)); y = h + fc2(gelu(fc1(ln2(h)))). */
inline Vec block(const Vec& x, std::size_t t, std::size_t hidden, std::size_t heads, std::size_t ffn, std::size_t seq,
                 const Params& p, const std::string& name) {
  const Vec a = layer_norm(x, t, hidden, p.at(name + ".ln1.weight"), p.at(name + ".ln1.bias"));
  const Vec h = add(x, attention(a, t, hidden, heads, seq, p, name + ".attn"));
  const Vec n = layer_norm(h, t, hidden, p.at(name + ".ln2.weight"), p.at(name + ".ln2.bias"));
  const Vec f = gelu(linear(n, t, hidden, ffn, p.at(name + ".mlp.fc1.weight"), &p.at(name + ".mlp.fc1.bias")));
  return add(h, linear(f, t, ffn, hidden, p.at(name + ".mlp.fc2.weight"), &p.at(name + ".mlp.fc2.bias")));
}

/** d loss / d x and d loss / d every parameter, loss = sum(f(x, p) * dy), by central differences. */
struct Gradients {
  Vec dx;
  Params dp;
};
inline Gradients numeric_gradients(const std::function<Vec(const Vec&, const Params&)>& f, Vec x, Params p,
                                   const Vec& dy, double h = 1e-6) {
  auto loss = [&] {
    const Vec y = f(x, p);
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += y[i] * dy[i];
    return s;
  };
  auto central = [&](double& v) {
    const double keep = v;
    v = keep + h;
    const double up = loss();
    v = keep - h;
    const double down = loss();
    v = keep;
    return (up - down) / (2 * h);
  };
  Gradients g;
  g.dx.resize(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) g.dx[i] = central(x[i]);
  for (auto& [name, v] : p) {
    Vec& d = g.dp[name];
    d.resize(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) d[i] = central(v[i]);
  }
  return g;
}

}  // namespace mpar::testing::ref
