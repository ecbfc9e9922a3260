// The layers that use fused kernels on CudaBackend must reproduce the host backend, which runs the unfused
// operations: the output, the input gradient and every parameter gradient.
// - Attention takes the fused attention path (cuDNN's SDPA where it applies, mpar's flash kernel otherwise;
//   no s x s scores) against the host's batched GEMMs and softmax, for fp32 and under bf16 Autocast.
// - TransformerBlock adds its first residual and normalises with ln2 in one kernel (forward and backward),
//   against the host's add and LayerNorm (and, with head size 64, fused attention inside).
//
// Tolerances (norm-relative): fp32 1e-4 (both sides fp32; the fused kernels sum in another order, and
// the layer-norm parameter gradients accumulate with atomics); bf16 2e-2 (the host rounds the
// probabilities to bf16 before P·V and dS before dS·K, the fused kernel keeps both in fp32).
// Skipped without a GPU.
#include <catch2/catch.hpp>

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../nn/nn_test_support.hpp"
#include "mpar/comm/threads.hpp"
#include "mpar/cuda.hpp"
#include "mpar/nn/autocast.hpp"
#include "mpar/nn/transformer_block.hpp"

using namespace mpar;
using nn::Activation;
using nn::ComputeType;

static_assert(mpar::nn::detail::fused_attention_backend<CudaBackend>, "CudaBackend's attention runs the fused kernels");
static_assert(!mpar::nn::detail::fused_attention_backend<HostBackend>,
              "HostBackend's attention stays the batched products");

namespace {

using mpar::testing::rel_err;

struct LayerResult {
  std::vector<float> y, dx;
  std::map<std::string, std::vector<float>> grads;
};

/** Rank-memory values as a host vector (a device copy on CudaBackend, the values themselves on the host). */
template <class B>
std::vector<float> read(const float* p, std::size_t n) {
  std::vector<float> h(n);
  B::copy_to_host_async(n, p, h.data());
  B::synchronize();
  return h;
}
/** Host values into a fresh `[rows, cols]` activation in the rank's memory. */
template <class B>
Activation write(const std::vector<float>& h, std::size_t rows, std::size_t cols) {
  Activation a({rows, cols}, uninitialized);
  B::copy_from_host_async(h.size(), h.data(), a.data());
  B::synchronize();
  return a;
}

/** One forward, backward and weight gradient of `layer` on random input and output gradient. */
template <class B, class Layer>
LayerResult run_layer(Layer& layer, std::size_t tokens, std::size_t hidden, ComputeType type) {
  std::vector<float> x(tokens * hidden), dy(tokens * hidden);
  const CounterRng rx{11, 1}, rd{12, 2};
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = float(2 * rx.uniform(i) - 1);
    dy[i] = float(2 * rd.uniform(i) - 1);
  }
  LayerResult r;
  {
    std::optional<nn::Autocast> scope;
    if (type != ComputeType::fp32) scope.emplace(type);
    const auto y = layer.forward(nn::Act<Replicate>(write<B>(x, tokens, hidden)), 0);
    const auto dx = layer.backward_input(nn::Act<Replicate>(write<B>(dy, tokens, hidden)), 0);
    layer.backward_weight(0);
    r.y = read<B>(y.tensor().data(), y.tensor().size());
    r.dx = read<B>(dx.tensor().data(), dx.tensor().size());
  }
  for (auto* p : layer.parameters()) r.grads[p->name] = read<B>(p->grad.data(), p->grad.size());
  return r;
}

void compare(const LayerResult& cuda, const LayerResult& host, double tol);

void check_attention_on_cuda(std::size_t hidden, std::size_t heads, std::size_t seq, ComputeType type, double tol) {
  nn::AttentionConfig cfg;
  cfg.hidden = hidden;
  cfg.heads = heads;
  cfg.seq = seq;
  cfg.seed = 5;
  const std::size_t tokens = 3 * seq;
  REQUIRE(CudaBackend::attention_supports(3 * heads, hidden / heads));  // the fused path is the one checked
  nn::Attention<HostBackend> host_layer(cfg);
  const LayerResult host = run_layer<HostBackend>(host_layer, tokens, hidden, type);
  CudaBackend::init_rank(0);
  const LayerResult cuda = [&] {
    nn::Attention<CudaBackend> layer(cfg);
    return run_layer<CudaBackend>(layer, tokens, hidden, type);
  }();
  set_current_memory_resource(detail::host_memory_resource());
  compare(cuda, host, tol);
}

void compare(const LayerResult& cuda, const LayerResult& host, double tol) {
  CHECK(rel_err(cuda.y, host.y) <= tol);
  CHECK(rel_err(cuda.dx, host.dx) <= tol);
  REQUIRE(cuda.grads.size() == host.grads.size());
  for (const auto& [name, g] : host.grads) {
    INFO("gradient of " << name);
    REQUIRE(cuda.grads.count(name) == 1);
    CHECK(rel_err(cuda.grads.at(name), g) <= tol);
  }
}

/** A transformer block (fused residual + ln2, and fused attention for head sizes 32..128) against the host's. */
void check_block_on_cuda(std::size_t hidden, std::size_t heads, std::size_t seq, double dropout) {
  static_assert(mpar::nn::detail::fused_residual_layernorm_backend<CudaBackend> &&
                !mpar::nn::detail::fused_residual_layernorm_backend<HostBackend>);
  const nn::BlockConfig cfg{hidden, heads, 4 * hidden, seq, dropout, 9, 0, "block"};
  const std::size_t tokens = 2 * seq;
  run_threads(1, [&](ThreadsCommunicator& tp) {
    nn::TransformerBlock<ThreadsCommunicator, false, HostBackend> host_block(tp, cfg);
    const LayerResult host = run_layer<HostBackend>(host_block, tokens, hidden, ComputeType::fp32);
    CudaBackend::init_rank(0);
    const LayerResult cuda = [&] {
      nn::TransformerBlock<ThreadsCommunicator, false, CudaBackend> block(tp, cfg);
      return run_layer<CudaBackend>(block, tokens, hidden, ComputeType::fp32);
    }();
    set_current_memory_resource(detail::host_memory_resource());
    compare(cuda, host, 1e-4);  // one rank: Catch2's assertions on this thread only
  });
}

}  // namespace

TEST_CASE("TransformerBlock on CudaBackend: fused residual + layer norm (and fused attention) equal the host backend",
          "[cuda][block]") {
  check_block_on_cuda(128, 2, 32, 0.0);  // head size 64: fused attention too
  check_block_on_cuda(96, 6, 16, 0.1);   // head size 16: batched products; dropout masks on both sides
}

TEST_CASE("Attention on CudaBackend runs the fused kernel and equals the host backend's attention (fp32)",
          "[cuda][attention]") {
  check_attention_on_cuda(128, 2, 48, ComputeType::fp32, 1e-4);  // head size 64, a sequence not a multiple of 32
  check_attention_on_cuda(128, 4, 32, ComputeType::fp32, 1e-4);  // head size 32
}

TEST_CASE("Attention on CudaBackend under bf16 Autocast equals the host backend's within bf16 rounding",
          "[cuda][attention]") {
  check_attention_on_cuda(256, 2, 64, ComputeType::bf16, 2e-2);  // head size 128
}
