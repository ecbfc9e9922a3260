// Split backward: for every layer with weights and every composite, backward_input (B) followed by
// backward_weight (W) reproduces the fused backward exactly (same dx, same gradients, bit for bit),
// the GEMM weight gradients are left to W, and micro-batches can sit between their B and W in any
// order. Tolerance: bit-identical for B-then-W against the fused backward (the same operations run);
// ||a - b||_2 <= 1e-6 ||b||_2 when W runs the micro-batches in another order (the two accumulations
// of a weight gradient are summed in the other order).
#include <catch2/catch.hpp>

#include <mpar/comm/threads.hpp>

#include "nn_test_support.hpp"

using namespace mpar;
using namespace mpar::nn;
using namespace mpar::testing;
using Comm = ThreadsCommunicator;

namespace {

constexpr std::uint64_t split_seed = 13;

/** What one rank observed, gathered under a lock and checked on the main thread (Catch2 is not thread-safe). */
struct SplitReport {
  std::mutex m;
  int ranks = 0;
  bool dx_equal = true, grads_equal = true, gemm_grads_deferred = true, weight_grads_nonzero = true;
  bool second_w_throws = true, interleaved_dx_equal = true;
  double interleaved_grad_err = 0;
  std::string first_failure;

  void fail(std::string_view what, bool& flag) {
    flag = false;
    if (first_failure.empty()) first_failure = std::string(what);
  }
};

/** GEMM weights have two or more dimensions; layer-norm gains and biases are vectors. */
bool is_gemm_weight(const Parameter& p) { return p.global_shape.size() >= 2; }

/**
 * What W writes: the GEMM weights and the biases of the linear layers (`X.bias` beside a GEMM weight
 * `X.weight`); layer-norm gains and biases and separate Bias layers are written by B.
 */
bool written_by_w(const Parameter& p, const std::vector<Parameter*>& all) {
  if (is_gemm_weight(p)) return true;
  const std::string suffix = ".bias";
  if (p.name.size() <= suffix.size() || p.name.compare(p.name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return false;
  const std::string weight = p.name.substr(0, p.name.size() - suffix.size()) + ".weight";
  for (const Parameter* q : all)
    if (q->name == weight && is_gemm_weight(*q)) return true;
  return false;
}

bool same_grads(const std::vector<Parameter*>& a, const std::vector<Parameter*>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i]->name != b[i]->name || a[i]->grad != b[i]->grad) return false;
  return true;
}

/**
 * On `p` ranks: `make(tp)` builds the layer; `In`/`Out` are the layouts of its input and output.
 * Checks B-then-W against the fused backward, that B leaves every GEMM weight gradient at zero, that
 * W consumes what B kept, and that B(mb0), B(mb1), W(mb1), W(mb0) gives the gradients of two fused
 * backwards in order.
 */
template <class In, class Out, class Make>
void check_split(int p, std::size_t tokens, std::size_t in_f, std::size_t out_f, Make make) {
  const Activation x0 = random_activation(tokens, in_f, 21), x1 = random_activation(tokens, in_f, 22);
  const Activation dy0 = random_activation(tokens, out_f, 23), dy1 = random_activation(tokens, out_f, 24);
  SplitReport rep;
  run_threads(p, [&](Comm& tp) {
    const auto n = std::size_t(p), r = std::size_t(tp.rank());
    const Activation a0 = local_block<In>(x0, n, r), a1 = local_block<In>(x1, n, r);
    const Activation g0 = local_block<Out>(dy0, n, r), g1 = local_block<Out>(dy1, n, r);
    using G = grad_layout_t<Out>;  // the layout of the output gradient
    auto fused = make(tp);
    auto split = make(tp);
    static_assert(mpar::nn::detail::split_backward_layer<decltype(split)>);

    // One micro-batch: fused backward vs B then W.
    (void)fused.forward(Act<In>(a0), 0);
    const Activation dx_f = fused.backward(Act<G>(g0), 0).tensor();
    (void)split.forward(Act<In>(a0), 0);
    const Activation dx_s = split.backward_input(Act<G>(g0), 0).tensor();
    bool deferred = true;
    const auto sp = split.parameters();
    for (auto* q : sp)
      if (written_by_w(*q, sp))
        for (float v : q->grad) deferred = deferred && v == 0.0f;
    split.backward_weight(0);
    bool nonzero = true;
    for (auto* q : sp)
      if (written_by_w(*q, sp)) {
        float s = 0;
        for (float v : q->grad) s += std::abs(v);
        nonzero = nonzero && s > 0;
      }
    const bool dx_eq = dx_f.shape() == dx_s.shape() && dx_f.values() == dx_s.values();
    const bool g_eq = same_grads(fused.parameters(), split.parameters());
    bool throws = false;  // and the message names the micro-batch and the missing B
    try {
      split.backward_weight(0);
    } catch (const std::exception& e) {
      const std::string what = e.what();
      throws = what.find("micro-batch 0") != std::string::npos && what.find("backward_input") != std::string::npos;
    }

    // Two micro-batches in flight: W in the opposite order of B.
    auto seq = make(tp);
    auto inter = make(tp);
    (void)seq.forward(Act<In>(a0), 0);
    const Activation s0 = seq.backward(Act<G>(g0), 0).tensor();
    (void)seq.forward(Act<In>(a1), 1);
    const Activation s1 = seq.backward(Act<G>(g1), 1).tensor();
    (void)inter.forward(Act<In>(a0), 0);
    (void)inter.forward(Act<In>(a1), 1);
    const Activation i0 = inter.backward_input(Act<G>(g0), 0).tensor();
    const Activation i1 = inter.backward_input(Act<G>(g1), 1).tensor();
    inter.backward_weight(1);
    inter.backward_weight(0);
    const bool idx_eq = s0.values() == i0.values() && s1.values() == i1.values();
    double err = 0;
    const auto ps = seq.parameters(), pi = inter.parameters();
    for (std::size_t k = 0; k < ps.size() && k < pi.size(); ++k) err = std::max(err, rel_err(pi[k]->grad, ps[k]->grad));
    if (ps.size() != pi.size()) err = 1e30;

    std::lock_guard lock(rep.m);
    ++rep.ranks;
    const std::string where = "tensor rank " + std::to_string(r) + ": ";
    if (!dx_eq) rep.fail(where + "dx of B differs from the fused backward's", rep.dx_equal);
    if (!g_eq) rep.fail(where + "gradients after B+W differ from the fused backward's", rep.grads_equal);
    if (!deferred) rep.fail(where + "a weight or linear-bias gradient was written by B", rep.gemm_grads_deferred);
    if (!nonzero) rep.fail(where + "a weight or linear-bias gradient is still zero after W", rep.weight_grads_nonzero);
    if (!throws)
      rep.fail(
          where + "a second W of the same micro-batch did not throw an error naming micro-batch 0 and backward_input",
          rep.second_w_throws);
    if (!idx_eq) rep.fail(where + "dx with two micro-batches in flight differs", rep.interleaved_dx_equal);
    rep.interleaved_grad_err = std::max(rep.interleaved_grad_err, err);
  });
  INFO("TP = " << p << "; first failure: " << rep.first_failure);
  CHECK(rep.ranks == p);
  CHECK(rep.dx_equal);
  CHECK(rep.grads_equal);
  CHECK(rep.gemm_grads_deferred);
  CHECK(rep.weight_grads_nonzero);
  CHECK(rep.second_w_throws);
  CHECK(rep.interleaved_dx_equal);
  CHECK(rep.interleaved_grad_err <= 1e-6);
}

/**
 * B then W of a dense linear layer named `name` against the fused backward written by hand from the
 * layer's (assembled) weight: dx = dy Wᵀ, dW = xᵀ dy, db = Σ_t dy. Tolerance ||a - b||_2 <= 1e-5 ||b||_2.
 */
template <class In, class Out, class Make>
void check_hand_backward(int p, std::size_t t, std::size_t in_f, std::size_t out_f, const std::string& name,
                         Make make) {
  const Activation x = random_activation(t, in_f, 41), dy = random_activation(t, out_f, 42);
  std::mutex m;
  std::vector<Activation> dx_of(std::size_t(p), Activation({1, 1}));
  Assembled params;
  run_threads(p, [&](Comm& tp) {
    const auto n = std::size_t(p), r = std::size_t(tp.rank());
    auto layer = make(tp);
    (void)layer.forward(Act<In>(local_block<In>(x, n, r)), 0);
    Activation dx = layer.backward_input(Act<grad_layout_t<Out>>(local_block<Out>(dy, n, r)), 0).tensor();
    layer.backward_weight(0);
    params.add(layer.parameters());
    std::lock_guard lock(m);
    dx_of[r] = std::move(dx);
  });
  INFO("layer " << name << ", TP = " << p);
  CHECK(params.replica_mismatch < 1e-6);
  REQUIRE(params.value.count(name + ".weight") == 1);
  const std::vector<float>& w = params.value[name + ".weight"];  // [in, out]
  REQUIRE(w.size() == in_f * out_f);
  Activation dx_want({t, in_f});
  std::vector<float> dw_want(in_f * out_f, 0.0f), db_want(out_f, 0.0f);
  for (std::size_t r = 0; r < t; ++r)
    for (std::size_t j = 0; j < out_f; ++j) {
      for (std::size_t i = 0; i < in_f; ++i) {
        dx_want(r, i) += dy(r, j) * w[i * out_f + j];
        dw_want[i * out_f + j] += x(r, i) * dy(r, j);
      }
      db_want[j] += dy(r, j);
    }
  for (std::size_t r = 0; r < std::size_t(p); ++r) {
    INFO("tensor rank " << r);
    const Activation want = local_block<In>(dx_want, std::size_t(p), r);
    REQUIRE(dx_of[r].shape() == want.shape());
    CHECK(rel_err(dx_of[r].values(), want.values()) <= 1e-5);
  }
  CHECK(rel_err(params.grad[name + ".weight"], dw_want) <= 1e-5);
  REQUIRE(params.grad.count(name + ".bias") == 1);
  CHECK(rel_err(params.grad[name + ".bias"], db_want) <= 1e-5);
}

}  // namespace

TEST_CASE("Linear, ColumnParallel and RowParallel (TP 1, 2): B then W equals the hand-written fused backward",
          "[nn][split][reference]") {
  check_hand_backward<Replicate, Replicate>(1, 6, 8, 12, "lin", [](Comm&) {
    return Linear<>(8, 12, {split_seed, 10, "lin", true});
  });
  for (int p : {1, 2}) {
    check_hand_backward<Replicate, FeatureShard>(p, 6, 8, 12, "col", [](Comm& tp) {
      return ColumnParallel<Comm>(tp, 8, 12, {split_seed, 10, "col", true});
    });
    check_hand_backward<TokenShard, FeatureShard>(p, 6, 8, 12, "col_sp", [](Comm& tp) {
      return ColumnParallel<Comm, dyn, dyn, dyn, ColumnOptions{true, false, 1}>(tp, 8, 12,
                                                                                {split_seed, 10, "col_sp", true});
    });
    check_hand_backward<Replicate, Replicate>(p, 6, 8, 12, "col_gather", [](Comm& tp) {
      return ColumnParallel<Comm, dyn, dyn, dyn, ColumnOptions{false, true, 1}>(tp, 8, 12,
                                                                                {split_seed, 10, "col_gather", true});
    });
    check_hand_backward<FeatureShard, Replicate>(p, 6, 12, 8, "row", [](Comm& tp) {
      return RowParallel<Comm>(tp, 12, 8, {split_seed, 20, "row", true});
    });
    check_hand_backward<FeatureShard, TokenShard>(p, 6, 12, 8, "row_rs", [](Comm& tp) {
      return RowParallel<Comm, dyn, dyn, dyn, RowReduce::reduce_scatter>(tp, 12, 8, {split_seed, 20, "row_rs", true});
    });
  }
}

TEST_CASE("Linear: B then W equals the fused backward; W may run micro-batches in any order", "[nn][split]") {
  check_split<Replicate, Replicate>(1, 6, 8, 12, [](Comm&) { return Linear<>(8, 12, {split_seed, 10, "lin", true}); });
  check_split<Replicate, Replicate>(1, 6, 8, 12, [](Comm&) { return Linear<>(8, 12, {split_seed, 10, "lin", false}); });
}

TEST_CASE("ColumnParallel and RowParallel: B then W equals the fused backward at TP 1 and 2", "[nn][split]") {
  for (int p : {1, 2}) {
    check_split<Replicate, FeatureShard>(p, 6, 8, 12, [](Comm& tp) {
      return ColumnParallel<Comm>(tp, 8, 12, {split_seed, 10, "col", true});
    });
    check_split<TokenShard, FeatureShard>(p, 6, 8, 12, [](Comm& tp) {
      return ColumnParallel<Comm, dyn, dyn, dyn, ColumnOptions{true, false, 1}>(tp, 8, 12,
                                                                                {split_seed, 10, "col_sp", true});
    });
    check_split<Replicate, Replicate>(p, 6, 8, 12, [](Comm& tp) {
      return ColumnParallel<Comm, dyn, dyn, dyn, ColumnOptions{false, true, 1}>(tp, 8, 12,
                                                                                {split_seed, 10, "col_gather", true});
    });
    check_split<Replicate, FeatureShard>(p, 6, 8, 24, [](Comm& tp) {
      return ColumnParallel<Comm, dyn, dyn, dyn, ColumnOptions{false, false, 3}>(tp, 8, 8,
                                                                                 {split_seed, 10, "qkv", true});
    });
    check_split<FeatureShard, Replicate>(p, 6, 12, 8, [](Comm& tp) {
      return RowParallel<Comm>(tp, 12, 8, {split_seed, 20, "row", true});
    });
    check_split<FeatureShard, TokenShard>(p, 6, 12, 8, [](Comm& tp) {
      return RowParallel<Comm, dyn, dyn, dyn, RowReduce::reduce_scatter>(tp, 12, 8, {split_seed, 20, "row_rs", true});
    });
  }
}

TEMPLATE_TEST_CASE("MLP, attention and transformer block: B then W equals the fused backward at TP 1 and 2",
                   "[nn][split]", std::false_type, std::true_type) {
  constexpr bool sp = TestType::value;
  using L = std::conditional_t<sp, TokenShard, Replicate>;
  for (int p : {1, 2}) {
    INFO((sp ? "sequence parallel" : "replicated"));
    check_split<L, L>(p, 8, 16, 16, [](Comm& tp) {
      return make_mlp<Comm, dyn, dyn, dyn, sp>(tp, MlpConfig{16, 32, split_seed, 100, "mlp"});
    });
    check_split<L, L>(p, 8, 16, 16, [](Comm& tp) {
      return SelfAttention<Comm, dyn, dyn, dyn, sp>(tp, AttentionConfig{16, 4, 4, split_seed, 200, "attn"});
    });
    for (bool recompute : {false, true}) {
      INFO("recompute " << recompute);
      check_split<L, L>(p, 8, 16, 16, [&](Comm& tp) {
        TransformerBlock<Comm, sp> b(tp, BlockConfig{16, 4, 64, 4, 0.1, split_seed, 300, "block"});
        b.set_recompute(recompute);
        return b;
      });
    }
  }
}

TEST_CASE("Serial attention and a Stage with a separate bias: B then W equals the fused backward", "[nn][split]") {
  check_split<Replicate, Replicate>(1, 8, 16, 16, [](Comm&) {
    return Attention<>(AttentionConfig{16, 4, 4, split_seed, 200, "attn"});
  });
  for (int p : {1, 2})
    check_split<Replicate, Replicate>(p, 6, 8, 8, [](Comm& tp) {
      const auto n = std::size_t(tp.size()), r = std::size_t(tp.rank());
      return Stage<ColumnParallel<Comm>, Bias<FeatureShard>, Gelu, RowParallel<Comm>>(
          ColumnParallel<Comm>(tp, 8, 16, {split_seed, 40, "fc1", false}),
          Bias<FeatureShard>(16, split_seed, 41, "fc1_bias", n, r), Gelu{},
          RowParallel<Comm>(tp, 16, 8, {split_seed, 42, "fc2", true}));
    });
}

TEST_CASE("W without B names the layer and the micro-batch", "[nn][split][errors]") {
  Linear<> l(4, 4, {split_seed, 1, "lin", true});
  (void)l.forward(Act<Replicate>(random_activation(2, 4, 1)), 3);
  REQUIRE_THROWS_WITH(l.backward_weight(3), Catch::Matchers::Contains("Linear") &&
                                                Catch::Matchers::Contains("micro-batch 3") &&
                                                Catch::Matchers::Contains("backward_input"));
  (void)l.backward_input(Act<Replicate>(random_activation(2, 4, 2)), 3);
  l.drop(3);  // drop frees what B kept, too
  REQUIRE_THROWS_WITH(l.backward_weight(3), Catch::Matchers::Contains("micro-batch 3"));
}

TEST_CASE("Linear2D (2 x 2 grid): B then W equals the fused backward; W may run micro-batches in any order",
          "[nn][split][2d]") {
  constexpr std::size_t t = 8, in = 8, out = 12, q = 2;
  const LinearInit init{split_seed, 500, "fc2d", true};
  const Activation x0 = random_activation(t, in, 31), x1 = random_activation(t, in, 32);
  const Activation dy0 = random_activation(t, out, 33), dy1 = random_activation(t, out, 34);
  SplitReport rep;
  run_threads(int(q * q), [&](Comm& tp) {
    auto grid = make_tensor_grid(tp, q, q);
    const std::size_t i = grid.i(), j = grid.j();
    auto block = [&](const Activation& g) {  // this rank's block X_ij, typed as the grid shard it is
      return Act<GridShard>(Activation(g.slice(0, i * g.extent(0) / q, (i + 1) * g.extent(0) / q)
                                           .slice(1, j * g.extent(1) / q, (j + 1) * g.extent(1) / q)));
    };
    Linear2D<Comm> fused(grid, in, out, init), split(grid, in, out, init);
    (void)fused.forward(block(x0), 0);
    (void)fused.forward(block(x1), 1);
    const Activation f0 = fused.backward(block(dy0), 0).tensor(), f1 = fused.backward(block(dy1), 1).tensor();
    (void)split.forward(block(x0), 0);
    (void)split.forward(block(x1), 1);
    const Activation s0 = split.backward_input(block(dy0), 0).tensor(),
                     s1 = split.backward_input(block(dy1), 1).tensor();
    bool deferred = true;
    for (float v : split.weight().grad) deferred = deferred && v == 0.0f;
    split.backward_weight(1);
    split.backward_weight(0);
    const bool dx_eq = f0.values() == s0.values() && f1.values() == s1.values();
    const double err =
        std::max(rel_err(split.weight().grad, fused.weight().grad), rel_err(split.bias().grad, fused.bias().grad));
    std::lock_guard lock(rep.m);
    ++rep.ranks;
    if (!dx_eq) rep.fail("dx differs", rep.dx_equal);
    if (!deferred) rep.fail("B wrote the weight gradient", rep.gemm_grads_deferred);
    rep.interleaved_grad_err = std::max(rep.interleaved_grad_err, err);
  });
  INFO(rep.first_failure);
  CHECK(rep.ranks == int(q * q));
  CHECK(rep.dx_equal);
  CHECK(rep.gemm_grads_deferred);
  CHECK(rep.interleaved_grad_err <= 1e-6);
}
