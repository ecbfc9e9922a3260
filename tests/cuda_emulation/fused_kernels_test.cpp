// mpar's fused CUDA kernels (backend/gpu/accumulate.hpp, residual_layernorm.hpp, moe_ops.hpp, flash_attention.hpp,
// qkv_attention.hpp) run on the emulated runtime against the host: the host kernels the fused ones replace
// (ops::accumulate's, host::add then host::layernorm_*, host::moe_*), and for attention, which the host backend
// computes as separate GEMMs and softmaxes, naive loops in double.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "device_array.hpp"
#include "mpar/backend/gpu/accumulate.hpp"
#include "mpar/backend/gpu/flash_attention.hpp"
#include "mpar/backend/gpu/moe_ops.hpp"
#include "mpar/backend/gpu/qkv_attention.hpp"
#include "mpar/backend/gpu/residual_layernorm.hpp"
#include "mpar/backend/host/kernels.hpp"
#include "mpar/backend/host/moe_routing.hpp"
#include "mpar/backend/ops/accumulate.hpp"
#include "mpar/core/init.hpp"

namespace mpar::fused_emulation_test {

using emulation_test::DeviceArray;
using emulation_test::require_close;

/** Random values in [lo, hi), exactly representable in T. */
template <class T = float>
std::vector<T> values(std::size_t n, std::uint64_t seed, float lo = -2.0f, float hi = 2.0f) {
  const CounterRng rng{seed, 11};
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = T(lo + (hi - lo) * float(rng.uniform(i)));
  return v;
}
template <class T>
std::vector<float> widen(const std::vector<T>& v) {
  return {v.begin(), v.end()};
}

TEST_CASE("fused kernels on the emulation: accumulate equals the host bit for bit") {
  for (std::size_t n : {0, 1, 5, 37}) {
    INFO("n = " << n);
    const auto x = values(n, 1);
    DeviceArray<float> dx(x);
    DeviceArray<double> acc(std::vector<double>{0.25});
    double want = 0.25;
    gpu::launch(ops::accumulate{.n = n, .x = dx.get(), .scale = 0.125, .acc = acc.get()});
    host_reference(ops::accumulate{.n = n, .x = x.data(), .scale = 0.125, .acc = &want});
    REQUIRE(acc.host()[0] == want);
  }
}

// [rows, cols]: a single element, columns below, at and over the block (256), rows over the backward's grid (2
// blocks per emulated multiprocessor: 8) so its blocks stride over rows.
const std::pair<std::size_t, std::size_t> shapes[] = {{1, 1}, {3, 257}, {5, 31}, {130, 17}};

template <class T>
void check_residual_layernorm(std::span<const std::pair<std::size_t, std::size_t>> cases, double rel, double abs) {
  for (auto [rows, cols] : cases) {
    INFO("rows = " << rows << ", cols = " << cols);
    const std::size_t n = rows * cols;
    const auto x = values<T>(n, 2, -3, 5), branch = values<T>(n, 3), gamma = values<T>(cols, 4),
               beta = values<T>(cols, 5), dy = values<T>(n, 6), dres = values<T>(n, 7);
    DeviceArray<T> dx(x), db(branch), dg(gamma), dbeta(beta), ddy(dy), ddres(dres), h(n), y(n), dh(n);
    DeviceArray<float> mean(rows), rstd(rows), dgamma(std::vector<float>(cols, 0.25f)),
        ddbeta(std::vector<float>(cols, 0.25f));
    gpu::residual_layernorm_forward(rows, cols, dx.get(), db.get(), dg.get(), dbeta.get(), h.get(), y.get(), mean.get(),
                                    rstd.get());

    // The host: h = x + branch rounded to T, then layer norm of h as stored.
    std::vector<float> wh(n), wy(n), wmean(rows), wrstd(rows);
    host::add(n, widen(x).data(), widen(branch).data(), wh.data());
    for (float& v : wh) v = float(T(v));
    host::layernorm_forward(rows, cols, wh.data(), widen(gamma).data(), widen(beta).data(), wy.data(), wmean.data(),
                            wrstd.data());
    require_close(widen(h.host()), wh, 0, 0);
    require_close(mean.host(), wmean, 1e-5, 1e-5);
    require_close(rstd.host(), wrstd, 1e-5);
    require_close(widen(y.host()), wy, rel, abs);

    for (bool with_dres : {true, false}) {
      INFO("dres " << (with_dres ? "given" : "null"));
      gpu::residual_layernorm_backward(rows, cols, h.get(), mean.get(), rstd.get(), dg.get(), ddy.get(),
                                       with_dres ? ddres.get() : nullptr, dh.get(), dgamma.get(), ddbeta.get());
      std::vector<float> wdh(n), wdgamma(cols, 0.25f), wdbeta(cols, 0.25f);
      host::layernorm_backward(rows, cols, wh.data(), wmean.data(), wrstd.data(), widen(gamma).data(), widen(dy).data(),
                               wdh.data(), wdgamma.data(), wdbeta.data());
      if (with_dres) host::add(n, wdh.data(), widen(dres).data(), wdh.data());
      require_close(widen(dh.host()), wdh, rel, abs);
      require_close(dgamma.host(), wdgamma, 1e-4, 1e-4);
      require_close(ddbeta.host(), wdbeta, 1e-4, 1e-4);
      dgamma.upload(std::vector<float>(cols, 0.25f));
      ddbeta.upload(std::vector<float>(cols, 0.25f));
    }
  }
}

TEST_CASE(
    "fused kernels on the emulation: residual + layer norm forward and backward equal the host's add and "
    "layer norm") {
  check_residual_layernorm<float>(shapes, 1e-4, 1e-5);
  // A bf16 ulp: the result is rounded once more. Two shapes keep the test fast: one over the block, one over the grid.
  check_residual_layernorm<bf16>(std::span(shapes).subspan(1, 1), 1.0 / 128, 1.0 / 64);
  check_residual_layernorm<bf16>(std::span(shapes).subspan(3, 1), 1.0 / 128, 1.0 / 64);
}

TEST_CASE("fused kernels on the emulation: the MoE gate statistics, loss, slots and gate backward equal the host") {
  struct Case {
    std::size_t tokens, experts, k, capacity;
  };
  for (Case c : {Case{1, 2, 1, 1}, Case{37, 5, 2, 9}, Case{300, 8, 2, 40}, Case{6, 3, 2, 0}}) {
    INFO("tokens = " << c.tokens << ", experts = " << c.experts << ", k = " << c.k << ", capacity = " << c.capacity);
    const auto probs = values(c.tokens * c.experts, 8, 0, 1);
    // Each token picks k distinct experts; each expert keeps the first `capacity` tokens that picked it.
    std::vector<std::int32_t> choice(c.tokens * c.k), used(c.experts, 0), route_token;
    std::vector<std::vector<std::int32_t>> picked(c.experts);
    for (std::size_t t = 0; t < c.tokens; ++t)
      for (std::size_t j = 0; j < c.k; ++j) {
        choice[t * c.k + j] = std::int32_t(((t * 7 + t / 5) + j) % c.experts);  // k <= experts: distinct
        const auto chosen = std::size_t(choice[t * c.k + j]);
        if (picked[chosen].size() < c.capacity) picked[chosen].push_back(std::int32_t(t));
      }
    for (std::size_t e = 0; e < c.experts; ++e) {
      used[e] = std::int32_t(picked[e].size());
      route_token.insert(route_token.end(), picked[e].begin(), picked[e].end());
    }
    std::int32_t routed = 0;
    for (auto u : used) routed += u;
    const auto route_weight = values(route_token.size() + 1, 9, 0, 1);
    const auto dot = values(c.experts * c.capacity + 1, 10);

    DeviceArray<float> dprobs_in(probs), stats(2 * c.experts + 2), aux(1), dweight(route_weight), ddot(dot),
        slot_weight(c.experts * c.capacity + 1), dprobs(c.tokens * c.experts);
    DeviceArray<std::int32_t> dchoice(choice), drouted(std::vector<std::int32_t>{routed}), dused(used),
        droute(route_token.empty() ? std::vector<std::int32_t>{0} : route_token),
        slot_token(c.experts * c.capacity + 1);
    std::vector<float> wstats(2 * c.experts + 2), wslot_weight(c.experts * c.capacity), wdprobs(c.tokens * c.experts);
    std::vector<std::int32_t> wslot_token(c.experts * c.capacity);
    float waux = 0;

    gpu::moe_gate_stats(c.tokens, c.experts, c.k, dprobs_in.get(), dchoice.get(), drouted.get(), stats.get());
    host::moe_gate_stats(c.tokens, c.experts, c.k, probs.data(), choice.data(), &routed, wstats.data());
    require_close(stats.host(), wstats, 0, 0);  // both sum in token order

    gpu::moe_aux_loss(c.experts, c.k, 0.01f, stats.get(), aux.get());
    host::moe_aux_loss(c.experts, c.k, 0.01f, wstats.data(), &waux);
    REQUIRE(aux.host()[0] == waux);

    gpu::moe_slots(c.experts, c.capacity, dused.get(), droute.get(), dweight.get(), slot_token.get(),
                   slot_weight.get());
    host::moe_slots(c.experts, c.capacity, used.data(), route_token.data(), route_weight.data(), wslot_token.data(),
                    wslot_weight.data());
    auto got_tokens = slot_token.host();
    auto got_weights = slot_weight.host();
    got_tokens.pop_back();
    got_weights.pop_back();
    REQUIRE(got_tokens == wslot_token);
    require_close(got_weights, wslot_weight, 0, 0);

    gpu::moe_gate_backward(c.tokens, c.experts, c.k, c.capacity, slot_token.get(), ddot.get(), 0.5f, 0.01f, stats.get(),
                           dprobs.get());
    host::moe_gate_backward(c.tokens, c.experts, c.k, c.capacity, wslot_token.data(), dot.data(), 0.5f, 0.01f,
                            wstats.data(), wdprobs.data());
    require_close(dprobs.host(), wdprobs, 0, 0);
  }
}

/** Naive attention of one `[bh, s, d]` problem in double: o, lse and, given dout, dq, dk, dv. */
struct Attention {
  std::vector<double> o, lse, dq, dk, dv;
};
template <class T>
Attention naive_attention(std::size_t bh, std::size_t s, std::size_t d, const std::vector<T>& q,
                          const std::vector<T>& k, const std::vector<T>& v, const std::vector<T>& dout, double scale,
                          bool causal) {
  Attention r;
  r.o.assign(bh * s * d, 0);
  r.lse.assign(bh * s, 0);
  r.dq.assign(bh * s * d, 0);
  r.dk.assign(bh * s * d, 0);
  r.dv.assign(bh * s * d, 0);
  auto at = [d](const std::vector<T>& m, std::size_t base, std::size_t i, std::size_t c) {
    return double(m[base + i * d + c]);
  };
  for (std::size_t h = 0; h < bh; ++h) {
    const std::size_t base = h * s * d;
    std::vector<double> p(s * s, 0.0), dp(s * s, 0.0);
    for (std::size_t i = 0; i < s; ++i) {
      double mx = -INFINITY;
      for (std::size_t j = 0; j < s; ++j) {
        if (causal && j > i) continue;
        double sc = 0;
        for (std::size_t c = 0; c < d; ++c) sc += at(q, base, i, c) * at(k, base, j, c);
        p[i * s + j] = scale * sc;
        mx = std::max(mx, p[i * s + j]);
      }
      double sum = 0;
      for (std::size_t j = 0; j < s; ++j) sum += (causal && j > i) ? 0.0 : std::exp(p[i * s + j] - mx);
      for (std::size_t j = 0; j < s; ++j) p[i * s + j] = (causal && j > i) ? 0.0 : std::exp(p[i * s + j] - mx) / sum;
      r.lse[h * s + i] = mx + std::log(sum);
      for (std::size_t c = 0; c < d; ++c)
        for (std::size_t j = 0; j < s; ++j) r.o[base + i * d + c] += p[i * s + j] * at(v, base, j, c);
    }
    // dP = dO V^T, dS = P (dP - rowsum(dO o O)), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO.
    for (std::size_t i = 0; i < s; ++i) {
      double delta = 0;
      for (std::size_t c = 0; c < d; ++c) delta += at(dout, base, i, c) * r.o[base + i * d + c];
      for (std::size_t j = 0; j < s; ++j) {
        double g = 0;
        for (std::size_t c = 0; c < d; ++c) g += at(dout, base, i, c) * at(v, base, j, c);
        dp[i * s + j] = p[i * s + j] * (g - delta);
      }
    }
    for (std::size_t i = 0; i < s; ++i)
      for (std::size_t j = 0; j < s; ++j)
        for (std::size_t c = 0; c < d; ++c) {
          r.dq[base + i * d + c] += scale * dp[i * s + j] * at(k, base, j, c);
          r.dk[base + j * d + c] += scale * dp[i * s + j] * at(q, base, i, c);
          r.dv[base + j * d + c] += p[i * s + j] * at(dout, base, i, c);
        }
  }
  return r;
}

template <class T>
void require_near(const std::vector<T>& got, const std::vector<double>& want, double rel, double abs) {
  require_close(std::vector<double>(got.begin(), got.end()), want, rel, abs);
}

template <class T>
void check_flash_attention(std::span<const std::pair<std::size_t, std::size_t>> cases, double rel, double abs) {
  const std::size_t bh = 2;
  for (auto [d, s] : cases)
    for (bool causal : {false, true}) {
      INFO("d = " << d << ", s = " << s << ", causal = " << causal);
      const std::size_t n = bh * s * d;
      const auto q = values<T>(n, 12), k = values<T>(n, 13), v = values<T>(n, 14), dout = values<T>(n, 15);
      const float scale = 1.0f / std::sqrt(float(d));
      DeviceArray<T> dq_in(q), dk_in(k), dv_in(v), ddout(dout), o(n), dq(n), dk(n), dv(n);
      DeviceArray<float> lse(bh * s);
      gpu::flash_attention_forward(bh, s, d, dq_in.get(), dk_in.get(), dv_in.get(), o.get(), lse.get(), scale, causal);
      gpu::flash_attention_backward(bh, s, d, dq_in.get(), dk_in.get(), dv_in.get(), o.get(), lse.get(), ddout.get(),
                                    dq.get(), dk.get(), dv.get(), scale, causal);
      const Attention want = naive_attention(bh, s, d, q, k, v, dout, scale, causal);
      require_near(o.host(), want.o, rel, abs);
      require_near(lse.host(), want.lse, 1e-5, 1e-5);
      require_near(dq.host(), want.dq, rel, 4 * abs);
      require_near(dk.host(), want.dk, rel, 4 * abs);
      require_near(dv.host(), want.dv, rel, 4 * abs);
    }
}

TEST_CASE("fused kernels on the emulation: flash attention forward and backward equal naive attention") {
  // [d, s]: one key, a partial block of 4 rows, two 32-key tiles (the second partial), a wider head.
  const std::pair<std::size_t, std::size_t> cases[] = {{32, 1}, {32, 6}, {32, 37}, {64, 37}};
  check_flash_attention<float>(cases, 1e-4, 1e-5);
  // bf16 storage of o and the gradients, fp32 arithmetic.
  check_flash_attention<bf16>(std::span(cases).subspan(2, 1), 1.0 / 64, 1.0 / 64);
}

TEST_CASE("fused kernels on the emulation: attention over the QKV layout equals naive attention per head") {
  const std::size_t nb = 2, heads = 3, s = 9, d = 32, hl = heads * d, tokens = nb * s;
  for (bool causal : {false, true}) {
    INFO("causal = " << causal);
    const auto qkv = values(tokens * 3 * hl, 16), dout = values(tokens * hl, 17);
    DeviceArray<float> dqkv_in(qkv), ddout(dout), o(tokens * hl), o_heads(tokens * hl), lse(nb * heads * s),
        dqkv(tokens * 3 * hl);
    const float scale = 0.25f;
    REQUIRE(gpu::qkv_attention_forward<float>(nb, heads, s, d, scale, causal, dqkv_in.get(), o.get(), o_heads.get(),
                                              lse.get()) == gpu::AttentionPath::ours);
    REQUIRE(gpu::qkv_attention_backward<float>(nb, heads, s, d, scale, causal, dqkv_in.get(), o_heads.get(), lse.get(),
                                               ddout.get(), dqkv.get()) == gpu::AttentionPath::ours);
    // The reference gathers the heads by hand: head h of sequence b is columns [h d, (h + 1) d) of its rows.
    std::vector<float> q(tokens * hl), k(tokens * hl), v(tokens * hl), go(tokens * hl);
    auto head_index = [&](std::size_t b, std::size_t h, std::size_t i, std::size_t c) {
      return ((b * heads + h) * s + i) * d + c;
    };
    for (std::size_t b = 0; b < nb; ++b)
      for (std::size_t h = 0; h < heads; ++h)
        for (std::size_t i = 0; i < s; ++i)
          for (std::size_t c = 0; c < d; ++c) {
            const std::size_t row = (b * s + i) * 3 * hl, at = head_index(b, h, i, c);
            q[at] = qkv[row + h * d + c];
            k[at] = qkv[row + hl + h * d + c];
            v[at] = qkv[row + 2 * hl + h * d + c];
            go[at] = dout[(b * s + i) * hl + h * d + c];
          }
    const Attention want = naive_attention(nb * heads, s, d, q, k, v, go, scale, causal);
    std::vector<double> wo(tokens * hl), wdqkv(tokens * 3 * hl);
    for (std::size_t b = 0; b < nb; ++b)
      for (std::size_t h = 0; h < heads; ++h)
        for (std::size_t i = 0; i < s; ++i)
          for (std::size_t c = 0; c < d; ++c) {
            const std::size_t row = (b * s + i) * 3 * hl, at = head_index(b, h, i, c);
            wo[(b * s + i) * hl + h * d + c] = want.o[at];
            wdqkv[row + h * d + c] = want.dq[at];
            wdqkv[row + hl + h * d + c] = want.dk[at];
            wdqkv[row + 2 * hl + h * d + c] = want.dv[at];
          }
    require_near(o.host(), wo, 1e-4, 1e-5);
    require_near(o_heads.host(), want.o, 1e-4, 1e-5);
    require_near(lse.host(), want.lse, 1e-5, 1e-5);
    require_near(dqkv.host(), wdqkv, 1e-4, 4e-5);
  }
}

}  // namespace mpar::fused_emulation_test
