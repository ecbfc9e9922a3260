// CUDA Graphs: a training step captured once and replayed equals the same step run eagerly, and a
// host wait inside a capture is refused with the call named; CudaBackend's `graph_backend` capture of
// AdamW::step_in_rank replays with each step's learning rate, gradients and skip flag. Skipped without a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "cuda_test_support.hpp"
#include "mpar/cuda.hpp"
#include "mpar/nn/parameter.hpp"
#include "mpar/optim/adamw.hpp"

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

TEST_CASE("CUDA graph: CudaBackend's ops::gemm_strided_batched is stream-ordered (capturable) and equals host loops",
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
    CudaBackend::run(ops::gemm_strided_batched<float>{.ta = Trans::no,
                                                      .tb = Trans::yes,
                                                      .m = m,
                                                      .n = n,
                                                      .k = k,
                                                      .alpha = 1.0f,
                                                      .a = a.data(),
                                                      .lda = k,
                                                      .stride_a = BatchStrides{0, m * k},
                                                      .b = bt.data(),
                                                      .ldb = k,
                                                      .stride_b = BatchStrides{0, n * k},
                                                      .beta = 0.0f,
                                                      .c = c.data(),
                                                      .ldc = n,
                                                      .stride_c = BatchStrides{0, m * n},
                                                      .batch = BatchExtents{1, batch}});
  };
  run();  // the cuBLAS handle exists before the capture
  CudaBackend::run(ops::fill<float>{.n = batch * m * n, .value = -7.0f, .x = c.data()});
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

namespace {

/**
 * `steps` AdamW updates of a weight (decays) and a bias (does not) on CudaBackend: eagerly with host scalars
 * (`step(lr, factors)`, the skipped update of t = 2 retracted by the host), or with `step_in_rank`, the first
 * eager and the others replays of a second step captured by `CudaBackend::begin_capture` / `end_capture`, its
 * learning rate, gradients and factors copied from pinned memory the host rewrites before each launch.
 */
std::vector<float> cuda_adamw_graph_train(std::size_t steps, bool captured, AdamWScalars& scalars) {
  using B = CudaBackend;
  constexpr std::size_t rows = 3, cols = 4, n = rows * cols + cols;
  nn::Parameter w{"w", 1, {rows, cols}}, b{"bias", 2, {cols}};
  const std::vector<float> initial = values(n, 21, 0.5);
  B::pinned_buffer<float> staged(n);
  for (std::size_t i = 0; i < n; ++i) staged[i] = initial[i];
  for (nn::Parameter* p : {&w, &b}) {
    const std::size_t size = p->global_size(), at = p == &w ? 0 : rows * cols;
    p->value = B::allocate<float>(size);
    p->grad = B::allocate<float>(size);
    B::copy_from_host_async<float>(size, staged.data() + at, p->value.data());
  }
  B::synchronize();
  optim::AdamW<B> opt({&w, &b}, optim::AdamWConfig{0.01f, 0.9f, 0.99f, 1e-6f, 0.1f, optim::decays_weight_matrices});
  Buffer<float> lr = B::allocate<float>(1);
  Buffer<UpdateFactors> factors = B::allocate<UpdateFactors>(1);
  B::pinned_buffer<float> lr_in(1), grads_in(n);
  B::pinned_buffer<UpdateFactors> factors_in(1);
  auto issue_inputs = [&] {
    B::copy_from_host_async<float>(1, lr_in.data(), lr.data());
    B::copy_from_host_async<UpdateFactors>(1, factors_in.data(), factors.data());
    B::copy_from_host_async<float>(rows * cols, grads_in.data(), w.grad.data());
    B::copy_from_host_async<float>(cols, grads_in.data() + rows * cols, b.grad.data());
  };
  B::graph_type graph;
  for (std::size_t t = 0; t < steps; ++t) {
    const float step_lr = 0.01f / float(t + 1);
    const UpdateFactors f{t == 3 ? 0.5f : 1.0f, t == 2 ? 1.0f : 0.0f};
    lr_in[0] = step_lr;
    factors_in[0] = f;
    const std::vector<float> g = values(n, 100 + t, 1.0);
    for (std::size_t i = 0; i < n; ++i) grads_in[i] = g[i];
    if (!captured) {
      issue_inputs();
      opt.step(step_lr, static_cast<const UpdateFactors*>(factors.data()));
      if (f.skip != 0.0f) opt.retract_step();
    } else if (t == 0) {
      issue_inputs();
      opt.step_in_rank(lr.data(), factors.data());
    } else {
      if (t == 1) {
        B::begin_capture();
        issue_inputs();
        opt.step_in_rank(lr.data(), factors.data());
        graph = B::end_capture();
      }
      B::launch(graph);
    }
    B::synchronize();  // the pinned inputs are rewritten next
  }
  std::vector<float> state;
  for (std::size_t i = 0; i < 2; ++i) {
    for (std::span<const float> part :
         {std::span<const float>(i == 0 ? w.value : b.value), opt.first_moment(i), opt.second_moment(i)}) {
      B::pinned_buffer<float> out(part.size());
      B::copy_to_host_async<float>(part.size(), part.data(), out.data());
      B::synchronize();
      state.insert(state.end(), out.data(), out.data() + part.size());
    }
  }
  if (captured) {
    B::pinned_buffer<AdamWScalars> s(1);
    B::copy_to_host_async<AdamWScalars>(1, opt.rank_scalars(), s.data());
    B::synchronize();
    scalars = s[0];
  }
  return state;
}

}  // namespace

TEST_CASE("CUDA graph: AdamW::step_in_rank captured by CudaBackend replays each step's rate, gradients and skip",
          "[cuda][graph][adamw]") {
  CudaBackend::init_rank(0);
  constexpr std::size_t steps = 6;
  AdamWScalars unused{}, scalars{};
  const std::vector<float> eager = cuda_adamw_graph_train(steps, false, unused);
  const std::vector<float> replayed = cuda_adamw_graph_train(steps, true, scalars);
  // The kernels round as the host does; the bias corrections come from the device's pow instead of the host's,
  // which may differ in the last bit of a double, so allow float rounding rather than demanding identity.
  CHECK(max_rel_diff(replayed, eager) <= 1e-6);
  CHECK(scalars.steps == steps - 1);  // the skipped update not counted
  CHECK(scalars.lr == 0.01f / float(steps));
}
