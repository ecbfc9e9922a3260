// The Llama-class layers against independent references: RMSNorm, the rotary position embedding and the SwiGLU
// MLP. Each forward equals a double-precision loop written here from the formulas (Hugging Face's Llama for the
// rotary embedding: cos/sin of position * theta^(-2i/d), applied as x cos + rotate_half(x) sin), and each backward
// equals central finite differences of sum(y * dy) through that loop (ref::numeric_gradients), for the input and
// every parameter. Tolerances (norm-relative, fp32 layer against the double reference): forward 1e-5, gradients
// 1e-4. The parallel forms against the single rank: bit for bit where every value is computed by the same
// per-row kernel in the same order on every layout (RMSNorm's output and input gradient, the rotary embedding);
// norm-relative 1e-6 or 1e-5 where a sum is split over the ranks and added in another order (the gain gradient's
// sum over tokens, the down projection's sum over ffn, the input gradient's sum over gate and up columns).
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include <mpar/backend/stream/stream_backend.hpp>
#include <mpar/comm/threads.hpp>
#include <mpar/observe/counting_backend.hpp>

#include "call_layer.hpp"
#include "llama_reference.hpp"

using namespace mpar;
using namespace mpar::nn;
using namespace mpar::testing;
using namespace mpar::testing::llama;

// The optional family: the host reference, both stream backends and a counting wrapper of each have it.
static_assert(mpar::detail::llama_kernel_backend<HostBackend> &&
              mpar::detail::llama_kernel_backend<StreamHostBackend> &&
              mpar::detail::llama_kernel_backend<DiscreteHostBackend>);
static_assert(mpar::detail::llama_kernel_backend<observe::CountingBackend<HostBackend>> &&
              mpar::detail::llama_kernel_backend<observe::CountingBackend<StreamHostBackend>>);
static_assert(!mpar::detail::llama_kernel_backend<int>);
static_assert(layer<RMSNorm<>> && layer<RMSNorm<TokenShard, ThreadsCommunicator>> && layer<SiluGate<>>);

TEST_CASE("RMSNorm: forward equals a double loop, backward equals finite differences (input and gain)",
          "[nn][llama][rms_norm]") {
  constexpr std::size_t t = 6, n = 16;
  constexpr float eps = 1e-6f;
  const Activation x = rms_input(t, n), dy = random_activation(t, n, 32);
  RMSNorm<> norm(n, 3, 40, "norm", eps);
  perturb(norm.parameters(), 1);
  const Activation y = testing::forward(norm, x), dx = testing::backward(norm, dy);
  const ref::Params p{{"norm.weight", doubles(norm.parameters()[0]->value)}};
  const auto f = [&](const ref::Vec& xv, const ref::Params& pv) {
    return rms_norm_ref(xv, n, pv.at("norm.weight"), eps);
  };
  CHECK(ref::rel_err(y.values(), f(doubles(x), p)) <= llama_fwd_tol);
  // The small row alone: its scale is where eps shows.
  const ref::Vec want = f(doubles(x), p);
  CHECK(ref::rel_err(std::span<const float>(y.values()).subspan(n, n),
                     ref::Vec(want.begin() + n, want.begin() + 2 * n)) <= llama_fwd_tol);
  const ref::Gradients g = ref::numeric_gradients(f, doubles(x), p, doubles(dy), 1e-7);
  CHECK(ref::rel_err(dx.values(), g.dx) <= llama_grad_tol);
  CHECK(ref::rel_err(norm.parameters()[0]->grad, g.dp.at("norm.weight")) <= llama_grad_tol);
  CHECK(norm.parameters().size() == 1);  // a gain and no bias
}

TEST_CASE("RMSNorm under sequence parallelism (tp = 2, 4) equals the single rank", "[nn][llama][rms_norm]") {
  constexpr std::size_t t = 8, n = 12;
  const Activation x = rms_input(t, n), dy = random_activation(t, n, 33);
  LlamaRun one;
  run_llama_layer<Replicate>(1, x, dy, one, [](ThreadsCommunicator&) { return RMSNorm<>(n, 3, 40, "norm"); });
  for (int p : {2, 4}) {
    for (bool deferred : {false, true}) {
      INFO("tp = " << p << (deferred ? ", gain gradient reduced by the owner (all_reduce_gradients)" : ""));
      LlamaRun sp;
      run_llama_layer<TokenShard>(
          p, x, dy, sp,
          [&](ThreadsCommunicator& tp) {
            RMSNorm<TokenShard, ThreadsCommunicator> norm(tp, n, 3, 40, "norm");
            if (deferred) norm.defer_gradient_reduction(true);
            return norm;
          },
          [&](auto& norm, ThreadsCommunicator& tp) {
            if (!deferred) return;
            const std::vector<Parameter*> ps = norm.parameters();
            all_reduce_gradients<HostBackend>(tp, std::span<Parameter* const>(ps));
          });
      // Each row is normalised by the same kernel in the same order on every layout: bit for bit.
      CHECK(sp.y.values() == one.y.values());
      CHECK(sp.dx.values() == one.dx.values());
      // The gain gradient sums the tokens per rank, then over the ranks: float reassociation only.
      CHECK(sp.params.value["norm.weight"] == one.params.value["norm.weight"]);
      CHECK(rel_err(sp.params.grad["norm.weight"], one.params.grad["norm.weight"]) <= 1e-6);
      CHECK(sp.params.replica_mismatch == 0);  // every rank holds the whole sum
    }
  }
}

TEST_CASE("Rotary: forward equals Hugging Face's rotate-half formula in double, backward its transpose",
          "[nn][llama][rotary]") {
  constexpr std::size_t t = 6, head_dim = 8, heads = 3, cols = heads * head_dim;
  for (double theta : {10000.0, 500000.0}) {
    INFO("theta " << theta);
    // Two sequences of 3 tokens, the second far into its sequence (global positions 1021..1023).
    std::vector<std::int32_t> pos = sequence_positions(3, 3);
    for (std::int32_t q : sequence_positions(3, 1024, 1021)) pos.push_back(q);
    const Activation x = random_activation(t, cols, 41), dy = random_activation(t, cols, 42);
    Rotary<> rope(head_dim, theta);
    const Act<Replicate> y = rope.forward(Act<Replicate>(x), pos);
    const Act<Replicate> dx = rope.backward(Act<Replicate>(dy));
    const auto f = [&](const ref::Vec& xv, const ref::Params&) { return rotary_ref(xv, cols, head_dim, pos, theta); };
    CHECK(ref::rel_err(y.tensor().values(), f(doubles(x), {})) <= llama_fwd_tol);
    const ref::Gradients g = ref::numeric_gradients(f, doubles(x), {}, doubles(dy));
    CHECK(ref::rel_err(dx.tensor().values(), g.dx) <= llama_grad_tol);
    // Position 0 is the identity.
    for (std::size_t j = 0; j < cols; ++j) CHECK(y.tensor()(0, j) == x(0, j));
  }
}

TEST_CASE("Rotary: token shards with global positions equal the single rank bit for bit; bad shapes are refused",
          "[nn][llama][rotary]") {
  constexpr std::size_t t = 8, seq = 4, head_dim = 4, cols = 16;
  const Activation x = random_activation(t, cols, 43), dy = random_activation(t, cols, 44);
  Rotary<> whole(head_dim);
  const Activation y = whole.forward(Act<Replicate>(x), sequence_positions(t, seq)).tensor();
  const Activation dx = whole.backward(Act<Replicate>(dy)).tensor();
  run_threads(2, [&](ThreadsCommunicator& tp) {
    const std::size_t rows = t / 2, first = std::size_t(tp.rank()) * rows;
    Rotary<> rope(head_dim);
    const Act<TokenShard> ys =
        rope.forward(Act<TokenShard>(local_tokens(x, 2, tp.rank())), sequence_positions(rows, seq, first));
    const Act<TokenShard> dxs = rope.backward(Act<TokenShard>(local_tokens(dy, 2, tp.rank())));
    CHECK(ys.tensor().values() == local_tokens(y, 2, tp.rank()).values());
    CHECK(dxs.tensor().values() == local_tokens(dx, 2, tp.rank()).values());
  });
  // A feature shard holds whole heads: 6 columns are not heads of 4; one position per row.
  Rotary<> rope(head_dim);
  CHECK_THROWS_WITH(rope.forward(Act<FeatureShard>(Activation({2, 6})), sequence_positions(2, seq)),
                    Catch::Contains("not whole heads"));
  CHECK_THROWS_WITH(rope.forward(Act<Replicate>(Activation({3, 8})), sequence_positions(2, seq)),
                    Catch::Contains("2 positions for 3 rows"));
  CHECK_THROWS_WITH(Rotary<>(5), Catch::Contains("even"));
}

TEST_CASE("SwiGLU MLP: forward equals a double loop, backward equals finite differences, on 1 and 2 ranks",
          "[nn][llama][swiglu]") {
  constexpr std::size_t t = 4, hidden = 6, ffn = 8;
  const SwiGluMlpConfig cfg{hidden, ffn, 5, 60, "mlp"};
  const Activation x = random_activation(t, hidden, 51), dy = random_activation(t, hidden, 52);
  const auto f = [&](const ref::Vec& xv, const ref::Params& pv) { return swiglu_ref(xv, hidden, ffn, pv); };
  for (int p : {1, 2}) {
    INFO("tp = " << p);
    LlamaRun got;
    run_llama_layer<Replicate>(p, x, dy, got, [&](ThreadsCommunicator& tp) { return make_swiglu_mlp(tp, cfg); });
    REQUIRE(got.params.value.size() == 2);  // gate_up and down weights, no biases
    REQUIRE(got.params.value["mlp.gate_up.weight"].size() == hidden * 2 * ffn);
    const ref::Params values = params_in_double(got.params);
    CHECK(ref::rel_err(got.y.values(), f(doubles(x), values)) <= llama_fwd_tol);
    const ref::Gradients g = ref::numeric_gradients(f, doubles(x), values, doubles(dy));
    CHECK(ref::rel_err(got.dx.values(), g.dx) <= llama_grad_tol);
    for (const auto& [name, want] : g.dp) {
      INFO("parameter " << name);
      CHECK(ref::rel_err(got.params.grad[name], want) <= llama_grad_tol);
    }
  }
}

TEMPLATE_TEST_CASE("SwiGLU MLP: tp = 2, 4 (with and without sequence parallelism) equal the single rank",
                   "[nn][llama][swiglu]", std::false_type, std::true_type) {
  constexpr bool sp = TestType::value;
  using L = std::conditional_t<sp, TokenShard, Replicate>;
  const SwiGluMlpConfig cfg{16, 24, 5, 60, "mlp"};
  const Activation x = random_activation(8, 16, 53), dy = random_activation(8, 16, 54);
  LlamaRun one;
  run_llama_layer<Replicate>(1, x, dy, one, [&](ThreadsCommunicator& tp) { return make_swiglu_mlp(tp, cfg); });
  for (int p : {2, 4}) {
    INFO("tp = " << p << (sp ? " with sequence parallelism" : ""));
    LlamaRun par;
    run_llama_layer<L>(p, x, dy, par,
                       [&](ThreadsCommunicator& tp) { return make_swiglu_mlp<ThreadsCommunicator, sp>(tp, cfg); });
    // The down projection's sum over ffn and dx's over the gate and up columns are split over the ranks and added
    // in another order: equal within fp32 reassociation (the equivalence tests' 1e-5), not bit for bit.
    CHECK(rel_err(par.y.values(), one.y.values()) <= rel_tol);
    CHECK(rel_err(par.dx.values(), one.dx.values()) <= rel_tol);
    CHECK(par.params.replica_mismatch == 0);
    for (const auto& [name, g] : one.params.grad) {
      INFO("parameter " << name);
      CHECK(par.params.value[name] == one.params.value[name]);  // the same initial values, drawn by global index
      CHECK(rel_err(par.params.grad[name], g) <= rel_tol);
    }
  }
}

TEST_CASE("SiluGate refuses an input whose gate and up halves differ; ffn must divide over the group",
          "[nn][llama][swiglu][errors]") {
  SiluGate<> gate(4);
  CHECK_THROWS_WITH(gate.forward(Act<FeatureShard>(Activation({2, 5}))), Catch::Contains("halves"));
  run_threads(2, [&](ThreadsCommunicator& tp) {
    CHECK_THROWS_WITH(make_swiglu_mlp(tp, SwiGluMlpConfig{8, 7, 1, 0, "mlp"}), Catch::Contains("not divisible"));
  });
}

TEST_CASE("The Llama-class kernels are counted as backend operations by CountingBackend", "[nn][llama][counting]") {
  using CB = observe::CountingBackend<HostBackend>;
  const Activation x = random_activation(4, 8, 61);
  const auto before = CB::counts();
  RMSNorm<Replicate, NoComm, CB> norm(8, 1, 0, "norm");
  Rotary<CB> rope(4);
  SiluGate<CB> gate(4);
  const auto h = norm.forward(Act<Replicate>(x));
  const auto r = rope.forward(h, sequence_positions(4, 4));
  const auto g = gate.forward(Act<Replicate>(r.tensor()));
  (void)norm.backward(rope.backward(Act<Replicate>(gate.backward(g).tensor())));
  const auto d = CB::counts() - before;
  using observe::Op;
  CHECK(d[Op::rmsnorm_forward] == 1);
  CHECK(d[Op::rmsnorm_backward] == 1);
  CHECK(d[Op::rope_forward] == 1);
  CHECK(d[Op::rope_backward] == 1);
  CHECK(d[Op::silu_gate_forward] == 1);
  CHECK(d[Op::silu_gate_backward] == 1);
}
