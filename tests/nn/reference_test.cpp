// Layers against independent references: naive double-precision loops written from the formulas
// (finite_difference.hpp; they call none of mpar's kernels or layers) for the forward output, and
// central finite differences of sum(y * dy) through those loops for the input gradient and EVERY
// parameter gradient, on one rank and, for the tensor-parallel layers, on two.
// Tolerances (norm-relative, fp32 layer against the double reference): forward 1e-5, gradients 1e-4;
// a wrong causal mask, a missing bias gradient or a wrong scale is off by more than 1e-2.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include <mpar/comm/threads.hpp>

#include "call_layer.hpp"
#include "finite_difference.hpp"
#include "nn_test_support.hpp"

using namespace mpar;
using namespace mpar::nn;
using namespace mpar::testing;
using Comm = ThreadsCommunicator;

namespace {

constexpr std::uint64_t reference_seed = 17;
constexpr double fwd_tol = 1e-5, grad_tol = 1e-4;

/** What the ranks of one run produced; filled under the lock, checked on the main thread. */
struct Observed {
  std::mutex m;
  int ranks = 0;
  std::vector<float> y, dx;                // rank 0's (the layers tested here return replicated activations)
  std::vector<std::vector<float>> others;  // the other ranks' y and dx, which must equal rank 0's
  double rank_disagreement = 0;            // (embedding test) largest |y_r - y_0|
  Assembled params;
};

enum class Backward { fused, split };

/** Runs `make(tp)` on `p` ranks: forward(x), then the fused backward or B then W, all on replicated x and dy. */
template <class Make>
void run_layer(int p, const Activation& x, const Activation& dy, Observed& out, Make make,
               Backward how = Backward::fused) {
  run_threads(p, [&](Comm& tp) {
    auto layer = make(tp);
    const Activation y = forward(layer, x);
    Activation dx;
    if (how == Backward::fused) {
      dx = backward(layer, dy);
    } else {
      dx = backward_input(layer, dy);
      backward_weight(layer);
    }
    out.params.add(layer.parameters());
    std::lock_guard lock(out.m);
    ++out.ranks;
    std::vector<float> yv(y.values().begin(), y.values().end()), dxv(dx.values().begin(), dx.values().end());
    if (tp.rank() == 0) {
      out.y = std::move(yv);
      out.dx = std::move(dxv);
    } else {
      out.others.push_back(std::move(yv));
      out.others.push_back(std::move(dxv));
    }
  });
}

ref::Params params_of(const Assembled& a) {
  ref::Params p;
  for (const auto& [name, v] : a.value) p[name] = ref::Vec(v.begin(), v.end());
  return p;
}

ref::Vec as_vec(const Activation& a) { return ref::Vec(a.values().begin(), a.values().end()); }

/** The layer's forward, input gradient and every parameter gradient against the reference `f`. */
void check_against_reference(Observed& got, int p, const Activation& x, const Activation& dy,
                             const std::function<ref::Vec(const ref::Vec&, const ref::Params&)>& f) {
  INFO("ranks: " << p);
  REQUIRE(got.ranks == p);
  CHECK(got.params.replica_mismatch < 1e-6);
  for (std::size_t i = 0; i < got.others.size(); ++i) CHECK(got.others[i] == (i % 2 == 0 ? got.y : got.dx));
  const ref::Params values = params_of(got.params);
  const ref::Vec xd = as_vec(x), dyd = as_vec(dy);
  CHECK(ref::rel_err(got.y, f(xd, values)) <= fwd_tol);
  const ref::Gradients g = ref::numeric_gradients(f, xd, values, dyd);
  CHECK(ref::rel_err(got.dx, g.dx) <= grad_tol);
  REQUIRE(got.params.grad.size() == g.dp.size());
  for (const auto& [name, want] : g.dp) {
    INFO("parameter " << name);
    REQUIRE(got.params.grad.count(name) == 1);
    CHECK(ref::rel_err(got.params.grad[name], want) <= grad_tol);
  }
}

/** Gives every parameter a non-trivial value (layer-norm gains start at 1 and biases at 0). */
void randomise(const std::vector<Parameter*>& ps, std::uint64_t stream) {
  const CounterRng rng{99, stream};
  std::uint64_t i = 0;
  for (Parameter* p : ps)
    for (float& v : p->value) v += float(0.3 * rng.normal(i++));
}

}  // namespace

TEST_CASE("Linear: forward and backward equal the hand formulas y = xW + b, dx = dy Wt, dW = xt dy, db = sum dy",
          "[nn][reference][linear]") {
  constexpr std::size_t t = 6, in = 8, out = 12;
  const Activation x = random_activation(t, in, 1), dy = random_activation(t, out, 2);
  for (Backward how : {Backward::fused, Backward::split}) {
    INFO((how == Backward::fused ? "fused backward" : "B then W"));
    Observed got;
    run_layer(
        1, x, dy, got,
        [](Comm&) {
          return Linear<>(in, out, {reference_seed, 10, "lin", true});
        },
        how);
    REQUIRE(got.ranks == 1);
    const ref::Vec w(got.params.value["lin.weight"].begin(), got.params.value["lin.weight"].end());
    const ref::Vec b(got.params.value["lin.bias"].begin(), got.params.value["lin.bias"].end());
    ref::Vec y(t * out), dx(t * in, 0.0), dw(in * out, 0.0), db(out, 0.0);
    for (std::size_t r = 0; r < t; ++r)
      for (std::size_t j = 0; j < out; ++j) {
        y[r * out + j] = b[j];
        for (std::size_t i = 0; i < in; ++i) {
          y[r * out + j] += x(r, i) * w[i * out + j];
          dx[r * in + i] += dy(r, j) * w[i * out + j];
          dw[i * out + j] += x(r, i) * dy(r, j);
        }
        db[j] += dy(r, j);
      }
    CHECK(ref::rel_err(got.y, y) <= fwd_tol);
    CHECK(ref::rel_err(got.dx, dx) <= fwd_tol);
    CHECK(ref::rel_err(got.params.grad["lin.weight"], dw) <= fwd_tol);
    CHECK(ref::rel_err(got.params.grad["lin.bias"], db) <= fwd_tol);
    check_against_reference(got, 1, x, dy, [&](const ref::Vec& xv, const ref::Params& p) {
      return ref::linear(xv, t, in, out, p.at("lin.weight"), &p.at("lin.bias"));
    });
  }
}

TEST_CASE(
    "Linear: the weight gradient adds up over backward passes; the first after zero_grad overwrites, a gradient "
    "written by hand with grad_zeroed cleared is added to",
    "[nn][reference][linear]") {
  constexpr std::size_t t = 5, in = 7, out = 9;
  const Activation x0 = random_activation(t, in, 3), x1 = random_activation(t, in, 4);
  const Activation dy0 = random_activation(t, out, 5), dy1 = random_activation(t, out, 6);
  auto layer = Linear<>(in, out, {reference_seed, 11, "lin", true});
  Parameter& w = *layer.parameters().front();
  REQUIRE(w.name == "lin.weight");
  const std::vector<float> wv(w.value.begin(), w.value.end());
  auto naive_dw = [&](const Activation& x, const Activation& dy) {  // xᵀ dy in double
    ref::Vec dw(in * out, 0.0);
    for (std::size_t r = 0; r < t; ++r)
      for (std::size_t i = 0; i < in; ++i)
        for (std::size_t j = 0; j < out; ++j) dw[i * out + j] += x(r, i) * dy(r, j);
    return dw;
  };
  const ref::Vec dw0 = naive_dw(x0, dy0), dw1 = naive_dw(x1, dy1);
  auto pass = [&](const Activation& x, const Activation& dy) {
    (void)forward(layer, x);
    (void)backward(layer, dy);
  };
  auto grad = [&] { return std::vector<float>(w.grad.begin(), w.grad.end()); };
  auto plus = [](ref::Vec a, const ref::Vec& b, double c = 0.0) {
    for (std::size_t i = 0; i < a.size(); ++i) a[i] += b[i] + c;
    return a;
  };

  for (Parameter* p : layer.parameters()) p->zero_grad();
  pass(x0, dy0);
  CHECK(ref::rel_err(grad(), dw0) <= fwd_tol);
  pass(x1, dy1);
  CHECK(ref::rel_err(grad(), plus(dw0, dw1)) <= fwd_tol);

  // A gradient the caller adds to after zero_grad (a regulariser's, say) is kept once grad_zeroed is cleared.
  for (Parameter* p : layer.parameters()) p->zero_grad();
  std::fill(w.grad.begin(), w.grad.end(), 1.0f);
  w.grad_zeroed = false;
  pass(x0, dy0);
  CHECK(ref::rel_err(grad(), plus(dw0, ref::Vec(in * out, 0.0), 1.0)) <= fwd_tol);

  // After zero_grad the first pass writes the gradient without reading it back: NaN put there by hand
  // without clearing grad_zeroed does not reach the result (the read of C the overwrite saves).
  for (Parameter* p : layer.parameters()) p->zero_grad();
  std::fill(w.grad.begin(), w.grad.end(), std::numeric_limits<float>::quiet_NaN());
  pass(x1, dy1);
  CHECK(ref::rel_err(grad(), dw1) <= fwd_tol);
  CHECK(std::vector<float>(w.value.begin(), w.value.end()) == wv);  // no pass changed the weight
}

TEST_CASE("Attention and SelfAttention (TP 1, 2) equal a naive causal attention loop and its finite differences",
          "[nn][reference][attention]") {
  // two sequences of 4 tokens: a query sees the keys j <= i of its own sequence only
  constexpr std::size_t hidden = 16, heads = 4, seq = 4, t = 8;
  const AttentionConfig cfg{hidden, heads, seq, reference_seed, 200, "attn"};
  const Activation x = random_activation(t, hidden, 3), dy = random_activation(t, hidden, 4);
  const auto naive = [&](std::size_t future) {
    return [=](const ref::Vec& xv, const ref::Params& p) {
      return ref::attention(xv, t, hidden, heads, seq, p, "attn", future);
    };
  };
  SECTION("Attention, fused backward and B then W") {
    for (Backward how : {Backward::fused, Backward::split}) {
      Observed got;
      run_layer(
          1, x, dy, got, [&](Comm&) { return Attention<>(cfg); }, how);
      check_against_reference(got, 1, x, dy, naive(0));
      // the reference tells a one-token-ahead mask apart: the test fails if the layer's mask leaks
      CHECK(ref::rel_err(got.y, naive(1)(as_vec(x), params_of(got.params))) > 1e-2);
    }
  }
  SECTION("SelfAttention split by heads") {
    for (int p : {1, 2}) {
      Observed got;
      run_layer(p, x, dy, got, [&](Comm& tp) { return SelfAttention<Comm>(tp, cfg); });
      check_against_reference(got, p, x, dy, naive(0));
    }
  }
}

TEST_CASE("LayerNorm equals the naive normalisation and its finite differences", "[nn][reference][layernorm]") {
  constexpr std::size_t t = 5, n = 12;
  const Activation x = random_activation(t, n, 5, 2.0), dy = random_activation(t, n, 6);
  Observed got;
  run_layer(1, x, dy, got, [](Comm&) {
    LayerNorm<> ln(n, reference_seed, 30, "ln");
    randomise(ln.parameters(), 1);
    return ln;
  });
  check_against_reference(got, 1, x, dy, [&](const ref::Vec& xv, const ref::Params& p) {
    return ref::layer_norm(xv, t, n, p.at("ln.weight"), p.at("ln.bias"));
  });
}

TEST_CASE("TransformerBlock (TP 1, 2; with and without recomputation; fused and B then W) equals the naive block",
          "[nn][reference][block]") {
  constexpr std::size_t hidden = 16, heads = 4, ffn = 32, seq = 4, t = 8;
  const BlockConfig cfg{hidden, heads, ffn, seq, 0.0, reference_seed, 300, "block"};
  const Activation x = random_activation(t, hidden, 7), dy = random_activation(t, hidden, 8);
  const auto naive = [&](const ref::Vec& xv, const ref::Params& p) {
    return ref::block(xv, t, hidden, heads, ffn, seq, p, "block");
  };
  for (int p : {1, 2})
    for (bool recompute : {false, true})
      for (Backward how : {Backward::fused, Backward::split}) {
        INFO("recompute " << recompute << (how == Backward::split ? ", B then W" : ", fused"));
        Observed got;
        run_layer(
            p, x, dy, got,
            [&](Comm& tp) {
              TransformerBlock<Comm> b(tp, cfg);
              b.set_recompute(recompute);
              // layer norms start at gain 1, bias 0; move them (identically on every rank) so their gradients matter
              for (Parameter* q : b.parameters())
                if (q->global_shape.size() == 1 && q->name.find(".ln") != std::string::npos) randomise({q}, q->id);
              return b;
            },
            how);
        check_against_reference(got, p, x, dy, naive);
      }
}

TEST_CASE("Embedding and VocabParallelEmbedding (TP 2) equal the table lookup and its scatter-add gradient",
          "[nn][reference][embedding]") {
  constexpr std::size_t vocab = 10, hidden = 6;
  const std::vector<std::int32_t> tokens{3, 0, 9, 3, 5, 4, 3, 9};  // repeated tokens add their gradients
  const Activation dy = random_activation(tokens.size(), hidden, 9);
  const EmbeddingConfig cfg{vocab, hidden, reference_seed, 40, "embed"};
  for (int p : {1, 2}) {
    INFO("ranks: " << p);
    Observed got;
    run_threads(p, [&](Comm& tp) {
      std::vector<float> y;
      std::vector<Parameter*> ps;
      if (p == 1) {
        Embedding e(cfg);
        const Activation out = e.embed(tokens).tensor();
        e.backward(Act<Replicate>(dy));
        y.assign(out.values().begin(), out.values().end());
        got.params.add(e.parameters());
      } else {
        VocabParallelEmbedding<Comm> e(tp, cfg);
        const Activation out = e.embed(tokens).tensor();
        e.backward(Act<Replicate>(dy));
        y.assign(out.values().begin(), out.values().end());
        got.params.add(e.parameters());
      }
      std::lock_guard lock(got.m);
      ++got.ranks;
      if (tp.rank() == 0)
        got.y = y;
      else
        for (std::size_t i = 0; i < y.size() && i < got.y.size(); ++i)
          got.rank_disagreement = std::max(got.rank_disagreement, double(std::abs(y[i] - got.y[i])));
    });
    REQUIRE(got.ranks == p);
    CHECK(got.rank_disagreement == 0.0);
    const auto& table = got.params.value["embed.weight"];
    REQUIRE(table.size() == vocab * hidden);
    ref::Vec y(tokens.size() * hidden), dw(vocab * hidden, 0.0);
    for (std::size_t i = 0; i < tokens.size(); ++i)
      for (std::size_t c = 0; c < hidden; ++c) {
        y[i * hidden + c] = table[std::size_t(tokens[i]) * hidden + c];
        dw[std::size_t(tokens[i]) * hidden + c] += dy(i, c);
      }
    CHECK(ref::rel_err(got.y, y) == 0.0);
    CHECK(ref::rel_err(got.params.grad["embed.weight"], dw) <= fwd_tol);
    for (std::size_t row : {std::size_t(1), std::size_t(2)}) {  // tokens never seen get no gradient
      INFO("row " << row);
      for (std::size_t c = 0; c < hidden; ++c) CHECK(got.params.grad["embed.weight"][row * hidden + c] == 0.0f);
    }
  }
}

TEST_CASE(
    "TransformerBlock with recomputation keeps no sub-layer activations after forward and rebuilds them in backward",
    "[nn][recompute][block]") {
  // Equal gradients alone would also hold if nothing were recomputed; here the feed-forward half is asked
  // for its saved activations right after the block's forward: they must be gone (and present without
  // recomputation), and the block's backward must still run, rebuilding them.
  const BlockConfig cfg{16, 4, 32, 4, 0.0, reference_seed, 300, "block"};
  const Activation x = random_activation(8, 16, 10), dy = random_activation(8, 16, 11);
  std::string kept_error = "not run", dropped_error, backward_error = "not run";
  run_threads(1, [&](Comm& tp) {
    auto error_of = [](auto&& f) -> std::string {
      try {
        f();
      } catch (const std::exception& e) {
        return e.what();
      }
      return "";
    };
    TransformerBlock<Comm> plain(tp, cfg), recomputed(tp, cfg);
    recomputed.set_recompute(true);
    (void)forward(plain, x);
    (void)forward(recomputed, x);
    kept_error = error_of([&] { (void)backward_input(plain.ffn(), dy); });
    dropped_error = error_of([&] { (void)backward_input(recomputed.ffn(), dy); });
    backward_error = error_of([&] { (void)backward(recomputed, dy); });
  });
  CHECK(kept_error.empty());
  CHECK_THAT(dropped_error, Catch::Contains("micro-batch 0") && Catch::Contains("no saved activations"));
  CHECK(backward_error.empty());
}
