// Ring attention (context parallelism) against full causal attention computed at one rank by naive
// loops in double: softmax(Q K^T / sqrt(d) + causal mask) V and its hand-derived backward.
// Tolerance as everywhere in the nn tests: ||parallel - reference||_2 <= 1e-5 ||reference||_2.
#include <catch2/catch.hpp>

#include <cmath>
#include <mutex>
#include <vector>

#include <mpar/comm/threads.hpp>
#include <mpar/nn/ring_attention.hpp>
#include <mpar/nn/ring_self_attention.hpp>

#include "nn_test_support.hpp"

using namespace mpar;
using namespace mpar::nn;
using namespace mpar::testing;
using Comm = ThreadsCommunicator;

namespace {

/** Global sizes: `batch` sequences of `seq` tokens, `heads` heads of `dim`; qkv is `[batch*seq, 3*heads*dim]`. */
struct Sizes {
  std::size_t batch, seq, heads, dim;
  [[nodiscard]] std::size_t hidden() const { return heads * dim; }
};

/** Naive causal attention and its backward on the whole sequence, in double. */
struct NaiveAttention {
  Sizes z;
  Activation out, dqkv;

  void run(const Activation& qkv, const Activation& dout) {
    const std::size_t S = z.seq, D = z.dim, H = z.hidden();
    const double scale = 1.0 / std::sqrt(double(D));
    out = Activation({z.batch * S, H});
    dqkv = Activation({z.batch * S, 3 * H});
    auto at = [&](const Activation& a, std::size_t b, std::size_t s, std::size_t col) {
      return double(a(b * S + s, col));
    };
    for (std::size_t b = 0; b < z.batch; ++b)
      for (std::size_t h = 0; h < z.heads; ++h) {
        const std::size_t qo = h * D, ko = H + h * D, vo = 2 * H + h * D;
        std::vector<double> P(S * S, 0.0), dP(S * S, 0.0);
        for (std::size_t i = 0; i < S; ++i) {
          double mx = -1e300;
          for (std::size_t j = 0; j <= i; ++j) {  // causal: key j <= query i
            double s = 0;
            for (std::size_t x = 0; x < D; ++x) s += at(qkv, b, i, qo + x) * at(qkv, b, j, ko + x);
            P[i * S + j] = s * scale;
            mx = std::max(mx, P[i * S + j]);
          }
          double sum = 0;
          for (std::size_t j = 0; j <= i; ++j) sum += (P[i * S + j] = std::exp(P[i * S + j] - mx));
          for (std::size_t j = 0; j <= i; ++j) P[i * S + j] /= sum;
          for (std::size_t x = 0; x < D; ++x) {
            double o = 0;
            for (std::size_t j = 0; j <= i; ++j) o += P[i * S + j] * at(qkv, b, j, vo + x);
            out(b * S + i, qo + x) = float(o);
          }
        }
        // dP = dO V^T; dS = P (dP - sum_j P dP); dQ = scale dS K; dK = scale dS^T Q; dV = P^T dO.
        for (std::size_t i = 0; i < S; ++i) {
          double corr = 0;
          for (std::size_t j = 0; j <= i; ++j) {
            double s = 0;
            for (std::size_t x = 0; x < D; ++x) s += at(dout, b, i, qo + x) * at(qkv, b, j, vo + x);
            dP[i * S + j] = s;
            corr += P[i * S + j] * s;
          }
          for (std::size_t j = 0; j <= i; ++j) dP[i * S + j] = P[i * S + j] * (dP[i * S + j] - corr);
        }
        for (std::size_t i = 0; i < S; ++i)
          for (std::size_t x = 0; x < D; ++x) {
            double dq = 0, dk = 0, dv = 0;
            for (std::size_t j = 0; j < S; ++j) {
              dq += dP[i * S + j] * at(qkv, b, j, ko + x);
              dk += dP[j * S + i] * at(qkv, b, j, qo + x);
              dv += P[j * S + i] * at(dout, b, j, qo + x);
            }
            dqkv(b * S + i, qo + x) = float(scale * dq);
            dqkv(b * S + i, ko + x) = float(scale * dk);
            dqkv(b * S + i, vo + x) = float(dv);
          }
      }
  }
};

/**
 * The local rows of context rank `r` of `cp` (zig-zag: chunks r and 2cp-1-r of each sequence) and the
 * local columns of tensor rank `t` of `tp` (heads split; `parts` column groups of width H, e.g. q|k|v).
 */
struct Placement {
  Sizes z;
  std::size_t cp, r, tp, t, parts;
  [[nodiscard]] std::size_t local_rows() const { return z.batch * z.seq / cp; }
  [[nodiscard]] std::size_t local_cols() const { return parts * z.hidden() / tp; }
  [[nodiscard]] std::size_t global_row(std::size_t lr) const {
    const std::size_t per = z.seq / cp, b = lr / per, i = lr % per;
    const auto chunks = ContextShard::local_blocks(z.seq, cp, r);
    const Block& ch = chunks[i < chunks[0].extent ? 0 : 1];
    return b * z.seq + ch.offset + (i < chunks[0].extent ? i : i - chunks[0].extent);
  }
  [[nodiscard]] std::size_t global_col(std::size_t lc) const {
    const std::size_t hl = z.hidden() / tp, part = lc / hl;
    return part * z.hidden() + t * hl + lc % hl;
  }
  Activation take(const Activation& g) const {
    Activation l({local_rows(), local_cols()});
    for (std::size_t i = 0; i < l.extent(0); ++i)
      for (std::size_t j = 0; j < l.extent(1); ++j) l(i, j) = g(global_row(i), global_col(j));
    return l;
  }
  void put(Activation& g, const Activation& l) const {
    for (std::size_t i = 0; i < l.extent(0); ++i)
      for (std::size_t j = 0; j < l.extent(1); ++j) g(global_row(i), global_col(j)) = l(i, j);
  }
};

struct RingRun {
  Activation out, dqkv;
  std::vector<BlockCount> blocks;
  std::mutex m;
};

/** Ring attention on cp x tp threads (tensor innermost), outputs and dqkv re-assembled into global tensors. */
void run_ring(const Sizes& z, std::size_t cp, std::size_t tp, const Activation& qkv, const Activation& dout,
              RingRun& res) {
  res.out = Activation({z.batch * z.seq, z.hidden()});
  res.dqkv = Activation({z.batch * z.seq, 3 * z.hidden()});
  res.blocks.assign(cp * tp, {});
  run_threads(int(cp * tp), [&](Comm& world) {
    const auto w = std::size_t(world.rank()), t = w % tp, c = w / tp;
    Comm context = world.split(int(t), int(c));  // ranks with the same heads, in chunk order
    RingAttention<Comm> ring(context, {z.heads / tp, z.dim, z.seq});
    const Placement in{z, cp, c, tp, t, 3}, outp{z, cp, c, tp, t, 1};
    const Act<ContextHeads> y = ring.forward(Act<ContextHeads>(in.take(qkv)), 0);
    const BlockCount blocks = ring.last_blocks();
    const Act<ContextHeads> dx = ring.backward(Act<ContextHeads>(outp.take(dout)), 0);
    std::lock_guard lock(res.m);
    outp.put(res.out, y.tensor());
    in.put(res.dqkv, dx.tensor());
    res.blocks[w] = blocks;
  });
}

void check_against_naive(const Sizes& z, std::size_t cp, std::size_t tp) {
  const Activation qkv = random_activation(z.batch * z.seq, 3 * z.hidden(), 101);
  const Activation dout = random_activation(z.batch * z.seq, z.hidden(), 102);
  NaiveAttention ref{z, {}, {}};
  ref.run(qkv, dout);
  RingRun ring;
  run_ring(z, cp, tp, qkv, dout, ring);
  INFO("cp = " << cp << ", tp = " << tp);
  CHECK(rel_err(ring.out.values(), ref.out.values()) <= rel_tol);
  // dq, dk, dv separately, so a wrong one is named.
  const std::size_t H = z.hidden();
  for (std::size_t part = 0; part < 3; ++part) {
    std::vector<float> a, b;
    for (std::size_t i = 0; i < ref.dqkv.extent(0); ++i)
      for (std::size_t j = part * H; j < (part + 1) * H; ++j) a.push_back(ring.dqkv(i, j)), b.push_back(ref.dqkv(i, j));
    INFO("gradient of "
         << "qkv"[part]);
    CHECK(rel_err(a, b) <= rel_tol);
  }
}

}  // namespace

TEST_CASE("the naive reference is causal: a later token does not change an earlier output", "[ring_attention]") {
  // Guards the reference itself: perturbing the last token's k and v leaves every other output unchanged.
  const Sizes z{1, 8, 2, 4};
  Activation qkv = random_activation(8, 24, 7);
  const Activation dout = random_activation(8, 8, 8);
  NaiveAttention a{z, {}, {}}, b{z, {}, {}};
  a.run(qkv, dout);
  for (std::size_t j = 8; j < 24; ++j) qkv(7, j) += 1.0f;
  b.run(qkv, dout);
  for (std::size_t i = 0; i < 7; ++i)
    for (std::size_t j = 0; j < 8; ++j) CHECK(a.out(i, j) == b.out(i, j));
  CHECK(a.out(7, 0) != b.out(7, 0));
}

TEST_CASE("ring attention equals full causal attention, forward and dq/dk/dv", "[ring_attention]") {
  SECTION("cp = 1 (no ring)") { check_against_naive({2, 8, 2, 4}, 1, 1); }
  SECTION("cp = 2") { check_against_naive({2, 16, 2, 4}, 2, 1); }
  SECTION("cp = 4") { check_against_naive({2, 24, 2, 4}, 4, 1); }
  SECTION("cp = 2 x tp = 2 (heads over tensor, sequence over context)") { check_against_naive({2, 16, 4, 4}, 2, 2); }
}

TEST_CASE("zig-zag placement gives every context rank the same score blocks", "[ring_attention]") {
  // Independent count: query chunk q sees key chunks 0..q, so ranks r holding {r, 2cp-1-r} see
  // (r + 1) + (2cp - r) = 2cp + 1 chunks, two of them diagonal.
  for (std::size_t cp : {1u, 2u, 3u, 4u, 8u})
    for (std::size_t r = 0; r < cp; ++r) {
      INFO("cp = " << cp << ", rank " << r);
      CHECK(zigzag_visible_blocks(cp, r) == BlockCount{2 * cp - 1, 2});
    }
  // The blocks a forward actually computed, per rank, at cp = 4 (per sequence; 2 sequences).
  RingRun run;
  const Sizes z{2, 16, 1, 4};
  run_ring(z, 4, 1, random_activation(32, 12, 3), random_activation(32, 4, 4), run);
  for (const BlockCount& b : run.blocks) CHECK(b == BlockCount{2 * (2 * 4 - 1), 2 * 2});
  // Contiguous placement (rank r holds chunks 2r, 2r+1) would not balance: the last rank sees 4x the first's.
  auto contiguous = [](std::size_t r) { return (2 * r + 1) + (2 * r + 2); };
  CHECK(contiguous(3) != contiguous(0));
}

TEST_CASE("ring attention refuses a sequence length not divisible by 2 cp", "[ring_attention]") {
  std::vector<std::string> errors(3);
  run_threads(3, [&](Comm& context) {
    try {
      RingAttention<Comm> ring(context, {2, 4, 20});  // 20 is not a multiple of 2 x 3 = 6
    } catch (const std::exception& e) {
      errors[std::size_t(context.rank())] = e.what();
    }
  });
  for (const auto& e : errors) {
    CHECK_THAT(e, Catch::Contains("sequence length 20") && Catch::Contains("2 x cp = 2 x 3 = 6") &&
                      Catch::Contains("multiple of 6"));
  }
  CHECK_THAT(errors[1], Catch::Contains("context rank 1 of 3"));
}

TEST_CASE("ring attention keeps several micro-batches in flight", "[ring_attention]") {
  // Two forwards, then the backwards in reverse order (as a pipeline schedule may run them), cp = 2.
  const Sizes z{1, 8, 2, 4};
  const std::size_t cp = 2;
  std::vector<Activation> qkv, dout;
  std::vector<NaiveAttention> ref(2, NaiveAttention{z, {}, {}});
  for (std::size_t mb = 0; mb < 2; ++mb) {
    qkv.push_back(random_activation(8, 24, 200 + mb));
    dout.push_back(random_activation(8, 8, 300 + mb));
    ref[mb].run(qkv[mb], dout[mb]);
  }
  std::vector<Activation> out(2, Activation({8, 8})), dqkv(2, Activation({8, 24}));
  std::mutex m;
  run_threads(int(cp), [&](Comm& context) {
    const auto r = std::size_t(context.rank());
    RingAttention<Comm> ring(context, {z.heads, z.dim, z.seq});
    const Placement in{z, cp, r, 1, 0, 3}, outp{z, cp, r, 1, 0, 1};
    std::vector<Act<ContextHeads>> y;
    for (int mb = 0; mb < 2; ++mb) y.push_back(ring.forward(Act<ContextHeads>(in.take(qkv[std::size_t(mb)])), mb));
    for (int mb = 1; mb >= 0; --mb) {
      const auto dx = ring.backward(Act<ContextHeads>(outp.take(dout[std::size_t(mb)])), mb);
      std::lock_guard lock(m);
      outp.put(out[std::size_t(mb)], y[std::size_t(mb)].tensor());
      in.put(dqkv[std::size_t(mb)], dx.tensor());
    }
  });
  for (std::size_t mb = 0; mb < 2; ++mb) {
    INFO("micro-batch " << mb);
    CHECK(rel_err(out[mb].values(), ref[mb].out.values()) <= rel_tol);
    CHECK(rel_err(dqkv[mb].values(), ref[mb].dqkv.values()) <= rel_tol);
  }
}

TEST_CASE("ring self-attention (projections + ring) at cp x tp equals the single-rank Attention layer",
          "[ring_attention]") {
  // The ring core is checked against naive loops above; here its composition with the projections:
  // output, input gradient and every weight gradient (summed over the context group, as the context
  // ranks hold replicas of the weights) equal nn::Attention at one rank. Weights start bit-identical.
  const Sizes z{2, 16, 4, 4};  // hidden 16, 4 heads
  const AttentionConfig cfg{z.hidden(), z.heads, z.seq, 7, 200, "attn"};
  const Activation x = random_activation(z.batch * z.seq, z.hidden(), 5),
                   dy = random_activation(z.batch * z.seq, z.hidden(), 6);
  Attention<> ref(cfg);
  const Activation y_ref = ref.forward(Act<Replicate>(x)).tensor();
  const Activation dx_ref = ref.backward(Act<Replicate>(dy)).tensor();
  Assembled ref_params;
  ref_params.add(ref.parameters());
  for (auto [cp, tp] : {std::pair<std::size_t, std::size_t>{2, 1}, {4, 1}, {2, 2}}) {
    INFO("cp = " << cp << ", tp = " << tp);
    Activation y({z.batch * z.seq, z.hidden()}), dx(y.shape());
    Assembled params;
    std::mutex m;
    run_threads(int(cp * tp), [&](Comm& world) {
      const auto w = std::size_t(world.rank()), t = w % tp, c = w / tp;
      Comm tensor = world.split(int(c), int(t)), context = world.split(int(t), int(c));
      RingSelfAttention<Comm> attn(tensor, context, cfg);
      const Placement rows{z, cp, c, 1, 0, 1};
      const Act<ContextShard> yl = attn.forward(Act<ContextShard>(rows.take(x)));
      const Act<ContextShard> dxl = attn.backward(Act<ContextShard>(rows.take(dy)));
      for (Parameter* p : attn.parameters())
        context.all_reduce(std::span<float>(p->grad.data(), p->grad.size()), ReduceOp::sum);
      params.add(attn.parameters());
      std::lock_guard lock(m);
      rows.put(y, yl.tensor());
      rows.put(dx, dxl.tensor());
    });
    CHECK(rel_err(y.values(), y_ref.values()) <= rel_tol);
    CHECK(rel_err(dx.values(), dx_ref.values()) <= rel_tol);
    CHECK(params.replica_mismatch < 1e-6);
    REQUIRE(params.grad.size() == ref_params.grad.size());
    for (const auto& [name, g] : ref_params.grad) {
      INFO("parameter " << name);
      CHECK(params.value[name] == ref_params.value[name]);
      CHECK(rel_err(params.grad[name], g) <= rel_tol);
    }
  }
}
