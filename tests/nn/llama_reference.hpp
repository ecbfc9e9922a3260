#pragma once
// What the Llama-class layer tests share: double-precision references written from the formulas (RMSNorm, Hugging
// Face's rotary embedding, the SwiGLU MLP), and a runner that gives a layer the same perturbed parameters on every
// layout and assembles what the ranks computed.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <mpar/comm/threads.hpp>

#include "finite_difference.hpp"
#include "nn_test_support.hpp"

namespace mpar::testing::llama {

using namespace mpar::nn;

inline constexpr double llama_fwd_tol = 1e-5, llama_grad_tol = 1e-4;

/** Adds 0.3 N(0, 1) to every parameter value (an RMSNorm gain starts at 1, which would hide a gain bug). */
inline void perturb(const std::vector<Parameter*>& ps, std::uint64_t stream) {
  const CounterRng rng{77, stream};
  std::uint64_t i = 0;
  for (Parameter* p : ps)
    for (float& v : p->value) v += float(0.3 * rng.normal(i++));
}

inline ref::Vec doubles(const Activation& a) { return ref::Vec(a.values().begin(), a.values().end()); }
inline ref::Vec doubles(std::span<const float> v) { return ref::Vec(v.begin(), v.end()); }

/** y = x / sqrt(mean(x^2) + eps) * gain, row by row, in double. */
inline ref::Vec rms_norm_ref(const ref::Vec& x, std::size_t n, const ref::Vec& gain, double eps) {
  ref::Vec y(x.size());
  for (std::size_t r = 0; r < x.size() / n; ++r) {
    double ms = 0;
    for (std::size_t i = 0; i < n; ++i) ms += x[r * n + i] * x[r * n + i];
    const double scale = 1.0 / std::sqrt(ms / double(n) + eps);
    for (std::size_t i = 0; i < n; ++i) y[r * n + i] = x[r * n + i] * scale * gain[i];
  }
  return y;
}

/**
 * Hugging Face's `apply_rotary_pos_emb` per row and head: inv_freq_i = theta^(-2i/d), cos/sin of position *
 * inv_freq duplicated over both halves, y = x cos + rotate_half(x) sin with rotate_half(x) = (-x2, x1).
 */
inline ref::Vec rotary_ref(const ref::Vec& x, std::size_t cols, std::size_t head_dim,
                           const std::vector<std::int32_t>& pos, double theta) {
  ref::Vec y(x.size());
  const std::size_t half = head_dim / 2;
  for (std::size_t r = 0; r < x.size() / cols; ++r)
    for (std::size_t h = 0; h < cols / head_dim; ++h) {
      const double* xh = x.data() + r * cols + h * head_dim;
      double* yh = y.data() + r * cols + h * head_dim;
      for (std::size_t j = 0; j < head_dim; ++j) {
        const double freq = double(pos[r]) * std::pow(theta, -2.0 * double(j % half) / double(head_dim));
        const double rotated = j < half ? -xh[j + half] : xh[j - half];
        yh[j] = xh[j] * std::cos(freq) + rotated * std::sin(freq);
      }
    }
  return y;
}

inline double silu(double v) { return v / (1.0 + std::exp(-v)); }

/**
 * The SwiGLU MLP in double: gate = x Wg, up = x Wu (Wg = gate_up[:, 0, :], Wu = gate_up[:, 1, :]),
 * y = (silu(gate) * up) Wd.
 */
inline ref::Vec swiglu_ref(const ref::Vec& x, std::size_t hidden, std::size_t ffn, const ref::Params& p,
                           const std::string& name = "mlp") {
  const ref::Vec &wgu = p.at(name + ".gate_up.weight"), &wd = p.at(name + ".down.weight");
  const std::size_t t = x.size() / hidden;
  ref::Vec h(t * ffn);
  for (std::size_t r = 0; r < t; ++r)
    for (std::size_t j = 0; j < ffn; ++j) {
      double g = 0, u = 0;
      for (std::size_t i = 0; i < hidden; ++i) {
        g += x[r * hidden + i] * wgu[(i * 2 + 0) * ffn + j];
        u += x[r * hidden + i] * wgu[(i * 2 + 1) * ffn + j];
      }
      h[r * ffn + j] = silu(g) * u;
    }
  return ref::linear(h, t, ffn, hidden, wd, nullptr);
}

inline ref::Params params_in_double(const Assembled& a) {
  ref::Params p;
  for (const auto& [name, v] : a.value) p[name] = ref::Vec(v.begin(), v.end());
  return p;
}

/** What `p` ranks gave, assembled into global tensors (rows of layout L put back where they belong). */
struct LlamaRun {
  Activation y, dx;
  Assembled params;
  std::mutex m;
  ComputeType compute = ComputeType::fp32;  ///< the ranks' passes run under `Autocast` of this type
};

/** Adds N(0, 0.3^2) to every weight, drawn by global index: every layout of a layer gets the same values. */
inline void perturb_by_global_index(const std::vector<Parameter*>& ps) {
  for (Parameter* q : ps) {
    const CounterRng rng{77, 5};
    const std::size_t rank = q->global_shape.size();
    std::vector<std::size_t> idx(rank);
    for (std::size_t k = 0; k < q->local_size(); ++k) {
      std::size_t rem = k, gi = 0;
      for (std::size_t d = rank; d-- > 0;) {
        idx[d] = rem % q->local_box[d].extent;
        rem /= q->local_box[d].extent;
      }
      for (std::size_t d = 0; d < rank; ++d) gi = gi * q->global_shape[d] + q->local_box[d].offset + idx[d];
      q->value[k] += float(0.3 * rng.normal(gi + 1000 * q->id));
    }
  }
}

/**
 * Runs `make(tp)` on `p` thread ranks: forward on this rank's block of `x` in layout L, `perturb` the parameters
 * first (the same values on every layout: they are drawn by global index), backward on its block of `dy`, then
 * `after(layer, tp)` where given.
 */
template <class L, class Make>
void run_llama_layer(int p, const Activation& x, const Activation& dy, LlamaRun& out, Make make,
                     const std::function<void(decltype(std::declval<Make&>()(std::declval<ThreadsCommunicator&>()))&,
                                              ThreadsCommunicator&)>& after = {}) {
  out.y = Activation({x.extent(0), dy.extent(1)});
  out.dx = Activation(x.shape());
  run_threads(p, [&](ThreadsCommunicator& tp) {
    auto layer = make(tp);
    perturb_by_global_index(layer.parameters());
    const auto n = std::size_t(p), r = std::size_t(tp.rank());
    const Autocast scope(out.compute);
    const Act<L> y = layer.forward(Act<L>(local_block<L>(x, n, r)), 0);
    const Act<L> dx = layer.backward(Act<L>(local_block<L>(dy, n, r)), 0);
    if (after) after(layer, tp);  // e.g. the owner's reduction of deferred gradients
    {
      std::lock_guard lock(out.m);
      put_block<L>(out.y, y.tensor(), n, r);
      put_block<L>(out.dx, dx.tensor(), n, r);
    }
    out.params.add(layer.parameters());
  });
}

/** Rows of N(0, 1) values, with row 1 scaled by 1e-3: there eps (1e-6) is as large as the mean square. */
inline Activation rms_input(std::size_t rows, std::size_t cols) {
  Activation x = random_activation(rows, cols, 31);
  for (std::size_t j = 0; j < cols; ++j) x(1, j) *= 1e-3f;
  return x;
}

/**
 * Llama's attention in double. The fused weight `[hidden, (heads + 2 kv) d]` holds, for KV head j, its g query heads,
 * then k_j, then v_j; query head h uses KV head h / g. Row r of the batch is at position r % seq of its sequence.
 */
inline ref::Vec gqa_ref(const ref::Vec& x, const GqaConfig& c, const ref::Params& p) {
  const std::size_t hidden = c.hidden, heads = c.heads, kv = c.kv_heads, d = hidden / heads, g = heads / kv,
                    t = x.size() / hidden, cols = (heads + 2 * kv) * d, seq = c.seq;
  const ref::Vec fused = ref::linear(x, t, hidden, cols, p.at(c.name + ".qkv.weight"), nullptr);
  ref::Vec q(t * heads * d), k(t * kv * d), v(t * kv * d);
  for (std::size_t r = 0; r < t; ++r)
    for (std::size_t j = 0; j < kv; ++j) {
      const double* row = fused.data() + r * cols + j * (g + 2) * d;
      for (std::size_t e = 0; e < g * d; ++e) q[r * heads * d + j * g * d + e] = row[e];
      for (std::size_t e = 0; e < d; ++e) {
        k[(r * kv + j) * d + e] = row[g * d + e];
        v[(r * kv + j) * d + e] = row[(g + 1) * d + e];
      }
    }
  std::vector<std::int32_t> pos(t);
  for (std::size_t r = 0; r < t; ++r) pos[r] = std::int32_t(r % seq);
  q = rotary_ref(q, heads * d, d, pos, c.rope_theta);
  k = rotary_ref(k, kv * d, d, pos, c.rope_theta);
  ref::Vec o(t * heads * d, 0.0);
  for (std::size_t b = 0; b < t / seq; ++b)
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t i = 0; i < seq; ++i) {
        const std::size_t qi = b * seq + i;
        ref::Vec s(i + 1);
        double mx = -1e300, z = 0;
        for (std::size_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (std::size_t e = 0; e < d; ++e)
            dot += q[(qi * heads + h) * d + e] * k[((b * seq + j) * kv + h / g) * d + e];
          s[j] = dot / std::sqrt(double(d));
          mx = std::max(mx, s[j]);
        }
        for (double& w : s) z += (w = std::exp(w - mx));
        for (std::size_t e = 0; e < d; ++e)
          for (std::size_t j = 0; j <= i; ++j)
            o[(qi * heads + h) * d + e] += s[j] / z * v[((b * seq + j) * kv + h / g) * d + e];
      }
  return ref::linear(o, t, heads * d, hidden, p.at(c.name + ".proj.weight"), nullptr);
}

}  // namespace mpar::testing::llama
