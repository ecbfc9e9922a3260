// The GPT stage on the CUDA backend against the host backend: the same layer templates, the same
// initial weights and tokens; the loss, the logits and every parameter gradient must agree.
//
// Tolerances (fp32 on both sides; cuBLAS runs true fp32, not TF32): the loss within 1e-5 relative,
// logits and gradients within 1e-4 in norm-relative error (the device sums in another order, and
// the embedding and bias gradients accumulate with atomics).
#include <algorithm>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "../nn/nn_test_support.hpp"
#include "cuda_test_support.hpp"
#include "mpar/cuda.hpp"
#include "mpar/models/gpt_generate.hpp"
#include "mpar/models/gpt_trainer.hpp"

using namespace mpar;
using mpar::cuda_testing::rank_values;

namespace {

struct StageResult {
  float loss = 0;
  std::vector<float> logits;
  std::map<std::string, std::vector<float>> grads;
};

using mpar::testing::rel_err;  // ||a - b|| / ||b||

/**
 * One forward, loss and backward of a single-stage GPT on backend B over tensor group `tp` (a communicator of B's
 * memory: the device communicator for CudaBackend). The host hands the tokens over as the trainer does and reads
 * the results by staged copies: it never touches device memory.
 */
template <class B, class C>
StageResult run_stage(C& tp, const models::GptConfig& cfg, std::span<const std::int32_t> tokens,
                      std::span<const std::int32_t> targets) {
  models::GptPipelinePart<C, B> stage(tp, cfg, true, true, 0, cfg.layers);
  nn::Act<Replicate> input;
  if constexpr (host_reads_rank_memory<B>) {
    input = decltype(stage)::tokens_as_activation(tokens);
  } else {
    stage.set_tokens(0, tokens);
    input = nn::Act<Replicate>(nn::Activation({tokens.size(), 1}, uninitialized));
  }
  const nn::Act<nn::FeatureShard> logits = stage.forward_to_loss(std::move(input), 0);
  StageResult r;
  r.loss = stage.loss().forward(logits, targets, 0);
  (void)stage.backward(stage.loss().logits_gradient(0), 0);
  r.logits = rank_values<B>(std::span<const float>(logits.tensor().values()));
  for (auto* p : stage.parameters()) r.grads[p->name] = rank_values<B>(std::span<const float>(p->grad));
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
  auto device_tp = gpu::DeviceCommunicator::create(tp_size, 0, "tensor");
  run_threads(tp_size, [&](ThreadsCommunicator& tp) {
    const StageResult host = run_stage<HostBackend>(tp, cfg, tokens, targets);
    CudaBackend::init_rank(0);
    const StageResult cuda = run_stage<CudaBackend>(device_tp[std::size_t(tp.rank())], cfg, tokens, targets);
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

TEST_CASE("CudaBackend: rank memory is device memory; values reach the host by asynchronous copies and events",
          "[cuda][gpt]") {
  const std::size_t n = 4096;
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = -3.0f + 0.25f * float(i % 97);
  std::vector<float> doubled(n), sextupled(n);
  std::string resource;
  int memory_type = -1;
  run_threads(1, [&](ThreadsCommunicator&) {
    CudaBackend::init_rank(0);
    resource = current_memory_resource().name();
    Buffer<float> x = CudaBackend::allocate<float>(n);
    cudaPointerAttributes attr{};
    gpu::check(cudaPointerGetAttributes(&attr, x.data()), "cudaPointerGetAttributes");
    memory_type = int(attr.type);
    CudaBackend::pinned_buffer<float> h1(n), h2(n);
    CudaBackend::copy_from_host_async<float>(n, v.data(), x.data());
    CudaBackend::run(ops::scale{.n = n, .factor = 2.0f, .x = x.data()});
    CudaBackend::copy_to_host_async<float>(n, x.data(), h1.data());  // ordered: must see 2v, not 6v
    CudaBackend::run(ops::scale{.n = n, .factor = 3.0f, .x = x.data()});
    CudaBackend::copy_to_host_async<float>(n, x.data(), h2.data());
    CudaBackend::event_type e;
    CudaBackend::record_event(e);
    CudaBackend::wait_event(e);
    std::copy_n(h1.data(), n, doubled.data());
    std::copy_n(h2.data(), n, sextupled.data());
    set_current_memory_resource(detail::host_memory_resource());
  });
  CHECK(resource == "cuda-device");
  CHECK(memory_type == int(cudaMemoryTypeDevice));
  for (std::size_t i = 0; i < n; ++i) {
    REQUIRE(doubled[i] == 2.0f * v[i]);
    REQUIRE(sextupled[i] == 6.0f * v[i]);
  }
}

TEST_CASE("generate on CudaBackend: greedy ids equal the host backend's (two tensor-parallel ranks)", "[cuda][gpt]") {
  models::GptConfig cfg;
  cfg.vocab = 37;  // padded to 48: the padding columns must never be picked
  cfg.hidden = 64;
  cfg.heads = 4;
  cfg.layers = 2;
  cfg.seq = 16;
  cfg.seed = 5;
  const std::vector<std::int32_t> prompt{3, 14, 15, 9, 2};
  std::mutex m;
  std::map<int, std::vector<std::int32_t>> host, cuda;
  auto device_tp = gpu::DeviceCommunicator::create(2, 0, "tensor");
  run_threads(2, [&](ThreadsCommunicator& tp) {
    std::vector<std::int32_t> h, c;
    {
      models::GptPipelinePart<ThreadsCommunicator, HostBackend> stage(tp, cfg, true, true, 0, cfg.layers);
      h = models::generate(stage, prompt, 24, {0.0, 0, 1});
    }
    CudaBackend::init_rank(0);
    {
      models::GptPipelinePart<gpu::DeviceCommunicator, CudaBackend> stage(device_tp[std::size_t(tp.rank())], cfg, true,
                                                                          true, 0, cfg.layers);
      c = models::generate(stage, prompt, 24, {0.0, 0, 1});
    }
    set_current_memory_resource(detail::host_memory_resource());
    std::lock_guard lock(m);
    host[tp.rank()] = std::move(h);
    cuda[tp.rank()] = std::move(c);
  });
  for (int r = 0; r < 2; ++r) {
    INFO("tensor rank " << r);
    CHECK(cuda.at(r) == host.at(r));
    for (auto id : cuda.at(r)) CHECK(std::size_t(id) < cfg.vocab);
  }
}

// The whole trainer instantiates with NCCL as the world communicator on the CUDA backend: every
// communicated buffer is rank memory, which the host residency test checks call by call.
template class mpar::models::GptTrainer<mpar::NcclCommunicator, mpar::CudaBackend>;
