// The GPT stage on the CUDA backend against the host backend: the same layer templates, the same
// initial weights and tokens; the loss, the logits and every parameter gradient must agree.
//
// Tolerances (fp32 on both sides; cuBLAS runs true fp32, not TF32): the loss within 1e-5 relative,
// logits and gradients within 1e-4 in norm-relative error (the device sums in another order, and
// the embedding and bias gradients accumulate with atomics).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "mpar/cuda.hpp"
#include "mpar/models/gpt_trainer.hpp"
#include "../nn/nn_test_support.hpp"

using namespace mpar;

namespace {

struct StageResult {
  float loss = 0;
  std::vector<float> logits;
  std::map<std::string, std::vector<float>> grads;
};

using mpar::testing::rel_err;  // ||a - b|| / ||b||

/** One forward, loss and backward of a single-stage GPT on backend B over tensor group `tp`. */
template <class B>
StageResult run_stage(ThreadsCommunicator& tp, const models::GptConfig& cfg, std::span<const std::int32_t> tokens,
                      std::span<const std::int32_t> targets) {
  models::GptStage<ThreadsCommunicator, B> stage(tp, cfg, true, true, 0, cfg.layers);
  const nn::Act<nn::FeatureShard> logits = stage.forward_to_loss(decltype(stage)::tokens_as_activation(tokens), 0);
  StageResult r;
  r.loss = stage.loss().forward(logits, targets, 0);
  (void)stage.backward(stage.loss().logits_gradient(0), 0);
  B::synchronize();
  r.logits.assign(logits.tensor().values().begin(), logits.tensor().values().end());
  for (auto* p : stage.parameters()) r.grads[p->name].assign(p->grad.begin(), p->grad.end());
  return r;
}

void compare(const StageResult& cuda, const StageResult& host, int rank) {
  INFO("tensor rank " << rank);
  CHECK(std::abs(cuda.loss - host.loss) <= 1e-5 * std::abs(host.loss));
  CHECK(rel_err(cuda.logits, host.logits) <= 1e-4);
  REQUIRE(cuda.grads.size() == host.grads.size());
  for (const auto& [name, g] : host.grads) {
    INFO("gradient of " << name);
    REQUIRE(cuda.grads.count(name) == 1);
    CHECK(rel_err(cuda.grads.at(name), g) <= 1e-4);
  }
}

/** Every rank runs the host stage, then binds GPU 0 (its own stream) and runs the CUDA stage. */
void check_gpt_on_cuda(int tp_size, double dropout) {
  models::GptConfig cfg;
  cfg.vocab = 37;
  cfg.hidden = 64;
  cfg.heads = 4;
  cfg.layers = 2;
  cfg.seq = 16;
  cfg.dropout = dropout;
  cfg.seed = 7;
  std::vector<std::int32_t> tokens(2 * cfg.seq), targets(2 * cfg.seq);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = std::int32_t((i * 7 + 3) % cfg.vocab);
    targets[i] = std::int32_t((i * 5 + 1) % cfg.vocab);
  }
  run_threads(tp_size, [&](ThreadsCommunicator& tp) {
    const StageResult host = run_stage<HostBackend>(tp, cfg, tokens, targets);
    CudaBackend::init_rank(0);
    const StageResult cuda = run_stage<CudaBackend>(tp, cfg, tokens, targets);
    set_current_memory_resource(detail::host_memory_resource());
    static std::mutex m;  // Catch2 assertions are not thread-safe
    std::lock_guard lock(m);
    compare(cuda, host, tp.rank());
  });
}

}  // namespace

TEST_CASE("GPT on CudaBackend: loss, logits and every gradient equal the host backend (one rank, dropout)",
          "[cuda][gpt]") {
  check_gpt_on_cuda(1, 0.1);
}

TEST_CASE("GPT on CudaBackend: two tensor-parallel thread ranks sharing GPU 0 equal the host backend", "[cuda][gpt]") {
  check_gpt_on_cuda(2, 0.0);
}

TEST_CASE("CudaBackend: tensors created after init_rank live in managed memory", "[cuda][gpt]") {
  run_threads(1, [](ThreadsCommunicator&) {
    CudaBackend::init_rank(0);
    nn::Activation a({4, 8}, 1.0f);
    cudaPointerAttributes attr{};
    gpu::check(cudaPointerGetAttributes(&attr, a.data()), "cudaPointerGetAttributes");
    CHECK(attr.type == cudaMemoryTypeManaged);
    CHECK(std::string(current_memory_resource().name()) == "cuda-managed");
    set_current_memory_resource(detail::host_memory_resource());
  });
}

// The whole trainer instantiates with NCCL as the world communicator on the CUDA backend: every
// communicated buffer is rank memory, which the host residency test checks call by call.
template class mpar::models::GptTrainer<mpar::NcclCommunicator, mpar::CudaBackend>;
