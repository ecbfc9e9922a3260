// CudaBackend itself on the emulated runtime: the layers a user composes, instantiated over CudaBackend (device
// memory the host cannot touch, stream-ordered allocation, cuBLAS(Lt), the fused attention and the Llama kernels),
// equal the same layers over HostBackend; a captured forward and backward replays what the eager passes computed,
// bit for bit; a host wait inside a capture is refused, naming the call. Each CudaBackend rank runs on a thread of
// its own (init_rank installs device memory for that thread), as a rank does.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mpar/backend/gpu/cuda_backend.hpp"
#include "mpar/backend/host/host_backend.hpp"
#include "mpar/core/init.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/nn/attention.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/gelu.hpp"
#include "mpar/nn/layer_norm.hpp"
#include "mpar/nn/linear.hpp"
#include "mpar/nn/rms_norm.hpp"
#include "mpar/nn/stage.hpp"
#include "mpar/nn/swiglu_mlp.hpp"

namespace mpar::cuda_backend_emulation_test {

using namespace mpar::nn;

/** One pass's results on the host: the output, the input gradient and each parameter's gradient (by name). */
struct Pass {
  std::vector<float> y, dx;
  std::vector<std::string> names;
  std::vector<std::vector<float>> values, grads;
};

std::vector<float> normal_values(std::size_t n, std::uint64_t stream) {
  const CounterRng rng{2024, stream};
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float(rng.normal(i));
  return v;
}

template <class B>
Activation to_rank(const std::vector<float>& host, std::size_t cols) {
  Activation a({host.size() / cols, cols}, uninitialized);
  B::template copy_from_host_async<float>(host.size(), host.data(), a.data());
  return a;
}
template <class B>
std::vector<float> to_host(const float* p, std::size_t n) {
  std::vector<float> h(n);
  B::template copy_to_host_async<float>(n, p, h.data());
  B::synchronize();
  return h;
}

/** The layer's parameters, values and gradients, copied to the host. */
template <class B, class Layer>
void read_parameters(Layer& layer, Pass& out) {
  for (const Parameter* p : layer.parameters()) {
    out.names.push_back(p->name);
    out.values.push_back(to_host<B>(p->value.data(), p->value.size()));
    out.grads.push_back(to_host<B>(p->grad.data(), p->grad.size()));
  }
}

/** Forward on `x` and backward on `dy` of the layer `make()` builds, over backend B on a rank thread of its own. */
template <class B, class Make>
Pass run_pass(Make make, const std::vector<float>& x, std::size_t x_cols, const std::vector<float>& dy,
              std::size_t dy_cols) {
  Pass out;
  std::thread rank([&] {
    HostMemoryResource host;
    ScopedMemoryResource use(host);  // HostBackend: host memory; CudaBackend: init_rank installs device memory
    B::init_rank();
    auto layer = make();
    const auto y = layer.forward(Act<Replicate>(to_rank<B>(x, x_cols)), 0);
    const auto dx = layer.backward(Act<Replicate>(to_rank<B>(dy, dy_cols)), 0);
    out.y = to_host<B>(y.data(), y.size());
    out.dx = to_host<B>(dx.data(), dx.size());
    read_parameters<B>(layer, out);
  });
  rank.join();
  return out;
}

/** ||a - b|| <= tol ||b||: the GEMMs and reductions sum in other orders on the two backends. */
void require_close_norm(const std::vector<float>& a, const std::vector<float>& b, double tol) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(std::isfinite(a[i]));
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  CHECK(std::sqrt(num) <= tol * std::sqrt(den) + 1e-12);
}

void require_same_pass(const Pass& cuda, const Pass& host) {
  require_close_norm(cuda.y, host.y, 1e-5);
  require_close_norm(cuda.dx, host.dx, 1e-5);
  REQUIRE(cuda.names == host.names);
  for (std::size_t k = 0; k < host.names.size(); ++k) {
    INFO("parameter " << host.names[k]);
    CHECK(cuda.values[k] == host.values[k]);  // the same counter-based initial values, bit for bit
    require_close_norm(cuda.grads[k], host.grads[k], 1e-5);
  }
}

constexpr std::size_t rows = 8, hidden = 16;
constexpr std::uint64_t seed = 5;

/** LayerNorm then causal attention (2 heads, sequences of 4): CudaBackend takes its fused attention here. */
template <class B>
auto norm_then_attention() {
  return Stage<LayerNorm<Replicate, NoComm, B>, Attention<B>>(
      LayerNorm<Replicate, NoComm, B>(hidden, seed, 10, "ln"),
      Attention<B>(AttentionConfig{hidden, 2, 4, seed, 12, "attn"}));
}
/** The GPT MLP's pieces: a biased projection, GeLU, a projection back. */
template <class B>
auto gelu_mlp() {
  return Stage<Linear<dyn, dyn, B>, BasicGelu<B>, Linear<dyn, dyn, B>>(
      Linear<dyn, dyn, B>(hidden, 32, LinearInit{seed, 20, "fc1"}), BasicGelu<B>{},
      Linear<dyn, dyn, B>(32, hidden, LinearInit{seed, 22, "fc2"}));
}
/** Llama's MLP: RMSNorm, the fused gate and up projection without bias, SwiGLU's gate, the down projection. */
template <class B>
auto rms_swiglu() {
  return Stage<RMSNorm<Replicate, NoComm, B>, Linear<dyn, dyn, B>, SiluGate<B>, Linear<dyn, dyn, B>>(
      RMSNorm<Replicate, NoComm, B>(hidden, seed, 30, "norm", 1e-6f),
      Linear<dyn, dyn, B>(hidden, 2 * 24, LinearInit{seed, 32, "gate_up", false}), SiluGate<B>(24),
      Linear<dyn, dyn, B>(24, hidden, LinearInit{seed, 34, "down", false}));
}

TEST_CASE("CudaBackend on the emulation: layers equal HostBackend's (norms, fused attention, MLPs, Llama kernels)",
          "[cuda][cuda_backend]") {
  const std::vector<float> x = normal_values(rows * hidden, 1), dy = normal_values(rows * hidden, 2);
  SECTION("layer norm and causal attention") {
    require_same_pass(run_pass<CudaBackend>([] { return norm_then_attention<CudaBackend>(); }, x, hidden, dy, hidden),
                      run_pass<HostBackend>([] { return norm_then_attention<HostBackend>(); }, x, hidden, dy, hidden));
  }
  SECTION("GeLU MLP") {
    require_same_pass(run_pass<CudaBackend>([] { return gelu_mlp<CudaBackend>(); }, x, hidden, dy, hidden),
                      run_pass<HostBackend>([] { return gelu_mlp<HostBackend>(); }, x, hidden, dy, hidden));
  }
  SECTION("RMSNorm and the SwiGLU MLP") {
    require_same_pass(run_pass<CudaBackend>([] { return rms_swiglu<CudaBackend>(); }, x, hidden, dy, hidden),
                      run_pass<HostBackend>([] { return rms_swiglu<HostBackend>(); }, x, hidden, dy, hidden));
  }
}

TEST_CASE("CudaBackend on the emulation: a captured forward and backward replays the eager passes bit for bit",
          "[cuda][cuda_backend][graph]") {
  const std::vector<float> x = normal_values(rows * hidden, 3), dy = normal_values(rows * hidden, 4);
  using B = CudaBackend;
  // Eager: two passes, the gradients accumulating. Captured: one eager pass (so every lazily made buffer exists, as a
  // trainer's warm-up steps do), then the second pass captured without running and replayed once.
  Pass eager, captured;
  std::size_t operations = 0;
  for (const bool capture : {false, true}) {
    Pass& out = capture ? captured : eager;
    std::thread rank([&] {
      B::init_rank();
      auto layer = norm_then_attention<B>();
      const Activation xa = to_rank<B>(x, hidden), dya = to_rank<B>(dy, hidden);
      Activation y({rows, hidden}, uninitialized), dx({rows, hidden}, uninitialized);  // outlive the capture
      const auto pass = [&] {  // its temporaries are allocated and freed inside: the graph's own memory
        const auto ya = layer.forward(Act<Replicate>(backend_copy<B>(xa)), 0);
        const auto dxa = layer.backward(Act<Replicate>(backend_copy<B>(dya)), 0);
        B::run(ops::copy<float>{.n = ya.size(), .src = ya.data(), .dst = y.data()});
        B::run(ops::copy<float>{.n = dxa.size(), .src = dxa.data(), .dst = dx.data()});
      };
      pass();
      if (capture) {
        B::begin_capture();
        pass();
        auto graph = B::end_capture();
        operations = graph.nodes();
        // Nothing ran during the capture: the gradients still hold one pass.
        B::launch(graph);
      } else {
        pass();
      }
      out.y = to_host<B>(y.data(), y.size());
      out.dx = to_host<B>(dx.data(), dx.size());
      read_parameters<B>(layer, out);
    });
    rank.join();
  }
  CHECK(operations > 10);  // kernels, GEMMs and copies of a norm, an attention and their backward
  CHECK(captured.y == eager.y);
  CHECK(captured.dx == eager.dx);
  REQUIRE(captured.names == eager.names);
  for (std::size_t k = 0; k < eager.names.size(); ++k) {
    INFO("gradient of " << eager.names[k]);
    CHECK(captured.grads[k] == eager.grads[k]);
  }
}

TEST_CASE("CudaBackend on the emulation: a host wait inside a capture is refused and the capture fails",
          "[cuda][cuda_backend][graph]") {
  using B = CudaBackend;
  std::string refused, ended;
  std::thread rank([&] {
    B::init_rank();
    Buffer<float> b = B::allocate<float>(4);
    B::begin_capture();
    B::run(ops::fill<float>{.n = 4, .value = 1.0f, .x = b.data()});  // recorded, not run
    try {
      B::synchronize();
    } catch (const std::exception& e) {
      refused = e.what();
    }
    try {
      (void)B::end_capture();
    } catch (const std::exception& e) {
      ended = e.what();
    }
  });
  rank.join();
  CHECK_THAT(refused, Catch::Contains("cudaStreamSynchronize") && Catch::Contains("capturing"));
  CHECK_THAT(ended, Catch::Contains("cudaStreamEndCapture"));
}

}  // namespace mpar::cuda_backend_emulation_test
