// Grouped-query attention against an independent reference: a double-precision loop written here from Hugging Face's
// Llama attention (q, k, v projections without bias, rotate-half rotary embedding of q and k, each key/value head
// shared by `heads / kv_heads` query heads, causal softmax of q.k / sqrt(d), output projection), reading the fused
// weight by the column order the layer documents. Forward within 1e-5 and every gradient within 1e-4 of the
// reference's central finite differences (norm-relative). The tensor-parallel forms equal the single rank within
// fp32 reassociation (1e-5): the output projection's sum over heads is split over the ranks.
#include <catch2/catch.hpp>

#include <cstdint>
#include <type_traits>

#include <mpar/comm/threads.hpp>

#include "llama_reference.hpp"

using namespace mpar;
using namespace mpar::nn;
using namespace mpar::testing;
using namespace mpar::testing::llama;

static_assert(layer<GroupedQueryAttention<ThreadsCommunicator>> &&
              layer<GroupedQueryAttention<ThreadsCommunicator, true>>);

TEST_CASE("GroupedQueryAttention: forward equals Llama's attention in double, backward equals finite differences",
          "[nn][llama][gqa]") {
  constexpr std::size_t hidden = 16, t = 6, seq = 3;
  const Activation x = random_activation(t, hidden, 61), dy = random_activation(t, hidden, 62);
  // kv_heads 2 of 4 (grouped), 1 (multi-query), 4 (multi-head); two tensor ranks where they divide the KV heads.
  for (const auto& [kv, p, theta] : {std::tuple{2, 1, 1e4}, std::tuple{2, 2, 5e5}, std::tuple{1, 1, 1e4},
                                     std::tuple{4, 1, 1e4}, std::tuple{4, 2, 1e4}}) {
    const GqaConfig cfg{hidden, 4, std::size_t(kv), seq, theta, 5, 70, "attn"};
    INFO("kv_heads " << kv << ", tp " << p << ", theta " << theta);
    LlamaRun got;
    run_llama_layer<Replicate>(
        p, x, dy, got, [&](ThreadsCommunicator& tp) { return GroupedQueryAttention<ThreadsCommunicator>(tp, cfg); });
    REQUIRE(got.params.value.size() == 2);  // the fused QKV and the output projection, no biases
    REQUIRE(got.params.value["attn.qkv.weight"].size() == hidden * (4 + 2 * std::size_t(kv)) * 4);
    const ref::Params values = params_in_double(got.params);
    const auto f = [&](const ref::Vec& xv, const ref::Params& pv) { return gqa_ref(xv, cfg, pv); };
    CHECK(ref::rel_err(got.y.values(), f(doubles(x), values)) <= llama_fwd_tol);
    const ref::Gradients g = ref::numeric_gradients(f, doubles(x), values, doubles(dy));
    CHECK(ref::rel_err(got.dx.values(), g.dx) <= llama_grad_tol);
    for (const auto& [name, want] : g.dp) {
      INFO("parameter " << name);
      CHECK(ref::rel_err(got.params.grad[name], want) <= llama_grad_tol);
    }
  }
}

TEMPLATE_TEST_CASE("GroupedQueryAttention: tp = 2, 4 (with and without sequence parallelism) equal the single rank",
                   "[nn][llama][gqa]", std::false_type, std::true_type) {
  constexpr bool sp = TestType::value;
  using L = std::conditional_t<sp, TokenShard, Replicate>;
  const GqaConfig cfg{32, 8, 4, 4, 10000.0, 5, 70, "attn"};
  const Activation x = random_activation(8, 32, 63), dy = random_activation(8, 32, 64);
  LlamaRun one;
  run_llama_layer<Replicate>(
      1, x, dy, one, [&](ThreadsCommunicator& tp) { return GroupedQueryAttention<ThreadsCommunicator>(tp, cfg); });
  for (int p : {2, 4}) {
    INFO("tp = " << p << (sp ? " with sequence parallelism" : ""));
    LlamaRun par;
    run_llama_layer<L>(p, x, dy, par, [&](ThreadsCommunicator& tp) {
      GroupedQueryAttention<ThreadsCommunicator, sp> attn(tp, cfg);
      CHECK(attn.local_heads() == 8 / std::size_t(p));
      CHECK(attn.local_kv_heads() == 4 / std::size_t(p));
      return attn;
    });
    CHECK(rel_err(par.y.values(), one.y.values()) <= rel_tol);
    CHECK(rel_err(par.dx.values(), one.dx.values()) <= rel_tol);
    CHECK(par.params.replica_mismatch == 0);
    for (const auto& [name, grad] : one.params.grad) {
      INFO("parameter " << name);
      CHECK(par.params.value[name] == one.params.value[name]);
      CHECK(rel_err(par.params.grad[name], grad) <= rel_tol);
    }
  }
}

TEST_CASE("GroupedQueryAttention: selective recomputation is bit-identical; bf16 autocast stays close to fp32",
          "[nn][llama][gqa]") {
  const GqaConfig cfg{32, 8, 2, 4, 10000.0, 5, 70, "attn"};
  const Activation x = random_activation(8, 32, 65), dy = random_activation(8, 32, 66);
  const auto make = [&](bool selective) {
    return [&cfg, selective](ThreadsCommunicator& tp) {
      GroupedQueryAttention<ThreadsCommunicator> attn(tp, cfg);
      attn.set_selective_recompute(selective);
      return attn;
    };
  };
  LlamaRun plain, selective, half;
  run_llama_layer<Replicate>(2, x, dy, plain, make(false));
  run_llama_layer<Replicate>(2, x, dy, selective, make(true));
  CHECK(selective.y.values() == plain.y.values());
  CHECK(selective.dx.values() == plain.dx.values());
  for (const auto& [name, grad] : plain.params.grad) CHECK(selective.params.grad[name] == grad);
  half.compute = ComputeType::bf16;
  run_llama_layer<Replicate>(2, x, dy, half, make(false));
  // bf16 operands (8 significant bits) with fp32 accumulation: within a few bf16 roundings of fp32.
  CHECK(rel_err(half.y.values(), plain.y.values()) <= 2e-2);
  CHECK(rel_err(half.dx.values(), plain.dx.values()) <= 2e-2);
  CHECK(rel_err(half.params.grad["attn.qkv.weight"], plain.params.grad["attn.qkv.weight"]) <= 2e-2);
  CHECK(rel_err(half.y.values(), plain.y.values()) > 0);  // it did run in bf16
}

TEST_CASE("GroupedQueryAttention refuses heads that do not group, a tensor group larger than kv_heads, odd head_dim",
          "[nn][llama][gqa][errors]") {
  run_threads(1, [](ThreadsCommunicator& tp) {
    using A = GroupedQueryAttention<ThreadsCommunicator>;
    CHECK_THROWS_WITH(A(tp, GqaConfig{24, 6, 4, 4}), Catch::Contains("6 query heads are not divisible by 4"));
    CHECK_THROWS_WITH(A(tp, GqaConfig{12, 4, 2, 4}), Catch::Contains("head_dim 3 is odd"));
    CHECK_THROWS_WITH(A(tp, GqaConfig{16, 4, 2, 0}), Catch::Contains("positive"));
  });
  run_threads(4, [](ThreadsCommunicator& tp) {
    CHECK_THROWS_WITH(
        GroupedQueryAttention<ThreadsCommunicator>(tp, GqaConfig{32, 8, 2, 4}),
        Catch::Contains("2 key/value heads are not divisible by the tensor-parallel size 4") && Catch::Contains("Fix"));
  });
}
