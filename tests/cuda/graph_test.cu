// CUDA Graphs: a training step captured once and replayed equals the same step run eagerly, and a
// host wait inside a capture is refused with the call named. Skipped without a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "cuda_test_support.hpp"
#include "mpar/cuda.hpp"

using namespace mpar;
using namespace mpar::cuda_testing;

namespace {

std::vector<float> values(std::size_t n, std::uint64_t seed, double scale) {
  return uniform_values<float>(n, CounterRng{seed, 5}, scale);
}

/**
 * A two-layer MLP classifier trained with SGD, every buffer allocated once: the step's state lives at
 * fixed device addresses, as a captured step requires. Step-dependent host scalars (AdamW's bias
 * corrections) would be frozen into a graph, so the step uses plain SGD.
 */
struct TinyModel {
  static constexpr std::size_t batch = 48, din = 64, dh = 128, vocab = 300;
  gpu::DeviceBuffer<float> x, w1, w2, pre, h, logits, dw1, dw2, dhid, dpre, row_loss, loss;
  gpu::DeviceBuffer<std::int32_t> targets;
  TinyModel()
      : x(upload(values(batch * din, 1, 1.0))), w1(upload(values(din * dh, 2, 0.2))),
        w2(upload(values(dh * vocab, 3, 0.2))), pre(batch * dh, S()), h(batch * dh, S()), logits(batch * vocab, S()),
        dw1(din * dh, S()), dw2(dh * vocab, S()), dhid(batch * dh, S()), dpre(batch * dh, S()), row_loss(batch, S()),
        loss(1, S()) {
    std::vector<std::int32_t> t(batch);
    for (std::size_t i = 0; i < batch; ++i) t[i] = std::int32_t((i * 37) % vocab);
    targets = gpu::to_device(std::span<const std::int32_t>(t), S());
  }
  /** Forward, fused loss and gradient, backward, SGD: stream-ordered work only. */
  void step() {
    gpu::gemm<float>(Trans::no, Trans::no, batch, dh, din, 1.0f, x.data(), din, w1.data(), dh, 0.0f, pre.data(), dh);
    gpu::gelu_forward(batch * dh, pre.data(), h.data());
    gpu::gemm<float>(Trans::no, Trans::no, batch, vocab, dh, 1.0f, h.data(), dh, w2.data(), vocab, 0.0f, logits.data(),
                     vocab);
    gpu::fused_classifier(batch, vocab, vocab, logits.data(), targets.data(), logits.data(), row_loss.data(),
                          loss.data());
    gpu::gemm<float>(Trans::yes, Trans::no, dh, vocab, batch, 1.0f, h.data(), dh, logits.data(), vocab, 0.0f,
                     dw2.data(), vocab);
    gpu::gemm<float>(Trans::no, Trans::yes, batch, dh, vocab, 1.0f, logits.data(), vocab, w2.data(), vocab, 0.0f,
                     dhid.data(), dh);
    gpu::gelu_backward(batch * dh, pre.data(), dhid.data(), dpre.data());
    gpu::gemm<float>(Trans::yes, Trans::no, din, dh, batch, 1.0f, x.data(), din, dpre.data(), dh, 0.0f, dw1.data(), dh);
    gpu::sgd_update<float>(din * dh, w1.data(), dw1.data(), nullptr, 0.0f, 0.0f, false, 0.5f, 0.0f, false);
    gpu::sgd_update<float>(dh * vocab, w2.data(), dw2.data(), nullptr, 0.0f, 0.0f, false, 0.5f, 0.0f, false);
  }
};

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double w = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    w = std::max(w, std::abs(double(a[i]) - double(b[i])) / (1e-6 + std::abs(double(b[i]))));
  return w;
}

}  // namespace

TEST_CASE("CUDA graph: a captured training step replayed three times equals three eager steps", "[cuda][graph]") {
  CudaBackend::init_rank(0);
  TinyModel eager, replayed;
  std::vector<float> eager_loss, graph_loss;
  // The eager steps run first, so the cuBLAS handle exists before the capture.
  for (int s = 0; s < 3; ++s) {
    eager.step();
    eager_loss.push_back(download(eager.loss)[0]);
  }
  const gpu::Graph g = gpu::Graph::capture(S(), [&] { replayed.step(); });
  CHECK(g.nodes() >= 10);  // eight GEMMs and kernels at least; capturing ran none of them
  for (int s = 0; s < 3; ++s) {
    g.launch(S());
    graph_loss.push_back(download(replayed.loss)[0]);
  }
  REQUIRE(eager_loss.size() == 3);
  CHECK(eager_loss[2] < eager_loss[0]);  // the step trains
  for (int s = 0; s < 3; ++s)
    CHECK(std::abs(graph_loss[std::size_t(s)] - eager_loss[std::size_t(s)]) <= 1e-6 * eager_loss[0]);
  CHECK(max_rel_diff(download(replayed.w1), download(eager.w1)) <= 1e-5);
  CHECK(max_rel_diff(download(replayed.w2), download(eager.w2)) <= 1e-5);
}

TEST_CASE("CUDA graph: a host wait inside the captured step is refused, naming the call", "[cuda][graph]") {
  CudaBackend::init_rank(0);
  TinyModel m;
  m.step();  // handles and workspaces exist before the capture (creating them is not stream-ordered)
  CHECK_THROWS_WITH(gpu::Graph::capture(S(),
                                        [&] {
                                          m.step();
                                          CudaBackend::synchronize();
                                        }),
                    Catch::Contains("cudaStreamSynchronize"));
  // The stream is usable afterwards: an eager step runs and gives a finite loss.
  m.step();
  CHECK(std::isfinite(download(m.loss)[0]));
  CHECK_THROWS_WITH(gpu::Graph{}.launch(S()), Catch::Contains("Graph::capture"));
}

TEST_CASE("CUDA graph: CudaBackend::gemm_strided_batched is stream-ordered (capturable) and equals host loops",
          "[cuda][graph][gemm]") {
  // A capture refuses any host wait (previous test), so capturing the batched GEMM proves it no longer
  // synchronises; the replay's result is checked against naive loops over the heads.
  CudaBackend::init_rank(0);
  constexpr std::size_t batch = 3, m = 17, n = 19, k = 23;
  const auto ha = values(batch * m * k, 11, 1.0), hb = values(batch * k * n, 12, 1.0);
  auto a = upload(ha), b = upload(hb);
  gpu::DeviceBuffer<float> c(batch * m * n, S());
  // C_i = A_i B_i with B_i stored transposed ([n, k]) to exercise Trans::yes; A_i is [m, k].
  std::vector<float> hbt(batch * n * k);
  for (std::size_t i = 0; i < batch; ++i)
    for (std::size_t p = 0; p < k; ++p)
      for (std::size_t j = 0; j < n; ++j) hbt[i * n * k + j * k + p] = hb[i * k * n + p * n + j];
  auto bt = upload(hbt);
  auto run = [&] {
    CudaBackend::gemm_strided_batched<float>(Trans::no, Trans::yes, m, n, k, 1.0f, a.data(), k, m * k, bt.data(), k,
                                             n * k, 0.0f, c.data(), n, m * n, batch);
  };
  run();  // the cuBLAS handle exists before the capture
  CudaBackend::fill(batch * m * n, -7.0f, c.data());
  const gpu::Graph g = gpu::Graph::capture(S(), run);
  CHECK(g.nodes() >= 1);
  g.launch(S());
  const auto got = download(c);
  double worst = 0;
  for (std::size_t i = 0; i < batch; ++i)
    for (std::size_t r = 0; r < m; ++r)
      for (std::size_t j = 0; j < n; ++j) {
        double ref = 0;
        for (std::size_t p = 0; p < k; ++p)
          ref += double(ha[i * m * k + r * k + p]) * double(hb[i * k * n + p * n + j]);
        worst = std::max(worst, std::abs(double(got[i * m * n + r * n + j]) - ref) / (1.0 + std::abs(ref)));
      }
  CHECK(worst <= 1e-5);
}
