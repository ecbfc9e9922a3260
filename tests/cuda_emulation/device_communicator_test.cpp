// Several CUDA ranks on the emulated runtime: gpu::DeviceCommunicator (thread ranks sharing one device, collectives
// as device copies and a reduction kernel over the peers' buffers) and the tensor-parallel blocks over CudaBackend
// with it. The collectives equal what each rank contributed, summed in rank order; a GPT-2 block and a Llama block
// at tp = 2 over CudaBackend equal the single rank over HostBackend (output, input gradient, every weight gradient
// assembled from the shards); integers reduce exactly; a mismatched call throws on every rank instead of hanging.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../cuda/cuda_test_support.hpp"
#include "mpar/backend/gpu/cuda_backend.hpp"
#include "mpar/backend/host/host_backend.hpp"
#include "mpar/comm/nccl/device_communicator.hpp"
#include "mpar/comm/threads.hpp"
#include "mpar/core/init.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/nn/llama_block.hpp"
#include "mpar/nn/transformer_block.hpp"

namespace mpar::device_communicator_emulation_test {

using namespace mpar::nn;
using Device = gpu::DeviceCommunicator;

/** Runs `body(rank)` on `n` CudaBackend rank threads; rethrows the first rank's exception. */
void on_cuda_ranks(int n, const std::function<void(int)>& body) {
  std::vector<std::exception_ptr> errors{std::size_t(n)};
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      try {
        CudaBackend::init_rank(0);
        body(r);
        CudaBackend::synchronize();
      } catch (...) {
        errors[std::size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : ranks) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

using cuda_testing::rank_buffer;
using cuda_testing::rank_values;

template <class B>
Activation rank_rows(const std::vector<float>& host, std::size_t cols) {
  Activation a({host.size() / cols, cols}, uninitialized);
  copy_to_rank<B>(host.data(), a.data(), host.size());
  return a;
}
template <class B>
std::vector<float> host_copy(const float* p, std::size_t n) {
  return rank_values<B>(std::span<const float>(p, n));
}

TEST_CASE("DeviceCommunicator on the emulation: all-reduce, all-gather, reduce-scatter, broadcast, send and recv",
          "[cuda][comm][device_communicator]") {
  using B = CudaBackend;
  for (int p : {2, 3}) {
    INFO(p << " ranks");
    auto comms = Device::create(p, 0, "tensor");
    const std::size_t n = 6;
    // rank r contributes r + 0.25 i at element i
    const auto contribution = [n](int r) {
      std::vector<float> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = float(r) + 0.25f * float(i);
      return v;
    };
    const auto np = std::size_t(p);
    std::vector<std::vector<float>> reduced(np), gathered(np), scattered(np), broadcast(np), received(np);
    on_cuda_ranks(p, [&](int r) {
      Device& c = comms[std::size_t(r)];
      const auto ur = std::size_t(r);
      Buffer<float> sum = rank_buffer<B>(contribution(r));
      c.all_reduce(std::span<float>(sum.data(), n), ReduceOp::sum);
      reduced[ur] = host_copy<B>(sum.data(), n);

      Buffer<float> mine = rank_buffer<B>(contribution(r)), all = B::allocate<float>(n * std::size_t(p));
      c.all_gather(std::span<const float>(mine.data(), n), std::span<float>(all.data(), n * std::size_t(p)));
      gathered[ur] = host_copy<B>(all.data(), n * std::size_t(p));

      Buffer<float> full = rank_buffer<B>(std::vector<float>(n * std::size_t(p), float(r + 1))),
                    part = B::allocate<float>(n);
      c.reduce_scatter(std::span<const float>(full.data(), full.size()), std::span<float>(part.data(), n),
                       ReduceOp::sum);
      scattered[ur] = host_copy<B>(part.data(), n);

      Buffer<float> root_values = rank_buffer<B>(contribution(r == 1 ? 7 : r));
      c.broadcast(std::span<float>(root_values.data(), n), 1);
      broadcast[ur] = host_copy<B>(root_values.data(), n);

      Buffer<float> out = rank_buffer<B>(contribution(10 + r)), in = B::allocate<float>(n);
      const int next = (r + 1) % p, prev = (r + p - 1) % p;
      c.send(std::span<const float>(out.data(), n), next, 5);  // eager: never blocks
      c.recv(std::span<float>(in.data(), n), prev, 5);
      received[ur] = host_copy<B>(in.data(), n);
    });
    std::vector<float> want_sum(n, 0.0f), want_all;
    for (int q = 0; q < p; ++q) {
      const auto v = contribution(q);
      for (std::size_t i = 0; i < n; ++i) want_sum[i] += v[i];  // rank order, as the reduction kernel adds
      want_all.insert(want_all.end(), v.begin(), v.end());
    }
    const float want_scatter = float(p * (p + 1) / 2);
    for (int r = 0; r < p; ++r) {
      INFO("rank " << r);
      CHECK(reduced[std::size_t(r)] == want_sum);
      CHECK(gathered[std::size_t(r)] == want_all);
      CHECK(scattered[std::size_t(r)] == std::vector<float>(n, want_scatter));
      CHECK(broadcast[std::size_t(r)] == contribution(7));
      CHECK(received[std::size_t(r)] == contribution(10 + (r + p - 1) % p));
    }
  }
}

TEST_CASE("DeviceCommunicator on the emulation: ranks that disagree on a count throw on every rank, naming it",
          "[cuda][comm][device_communicator][errors]") {
  auto comms = Device::create(2, 0, "tensor", std::chrono::milliseconds(2000));
  std::vector<std::string> messages(2);
  on_cuda_ranks(2, [&](int r) {
    Buffer<float> b = CudaBackend::allocate<float>(r == 1 ? 5 : 4);
    CudaBackend::run(ops::zero<float>{.n = b.size(), .x = b.data()});
    try {
      comms[std::size_t(r)].all_reduce(std::span<float>(b.data(), b.size()), ReduceOp::sum);
    } catch (const comm_error& e) {
      messages[std::size_t(r)] = e.what();
    }
  });
  for (const auto& m : messages)
    CHECK_THAT(m, Catch::Contains("all_reduce") && Catch::Contains("'tensor'") && Catch::Contains("count 5"));
}

template <class T>
Buffer<T> rank_values(const std::vector<T>& host) {
  Buffer<T> b = CudaBackend::allocate<T>(host.size());
  CudaBackend::copy_from_host_async<T>(host.size(), host.data(), b.data());
  return b;
}
template <class T>
std::vector<T> host_values(const Buffer<T>& b) {
  std::vector<T> h(b.size());
  CudaBackend::copy_to_host_async<T>(b.size(), b.data(), h.data());
  CudaBackend::synchronize();
  return h;
}

TEST_CASE("DeviceCommunicator on the emulation: integers reduce exactly in the reduction kernel, and move bit for bit",
          "[cuda][comm][device_communicator]") {
  for (int p : {2, 3}) {
    INFO(p << " ranks");
    auto comms = Device::create(p, 0, "data");
    const std::size_t n = 7;
    const auto np = std::size_t(p);
    // int64 beyond 2^53 with odd low bits and both signs: a float or double accumulator rounds them.
    const auto big = [](int r, std::size_t i) {
      const std::int64_t m = (std::int64_t(1) << 58) + std::int64_t(1000003 * r + 2 * i + 1);
      return (i + std::size_t(r)) % 3 == 1 ? -m : m;
    };
    // uint32 near the top: the sum wraps modulo 2^32, as in a plain loop.
    const auto top = [](int r, std::size_t i) { return ~std::uint32_t(0) - std::uint32_t(2 * r + 5 * i); };
    std::vector<std::vector<std::int64_t>> sum(np), mx(np), mn(np), ring(np);
    std::vector<std::vector<std::uint32_t>> part(np);
    std::vector<std::vector<std::int32_t>> all(np);
    on_cuda_ranks(p, [&](int r) {
      Device& c = comms[std::size_t(r)];
      std::vector<std::int64_t> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = big(r, i);
      Buffer<std::int64_t> s = rank_values(v), hi = rank_values(v), lo = rank_values(v);
      c.all_reduce(std::span<std::int64_t>(s.data(), n), ReduceOp::sum);
      c.all_reduce(std::span<std::int64_t>(hi.data(), n), ReduceOp::max);
      c.all_reduce(std::span<std::int64_t>(lo.data(), n), ReduceOp::min);
      sum[std::size_t(r)] = host_values(s);
      mx[std::size_t(r)] = host_values(hi);
      mn[std::size_t(r)] = host_values(lo);
      std::vector<std::uint32_t> u(n * std::size_t(p));
      for (std::size_t i = 0; i < u.size(); ++i) u[i] = top(r, i);
      Buffer<std::uint32_t> full = rank_values(u), mine = CudaBackend::allocate<std::uint32_t>(n);
      c.reduce_scatter(std::span<const std::uint32_t>(full.data(), full.size()),
                       std::span<std::uint32_t>(mine.data(), n), ReduceOp::sum);
      part[std::size_t(r)] = host_values(mine);
      Buffer<std::int32_t> neg = rank_values(std::vector<std::int32_t>(n, -(1 << 25) - 2 * r - 1)),
                           gathered = CudaBackend::allocate<std::int32_t>(n * std::size_t(p));
      c.all_gather(std::span<const std::int32_t>(neg.data(), n),
                   std::span<std::int32_t>(gathered.data(), gathered.size()));
      all[std::size_t(r)] = host_values(gathered);
      Buffer<std::int64_t> in = CudaBackend::allocate<std::int64_t>(n);
      c.send(std::span<const std::int64_t>(s.data(), n), (r + 1) % p, 3);
      c.recv(std::span<std::int64_t>(in.data(), n), (r + p - 1) % p, 3);
      ring[std::size_t(r)] = host_values(in);
    });
    std::vector<std::int64_t> want_sum(n), want_max(n), want_min(n);
    std::vector<std::int32_t> want_all;
    for (std::size_t i = 0; i < n; ++i) {
      want_sum[i] = want_max[i] = want_min[i] = big(0, i);
      for (int q = 1; q < p; ++q) {
        want_sum[i] += big(q, i);
        want_max[i] = std::max(want_max[i], big(q, i));
        want_min[i] = std::min(want_min[i], big(q, i));
      }
    }
    for (int q = 0; q < p; ++q) want_all.insert(want_all.end(), n, -(1 << 25) - 2 * q - 1);
    for (int r = 0; r < p; ++r) {
      INFO("rank " << r);
      CHECK(sum[std::size_t(r)] == want_sum);
      CHECK(mx[std::size_t(r)] == want_max);
      CHECK(mn[std::size_t(r)] == want_min);
      CHECK(ring[std::size_t(r)] == want_sum);
      CHECK(all[std::size_t(r)] == want_all);
      std::vector<std::uint32_t> want_part(n);
      for (std::size_t i = 0; i < n; ++i) {
        std::uint32_t acc = 0;
        for (int q = 0; q < p; ++q) acc += top(q, std::size_t(r) * n + i);
        want_part[i] = acc;
      }
      CHECK(part[std::size_t(r)] == want_part);
    }
  }
}

TEST_CASE(
    "DeviceCommunicator on the emulation: an int64 call against a float one, and avg of integers, throw on "
    "every rank",
    "[cuda][comm][device_communicator][errors]") {
  // One group per failing call: a rank leaves a failed call at once, so the group's next call could overwrite
  // its arguments while a peer still reads them to name the failure.
  auto comms = Device::create(2, 0, "data", std::chrono::milliseconds(2000));
  auto others = Device::create(2, 0, "data", std::chrono::milliseconds(2000));
  std::vector<std::string> mismatch(2), avg(2);
  on_cuda_ranks(2, [&](int r) {
    Device& c = comms[std::size_t(r)];
    Buffer<std::int64_t> i64 = CudaBackend::allocate<std::int64_t>(4);
    Buffer<float> f32 = CudaBackend::allocate<float>(4);
    CudaBackend::run(ops::zero<float>{.n = f32.size(), .x = f32.data()});
    try {
      if (r == 0)
        c.all_reduce(std::span<std::int64_t>(i64.data(), 4), ReduceOp::sum);
      else
        c.all_reduce(std::span<float>(f32.data(), 4), ReduceOp::sum);
    } catch (const comm_error& e) {
      mismatch[std::size_t(r)] = e.what();
    }
    try {
      others[std::size_t(r)].all_reduce(std::span<std::int64_t>(i64.data(), 4), ReduceOp::avg);
    } catch (const comm_error& e) {
      avg[std::size_t(r)] = e.what();
    }
  });
  for (const auto& m : mismatch)
    CHECK_THAT(m, Catch::Contains("ranks disagree: rank 0 called all_reduce<i64>") &&
                      Catch::Contains("rank 1 called all_reduce<f32>"));
  for (const auto& m : avg) CHECK_THAT(m, Catch::Contains("'data'") && Catch::Contains("op=avg over i64 elements"));
}

/** A block's pass, on the host: output, input gradient, and every weight gradient assembled by global index. */
struct BlockPass {
  std::vector<float> y, dx;
  std::map<std::string, std::vector<float>> grads;
  std::mutex m;
};

std::vector<float> block_values(std::size_t n, std::uint64_t stream) {
  const CounterRng rng{77, stream};
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float(rng.normal(i));
  return v;
}

/** Forward and backward of `block` over backend B, the weight gradients placed at their global indices. */
template <class B, class Block>
void block_pass(Block& block, const std::vector<float>& x, const std::vector<float>& dy, std::size_t hidden,
                BlockPass& out) {
  const auto y = block.forward(Act<Replicate>(rank_rows<B>(x, hidden)), 0);
  const auto dx = block.backward(Act<Replicate>(rank_rows<B>(dy, hidden)), 0);
  const std::vector<float> yh = host_copy<B>(y.data(), y.size()), dxh = host_copy<B>(dx.data(), dx.size());
  std::lock_guard lock(out.m);
  out.y = yh, out.dx = dxh;  // replicated: every rank holds the same rows
  for (const Parameter* p : block.parameters()) {
    const std::vector<float> g = host_copy<B>(p->grad.data(), p->grad.size());
    auto& full = out.grads[p->name];
    full.resize(p->global_size());
    const std::size_t rank = p->global_shape.size();
    for (std::size_t k = 0; k < g.size(); ++k) {
      std::size_t rem = k, gi = 0;
      std::vector<std::size_t> idx(rank);
      for (std::size_t d = rank; d-- > 0;) {
        idx[d] = rem % p->local_box[d].extent;
        rem /= p->local_box[d].extent;
      }
      for (std::size_t d = 0; d < rank; ++d) gi = gi * p->global_shape[d] + p->local_box[d].offset + idx[d];
      full[gi] = g[k];
    }
  }
}

double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num) / (std::sqrt(den) + 1e-30);
}

/** `make(tp)` at tp = 2 over CudaBackend with DeviceCommunicator, against one HostBackend rank. */
template <template <class, class> class MakeBlock>
void check_block_at_tp2() {
  constexpr std::size_t hidden = 32, rows = 8;
  const std::vector<float> x = block_values(rows * hidden, 1), dy = block_values(rows * hidden, 2);
  BlockPass host, cuda;
  run_threads(1, [&](ThreadsCommunicator& tp) {
    HostMemoryResource memory;
    ScopedMemoryResource use(memory);
    auto block = MakeBlock<ThreadsCommunicator, HostBackend>::make(tp);
    block_pass<HostBackend>(block, x, dy, hidden, host);
  });
  auto comms = Device::create(2, 0, "tensor");
  on_cuda_ranks(2, [&](int r) {
    auto block = MakeBlock<Device, CudaBackend>::make(comms[std::size_t(r)]);
    block_pass<CudaBackend>(block, x, dy, hidden, cuda);
  });
  CHECK(relative_error(cuda.y, host.y) <= 1e-5);
  CHECK(relative_error(cuda.dx, host.dx) <= 1e-5);
  REQUIRE(cuda.grads.size() == host.grads.size());
  for (const auto& [name, g] : host.grads) {
    INFO("gradient of " << name);
    CHECK(relative_error(cuda.grads.at(name), g) <= 1e-5);
  }
}

template <class C, class B>
struct Gpt2Block {
  static TransformerBlock<C, false, B> make(C& tp) {
    return TransformerBlock<C, false, B>(tp, BlockConfig{32, 4, 128, 4, 0.0, 5, 0, "block"});
  }
};
template <class C, class B>
struct Llama2Block {
  static LlamaBlock<C, false, B> make(C& tp) {
    return LlamaBlock<C, false, B>(tp, LlamaBlockConfig{32, 4, 2, 48, 4, 10000.0, 1e-6f, 5, 0, "block"});
  }
};

TEST_CASE("GPT-2 and Llama blocks at tp = 2 over CudaBackend and DeviceCommunicator equal the single host rank",
          "[cuda][comm][device_communicator][cuda_backend]") {
  SECTION("GPT-2 block (fused attention, fused residual + layer norm)") { check_block_at_tp2<Gpt2Block>(); }
  SECTION("Llama block (grouped-query attention, rotary, RMSNorm, SwiGLU)") { check_block_at_tp2<Llama2Block>(); }
}

TEST_CASE("A host communicator over CudaBackend ranks is refused where the layer is built, naming the fix",
          "[cuda][comm][device_communicator]") {
  using Fc = ColumnParallel<ThreadsCommunicator, dyn, dyn, dyn, ColumnOptions{}, CudaBackend>;
  using Proj = RowParallel<ThreadsCommunicator, dyn, dyn, dyn, RowReduce::all_reduce, CudaBackend>;
  std::vector<std::string> column(2), row(2);
  std::vector<int> alone_built(1, 0);
  std::mutex m;
  // Two thread ranks over the threads communicator: its first collective would read device memory on the host.
  run_threads(2, [&](ThreadsCommunicator& tp) {
    CudaBackend::init_rank(0);
    std::string c, w;
    try {
      Fc fc(tp, 8, 16, {.seed = 1, .name = "fc1"});
    } catch (const std::exception& e) {
      c = e.what();
    }
    try {
      Proj proj(tp, 16, 8, {.seed = 1, .id_base = 2, .name = "fc2"});
    } catch (const std::exception& e) {
      w = e.what();
    }
    set_current_memory_resource(mpar::detail::host_memory_resource());
    std::lock_guard lock(m);
    column[std::size_t(tp.rank())] = c;
    row[std::size_t(tp.rank())] = w;
  });
  // One rank moves nothing: the same layer over a one-rank threads communicator is fine.
  run_threads(1, [&](ThreadsCommunicator& tp) {
    CudaBackend::init_rank(0);
    { Fc fc(tp, 8, 16, {.seed = 1, .name = "fc1"}); }
    alone_built[0] = 1;
    set_current_memory_resource(mpar::detail::host_memory_resource());
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK_THAT(column[std::size_t(r)], Catch::Contains("ColumnParallel 'fc1' (rank " + std::to_string(r) + " of 2") &&
                                           Catch::Contains("moves host memory") &&
                                           Catch::Contains("Fix: use gpu::DeviceCommunicator"));
    CHECK_THAT(row[std::size_t(r)], Catch::Contains("RowParallel 'fc2'") && Catch::Contains("NcclCommunicator"));
  }
  CHECK(alone_built[0] == 1);
}

}  // namespace mpar::device_communicator_emulation_test
