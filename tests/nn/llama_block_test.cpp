// The Llama block against an independent reference: h = x + attn(rmsnorm(x)), y = h + swiglu(rmsnorm(h)), composed
// in double from the layer references of llama_reference.hpp (each written from Hugging Face's Llama formulas);
// forward within 1e-5, every gradient within 1e-4 of central finite differences. The tensor-parallel blocks (tp 2 and
// 4, with and without sequence parallelism) equal the single rank within fp32 reassociation (1e-5); recomputation,
// full or selective, and the split backward (B then W) are bit-identical to the plain block.
#include <catch2/catch.hpp>

#include <cstdint>
#include <type_traits>

#include <mpar/comm/threads.hpp>

#include "llama_reference.hpp"

using namespace mpar;
using namespace mpar::nn;
using namespace mpar::testing;
using namespace mpar::testing::llama;

static_assert(layer<LlamaBlock<ThreadsCommunicator>> && layer<LlamaBlock<ThreadsCommunicator, true>>);
static_assert(mpar::nn::detail::split_backward_layer<LlamaBlock<ThreadsCommunicator>>);

namespace {

constexpr float block_eps = 1e-5f;

LlamaBlockConfig block_config(std::size_t hidden, std::size_t heads, std::size_t kv, std::size_t ffn, std::size_t seq) {
  return LlamaBlockConfig{hidden, heads, kv, ffn, seq, 10000.0, block_eps, 5, 80, "block"};
}

ref::Vec llama_block_ref(const ref::Vec& x, const LlamaBlockConfig& c, const ref::Params& p) {
  const GqaConfig attn{c.hidden, c.heads, c.kv_heads, c.seq, c.rope_theta, 0, 0, c.name + ".attn"};
  const ref::Vec a = rms_norm_ref(x, c.hidden, p.at(c.name + ".ln1.weight"), block_eps);
  const ref::Vec h = ref::add(x, gqa_ref(a, attn, p));
  const ref::Vec n = rms_norm_ref(h, c.hidden, p.at(c.name + ".ln2.weight"), block_eps);
  return ref::add(h, swiglu_ref(n, c.hidden, c.ffn, p, c.name + ".mlp"));
}

}  // namespace

TEST_CASE("LlamaBlock: forward equals the block composed in double, backward equals finite differences",
          "[nn][llama][llama_block]") {
  const LlamaBlockConfig cfg = block_config(16, 4, 2, 24, 3);
  const Activation x = random_activation(6, 16, 71), dy = random_activation(6, 16, 72);
  const auto f = [&](const ref::Vec& xv, const ref::Params& pv) { return llama_block_ref(xv, cfg, pv); };
  for (int p : {1, 2}) {
    INFO("tp = " << p);
    LlamaRun got;
    run_llama_layer<Replicate>(p, x, dy, got,
                               [&](ThreadsCommunicator& tp) { return LlamaBlock<ThreadsCommunicator>(tp, cfg); });
    REQUIRE(got.params.value.size() == 6);  // two gains, fused QKV, output projection, gate_up, down: no biases
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

TEMPLATE_TEST_CASE(
    "LlamaBlock: tp = 2, 4 (with and without sequence parallelism) equal the single rank; "
    "recomputation is bit-identical",
    "[nn][llama][llama_block]", std::false_type, std::true_type) {
  constexpr bool sp = TestType::value;
  using L = std::conditional_t<sp, TokenShard, Replicate>;
  const LlamaBlockConfig cfg = block_config(32, 8, 4, 48, 4);
  const Activation x = random_activation(8, 32, 73), dy = random_activation(8, 32, 74);
  LlamaRun one;
  run_llama_layer<Replicate>(1, x, dy, one,
                             [&](ThreadsCommunicator& tp) { return LlamaBlock<ThreadsCommunicator>(tp, cfg); });
  for (int p : {2, 4}) {
    LlamaRun plain;
    for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full}) {
      INFO("tp = " << p << (sp ? " with sequence parallelism" : "") << ", recompute " << recompute_name(r));
      LlamaRun par;
      run_llama_layer<L>(p, x, dy, par, [&](ThreadsCommunicator& tp) {
        LlamaBlock<ThreadsCommunicator, sp> block(tp, cfg);
        block.set_recompute(r);
        return block;
      });
      CHECK(rel_err(par.y.values(), one.y.values()) <= rel_tol);
      CHECK(rel_err(par.dx.values(), one.dx.values()) <= rel_tol);
      CHECK(par.params.replica_mismatch == 0);
      for (const auto& [name, grad] : one.params.grad) {
        INFO("parameter " << name);
        CHECK(par.params.value[name] == one.params.value[name]);
        CHECK(rel_err(par.params.grad[name], grad) <= rel_tol);
      }
      if (r == Recompute::none) {
        plain.y = par.y;
        plain.dx = par.dx;
        plain.params.grad = par.params.grad;
      } else {  // the same kernels on the same values: bit for bit
        CHECK(par.y.values() == plain.y.values());
        CHECK(par.dx.values() == plain.dx.values());
        for (const auto& [name, grad] : plain.params.grad) CHECK(par.params.grad[name] == grad);
      }
    }
  }
}

TEST_CASE(
    "LlamaBlock under sequence parallelism: the norms' gain gradients reduced once by the owner equal the "
    "per-backward reduction",
    "[nn][llama][llama_block]") {
  const LlamaBlockConfig cfg = block_config(16, 4, 2, 16, 4);
  const Activation x = random_activation(8, 16, 75), dy = random_activation(8, 16, 76);
  LlamaRun each, deferred;
  run_llama_layer<TokenShard>(2, x, dy, each,
                              [&](ThreadsCommunicator& tp) { return LlamaBlock<ThreadsCommunicator, true>(tp, cfg); });
  run_llama_layer<TokenShard>(
      2, x, dy, deferred,
      [&](ThreadsCommunicator& tp) {
        LlamaBlock<ThreadsCommunicator, true> block(tp, cfg);
        CHECK(block.defer_norm_gradient_reduction().size() == 2);
        return block;
      },
      [&](auto& block, ThreadsCommunicator& tp) {
        const std::vector<Parameter*> gains{block.parameters()[0], block.parameters()[3]};
        all_reduce_gradients<HostBackend>(tp, std::span<Parameter* const>(gains));
      });
  CHECK(deferred.y.values() == each.y.values());
  CHECK(deferred.dx.values() == each.dx.values());
  CHECK(deferred.params.replica_mismatch == 0);
  for (const auto& [name, grad] : each.params.grad) CHECK(deferred.params.grad[name] == grad);
}

TEST_CASE("LlamaBlock: a Stage of two blocks composes, and a wrong input width is refused",
          "[nn][llama][llama_block]") {
  run_threads(2, [](ThreadsCommunicator& tp) {
    using Block = LlamaBlock<ThreadsCommunicator>;
    LlamaBlockConfig first = block_config(16, 4, 2, 16, 4), second = first;
    second.id_base += LlamaBlockConfig::ids_per_block;
    second.name = "block2";
    Stage<Block, Block> stage(Block(tp, first), Block(tp, second));
    const Act<Replicate> y = stage.forward(Act<Replicate>(random_activation(8, 16, 77)), 0);
    CHECK(y.extent(0) == 8);
    CHECK(y.extent(1) == 16);
    CHECK(stage.parameters().size() == 12);
    Block block(tp, first);
    CHECK_THROWS_WITH(block.forward(Act<Replicate>(random_activation(8, 12, 78)), 0),
                      Catch::Contains("12 features, expected 16"));
  });
}
