// The SIMT emulator itself: built-ins, barriers, shared memory, warp collectives, atomics, device memory, and the
// rule breaks it must report (instead of hanging or passing by luck).
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <csignal>
#include <cstdint>
#include <string>
#include <vector>

#include "device_array.hpp"
#include "mpar/backend/gpu/runtime.hpp"

namespace mpar::emulator_test {

using emulation_test::DeviceArray;
using gpu::emulation::emulation_error;

__global__ void record_indices(unsigned* out) {
  const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned i = block * threads + t;
  out[4 * i + 0] = t;
  out[4 * i + 1] = block;
  out[4 * i + 2] = threadIdx.y;
  out[4 * i + 3] = blockIdx.z;
}

TEST_CASE("emulation: every thread of a 3-D grid of 3-D blocks runs once with its own indices") {
  const dim3 grid(3, 2, 2), block(5, 3, 2);
  const unsigned threads = 30, blocks = 12;
  DeviceArray<unsigned> out(4 * threads * blocks);
  out.zero();
  MPAR_LAUNCH(record_indices, grid, block, 0, nullptr, out.get());
  const std::vector<unsigned> h = out.host();
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned t = 0; t < threads; ++t) {
      const unsigned i = b * threads + t;
      REQUIRE(h[4 * i + 0] == t);
      REQUIRE(h[4 * i + 1] == b);
      REQUIRE(h[4 * i + 2] == t / 5 % 3);
      REQUIRE(h[4 * i + 3] == b / 6);
    }
}

// Each thread publishes its index in shared memory and reads its neighbour's: right only after a barrier.
template <bool with_barrier>
__global__ void rotate_through_shared(unsigned* out) {
  __shared__ unsigned slot[128];
  slot[threadIdx.x] = blockIdx.x * 1000 + threadIdx.x;
  if constexpr (with_barrier) __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = slot[(threadIdx.x + 1) % blockDim.x];
}

TEST_CASE("emulation: __syncthreads orders shared memory, and a missing one gives wrong values") {
  const unsigned blocks = 4, threads = 128;
  DeviceArray<unsigned> out(blocks * threads);
  std::vector<unsigned> want(blocks * threads);
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned t = 0; t < threads; ++t) want[b * threads + t] = b * 1000 + (t + 1) % threads;
  MPAR_LAUNCH(rotate_through_shared<true>, blocks, threads, 0, nullptr, out.get());
  REQUIRE(out.host() == want);  // shared memory is each block's own: block b reads only block b's values
  MPAR_LAUNCH(rotate_through_shared<false>, blocks, threads, 0, nullptr, out.get());
  REQUIRE(out.host() != want);  // the schedule runs readers before writers: the race shows
}

// Reverses each block's slice through dynamic shared memory; `probe` gets what a thread read before any write.
__global__ void reverse_in_dynamic_shared(const float* in, float* out, float* probe) {
  MPAR_DYNAMIC_SHARED(float, buffer);
  if (threadIdx.x == 0) probe[blockIdx.x] = buffer[blockDim.x - 1];
  __syncthreads();
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  buffer[threadIdx.x] = in[i];
  __syncthreads();
  out[i] = buffer[blockDim.x - 1 - threadIdx.x];
}

TEST_CASE("emulation: dynamic shared memory is per block and starts as NaN") {
  const unsigned blocks = 3, threads = 96;
  std::vector<float> in(blocks * threads), want(blocks * threads);
  for (unsigned i = 0; i < in.size(); ++i) in[i] = float(i);
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned t = 0; t < threads; ++t) want[b * threads + t] = in[b * threads + threads - 1 - t];
  DeviceArray<float> x(in), y(in.size()), probe(blocks);
  MPAR_LAUNCH(reverse_in_dynamic_shared, blocks, threads, threads * sizeof(float), nullptr, x.get(), y.get(),
              probe.get());
  REQUIRE(y.host() == want);
  for (float p : probe.host()) REQUIRE(std::isnan(p));  // not the previous block's values: each block starts afresh
}

__global__ void warp_collectives(const int* in, int* out) {
  const unsigned t = threadIdx.x, lane = t % 32;
  const int v = in[t];
  int* o = out + 8 * t;
  o[0] = __shfl_xor_sync(0xffffffffu, v, 5);
  o[1] = __shfl_down_sync(0xffffffffu, v, 3);
  o[2] = __shfl_up_sync(0xffffffffu, v, 2);
  o[3] = __shfl_sync(0xffffffffu, v, 7);
  o[4] = __shfl_down_sync(0xffffffffu, v, 3, 16);  // segments of 16 lanes
  o[5] = int(__ballot_sync(0xffffffffu, v % 3 == 0));
  o[6] = __any_sync(0xffffffffu, v == 40) + 2 * __all_sync(0xffffffffu, v >= 0);
  o[7] = lane < 8 ? __shfl_xor_sync(0x000000ffu, v, 1) : -1;  // a sub-mask: only lanes 0-7 take part
}

TEST_CASE("emulation: warp shuffles and votes give CUDA's results") {
  const unsigned threads = 64;
  std::vector<int> in(threads);
  for (unsigned t = 0; t < threads; ++t) in[t] = int((t * 7 + 3) % 50);
  DeviceArray<int> x(in), y(8 * threads);
  MPAR_LAUNCH(warp_collectives, 1, threads, 0, nullptr, x.get(), y.get());
  const std::vector<int> h = y.host();
  for (unsigned t = 0; t < threads; ++t) {
    const unsigned lane = t % 32, base = t - lane;
    INFO("thread " << t);
    REQUIRE(h[8 * t + 0] == in[base + (lane ^ 5)]);
    REQUIRE(h[8 * t + 1] == in[lane + 3 < 32 ? t + 3 : t]);
    REQUIRE(h[8 * t + 2] == in[lane >= 2 ? t - 2 : t]);
    REQUIRE(h[8 * t + 3] == in[base + 7]);
    REQUIRE(h[8 * t + 4] == in[lane % 16 + 3 < 16 ? t + 3 : t]);
    unsigned ballot = 0;
    bool any40 = false;
    for (unsigned l = 0; l < 32; ++l) {
      if (in[base + l] % 3 == 0) ballot |= 1u << l;
      any40 = any40 || in[base + l] == 40;
    }
    REQUIRE(unsigned(h[8 * t + 5]) == ballot);
    REQUIRE(h[8 * t + 6] == int(any40) + 2);
    REQUIRE(h[8 * t + 7] == (lane < 8 ? in[t ^ 1] : -1));
  }
}

__global__ void count_atomically(float* fsum, int* isum, double* dsum, int* imax, unsigned* cas_count) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  atomicAdd(fsum, 1.0f);
  atomicAdd(isum, i);
  atomicAdd(dsum, 0.5);
  atomicMax(imax, (i * 37) % 1000);
  unsigned old = *cas_count, seen;
  do {  // the compare-and-swap loop every CUDA atomic is built from
    seen = old;
    old = atomicCAS(cas_count, seen, seen + 2);
  } while (old != seen);
}

TEST_CASE("emulation: atomics from every thread of several blocks all land") {
  const unsigned blocks = 5, threads = 200, n = blocks * threads;
  DeviceArray<float> f(1);
  DeviceArray<int> is(1), imax(1);
  DeviceArray<double> d(1);
  DeviceArray<unsigned> cas(1);
  f.zero(), is.zero(), imax.zero(), d.zero(), cas.zero();
  MPAR_LAUNCH(count_atomically, blocks, threads, 0, nullptr, f.get(), is.get(), d.get(), imax.get(), cas.get());
  int want_max = 0;
  for (unsigned i = 0; i < n; ++i) want_max = std::max(want_max, int(i * 37 % 1000));
  REQUIRE(f.host()[0] == float(n));
  REQUIRE(is.host()[0] == int(n * (n - 1) / 2));
  REQUIRE(d.host()[0] == 0.5 * n);
  REQUIRE(imax.host()[0] == want_max);
  REQUIRE(cas.host()[0] == 2 * n);
}

__global__ void early_exit_then_barrier(int* out) {
  if (threadIdx.x >= 16) return;  // the classic bug: threads leave, the rest wait at a barrier
  __syncthreads();
  out[threadIdx.x] = 1;
}
__global__ void barriers_in_both_branches(int* out) {
  if (threadIdx.x % 2)
    __syncthreads();
  else
    __syncthreads();
  out[threadIdx.x] = 1;
}
__global__ void shuffle_in_half_a_warp(int* out) {
  int v = int(threadIdx.x);
  if (threadIdx.x % 32 < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);  // the mask names lanes that never come
  out[threadIdx.x] = v;
}
__global__ void shuffle_against_barrier(int* out) {
  int v = int(threadIdx.x);
  if (threadIdx.x < 8)
    v = __shfl_down_sync(0xffffffffu, v, 1);
  else
    __syncthreads();
  out[threadIdx.x] = v;
}
__global__ void shuffle_mask_without_caller(int* out) { out[threadIdx.x] = __shfl_sync(0x1u, int(threadIdx.x), 0); }
__global__ void shuffle_everywhere(int* out) { out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, int(threadIdx.x), 1); }
__global__ void store_one_too_many(int* out, unsigned n) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) out[i] = 1;  // off by one: writes out[n] too
}
__global__ void store_one(int* out) { out[blockIdx.x * blockDim.x + threadIdx.x] = 1; }

/** Runs `launch`, which must throw emulation_error whose message holds every one of `parts`. */
template <class F>
void require_emulation_error(F&& launch, std::initializer_list<const char*> parts) {
  try {
    launch();
  } catch (const emulation_error& e) {
    const std::string what = e.what();
    INFO(what);
    for (const char* p : parts) REQUIRE(what.find(p) != std::string::npos);
    return;
  }
  FAIL("no emulation_error");
}

TEST_CASE("emulation: barriers and warp collectives not reached by every thread they name are errors") {
  DeviceArray<int> out(256);
  require_emulation_error([&] { MPAR_LAUNCH(early_exit_then_barrier, 2, 64, 0, nullptr, out.get()); },
                          {"early_exit_then_barrier", "__syncthreads", "exit"});
  require_emulation_error([&] { MPAR_LAUNCH(barriers_in_both_branches, 1, 64, 0, nullptr, out.get()); },
                          {"two different __syncthreads", "emulator_test.cpp"});
  require_emulation_error([&] { MPAR_LAUNCH(shuffle_in_half_a_warp, 1, 64, 0, nullptr, out.get()); },
                          {"__shfl_xor_sync", "exit"});
  require_emulation_error([&] { MPAR_LAUNCH(shuffle_against_barrier, 1, 64, 0, nullptr, out.get()); },
                          {"no thread can move", "__shfl_down_sync", "__syncthreads"});
  require_emulation_error([&] { MPAR_LAUNCH(shuffle_mask_without_caller, 1, 32, 0, nullptr, out.get()); },
                          {"does not name the calling lane"});
  // A warp's mask may name only lanes that exist: a 40-thread block has 8 lanes in its second warp.
  require_emulation_error([&] { MPAR_LAUNCH(shuffle_everywhere, 1, 40, 0, nullptr, out.get()); },
                          {"do not exist", "warp 1"});
  // After all that the emulator runs the next launch normally.
  out.zero();
  MPAR_LAUNCH(store_one, 4, 64, 0, nullptr, out.get());
  REQUIRE(out.host() == std::vector<int>(256, 1));
}

TEST_CASE("emulation: bad launches are errors that name the kernel") {
  DeviceArray<int> out(64);
  require_emulation_error([&] { MPAR_LAUNCH(store_one, 1, 2048, 0, nullptr, out.get()); }, {"store_one", "1024"});
  require_emulation_error([&] { MPAR_LAUNCH(store_one, 0, 32, 0, nullptr, out.get()); }, {"store_one", "grid"});
  std::vector<int> host(64);
  require_emulation_error([&] { MPAR_LAUNCH(store_one, 1, 64, 0, nullptr, host.data()); },
                          {"store_one", "argument 1", "host memory"});
  REQUIRE_THROWS_AS((void)threadIdx, emulation_error);  // outside a kernel there is no thread
}

TEST_CASE("emulation: a kernel writing past the end of its allocation is an error that names it") {
  DeviceArray<int> out(100);
  require_emulation_error([&] { MPAR_LAUNCH(store_one_too_many, 1, 128, 0, nullptr, out.get(), 100u); },
                          {"store_one_too_many", "past the end", "400 bytes"});
  MPAR_LAUNCH(store_one_too_many, 1, 128, 0, nullptr, out.get(), 99u);  // in bounds: no error (the zone was restored)
  REQUIRE(out.host() == std::vector<int>(100, 1));
}

TEST_CASE("emulation: the host cannot touch device memory, only copy to and from it") {
  DeviceArray<float> d(std::vector<float>{1.0f, 2.0f, 3.0f});
  REQUIRE(d.host() == std::vector<float>{1.0f, 2.0f, 3.0f});
  // A host read of device memory faults, as on a GPU: in a child process, so the test survives it.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::signal(SIGSEGV, SIG_DFL);  // the test framework's handler would report the fault as a failure
    const volatile float* p = d.get();
    const float v = *p;
    ::_exit(v == 1.0f ? 0 : 1);  // reached only if the read did not fault
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGSEGV);
  // Copies check the direction and the bounds the call names.
  std::vector<float> h(3);
  REQUIRE(cudaMemcpy(h.data(), d.get(), 3 * sizeof(float), cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
  REQUIRE(cudaMemcpy(h.data(), d.get(), 4 * sizeof(float), cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
  REQUIRE(cudaMemcpy(h.data(), d.get(), 3 * sizeof(float), cudaMemcpyDefault) == cudaSuccess);
  REQUIRE(h == std::vector<float>{1.0f, 2.0f, 3.0f});
  REQUIRE(cudaMemset(h.data(), 0, sizeof(float)) == cudaErrorInvalidValue);
  REQUIRE(cudaFree(h.data()) == cudaErrorInvalidDevicePointer);
  // A fresh allocation holds NaN, not zeros: a kernel that accumulates into unset memory shows it.
  DeviceArray<float> fresh(4);
  for (float v : fresh.host()) REQUIRE(std::isnan(v));
}

}  // namespace mpar::emulator_test
