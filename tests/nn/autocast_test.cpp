// The GEMM layers under Autocast(bf16) against a naive-loop reference that rounds the operands to bf16 itself.
//
// Tolerance: the layer multiplies bf16 operands (whose products are exact in fp32) and accumulates in fp32, so
// each output element may differ from the exact (double) sum of the rounded products by at most about
// k * 2^-24 * sum_k |a_ik b_kj| for a k-term sum. The test allows 1e-5 * sum_k |a_ik b_kj| per element (k <= 24
// here, so that is more than 20x the worst case and far below bf16's own rounding, 2^-8). To show that the
// operands really are 16-bit, the same output must miss the unrounded fp32 reference by more than that.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include <mpar/comm/threads.hpp>

#include "call_layer.hpp"
#include "nn_test_support.hpp"

using namespace mpar;
using namespace mpar::nn;
using namespace mpar::testing;
using Comm = ThreadsCommunicator;

namespace {

/** fp32 to the nearest bf16 (ties to even), written here on the bits, independent of mpar's bf16 type. */
float round_bf16(float v) {
  std::uint32_t u;
  std::memcpy(&u, &v, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  u &= 0xFFFF0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

/** Global reference of one layer: y = r(x) r(W) + b, dx = r(dy) r(W)ᵀ, dW = r(x)ᵀ r(dy), db = Σ dy. */
struct Reference {
  std::size_t t, in, out;
  std::vector<double> y, y_bound, y_fp32, dx, dx_bound, dw, dw_bound, db;
};

Reference reference(const Activation& x, const Activation& dy, const std::vector<float>& w,
                    const std::vector<float>& b) {
  const std::size_t t = x.extent(0), in = x.extent(1), out = dy.extent(1);
  Reference r{t, in, out, {}, {}, {}, {}, {}, {}, {}, {}};
  r.y.assign(t * out, 0), r.y_bound.assign(t * out, 0), r.y_fp32.assign(t * out, 0);
  r.dx.assign(t * in, 0), r.dx_bound.assign(t * in, 0), r.dw.assign(in * out, 0), r.dw_bound.assign(in * out, 0);
  r.db.assign(out, 0);
  auto rx = [&](std::size_t i, std::size_t k) { return double(round_bf16(x(i, k))); };
  auto rw = [&](std::size_t k, std::size_t j) { return double(round_bf16(w[k * out + j])); };
  auto rdy = [&](std::size_t i, std::size_t j) { return double(round_bf16(dy(i, j))); };
  for (std::size_t i = 0; i < t; ++i)
    for (std::size_t j = 0; j < out; ++j) {
      double s = b.empty() ? 0.0 : double(b[j]), s32 = s, bound = 0;
      for (std::size_t k = 0; k < in; ++k) {
        s += rx(i, k) * rw(k, j);
        bound += std::abs(rx(i, k) * rw(k, j));
        s32 += double(x(i, k)) * double(w[k * out + j]);
      }
      r.y[i * out + j] = s, r.y_bound[i * out + j] = bound, r.y_fp32[i * out + j] = s32;
    }
  for (std::size_t i = 0; i < t; ++i)
    for (std::size_t k = 0; k < in; ++k)
      for (std::size_t j = 0; j < out; ++j) {
        r.dx[i * in + k] += rdy(i, j) * rw(k, j);
        r.dx_bound[i * in + k] += std::abs(rdy(i, j) * rw(k, j));
      }
  for (std::size_t k = 0; k < in; ++k)
    for (std::size_t j = 0; j < out; ++j)
      for (std::size_t i = 0; i < t; ++i) {
        r.dw[k * out + j] += rx(i, k) * rdy(i, j);
        r.dw_bound[k * out + j] += std::abs(rx(i, k) * rdy(i, j));
      }
  for (std::size_t i = 0; i < t; ++i)
    for (std::size_t j = 0; j < out; ++j) r.db[j] += double(dy(i, j));
  return r;
}

/** Largest |got - ref| / (1e-5 * bound) over a local block whose element (i, j) is global (i + r0, j + c0). */
double excess(const Activation& got, const std::vector<double>& ref, const std::vector<double>& bound,
              std::size_t global_cols, std::size_t r0, std::size_t c0) {
  double worst = 0;
  for (std::size_t i = 0; i < got.extent(0); ++i)
    for (std::size_t j = 0; j < got.extent(1); ++j) {
      const std::size_t g = (i + r0) * global_cols + j + c0;
      worst = std::max(worst, std::abs(double(got(i, j)) - ref[g]) / (1e-5 * bound[g] + 1e-30));
    }
  return worst;
}
/** The same for a parameter's gradient block (its global index), with a bound per element (or a flat one). */
double grad_excess(const Parameter& p, const std::vector<double>& ref, const std::vector<double>* bound) {
  double worst = 0;
  for (std::size_t k = 0; k < p.local_size(); ++k) {
    const std::size_t g = p.global_index(k);
    const double tol = bound ? 1e-5 * (*bound)[g] + 1e-30 : 1e-5 * (std::abs(ref[g]) + 1.0);
    worst = std::max(worst, std::abs(double(p.grad[k]) - ref[g]) / tol);
  }
  return worst;
}

/** What one rank measured (Catch2 assertions stay on the main thread). */
struct Measured {
  double y = 0, y_vs_fp32 = 1e30, dx = 0, dw = 0, db = 0;
};

constexpr std::uint64_t autocast_seed = 11;
constexpr std::size_t T = 8, In = 16, Out = 24;

void check(const std::vector<Measured>& ms) {
  for (std::size_t r = 0; r < ms.size(); ++r) {
    INFO("rank " << r);
    CHECK(ms[r].y <= 1.0);
    CHECK(ms[r].dx <= 1.0);
    CHECK(ms[r].dw <= 1.0);
    CHECK(ms[r].db <= 1.0);
  }
  // Some rank's output misses the unrounded product: the operands were 16-bit.
  double most = 0;
  for (const auto& m : ms) most = std::max(most, m.y_vs_fp32);
  CHECK(most > 10.0);
}

}  // namespace

TEST_CASE("Autocast(bf16): Linear, ColumnParallel and RowParallel match a bf16-rounded naive reference",
          "[nn][autocast]") {
  const Activation x = random_activation(T, In, 71), dy = random_activation(T, Out, 72);
  const LinearInit init{autocast_seed, 500, "lin", true};
  Linear<> global(In, Out, init);  // its (sharding-independent) initial values are every layer's global weights
  const std::vector<float> w(global.weight().value.begin(), global.weight().value.end()),
      b(global.bias().value.begin(), global.bias().value.end());
  const Reference ref = reference(x, dy, w, b);

  SECTION("Linear") {
    std::vector<Measured> ms(1);
    Linear<> layer(In, Out, init);
    {
      Autocast scope(ComputeType::bf16);
      const Activation y = testing::forward(layer, x, 3);
      const Activation dx = testing::backward_input(layer, dy, 3);
      layer.backward_weight(3);
      ms[0].y = excess(y, ref.y, ref.y_bound, Out, 0, 0);
      ms[0].y_vs_fp32 = excess(y, ref.y_fp32, ref.y_bound, Out, 0, 0);
      ms[0].dx = excess(dx, ref.dx, ref.dx_bound, In, 0, 0);
    }
    ms[0].dw = grad_excess(layer.weight(), ref.dw, &ref.dw_bound);
    ms[0].db = grad_excess(layer.bias(), ref.db, nullptr);
    check(ms);
    // Outside the scope the layer computes in fp32 again.
    Linear<> plain(In, Out, init);
    CHECK(excess(testing::forward(plain, x), ref.y_fp32, ref.y_bound, Out, 0, 0) <= 1.0);
  }
  for (int p : {1, 2}) {
    DYNAMIC_SECTION("ColumnParallel, TP = " << p) {
      std::vector<Measured> ms(static_cast<std::size_t>(p));
      run_threads(p, [&](Comm& tp) {
        const auto r = std::size_t(tp.rank()), cols = Out / std::size_t(p);
        ColumnParallel<Comm> layer(tp, In, Out, init);
        Measured& m = ms[r];
        {
          Autocast scope(ComputeType::bf16);
          const Activation y = testing::forward(layer, x, 0);  // this rank's output columns
          const Activation dx =
              testing::backward_input(layer, local_features<HostBackend>(dy, std::size_t(p), r), 0);  // all-reduced
          layer.backward_weight(0);
          m.y = excess(y, ref.y, ref.y_bound, Out, 0, r * cols);
          m.y_vs_fp32 = excess(y, ref.y_fp32, ref.y_bound, Out, 0, r * cols);
          m.dx = excess(dx, ref.dx, ref.dx_bound, In, 0, 0);
        }
        m.dw = grad_excess(layer.weight(), ref.dw, &ref.dw_bound);
        m.db = grad_excess(layer.bias(), ref.db, nullptr);
      });
      check(ms);
    }
    DYNAMIC_SECTION("RowParallel, TP = " << p) {
      std::vector<Measured> ms(static_cast<std::size_t>(p));
      run_threads(p, [&](Comm& tp) {
        const auto r = std::size_t(tp.rank()), rows = In / std::size_t(p);
        RowParallel<Comm> layer(tp, In, Out, init);
        Measured& m = ms[r];
        {
          Autocast scope(ComputeType::bf16);
          const Activation y =
              testing::forward(layer, local_features<HostBackend>(x, std::size_t(p), r), 0);  // all-reduced
          const Activation dx = testing::backward_input(layer, dy, 0);  // this rank's input columns
          layer.backward_weight(0);
          m.y = excess(y, ref.y, ref.y_bound, Out, 0, 0);
          m.y_vs_fp32 = excess(y, ref.y_fp32, ref.y_bound, Out, 0, 0);
          m.dx = excess(dx, ref.dx, ref.dx_bound, In, 0, r * rows);
        }
        m.dw = grad_excess(layer.weight(), ref.dw, &ref.dw_bound);
        m.db = grad_excess(layer.bias(), ref.db, nullptr);
      });
      check(ms);
    }
  }
  SECTION("Linear2D (SUMMA), 2 x 2 grid") {
    constexpr std::size_t q = 2;
    std::vector<Measured> ms(q * q);
    run_threads(int(q * q), [&](Comm& world) {
      auto grid = make_tensor_grid(world, q, q);
      Linear2D<Comm> layer(grid, In, Out, init);
      const std::size_t i = grid.i(), j = grid.j(), tq = T / q, iq = In / q, oq = Out / q;
      auto block = [&](const Activation& g, std::size_t cols) {
        return Activation(g.slice(0, i * tq, (i + 1) * tq).slice(1, j * cols / q, (j + 1) * cols / q));
      };
      Measured& m = ms[i * q + j];
      {
        Autocast scope(ComputeType::bf16);
        const Activation y = layer.forward(Act<GridShard>(block(x, In)), 0).tensor();
        const Activation dx = layer.backward_input(Act<GridShard>(block(dy, Out)), 0).tensor();
        layer.backward_weight(0);
        m.y = excess(y, ref.y, ref.y_bound, Out, i * tq, j * oq);
        m.y_vs_fp32 = excess(y, ref.y_fp32, ref.y_bound, Out, i * tq, j * oq);
        m.dx = excess(dx, ref.dx, ref.dx_bound, In, i * tq, j * iq);
      }
      m.dw = grad_excess(layer.weight(), ref.dw, &ref.dw_bound);
      m.db = grad_excess(layer.bias(), ref.db, nullptr);
    });
    check(ms);
  }
}

TEST_CASE("Autocast: a backward uses the type its forward used, and scopes nest", "[nn][autocast]") {
  CHECK(autocast_type() == ComputeType::fp32);
  {
    Autocast outer(ComputeType::bf16);
    const auto g = autocast_generation();
    CHECK(autocast_type() == ComputeType::bf16);
    {
      Autocast inner(ComputeType::fp32);
      CHECK(autocast_type() == ComputeType::fp32);
      CHECK(autocast_generation() != g);
    }
    CHECK(autocast_type() == ComputeType::bf16);
    CHECK(autocast_generation() == g);
  }
  CHECK(autocast_type() == ComputeType::fp32);

  // Forward in bf16, backward after the scope closed: the kept 16-bit input decides, so dW is the bf16 one.
  const Activation x = random_activation(T, In, 81), dy = random_activation(T, Out, 82);
  const LinearInit init{autocast_seed, 510, "lin", true};
  Linear<> layer(In, Out, init);
  const std::vector<float> w(layer.weight().value.begin(), layer.weight().value.end()),
      b(layer.bias().value.begin(), layer.bias().value.end());
  const Reference ref = reference(x, dy, w, b);
  {
    Autocast scope(ComputeType::bf16);
    (void)testing::forward(layer, x, 0);
  }
  const Activation dx = testing::backward_input(layer, dy, 0);
  layer.backward_weight(0);
  CHECK(excess(dx, ref.dx, ref.dx_bound, In, 0, 0) <= 1.0);
  CHECK(grad_excess(layer.weight(), ref.dw, &ref.dw_bound) <= 1.0);
}

// A mixed-precision optimizer hands the layers its 16-bit copy of each weight (`Parameter::compute_copy`, set
// between begin_compute and end_compute); the layer must multiply that copy instead of rounding `value` again,
// and an fp32 pass in that window must multiply the copy widened.
// Here the copy deliberately holds other weights (2 W, exact in bf16 when W is) so the output says which was read.
TEST_CASE("Autocast(bf16): a linear layer multiplies the parameter's 16-bit compute copy while one is set",
          "[nn][autocast]") {
  const Activation x = random_activation(T, In, 91), dy = random_activation(T, Out, 92);
  const LinearInit init{autocast_seed, 520, "lin", false};
  Linear<> layer(In, Out, init);
  for (float& w : layer.weight().value) w = round_bf16(w);  // so that 2 W is exactly the bf16 copy below
  const std::vector<float> w(layer.weight().value.begin(), layer.weight().value.end());
  std::vector<float> doubled(w.size());
  std::vector<bf16> copy(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) doubled[i] = 2.0f * w[i], copy[i] = bf16(doubled[i]);
  const Reference plain = reference(x, dy, w, {}), twice = reference(x, dy, doubled, {});

  layer.weight().set_compute_copy(std::span<const bf16>(copy));
  {
    Autocast scope(ComputeType::bf16);
    const Activation y = testing::forward(layer, x, 0);
    CHECK(excess(y, twice.y, twice.y_bound, Out, 0, 0) <= 1.0);
    const Activation dx = testing::backward_input(layer, dy, 0);  // dx = dy (2 W)ᵀ: the same copy
    CHECK(excess(dx, twice.dx, twice.dx_bound, In, 0, 0) <= 1.0);
  }
  layer.backward_weight(0);

  // Outside Autocast while the copy is set (an fp32 pass inside a mixed-precision step): a linear layer's weight
  // is read by GEMMs alone (`gemm_operand_only`), so the optimizer leaves its unrounded master in `value`; the
  // fp32 product multiplies the copy widened, 2 W, not `value`.
  REQUIRE(layer.weight().gemm_operand_only);
  {
    const Activation y = testing::forward(layer, x, 2);
    CHECK(excess(y, twice.y_fp32, twice.y_bound, Out, 0, 0) <= 1.0);
    CHECK(excess(y, plain.y_fp32, plain.y_bound, Out, 0, 0) > 10.0);
  }
  layer.drop(2);

  // Cleared (end_compute): the next scope rounds `value` itself, W.
  layer.weight().clear_compute_copy();
  {
    Autocast scope(ComputeType::bf16);
    const Activation y = testing::forward(layer, x, 1);
    CHECK(excess(y, plain.y, plain.y_bound, Out, 0, 0) <= 1.0);
    CHECK(excess(y, twice.y, twice.y_bound, Out, 0, 0) > 10.0);
  }
  layer.drop(1);
}

// The attention core's six products under bf16 against naive loops: q, k, v, the probabilities, dO and dS
// rounded to bf16 by the test, everything else in double (the softmax and its backward in fp32 in the layer).
// Tolerance, norm-relative: 3e-4. The layer's fp32 probabilities and the reference's double ones can fall on
// two sides of a bf16 rounding boundary (one element moves by 2^-8 relative), so elementwise bounds as above
// would be brittle; the bf16-vs-fp32 difference itself is about 10x larger than the tolerance, which the test
// checks too.
TEST_CASE("Autocast(bf16): the attention core's products match a bf16-rounded naive reference",
          "[nn][autocast][attention]") {
  const std::size_t heads = 2, d = 8, s = 6, nb = 2, hl = heads * d, ld = 3 * hl, tokens = nb * s;
  const AttentionCore core{heads, d, s};
  const Activation qkv = random_activation(tokens, ld, 91), dout = random_activation(tokens, hl, 92);
  // The layer: q, k, v converted to bf16 as AttentionLayer does, then the core in bf16.
  Buffer<bf16> qkv16(qkv.size());
  HostBackend::run(ops::convert<float, bf16>{.n = qkv.size(), .src = qkv.data(), .dst = qkv16.data()});
  Buffer<float> probs;
  const Activation o = core.forward<HostBackend, bf16>(qkv, qkv16.data(), probs, "test");
  const Activation dqkv = core.backward<HostBackend, bf16>(tokens, qkv16.data(), probs, dout, "test");

  auto reference = [&](bool rounded) {
    auto r = [&](double v) { return rounded ? double(round_bf16(float(v))) : v; };
    const double scale = 1.0 / std::sqrt(double(d));
    std::vector<double> out(tokens * hl, 0.0), grad(tokens * ld, 0.0);
    for (std::size_t b = 0; b < nb; ++b)
      for (std::size_t h = 0; h < heads; ++h) {
        auto q = [&](std::size_t i, std::size_t c) { return r(qkv(b * s + i, h * d + c)); };
        auto k = [&](std::size_t i, std::size_t c) { return r(qkv(b * s + i, hl + h * d + c)); };
        auto v = [&](std::size_t i, std::size_t c) { return r(qkv(b * s + i, 2 * hl + h * d + c)); };
        auto go = [&](std::size_t i, std::size_t c) { return r(dout(b * s + i, h * d + c)); };
        std::vector<double> p(s * s, 0.0), dp(s * s, 0.0);
        for (std::size_t i = 0; i < s; ++i) {
          double m = -1e300, z = 0;
          std::vector<double> sc(i + 1);
          for (std::size_t j = 0; j <= i; ++j) {
            for (std::size_t c = 0; c < d; ++c) sc[j] += q(i, c) * k(j, c);
            sc[j] *= scale;
            m = std::max(m, sc[j]);
          }
          for (std::size_t j = 0; j <= i; ++j) z += std::exp(sc[j] - m);
          for (std::size_t j = 0; j <= i; ++j) p[i * s + j] = std::exp(sc[j] - m) / z;
        }
        for (std::size_t i = 0; i < s; ++i)
          for (std::size_t c = 0; c < d; ++c) {
            double acc = 0;
            for (std::size_t j = 0; j <= i; ++j) acc += r(p[i * s + j]) * v(j, c);
            out[(b * s + i) * hl + h * d + c] = acc;
          }
        for (std::size_t i = 0; i < s; ++i)
          for (std::size_t j = 0; j <= i; ++j)
            for (std::size_t c = 0; c < d; ++c) dp[i * s + j] += go(i, c) * v(j, c);
        for (std::size_t i = 0; i < s; ++i) {
          double dot = 0;
          for (std::size_t j = 0; j <= i; ++j) dot += p[i * s + j] * dp[i * s + j];
          for (std::size_t j = 0; j <= i; ++j) dp[i * s + j] = p[i * s + j] * (dp[i * s + j] - dot);  // dS
        }
        for (std::size_t i = 0; i < s; ++i)
          for (std::size_t j = 0; j <= i; ++j)
            for (std::size_t c = 0; c < d; ++c) {
              const double ds = r(dp[i * s + j]);
              grad[(b * s + i) * ld + h * d + c] += scale * ds * k(j, c);                 // dQ
              grad[(b * s + j) * ld + hl + h * d + c] += scale * ds * q(i, c);            // dK
              grad[(b * s + j) * ld + 2 * hl + h * d + c] += r(p[i * s + j]) * go(i, c);  // dV
            }
      }
    return std::pair{out, grad};
  };
  auto rel = [](const Activation& got, const std::vector<double>& ref) {
    double num = 0, den = 0;
    for (std::size_t i = 0; i < ref.size(); ++i) {
      num += (double(got.data()[i]) - ref[i]) * (double(got.data()[i]) - ref[i]);
      den += ref[i] * ref[i];
    }
    return std::sqrt(num / den);
  };
  const auto [o_ref, g_ref] = reference(true);
  const auto [o_32, g_32] = reference(false);
  INFO("output: " << rel(o, o_ref) << " from the bf16 reference, " << rel(o, o_32) << " from fp32");
  INFO("dqkv: " << rel(dqkv, g_ref) << " from the bf16 reference, " << rel(dqkv, g_32) << " from fp32");
  CHECK(rel(o, o_ref) <= 3e-4);
  CHECK(rel(dqkv, g_ref) <= 3e-4);
  CHECK(rel(o, o_32) > 1e-3);
  CHECK(rel(dqkv, g_32) > 1e-3);
}

// The MLP's first half fused (bias and GeLU as the GEMM's epilogue, `ops::gemm_bias_gelu`) against the unfused
// chain ColumnParallel -> Gelu on the same rank, in fp32 and inside Autocast(bf16), and against gelu(x W + b)
// by a naive loop in double (fp32). Tolerance: the equivalence tests' norm-relative 1e-5 (rel_tol) for the
// output, the input gradient and both parameter gradients: the two paths differ only in where the bias enters
// the fp32 sum (inside oneDNN's matmul or after it), a few ulps of the activation.
TEST_CASE("ColumnParallelGelu: matches ColumnParallel then Gelu (fp32 and bf16) and a naive loop, TP = 1, 2",
          "[nn][autocast][fused]") {
  const Activation x = random_activation(T, In, 31), dy = random_activation(T, Out, 32);
  for (ComputeType type : {ComputeType::fp32, ComputeType::bf16})
    for (int p : {1, 2}) {
      INFO("TP = " << p << ", " << name_of(type));
      struct Errors {
        double y = 1e30, dx = 1e30, dw = 1e30, db = 1e30, naive = 1e30;
      };
      std::vector<Errors> errs(static_cast<std::size_t>(p));
      run_threads(p, [&](Comm& tp) {
        const auto n = std::size_t(p), r = std::size_t(tp.rank());
        const LinearInit init{autocast_seed, 40, "fc", true};
        ColumnParallelGelu<Comm> fused(tp, In, Out, init);
        ColumnParallel<Comm> fc(tp, In, Out, init);
        Gelu gelu;
        const Activation dy_local = local_features<HostBackend>(dy, n, r);
        Errors e;
        {
          Autocast scope(type);
          const auto y = fused.forward(Act<Replicate>(x));
          const auto dx = fused.backward(Act<FeatureShard>(dy_local));
          const auto y2 = gelu.forward(fc.forward(Act<Replicate>(x)));
          const auto dx2 = fc.backward(gelu.backward(Act<FeatureShard>(dy_local)));
          e.y = rel_err(y.tensor().values(), y2.tensor().values());
          e.dx = rel_err(dx.tensor().values(), dx2.tensor().values());
          if (type == ComputeType::fp32) {
            const auto& w = fused.weight().value;
            const auto& b = fused.bias().value;
            const std::size_t local = Out / n;
            std::vector<float> ref(T * local);
            for (std::size_t i = 0; i < T; ++i)
              for (std::size_t j = 0; j < local; ++j) {
                double s = b[j];
                for (std::size_t k = 0; k < In; ++k) s += double(x(i, k)) * double(w[k * local + j]);
                ref[i * local + j] =
                    float(0.5 * s * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (s + 0.044715 * s * s * s))));
              }
            e.naive = rel_err(y.tensor().values(), ref);
          } else {
            e.naive = 0;
          }
        }
        e.dw = rel_err(fused.weight().grad, fc.weight().grad);
        e.db = rel_err(fused.bias().grad, fc.bias().grad);
        errs[r] = e;
      });
      for (std::size_t r = 0; r < errs.size(); ++r) {
        INFO("rank " << r);
        CHECK(errs[r].y <= rel_tol);
        CHECK(errs[r].dx <= rel_tol);
        CHECK(errs[r].dw <= rel_tol);
        CHECK(errs[r].db <= rel_tol);
        CHECK(errs[r].naive <= rel_tol);
      }
    }
}

TEST_CASE("ColumnParallelGelu: a projection without a bias is refused, naming the layer", "[nn][fused]") {
  std::string message = "(no exception)";
  run_threads(1, [&](Comm& tp) {
    try {
      ColumnParallelGelu<Comm> layer(tp, In, Out, LinearInit{autocast_seed, 40, "fc1", false});
    } catch (const std::exception& e) {
      message = e.what();
    }
  });
  CHECK_THAT(message, Catch::Contains("ColumnParallelGelu 'fc1'") && Catch::Contains("needs a bias"));
}
