// Llama's attention and block under context parallelism against the single rank: RingGroupedQueryAttention and
// RingLlamaBlock at cp x tp (the sequence in zig-zag chunks, KV heads over the tensor group) reproduce
// GroupedQueryAttention and LlamaBlock at one rank — output, input gradient and every weight gradient (summed over the
// context ranks, which hold replicas) within fp32 reassociation (1e-5, norm-relative: the online softmax and the split
// output projection sum in other orders). The single-rank layers are checked against double-precision references in
// gqa_attention_test.cpp and llama_block_test.cpp; the ring core against naive loops in ring_attention_test.cpp.
#include <catch2/catch.hpp>

#include <cstddef>
#include <mutex>
#include <utility>

#include <mpar/comm/threads.hpp>
#include <mpar/nn/ring_llama_block.hpp>

#include "llama_reference.hpp"

using namespace mpar;
using namespace mpar::nn;
using namespace mpar::testing;
using namespace mpar::testing::llama;

namespace {

/**
 * The global row of local row `l` on context rank `r` of `cp`, written from the placement's definition: of each
 * sequence the rank holds chunk r, then chunk 2 cp - 1 - r, each seq / (2 cp) tokens.
 */
std::size_t ring_global_row(std::size_t l, std::size_t seq, std::size_t cp, std::size_t r) {
  const std::size_t c = seq / (2 * cp), s = l / (2 * c), i = l % (2 * c);
  const std::size_t chunk = i < c ? r : 2 * cp - 1 - r;
  return s * seq + chunk * c + i % c;
}

Activation ring_rows(const Activation& g, std::size_t seq, std::size_t cp, std::size_t r) {
  Activation l({g.extent(0) / cp, g.extent(1)});
  for (std::size_t i = 0; i < l.extent(0); ++i)
    for (std::size_t j = 0; j < l.extent(1); ++j) l(i, j) = g(ring_global_row(i, seq, cp, r), j);
  return l;
}

void ring_put_rows(Activation& g, const Activation& l, std::size_t seq, std::size_t cp, std::size_t r) {
  for (std::size_t i = 0; i < l.extent(0); ++i)
    for (std::size_t j = 0; j < l.extent(1); ++j) g(ring_global_row(i, seq, cp, r), j) = l(i, j);
}

/**
 * Runs `make(tensor, context)` on cp x tp thread ranks (tensor innermost): forward on the context rank's zig-zag
 * rows of `x`, backward on those of `dy`, the weight gradients summed over the context group, everything assembled.
 */
template <class Make>
void run_ring_llama_layer(std::size_t cp, std::size_t tp, std::size_t seq, const Activation& x, const Activation& dy,
                          LlamaRun& out, Make make) {
  out.y = Activation({x.extent(0), dy.extent(1)});
  out.dx = Activation(x.shape());
  run_threads(int(cp * tp), [&](ThreadsCommunicator& world) {
    const auto w = std::size_t(world.rank()), t = w % tp, c = w / tp;
    ThreadsCommunicator tensor = world.split(int(c), int(t)), context = world.split(int(t), int(c));
    auto layer = make(tensor, context);
    perturb_by_global_index(layer.parameters());
    const Act<ContextShard> y = layer.forward(Act<ContextShard>(ring_rows(x, seq, cp, c)), 0);
    const Act<ContextShard> dx = layer.backward_input(Act<ContextShard>(ring_rows(dy, seq, cp, c)), 0);
    layer.backward_weight(0);
    for (Parameter* p : layer.parameters())
      context.all_reduce(std::span<float>(p->grad.data(), p->grad.size()), ReduceOp::sum);
    {
      std::lock_guard lock(out.m);
      ring_put_rows(out.y, y.tensor(), seq, cp, c);
      ring_put_rows(out.dx, dx.tensor(), seq, cp, c);
    }
    out.params.add(layer.parameters());
  });
}

void require_ring_equals(const LlamaRun& got, LlamaRun& one) {
  CHECK(rel_err(got.y.values(), one.y.values()) <= rel_tol);
  CHECK(rel_err(got.dx.values(), one.dx.values()) <= rel_tol);
  CHECK(got.params.replica_mismatch < 1e-6);
  REQUIRE(got.params.grad.size() == one.params.grad.size());
  for (const auto& [name, grad] : one.params.grad) {
    INFO("parameter " << name);
    CHECK(got.params.value.at(name) == one.params.value[name]);
    CHECK(rel_err(got.params.grad.at(name), grad) <= rel_tol);
  }
}

}  // namespace

TEST_CASE("RingGroupedQueryAttention at cp x tp equals GroupedQueryAttention at one rank", "[nn][llama][gqa][ring]") {
  using Comm = ThreadsCommunicator;
  constexpr std::size_t hidden = 32, heads = 8, seq = 16, batch = 2;
  const Activation x = random_activation(batch * seq, hidden, 91), dy = random_activation(batch * seq, hidden, 92);
  // 4 query heads per KV head (2 KV heads), multi-query (1), multi-head (8); theta of Llama 2 and Llama 3.
  for (const auto& [kv, theta] : {std::pair<std::size_t, double>{2, 1e4}, {1, 5e5}, {8, 1e4}}) {
    const GqaConfig cfg{hidden, heads, kv, seq, theta, 5, 70, "attn"};
    LlamaRun one;
    run_llama_layer<Replicate>(1, x, dy, one, [&](Comm& tp) { return GroupedQueryAttention<Comm>(tp, cfg); });
    for (auto [cp, tp] : {std::pair<std::size_t, std::size_t>{2, 1}, {4, 1}, {2, 2}}) {
      if (kv % tp != 0) continue;
      INFO("kv_heads " << kv << ", cp " << cp << ", tp " << tp);
      LlamaRun ring;
      run_ring_llama_layer(cp, tp, seq, x, dy, ring, [&](Comm& tensor, Comm& context) {
        RingGroupedQueryAttention<Comm> attn(tensor, context, cfg);
        CHECK(attn.local_kv_heads() == kv / tp);  // only these travel the ring
        return attn;
      });
      require_ring_equals(ring, one);
    }
  }
}

TEST_CASE("RingLlamaBlock at cp x tp equals LlamaBlock at one rank; full recomputation is bit-identical",
          "[nn][llama][llama_block][ring]") {
  using Comm = ThreadsCommunicator;
  constexpr std::size_t seq = 8;
  const LlamaBlockConfig cfg{32, 8, 2, 48, seq, 10000.0, 1e-6f, 5, 80, "block"};
  const Activation x = random_activation(2 * seq, 32, 93), dy = random_activation(2 * seq, 32, 94);
  LlamaRun one;
  run_llama_layer<Replicate>(1, x, dy, one, [&](Comm& tp) { return LlamaBlock<Comm>(tp, cfg); });
  for (auto [cp, tp] : {std::pair<std::size_t, std::size_t>{2, 1}, {2, 2}, {4, 1}}) {
    LlamaRun plain;
    for (Recompute r : {Recompute::none, Recompute::full}) {
      INFO("cp " << cp << ", tp " << tp << ", recompute " << recompute_name(r));
      LlamaRun ring;
      run_ring_llama_layer(cp, tp, seq, x, dy, ring, [&](Comm& tensor, Comm& context) {
        RingLlamaBlock<Comm> block(tensor, context, cfg);
        block.set_recompute(r);
        return block;
      });
      require_ring_equals(ring, one);
      if (r == Recompute::none) {
        plain.y = ring.y, plain.dx = ring.dx, plain.params.grad = ring.params.grad;
      } else {  // the forward rerun with the same kernels on the same values
        CHECK(ring.y.values() == plain.y.values());
        CHECK(ring.dx.values() == plain.dx.values());
        for (const auto& [name, grad] : plain.params.grad) CHECK(ring.params.grad[name] == grad);
      }
    }
  }
}

TEST_CASE("RingGroupedQueryAttention refuses a tensor group that does not divide the KV heads, naming the fix",
          "[nn][llama][gqa][ring]") {
  using Comm = ThreadsCommunicator;
  run_threads(4, [&](Comm& world) {
    const auto w = world.rank();
    Comm tensor = world.split(w / 2, w % 2), context = world.split(w % 2, w / 2);
    const GqaConfig cfg{32, 8, 1, 16, 1e4, 5, 70, "attn"};  // one KV head over two tensor ranks
    CHECK_THROWS_WITH((RingGroupedQueryAttention<Comm>(tensor, context, cfg)),
                      Catch::Contains("RingGroupedQueryAttention 'attn'") &&
                          Catch::Contains("1 key/value heads are not divisible by the tensor-parallel size 2") &&
                          Catch::Contains("Fix"));
  });
}
