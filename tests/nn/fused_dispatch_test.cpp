// The layers' fused-kernel paths, run on the CPU: a host backend that also has the fused operations
// (`ops::attention_forward/backward`, `ops::residual_layernorm_forward/backward`), implemented here with naive loops and
// the host kernels, so the layers' choice, arguments and caches are checked in every CI run; the device kernels
// behind the same operations are checked against the host on a GPU (tests/cuda/layers_cuda_test.cu).
//
// - TransformerBlock with the fused residual + ln2 equals HostBackend's add and LayerNorm bit for bit (the fused
//   operations here are the same host kernels in the same order), with two micro-batches in flight, dropout and
//   each recomputation mode; with fused attention as well, within attention's tolerance.
// - Attention through `attention_forward/backward` (naive causal attention over the QKV layout, in double) equals
//   HostBackend's batched products and softmax within 1e-5, norm-relative (only the summation order differs).
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include <mpar/comm/threads.hpp>
#include <mpar/nn/transformer_block.hpp>
#include <mpar/observe/counting_backend.hpp>

#include "counting_communicator.hpp"
#include "nn_test_support.hpp"

using namespace mpar;
using mpar::testing::rel_err;

namespace {

/** HostBackend plus the fused residual + layer norm: the host kernels the unfused path calls, in its order. */
struct ResidualLnHostBackend : HostBackend {
  static inline std::atomic<int> fused_forwards{0};  ///< calls of the fused forward: whether a layer took it
  /** h = x + branch, then the host layer norm of h: HostBackend's add and layernorm_forward, in that order. */
  using HostBackend::run;
  static void run(const ops::residual_layernorm_forward& op) {
    ++fused_forwards;
    host::add(op.rows * op.cols, op.x, op.branch, op.h);
    host::layernorm_forward(op.rows, op.cols, op.h, op.gamma, op.beta, op.y, op.mean, op.rstd);
  }
  /** dh = LN'(dy) + dres, dgamma and dbeta accumulated: HostBackend's layernorm_backward and add. */
  static void run(const ops::residual_layernorm_backward& op) {
    host::layernorm_backward(op.rows, op.cols, op.h, op.mean, op.rstd, op.gamma, op.dy, op.dh, op.dgamma, op.dbeta);
    host::add(op.rows * op.cols, static_cast<const float*>(op.dh), op.dres, op.dh);
  }
};
/** And fused attention, written as the textbook formulas in double (not the device kernels). */
struct FusedHostBackend : ResidualLnHostBackend {
  static bool attention_supports(std::size_t, std::size_t) { return true; }
  using ResidualLnHostBackend::run;
  template <class T>
  static void run(const ops::attention_forward<T>& op) {
    attention_forward(op.nb, op.heads, op.seq, op.head_dim, op.scale, op.causal, op.qkv, op.o, op.o_heads, op.lse);
  }
  template <class T>
  static void run(const ops::attention_backward<T>& op) {
    attention_backward(op.nb, op.heads, op.seq, op.head_dim, op.scale, op.causal, op.qkv, op.o_heads, op.lse, op.dout,
                       op.dqkv);
  }

 private:
  /** o = softmax(scale q kᵀ, causal) v per (sequence, head), read from and written to the layers' layouts. */
  template <class T>
  static void attention_forward(std::size_t nb, std::size_t heads, std::size_t s, std::size_t d, float scale,
                                bool causal, const T* qkv, float* o, T* o_heads, float* lse) {
    const std::size_t hl = heads * d, ld = 3 * hl;
    std::vector<double> p(s);
    for (std::size_t b = 0; b < nb; ++b)
      for (std::size_t h = 0; h < heads; ++h)
        for (std::size_t i = 0; i < s; ++i) {
          const std::size_t n = causal ? i + 1 : s;
          double mx = -INFINITY;
          for (std::size_t j = 0; j < n; ++j) {
            double sc = 0;
            for (std::size_t c = 0; c < d; ++c)
              sc += double(float(qkv[(b * s + i) * ld + h * d + c])) *
                    double(float(qkv[(b * s + j) * ld + hl + h * d + c]));
            p[j] = scale * sc;
            mx = std::max(mx, p[j]);
          }
          double sum = 0;
          for (std::size_t j = 0; j < n; ++j) sum += std::exp(p[j] - mx);
          lse[(b * heads + h) * s + i] = float(mx + std::log(sum));
          for (std::size_t c = 0; c < d; ++c) {
            double acc = 0;
            for (std::size_t j = 0; j < n; ++j)
              acc += std::exp(p[j] - mx) / sum * double(float(qkv[(b * s + j) * ld + 2 * hl + h * d + c]));
            o[(b * s + i) * hl + h * d + c] = float(acc);
            o_heads[((b * heads + h) * s + i) * d + c] = mpar::convert<T>(acc);
          }
        }
  }
  /** dq, dk, dv from the probabilities recomputed with the saved log-sum-exp (dS = P ∘ (dP − rowsum(dO ∘ O))). */
  template <class T>
  static void attention_backward(std::size_t nb, std::size_t heads, std::size_t s, std::size_t d, float scale,
                                 bool causal, const T* qkv, const T* o_heads, const float* lse, const float* dout,
                                 float* dqkv) {
    const std::size_t hl = heads * d, ld = 3 * hl;
    for (std::size_t i = 0; i < nb * s * ld; ++i) dqkv[i] = 0.0f;
    auto q = [&](std::size_t b, std::size_t h, std::size_t i, std::size_t c, std::size_t part) {
      return double(float(qkv[(b * s + i) * ld + part * hl + h * d + c]));
    };
    for (std::size_t b = 0; b < nb; ++b)
      for (std::size_t h = 0; h < heads; ++h)
        for (std::size_t i = 0; i < s; ++i) {
          const std::size_t n = causal ? i + 1 : s;
          double delta = 0;
          for (std::size_t c = 0; c < d; ++c)
            delta +=
                double(dout[(b * s + i) * hl + h * d + c]) * double(float(o_heads[((b * heads + h) * s + i) * d + c]));
          for (std::size_t j = 0; j < n; ++j) {
            double sc = 0, dp = 0;
            for (std::size_t c = 0; c < d; ++c) {
              sc += q(b, h, i, c, 0) * q(b, h, j, c, 1);
              dp += double(dout[(b * s + i) * hl + h * d + c]) * q(b, h, j, c, 2);
            }
            const double pij = std::exp(scale * sc - double(lse[(b * heads + h) * s + i])), ds = pij * (dp - delta);
            for (std::size_t c = 0; c < d; ++c) {
              dqkv[(b * s + i) * ld + h * d + c] += float(scale * ds * q(b, h, j, c, 1));
              dqkv[(b * s + j) * ld + hl + h * d + c] += float(scale * ds * q(b, h, i, c, 0));
              dqkv[(b * s + j) * ld + 2 * hl + h * d + c] += float(pij * double(dout[(b * s + i) * hl + h * d + c]));
            }
          }
        }
  }
};
static_assert(backend<FusedHostBackend> && backend<ResidualLnHostBackend>);
static_assert(!mpar::nn::detail::fused_attention_backend<ResidualLnHostBackend>);
static_assert(mpar::nn::detail::fused_attention_backend<FusedHostBackend> &&
              !mpar::nn::detail::fused_attention_backend<HostBackend>);
static_assert(mpar::nn::detail::fused_residual_layernorm_backend<FusedHostBackend> &&
              !mpar::nn::detail::fused_residual_layernorm_backend<HostBackend>);

struct Result {
  std::vector<std::vector<float>> y, dx;
  std::map<std::string, std::vector<float>> grads;
};

std::vector<float> values(std::size_t n, std::uint64_t seed) {
  std::vector<float> v(n);
  const CounterRng r{seed, 3};
  for (std::size_t i = 0; i < n; ++i) v[i] = float(2 * r.uniform(i) - 1);
  return v;
}
nn::Act<Replicate> act(const std::vector<float>& v, std::size_t rows, std::size_t cols) {
  nn::Activation a({rows, cols}, uninitialized);
  std::copy(v.begin(), v.end(), a.data());
  return nn::Act<Replicate>(std::move(a));
}

/** Two micro-batches: both forwards, then both backwards (what a pipeline schedule keeps in flight). */
template <class Layer>
Result run(Layer& layer, std::size_t tokens, std::size_t hidden) {
  Result r;
  std::vector<nn::Act<Replicate>> ys;
  for (int mb = 0; mb < 2; ++mb) ys.push_back(layer.forward(act(values(tokens * hidden, 10 + mb), tokens, hidden), mb));
  for (int mb = 0; mb < 2; ++mb) {
    const auto dx = layer.backward_input(act(values(tokens * hidden, 20 + mb), tokens, hidden), mb);
    layer.backward_weight(mb);
    r.y.emplace_back(ys[std::size_t(mb)].data(), ys[std::size_t(mb)].data() + tokens * hidden);
    r.dx.emplace_back(dx.data(), dx.data() + tokens * hidden);
  }
  for (auto* p : layer.parameters()) r.grads[p->name].assign(p->grad.begin(), p->grad.end());
  return r;
}

void compare(const Result& got, const Result& want, double tol) {
  for (std::size_t mb = 0; mb < 2; ++mb) {
    INFO("micro-batch " << mb);
    if (tol == 0) {
      CHECK(got.y[mb] == want.y[mb]);
      CHECK(got.dx[mb] == want.dx[mb]);
    } else {
      CHECK(rel_err(got.y[mb], want.y[mb]) <= tol);
      CHECK(rel_err(got.dx[mb], want.dx[mb]) <= tol);
    }
  }
  REQUIRE(got.grads.size() == want.grads.size());
  for (const auto& [name, g] : want.grads) {
    INFO("gradient of " << name);
    REQUIRE(got.grads.count(name) == 1);
    if (tol == 0)
      CHECK(got.grads.at(name) == g);
    else
      CHECK(rel_err(got.grads.at(name), g) <= tol);
  }
}

}  // namespace

TEST_CASE("Attention on a backend with fused attention takes it and equals the batched products and softmax",
          "[nn][attention][fused]") {
  const nn::AttentionConfig cfg{48, 3, 8, 4, 0, "attn"};
  nn::Attention<HostBackend> unfused(cfg);
  nn::Attention<FusedHostBackend> fused(cfg);
  const Result want = run(unfused, 3 * cfg.seq, cfg.hidden);
  compare(run(fused, 3 * cfg.seq, cfg.hidden), want, 1e-5);
}

template <class B>
Result run_block(const nn::BlockConfig& cfg, nn::Recompute recompute) {
  Result r;
  run_threads(1, [&](ThreadsCommunicator& tp) {
    nn::TransformerBlock<ThreadsCommunicator, false, B> block(tp, cfg);
    block.set_recompute(recompute);
    r = run(block, 2 * cfg.seq, cfg.hidden);
  });
  return r;
}

TEST_CASE("TransformerBlock on a backend with fused residual + layer norm equals add and LayerNorm bit for bit",
          "[nn][block][fused]") {
  const nn::BlockConfig cfg{32, 4, 64, 8, 0.1, 5, 0, "block"};
  // Selective recomputation changes nothing on the fused path (it keeps no probabilities to drop).
  for (nn::Recompute recompute : {nn::Recompute::none, nn::Recompute::selective, nn::Recompute::full}) {
    INFO("recomputation " << nn::recompute_name(recompute));
    const Result want = run_block<HostBackend>(cfg, recompute);
    compare(run_block<ResidualLnHostBackend>(cfg, recompute), want, 0);  // the same host kernels, the same order
    compare(run_block<FusedHostBackend>(cfg, recompute), want, 1e-5);    // and with fused attention
  }
}

// CountingBackend has exactly the fused operations of the backend it wraps, and counts them: inherited, they
// ran uncounted. The counted block gives the wrapped backend's results bit for bit (it forwards the arguments).
static_assert(mpar::nn::detail::fused_attention_backend<observe::CountingBackend<FusedHostBackend>> &&
              mpar::nn::detail::fused_residual_layernorm_backend<observe::CountingBackend<FusedHostBackend>>);
static_assert(!mpar::nn::detail::fused_attention_backend<observe::CountingBackend<HostBackend>> &&
              !mpar::nn::detail::fused_residual_layernorm_backend<observe::CountingBackend<HostBackend>>);

TEST_CASE("CountingBackend counts the fused operations of the backend it wraps, one per layer and micro-batch",
          "[nn][block][fused][counts]") {
  using Counting = observe::CountingBackend<FusedHostBackend>;
  using observe::Op;
  const nn::BlockConfig cfg{32, 4, 64, 8, 0.1, 5, 0, "block"};
  observe::BackendCounts counts;
  const Result counted = [&] {
    Result r;
    run_threads(1, [&](ThreadsCommunicator& tp) {
      nn::TransformerBlock<ThreadsCommunicator, false, Counting> block(tp, cfg);
      const observe::BackendCounts before = Counting::counts();
      r = run(block, 2 * cfg.seq, cfg.hidden);  // two micro-batches, forward and backward
      counts = Counting::counts() - before;
    });
    return r;
  }();
  CHECK(counts[Op::attention_forward] == 2);
  CHECK(counts[Op::attention_backward] == 2);
  CHECK(counts[Op::residual_layernorm_forward] == 2);
  CHECK(counts[Op::residual_layernorm_backward] == 2);
  CHECK(counts[Op::gemm_strided_batched] == 0);  // the fused attention replaced the batched products
  compare(counted, run_block<FusedHostBackend>(cfg, nn::Recompute::none), 0);
}

namespace {

using mpar::testing::CollectiveCounts;
using mpar::testing::CountingCommunicator;

/** What each tensor rank's sequence-parallel block gave, and the collectives its backwards (and the reduction) issued. */
struct SpRun {
  std::vector<Result> ranks;
  std::vector<CollectiveCounts> backward;
};

/**
 * A sequence-parallel block on 2 tensor ranks, two micro-batches in flight over 2 sequences each (each rank holds
 * its half of the token rows), with or without the norms' gradient reduction deferred to one `all_reduce_gradients`
 * after the last backward.
 */
template <class B>
SpRun run_sp_block(const nn::BlockConfig& cfg, bool defer) {
  constexpr int p = 2;
  const std::size_t tokens = 2 * cfg.seq, rows = tokens / p, h = cfg.hidden;
  SpRun out{std::vector<Result>(p), std::vector<CollectiveCounts>(p)};
  run_threads(p, [&](ThreadsCommunicator& raw) {
    CountingCommunicator<ThreadsCommunicator> tp(raw);
    nn::TransformerBlock<CountingCommunicator<ThreadsCommunicator>, true, B> block(tp, cfg);
    std::vector<nn::Parameter*> norms;
    if (defer) norms = block.defer_norm_gradient_reduction();
    const std::size_t r = std::size_t(tp.rank());
    auto own_rows = [&](std::uint64_t seed) {  // this rank's rows of a global [tokens, h] matrix
      const std::vector<float> all = values(tokens * h, seed);
      nn::Activation a({rows, h}, uninitialized);
      std::copy(all.begin() + std::ptrdiff_t(r * rows * h), all.begin() + std::ptrdiff_t((r + 1) * rows * h), a.data());
      return nn::Act<nn::TokenShard>(std::move(a));
    };
    Result& res = out.ranks[r];
    std::vector<nn::Act<nn::TokenShard>> ys;
    for (int mb = 0; mb < 2; ++mb) ys.push_back(block.forward(own_rows(10 + std::uint64_t(mb)), mb));
    tp.counts().reset();
    for (int mb = 0; mb < 2; ++mb) {
      const auto dx = block.backward_input(own_rows(20 + std::uint64_t(mb)), mb);
      block.backward_weight(mb);
      res.y.emplace_back(ys[std::size_t(mb)].data(), ys[std::size_t(mb)].data() + rows * h);
      res.dx.emplace_back(dx.data(), dx.data() + rows * h);
    }
    if (defer) nn::all_reduce_gradients<B>(tp, norms);  // once, after the step's last backward
    out.backward[r] = tp.counts();
    for (auto* q : block.parameters()) res.grads[q->name].assign(q->grad.begin(), q->grad.end());
  });
  return out;
}

}  // namespace

TEST_CASE(
    "Sequence-parallel block: the norms' gradients summed once per step equal the per-backward sums, with one "
    "collective instead of one per norm and micro-batch, and the fused residual + ln2 is then taken",
    "[nn][block][fused][sequence]") {
  const nn::BlockConfig cfg{32, 4, 64, 8, 0.1, 5, 0, "block"};
  const SpRun each = run_sp_block<HostBackend>(cfg, false), once = run_sp_block<HostBackend>(cfg, true);
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("tensor rank " << r);
    // Outputs and input gradients do not depend on where the norms' gradients are summed; those are the same sums in
    // another order (each rank's two micro-batches first).
    compare(once.ranks[r], each.ranks[r], 1e-6);
    for (std::size_t mb = 0; mb < 2; ++mb) CHECK(once.ranks[r].dx[mb] == each.ranks[r].dx[mb]);
    // Per backward, each of the two norms all-reduced its 2 x 32 values; deferred, one all-reduce of all four.
    CHECK(each.backward[r].count("all_reduce") == 2 * 2);
    CHECK(each.backward[r].volume("all_reduce") == 2 * 2 * 2 * 32);
    CHECK(once.backward[r].count("all_reduce") == 1);
    CHECK(once.backward[r].volume("all_reduce") == 4 * 32);
    CHECK(once.backward[r].count("all_gather") == each.backward[r].count("all_gather"));
    CHECK(once.backward[r].count("reduce_scatter") == each.backward[r].count("reduce_scatter"));
  }
  // With the fused residual + ln2 (the same host kernels in the same order): bit for bit the unfused deferred run;
  // not deferred, the backend's fused kernel is not taken (the norm all-reduces its own share) and nothing changes.
  const int before = ResidualLnHostBackend::fused_forwards;
  const SpRun unfused = run_sp_block<ResidualLnHostBackend>(cfg, false);
  CHECK(ResidualLnHostBackend::fused_forwards == before);
  const SpRun fused = run_sp_block<ResidualLnHostBackend>(cfg, true);
  CHECK(ResidualLnHostBackend::fused_forwards == before + 2 * 2);  // per rank and micro-batch
  for (std::size_t r = 0; r < 2; ++r) {
    compare(fused.ranks[r], once.ranks[r], 0);
    compare(unfused.ranks[r], each.ranks[r], 0);
  }
}
