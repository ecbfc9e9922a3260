// Selective recomputation in the attention layers (Korthikanti et al. 2022): the layer with
// `set_selective_recompute(true)` against the same layer without it.
//
// - Outputs, input gradients and every parameter gradient are bit-identical (the probabilities are
//   recomputed by the same products and softmax), in fp32 and under bf16 Autocast, with two micro-batches in
//   flight, on one rank (Attention) and over two tensor ranks (SelfAttention).
// - The memory it keeps per micro-batch is smaller by exactly the probabilities, b x heads x s x s floats,
//   measured as the bytes a CachingMemoryResource has handed out after the forwards (one rank: over two, the
//   collectives' buffers may cross threads).
#include <catch2/catch.hpp>

#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <mpar/comm/threads.hpp>
#include <mpar/core/caching_memory_resource.hpp>
#include <mpar/nn/attention.hpp>
#include <mpar/nn/autocast.hpp>

#include "nn_test_support.hpp"

using namespace mpar;
using namespace mpar::nn;
using mpar::testing::random_activation;

namespace {

constexpr int microbatches = 2;

/** What a layer produced over both micro-batches, and what it held after both forwards. */
struct Run {
  std::vector<std::vector<float>> y, dx;
  std::map<std::string, std::vector<float>> grads;
  std::size_t held_after_forwards = 0;  ///< bytes handed out by the layer's forwards and not returned (outputs too)
};

/**
 * Both forwards of `layer` (on this rank's `tokens` x `hidden` input), then both backwards. With `pool`, every
 * allocation of the calling thread is made from it, so the bytes the forwards left allocated can be read off it
 * (it must outlive the layer, which keeps its 16-bit weight copies).
 */
template <class Layer, class In = typename Layer::default_input>
Run run(Layer& layer, std::size_t tokens, std::size_t hidden, ComputeType type, CachingMemoryResource* pool = nullptr) {
  Run r;
  {
    std::optional<ScopedMemoryResource> use;
    if (pool != nullptr) use.emplace(*pool);
    const Autocast scope(type);
    std::vector<nn::Act<In>> xs, ys;
    for (int mb = 0; mb < microbatches; ++mb) xs.emplace_back(random_activation(tokens, hidden, 10 + mb));
    const std::size_t before = pool ? pool->stats().in_use : 0;
    for (int mb = 0; mb < microbatches; ++mb) ys.push_back(layer.forward(xs[std::size_t(mb)], mb));
    r.held_after_forwards = pool ? pool->stats().in_use - before : 0;
    for (int mb = 0; mb < microbatches; ++mb) {
      const nn::Act<nn::grad_layout_t<In>> dy(random_activation(tokens, hidden, 20 + mb));
      const auto dx = layer.backward_input(dy, mb);
      layer.backward_weight(mb);
      const auto& y = ys[std::size_t(mb)];
      r.y.emplace_back(y.data(), y.data() + y.size());
      r.dx.emplace_back(dx.data(), dx.data() + dx.size());
    }
    for (auto* p : layer.parameters()) r.grads[p->name].assign(p->grad.begin(), p->grad.end());
  }
  return r;
}

void require_bit_equal(const Run& got, const Run& want) {
  for (int mb = 0; mb < microbatches; ++mb) {
    INFO("micro-batch " << mb);
    CHECK(got.y[std::size_t(mb)] == want.y[std::size_t(mb)]);
    CHECK(got.dx[std::size_t(mb)] == want.dx[std::size_t(mb)]);
  }
  REQUIRE(got.grads.size() == want.grads.size());
  for (const auto& [name, g] : want.grads) {
    INFO(name);
    REQUIRE(got.grads.count(name) == 1);
    CHECK(got.grads.at(name) == g);
  }
}

}  // namespace

TEST_CASE(
    "Attention with selective recomputation equals the plain layer bit for bit and keeps the probabilities' bytes "
    "less per micro-batch",
    "[nn][attention][recompute][selective]") {
  // 2 sequences of 16 tokens, 4 heads: the probabilities of one micro-batch are 2 x 4 x 16 x 16 floats = 8 KiB,
  // a whole number of the pool's 512-byte size classes, so the difference is exact.
  const nn::AttentionConfig cfg{32, 4, 16, 7, 0, "attn"};
  const std::size_t tokens = 2 * cfg.seq, probs_bytes = 2 * cfg.heads * cfg.seq * cfg.seq * sizeof(float);
  for (ComputeType type : {ComputeType::fp32, ComputeType::bf16}) {
    INFO((type == ComputeType::fp32 ? "fp32" : "bf16 Autocast"));
    HostMemoryResource host;
    CachingMemoryResource pool(host);  // before the layers: it outlives them
    nn::Attention<> plain(cfg), selective(cfg);
    selective.set_selective_recompute(true);
    CHECK(selective.selective_recompute());
    const Run want = run(plain, tokens, cfg.hidden, type, &pool);
    const Run got = run(selective, tokens, cfg.hidden, type, &pool);
    require_bit_equal(got, want);
    CHECK(want.held_after_forwards - got.held_after_forwards == microbatches * probs_bytes);
  }
}

TEST_CASE("SelfAttention over two tensor ranks with selective recomputation equals the plain layer bit for bit",
          "[nn][attention][recompute][selective]") {
  const nn::AttentionConfig cfg{32, 4, 8, 9, 0, "attn"};
  std::mutex m;
  std::vector<Run> plain(2), selective(2);
  run_threads(2, [&](ThreadsCommunicator& tp) {
    nn::SelfAttention<ThreadsCommunicator> a(tp, cfg), b(tp, cfg);
    b.set_selective_recompute(true);
    Run want = run(a, 3 * cfg.seq, cfg.hidden, ComputeType::fp32);
    Run got = run(b, 3 * cfg.seq, cfg.hidden, ComputeType::fp32);
    std::lock_guard lock(m);
    plain[std::size_t(tp.rank())] = std::move(want);
    selective[std::size_t(tp.rank())] = std::move(got);
  });
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("tensor rank " << r);
    require_bit_equal(selective[r], plain[r]);
  }
}
