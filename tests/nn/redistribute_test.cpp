// Redistributions and typed compositions: each collective of nn/redistributions.hpp forward and backward
// against naive loops over the ranks' tensors (no collective in the reference), and a block written
// by hand with typed activations (column, GeLU, row without reduction, a Partial + Partial residual,
// then the reduction) against the same block computed serially.
#include <catch2/catch.hpp>

#include <mpar/comm/threads.hpp>

#include "nn_test_support.hpp"

using namespace mpar;
using namespace mpar::nn;
using namespace mpar::testing;
using Comm = ThreadsCommunicator;

namespace {

constexpr std::size_t input_rows = 8, input_cols = 12;

/** Rank r's input: a distinct [input_rows, input_cols] tensor per rank (for Partial and Replicate inputs alike). */
Activation input_of(std::size_t r, std::uint64_t salt) {
  return random_activation(input_rows, input_cols, 100 * salt + r);
}

/** Σ_r inputs[r], elementwise. */
Activation sum_of(const std::vector<Activation>& xs) {
  Activation s(xs[0].shape());
  for (const auto& x : xs)
    for (std::size_t i = 0; i < s.size(); ++i) s.data()[i] += x.data()[i];
  return s;
}
/** Rows [r·T/p, (r+1)·T/p) or columns [r·N/p, (r+1)·N/p) of a [T, N] tensor, by loops. */
Activation rows_of(const Activation& a, std::size_t p, std::size_t r) {
  const std::size_t n = a.extent(0) / p;
  Activation b({n, a.extent(1)});
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < a.extent(1); ++j) b(i, j) = a(r * n + i, j);
  return b;
}
Activation cols_of(const Activation& a, std::size_t p, std::size_t r) {
  const std::size_t n = a.extent(1) / p;
  Activation b({a.extent(0), n});
  for (std::size_t i = 0; i < a.extent(0); ++i)
    for (std::size_t j = 0; j < n; ++j) b(i, j) = a(i, r * n + j);
  return b;
}
/** The ranks' blocks stacked by rows or by columns, by loops. */
Activation stack_rows(const std::vector<Activation>& bs) {
  const std::size_t n = bs[0].extent(0);
  Activation a({n * bs.size(), bs[0].extent(1)});
  for (std::size_t r = 0; r < bs.size(); ++r)
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < a.extent(1); ++j) a(r * n + i, j) = bs[r](i, j);
  return a;
}
Activation stack_cols(const std::vector<Activation>& bs) {
  const std::size_t n = bs[0].extent(1);
  Activation a({bs[0].extent(0), n * bs.size()});
  for (std::size_t r = 0; r < bs.size(); ++r)
    for (std::size_t i = 0; i < a.extent(0); ++i)
      for (std::size_t j = 0; j < n; ++j) a(i, r * n + j) = bs[r](i, j);
  return a;
}

/** What every rank's forward and backward returned. */
struct PerRank {
  std::vector<Activation> fwd, bwd;
  explicit PerRank(std::size_t p) : fwd(p), bwd(p) {}
};

/** Runs `f(tp, r) -> {forward result, backward result}` on p thread ranks, recording per rank. */
template <class F>
PerRank run(std::size_t p, F f) {
  PerRank out(p);
  run_threads(int(p), [&](Comm& tp) {
    const auto r = std::size_t(tp.rank());
    auto [y, dx] = f(tp, r);
    out.fwd[r] = std::move(y);  // each rank writes its own slot: no lock needed
    out.bwd[r] = std::move(dx);
  });
  return out;
}

void require_equal(const Activation& a, const Activation& b, const char* what) {
  INFO(what);
  REQUIRE(a.shape() == b.shape());
  CHECK(rel_err(a.values(), b.values()) <= 1e-6);
}

}  // namespace

TEST_CASE("redistributions match naive references forward and their duals backward", "[nn][redistribute]") {
  for (std::size_t p : {std::size_t(1), std::size_t(2), std::size_t(4)}) {
    INFO("TP = " << p);
    std::vector<Activation> x(p), g(p);
    for (std::size_t r = 0; r < p; ++r) x[r] = input_of(r, 1), g[r] = input_of(r, 2);
    // Replicated inputs are the same on every rank: rank 0's.
    const Activation& xr = x[0];
    const Activation& gr = g[0];

    SECTION("ReduceToReplicate: all-reduce / identity") {
      auto out = run(p, [&](Comm& tp, std::size_t r) {
        Act<Replicate> y = ReduceToReplicate::forward<HostBackend>(tp, Act<TensorPartial>(x[r]));
        Act<Replicate> d = ReduceToReplicate::backward<HostBackend>(tp, Act<Replicate>(gr));
        return std::pair{std::move(y).tensor(), std::move(d).tensor()};
      });
      for (std::size_t r = 0; r < p; ++r) require_equal(out.fwd[r], sum_of(x), "forward: the sum of the addends");
      for (std::size_t r = 0; r < p; ++r) require_equal(out.bwd[r], gr, "backward: the gradient unchanged");
    }
    SECTION("CopyToTensorRegion: identity / all-reduce") {
      auto out = run(p, [&](Comm& tp, std::size_t r) {
        Act<Replicate> y = CopyToTensorRegion::forward<HostBackend>(tp, Act<Replicate>(xr));
        Act<Replicate> d = CopyToTensorRegion::backward<HostBackend>(tp, Act<TensorPartial>(g[r]));
        return std::pair{std::move(y).tensor(), std::move(d).tensor()};
      });
      for (std::size_t r = 0; r < p; ++r) require_equal(out.fwd[r], xr, "forward: the input unchanged");
      for (std::size_t r = 0; r < p; ++r)
        require_equal(out.bwd[r], sum_of(g), "backward: the sum of the Partial gradients");
    }
    SECTION("ScatterFeatures: slice / all-gather") {
      auto out = run(p, [&](Comm& tp, std::size_t r) {
        Act<FeatureShard> y = ScatterFeatures::forward<HostBackend>(tp, Act<Replicate>(xr));
        Act<Replicate> d = ScatterFeatures::backward<HostBackend>(tp, Act<FeatureShard>(cols_of(g[r], p, r)));
        return std::pair{std::move(y).tensor(), std::move(d).tensor()};
      });
      std::vector<Activation> gcols(p);
      for (std::size_t r = 0; r < p; ++r) gcols[r] = cols_of(g[r], p, r);
      for (std::size_t r = 0; r < p; ++r) require_equal(out.fwd[r], cols_of(xr, p, r), "forward: this rank's columns");
      for (std::size_t r = 0; r < p; ++r)
        require_equal(out.bwd[r], stack_cols(gcols), "backward: every rank's columns");
    }
    SECTION("GatherFeaturesOf: all-gather / slice") {
      auto out = run(p, [&](Comm& tp, std::size_t r) {
        Act<Replicate> y = GatherFeaturesOf::forward<HostBackend>(tp, Act<FeatureShard>(cols_of(x[r], p, r)));
        Act<FeatureShard> d = GatherFeaturesOf::backward<HostBackend>(tp, Act<Replicate>(gr));
        return std::pair{std::move(y).tensor(), std::move(d).tensor()};
      });
      std::vector<Activation> xcols(p);
      for (std::size_t r = 0; r < p; ++r) xcols[r] = cols_of(x[r], p, r);
      for (std::size_t r = 0; r < p; ++r) require_equal(out.fwd[r], stack_cols(xcols), "forward: every rank's columns");
      for (std::size_t r = 0; r < p; ++r) require_equal(out.bwd[r], cols_of(gr, p, r), "backward: this rank's columns");
    }
    SECTION("ReduceScatterTokens: reduce-scatter / all-gather") {
      auto out = run(p, [&](Comm& tp, std::size_t r) {
        Act<TokenShard> y = ReduceScatterTokens::forward<HostBackend>(tp, Act<TensorPartial>(x[r]), "test");
        Act<Replicate> d = ReduceScatterTokens::backward<HostBackend>(tp, Act<TokenShard>(rows_of(g[r], p, r)));
        return std::pair{std::move(y).tensor(), std::move(d).tensor()};
      });
      std::vector<Activation> grows(p);
      for (std::size_t r = 0; r < p; ++r) grows[r] = rows_of(g[r], p, r);
      for (std::size_t r = 0; r < p; ++r)
        require_equal(out.fwd[r], rows_of(sum_of(x), p, r), "forward: this rank's rows of the sum");
      for (std::size_t r = 0; r < p; ++r) require_equal(out.bwd[r], stack_rows(grows), "backward: every rank's rows");
    }
    SECTION("GatherTokens: all-gather / reduce-scatter") {
      auto out = run(p, [&](Comm& tp, std::size_t r) {
        Act<Replicate> y = GatherTokens::forward<HostBackend>(tp, Act<TokenShard>(rows_of(x[r], p, r)));
        Act<TokenShard> d = GatherTokens::backward<HostBackend>(tp, Act<TensorPartial>(g[r]), "test");
        return std::pair{std::move(y).tensor(), std::move(d).tensor()};
      });
      std::vector<Activation> xrows(p);
      for (std::size_t r = 0; r < p; ++r) xrows[r] = rows_of(x[r], p, r);
      for (std::size_t r = 0; r < p; ++r) require_equal(out.fwd[r], stack_rows(xrows), "forward: every rank's rows");
      for (std::size_t r = 0; r < p; ++r)
        require_equal(out.bwd[r], rows_of(sum_of(g), p, r), "backward: this rank's rows of the sum");
    }
  }
}

namespace {
/** A user's redistribution in the shared signature: Replicate -> Replicate both ways (the identity). */
struct Identity {
  using from = Replicate;
  using to = Replicate;
  using grad_to = Replicate;
  using grad_from = Replicate;
  static constexpr std::string_view name = "Identity", forward_collective = "identity",
                                    backward_collective = "identity";
  template <backend B, communicator C, class X>
  static Act<Replicate> forward(C&, X&& x, std::string_view = name) {
    return Act<Replicate>(std::forward<X>(x));
  }
  template <backend B, communicator C, class X>
  static Act<Replicate> backward(C&, X&& dy, std::string_view = name) {
    return Act<Replicate>(std::forward<X>(dy));
  }
};
/** The same map written without the backend and `who` (the signature the concept refuses). */
struct IdentityWithoutBackend : Identity {
  template <communicator C>
  static Act<Replicate> forward(C&, Act<Replicate> x) {
    return x;
  }
  template <communicator C>
  static Act<Replicate> backward(C&, Act<Replicate> dy) {
    return dy;
  }
};
/** Forward returning the wrong layout. */
struct IdentityToPartial : Identity {
  template <backend B, communicator C, class X>
  static Act<TensorPartial> forward(C&, X&& x, std::string_view = name) {
    return Act<TensorPartial>(Activation(x.tensor()));
  }
};
}  // namespace

TEST_CASE("every redistribution has the one signature the concept checks; a user's is checked the same way",
          "[nn][redistribute]") {
  STATIC_REQUIRE(redistribution<ReduceToReplicate, HostBackend, Comm>);
  STATIC_REQUIRE(redistribution<CopyToTensorRegion, HostBackend, Comm>);
  STATIC_REQUIRE(redistribution<ScatterFeatures, HostBackend, Comm>);
  STATIC_REQUIRE(redistribution<GatherFeaturesOf, HostBackend, Comm>);
  STATIC_REQUIRE(redistribution<ReduceScatterTokens, HostBackend, Comm>);
  STATIC_REQUIRE(redistribution<GatherTokens, HostBackend, Comm>);
  STATIC_REQUIRE(redistribution<ScatterTokens, HostBackend, Comm>);
  STATIC_REQUIRE(redistribution<GatherTokensReplicatedGrad, HostBackend, Comm>);
  STATIC_REQUIRE(redistribution<Identity, HostBackend, Comm>);
  STATIC_REQUIRE_FALSE(redistribution<IdentityWithoutBackend, HostBackend, Comm>);
  STATIC_REQUIRE_FALSE(redistribution<IdentityToPartial, HostBackend, Comm>);
  STATIC_REQUIRE_FALSE(redistribution<Activation, HostBackend, Comm>);
  // A kept input is read, not consumed: the caller's tensor is whole after the forward and the backward.
  std::vector<Activation> kept(2), gathered(2);
  run_threads(2, [&](Comm& tp) {
    const Act<Replicate> x(input_of(0, 3));
    const Act<FeatureShard> mine = ScatterFeatures::forward<HostBackend>(tp, x);
    const Act<Replicate> back = ScatterFeatures::backward<HostBackend>(tp, mine);
    kept[std::size_t(tp.rank())] = x.tensor();  // each rank writes its own slot
    gathered[std::size_t(tp.rank())] = back.tensor();
  });
  for (std::size_t r = 0; r < 2; ++r) {
    require_equal(kept[r], input_of(0, 3), "the kept input");
    require_equal(gathered[r], input_of(0, 3), "slice, then all-gather");
  }
}

TEST_CASE("a hand-written typed block with a Partial + Partial residual matches the serial block", "[nn][typed]") {
  // y = AllReduce(row1(gelu(col1(x))) + row2(gelu(col2(x)))) + x: two deferred reductions added as
  // Partial tensors and reduced once, which is what Partial + Partial allows.
  const std::size_t hidden = 8, ffn = 16, tokens = 6;
  const Activation x = random_activation(tokens, hidden, 7), dy = random_activation(tokens, hidden, 8);
  auto lin = [&](std::size_t in, std::size_t out, std::uint64_t id, const char* n) {
    return Linear<>(in, out, {.seed = 3, .id_base = id, .name = n});
  };
  Linear<> a1 = lin(hidden, ffn, 0, "a1"), a2 = lin(ffn, hidden, 2, "a2"), b1 = lin(hidden, ffn, 4, "b1"),
           b2 = lin(ffn, hidden, 6, "b2");
  Gelu ga, gb;
  const Act<Replicate> xs(x);
  const Act<Replicate> ys =
      add(add(a2.forward(ga.forward(a1.forward(xs))), b2.forward(gb.forward(b1.forward(xs)))), xs);
  const Act<Replicate> g(dy);
  const Act<Replicate> dxs =
      add(add(a1.backward(ga.backward(a2.backward(g))), b1.backward(gb.backward(b2.backward(g)))), g);

  for (int p : {2, 4}) {
    INFO("TP = " << p);
    std::vector<Activation> ys_par(static_cast<std::size_t>(p)), dxs_par(static_cast<std::size_t>(p));
    run_threads(p, [&](Comm& tp) {
      using Row = RowParallel<Comm, dyn, dyn, dyn, RowReduce::none>;
      ColumnParallel<Comm> c1(tp, hidden, ffn, {.seed = 3, .id_base = 0, .name = "a1"});
      Row r1(tp, ffn, hidden, {.seed = 3, .id_base = 2, .name = "a2"});
      ColumnParallel<Comm> c2(tp, hidden, ffn, {.seed = 3, .id_base = 4, .name = "b1"});
      Row r2(tp, ffn, hidden, {.seed = 3, .id_base = 6, .name = "b2"});
      Gelu g1, g2;
      const Act<Replicate> xl(x);
      const Act<TensorPartial> both =
          add(r1.forward(g1.forward(c1.forward(xl))), r2.forward(g2.forward(c2.forward(xl))));
      const Act<Replicate> y = add(ReduceToReplicate::forward<HostBackend>(tp, both), xl);
      // Backward: the gradient of a Partial value is replicated, so both branches take dy as it is.
      const Act<Replicate> d = ReduceToReplicate::backward<HostBackend>(tp, Act<Replicate>(dy));
      const Act<Replicate> dx =
          add(add(c1.backward(g1.backward(r1.backward(d))), c2.backward(g2.backward(r2.backward(d)))), d);
      ys_par[std::size_t(tp.rank())] = y.tensor();
      dxs_par[std::size_t(tp.rank())] = dx.tensor();
    });
    for (int r = 0; r < p; ++r) {
      CHECK(rel_err(ys_par[std::size_t(r)].values(), ys.tensor().values()) <= rel_tol);
      CHECK(rel_err(dxs_par[std::size_t(r)].values(), dxs.tensor().values()) <= rel_tol);
    }
  }
}
