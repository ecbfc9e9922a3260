#pragma once
// The baseline of the tensor-parallel benchmark: the same pre-LN transformer block (no dropout) written
// directly with CBLAS calls and loops over std::vector, without any mpar type. Its cost against
// mpar's TransformerBlock at TP = 1 is the cost of the abstraction.
#include <cblas.h>

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace baseline {

using Vec = std::vector<float>;

inline void sgemm(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                  std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
              alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
}

struct Block {
  std::size_t t, h, heads, f, seq;
  Vec g1, be1, wqkv, bqkv, wo, bo, g2, be2, w1, b1, w2, b2;              // parameters
  Vec dg1, dbe1, dwqkv, dbqkv, dwo, dbo, dg2, dbe2, dw1, db1, dw2, db2;  // gradients
  Vec x, xn1, mean1, rstd1, qkv, probs, o, h1, xn2, mean2, rstd2, u, g;  // saved activations

  Block(std::size_t t_, std::size_t h_, std::size_t heads_, std::size_t f_, std::size_t seq_)
      : t(t_), h(h_), heads(heads_), f(f_), seq(seq_) {
    auto rnd = [](std::size_t n, float s) {
      Vec v(n);
      unsigned x = 12345;
      for (auto& e : v) e = s * ((float((x = x * 1664525u + 1013904223u) >> 8) / float(1u << 24)) - 0.5f);
      return v;
    };
    g1 = Vec(h, 1.0f), be1 = Vec(h, 0.0f), g2 = g1, be2 = be1;
    wqkv = rnd(h * 3 * h, 0.05f), bqkv = Vec(3 * h), wo = rnd(h * h, 0.05f), bo = Vec(h);
    w1 = rnd(h * f, 0.05f), b1 = Vec(f), w2 = rnd(f * h, 0.05f), b2 = Vec(h);
    dg1 = Vec(h), dbe1 = Vec(h), dg2 = Vec(h), dbe2 = Vec(h), dwqkv = Vec(h * 3 * h), dbqkv = Vec(3 * h);
    dwo = Vec(h * h), dbo = Vec(h), dw1 = Vec(h * f), db1 = Vec(f), dw2 = Vec(f * h), db2 = Vec(h);
  }

  static void ln_fwd(std::size_t rows, std::size_t n, const float* x, const float* gm, const float* bt, float* y,
                     float* mu, float* rs) {
    for (std::size_t r = 0; r < rows; ++r) {
      const float* xr = x + r * n;
      float m = 0, v = 0;
      for (std::size_t c = 0; c < n; ++c) m += xr[c];
      m /= float(n);
      for (std::size_t c = 0; c < n; ++c) v += (xr[c] - m) * (xr[c] - m);
      const float s = 1.0f / std::sqrt(v / float(n) + 1e-5f);
      mu[r] = m, rs[r] = s;
      for (std::size_t c = 0; c < n; ++c) y[r * n + c] = (xr[c] - m) * s * gm[c] + bt[c];
    }
  }
  static void ln_bwd(std::size_t rows, std::size_t n, const float* x, const float* mu, const float* rs, const float* gm,
                     const float* dy, float* dx, float* dg, float* db) {
    for (std::size_t r = 0; r < rows; ++r) {
      float sg = 0, sgx = 0;
      for (std::size_t c = 0; c < n; ++c) {
        const float xh = (x[r * n + c] - mu[r]) * rs[r], gg = dy[r * n + c] * gm[c];
        sg += gg, sgx += gg * xh, dg[c] += dy[r * n + c] * xh, db[c] += dy[r * n + c];
      }
      for (std::size_t c = 0; c < n; ++c) {
        const float xh = (x[r * n + c] - mu[r]) * rs[r];
        dx[r * n + c] = rs[r] * (dy[r * n + c] * gm[c] - (sg + xh * sgx) / float(n));
      }
    }
  }
  static void add_bias(std::size_t rows, std::size_t n, const float* b, float* y) {
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < n; ++c) y[r * n + c] += b[c];
  }
  static void col_sums(std::size_t rows, std::size_t n, const float* dy, float* db) {
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < n; ++c) db[c] += dy[r * n + c];
  }

  Vec forward(const Vec& in) {
    x = in;
    const std::size_t d = h / heads, ld = 3 * h;
    xn1.resize(t * h), mean1.resize(t), rstd1.resize(t);
    ln_fwd(t, h, x.data(), g1.data(), be1.data(), xn1.data(), mean1.data(), rstd1.data());
    qkv.assign(t * ld, 0.0f);
    sgemm(false, false, t, ld, h, 1, xn1.data(), h, wqkv.data(), ld, 0, qkv.data(), ld);
    add_bias(t, ld, bqkv.data(), qkv.data());
    const std::size_t nb = t / seq;
    probs.assign(nb * heads * seq * seq, 0.0f);
    o.assign(t * h, 0.0f);
    const float sc = 1.0f / std::sqrt(float(d));
    for (std::size_t b = 0; b < nb; ++b)
      for (std::size_t hd = 0; hd < heads; ++hd) {
        const float* q = qkv.data() + b * seq * ld + hd * d;
        float* p = probs.data() + (b * heads + hd) * seq * seq;
        sgemm(false, true, seq, seq, d, sc, q, ld, q + h, ld, 0, p, seq);
        for (std::size_t i = 0; i < seq; ++i) {
          float mx = -std::numeric_limits<float>::infinity(), s = 0;
          for (std::size_t j = 0; j <= i; ++j) mx = std::max(mx, p[i * seq + j]);
          for (std::size_t j = 0; j < seq; ++j) s += (p[i * seq + j] = j <= i ? std::exp(p[i * seq + j] - mx) : 0.0f);
          for (std::size_t j = 0; j < seq; ++j) p[i * seq + j] /= s;
        }
        sgemm(false, false, seq, d, seq, 1, p, seq, q + 2 * h, ld, 0, o.data() + b * seq * h + hd * d, h);
      }
    h1.assign(t * h, 0.0f);
    sgemm(false, false, t, h, h, 1, o.data(), h, wo.data(), h, 0, h1.data(), h);
    add_bias(t, h, bo.data(), h1.data());
    for (std::size_t i = 0; i < t * h; ++i) h1[i] += x[i];
    xn2.resize(t * h), mean2.resize(t), rstd2.resize(t);
    ln_fwd(t, h, h1.data(), g2.data(), be2.data(), xn2.data(), mean2.data(), rstd2.data());
    u.assign(t * f, 0.0f);
    sgemm(false, false, t, f, h, 1, xn2.data(), h, w1.data(), f, 0, u.data(), f);
    add_bias(t, f, b1.data(), u.data());
    g.resize(t * f);
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    for (std::size_t i = 0; i < t * f; ++i) g[i] = 0.5f * u[i] * (1 + std::tanh(k0 * (u[i] + k1 * u[i] * u[i] * u[i])));
    Vec y(t * h, 0.0f);
    sgemm(false, false, t, h, f, 1, g.data(), f, w2.data(), h, 0, y.data(), h);
    add_bias(t, h, b2.data(), y.data());
    for (std::size_t i = 0; i < t * h; ++i) y[i] += h1[i];
    return y;
  }

  Vec backward(const Vec& dy) {
    const std::size_t d = h / heads, ld = 3 * h;
    // MLP
    Vec dg(t * f, 0.0f);
    sgemm(true, false, f, h, t, 1, g.data(), f, dy.data(), h, 1, dw2.data(), h);
    col_sums(t, h, dy.data(), db2.data());
    sgemm(false, true, t, f, h, 1, dy.data(), h, w2.data(), h, 0, dg.data(), f);
    const float k0 = 0.7978845608028654f, k1 = 0.044715f;
    for (std::size_t i = 0; i < t * f; ++i) {
      const float v = u[i], th = std::tanh(k0 * (v + k1 * v * v * v));
      dg[i] *= 0.5f * (1 + th) + 0.5f * v * k0 * (1 + 3 * k1 * v * v) * (1 - th * th);
    }
    sgemm(true, false, h, f, t, 1, xn2.data(), h, dg.data(), f, 1, dw1.data(), f);
    col_sums(t, f, dg.data(), db1.data());
    Vec dxn(t * h, 0.0f), dh(t * h, 0.0f);
    sgemm(false, true, t, h, f, 1, dg.data(), f, w1.data(), f, 0, dxn.data(), h);
    ln_bwd(t, h, h1.data(), mean2.data(), rstd2.data(), g2.data(), dxn.data(), dh.data(), dg2.data(), dbe2.data());
    for (std::size_t i = 0; i < t * h; ++i) dh[i] += dy[i];
    // attention
    sgemm(true, false, h, h, t, 1, o.data(), h, dh.data(), h, 1, dwo.data(), h);
    col_sums(t, h, dh.data(), dbo.data());
    Vec dout(t * h, 0.0f), dqkv(t * ld, 0.0f), dp(seq * seq);
    sgemm(false, true, t, h, h, 1, dh.data(), h, wo.data(), h, 0, dout.data(), h);
    const float sc = 1.0f / std::sqrt(float(d));
    for (std::size_t b = 0; b < t / seq; ++b)
      for (std::size_t hd = 0; hd < heads; ++hd) {
        const float* q = qkv.data() + b * seq * ld + hd * d;
        const float* p = probs.data() + (b * heads + hd) * seq * seq;
        const float* go = dout.data() + b * seq * h + hd * d;
        float* dq = dqkv.data() + b * seq * ld + hd * d;
        sgemm(true, false, seq, d, seq, 1, p, seq, go, h, 0, dq + 2 * h, ld);
        sgemm(false, true, seq, seq, d, 1, go, h, q + 2 * h, ld, 0, dp.data(), seq);
        for (std::size_t i = 0; i < seq; ++i) {
          float dot = 0;
          for (std::size_t j = 0; j < seq; ++j) dot += p[i * seq + j] * dp[i * seq + j];
          for (std::size_t j = 0; j < seq; ++j) dp[i * seq + j] = p[i * seq + j] * (dp[i * seq + j] - dot);
        }
        sgemm(false, false, seq, d, seq, sc, dp.data(), seq, q + h, ld, 0, dq, ld);
        sgemm(true, false, seq, d, seq, sc, dp.data(), seq, q, ld, 0, dq + h, ld);
      }
    sgemm(true, false, h, ld, t, 1, xn1.data(), h, dqkv.data(), ld, 1, dwqkv.data(), ld);
    col_sums(t, ld, dqkv.data(), dbqkv.data());
    Vec dx(t * h, 0.0f);
    sgemm(false, true, t, h, ld, 1, dqkv.data(), ld, wqkv.data(), ld, 0, dxn.data(), h);
    ln_bwd(t, h, x.data(), mean1.data(), rstd1.data(), g1.data(), dxn.data(), dx.data(), dg1.data(), dbe1.data());
    for (std::size_t i = 0; i < t * h; ++i) dx[i] += dh[i];
    return dx;
  }
};

}  // namespace baseline
