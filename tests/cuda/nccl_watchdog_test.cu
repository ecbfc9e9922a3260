// NcclCommunicator never blocks the host, and its failures reach the host through the watchdog: a
// collective held back by a compute stream that cannot finish is reported (rank, operation, sequence
// number, the fix) and the communicator aborted, while the host, which waited for nothing, is free to
// release the stream. Skipped without a GPU.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "mpar/cuda.hpp"

using namespace mpar;

namespace {

/** Holds the stream until the host sets `*flag` (page-locked, mapped host memory: no managed memory). */
__global__ void spin_until(const volatile int* flag) {
  while (*flag == 0) {}
}

}  // namespace

TEST_CASE(
    "NcclCommunicator: wait() orders the compute stream without blocking the host; the watchdog reports a stuck "
    "collective",
    "[cuda][comm][nccl]") {
  CudaBackend::init_rank(0);
  NcclCommunicator comm(NcclCommunicator::make_unique_id(), 0, 1, 0,
                        NcclOptions{"world", std::chrono::milliseconds(200)});
  const cudaStream_t s = gpu::current_stream();
  gpu::DeviceBuffer<float> x(64, s);
  x.zero();

  SECTION("a collective completes in stream order: work queued after wait() sees the result") {
    const std::vector<float> ones(64, 1.0f);
    gpu::copy_to_device(ones.data(), x.data(), 64, s);
    comm.all_reduce(x.span(), ReduceOp::sum);
    gpu::scale(64, 3.0f, x.data());  // on the compute stream, after the all-reduce
    const auto h = gpu::to_host(x.data(), 64, s);
    for (float v : h) CHECK(v == 3.0f);
    CHECK_FALSE(comm.aborted());
  }

  SECTION("a stuck collective: the host is not blocked; the watchdog aborts and the next call says why") {
    int* flag = nullptr;
    gpu::check(cudaHostAlloc(reinterpret_cast<void**>(&flag), sizeof(int), cudaHostAllocMapped), "cudaHostAlloc");
    *flag = 0;
    int* dflag = nullptr;
    gpu::check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dflag), flag, 0), "cudaHostGetDevicePointer");
    spin_until<<<1, 1, 0, s>>>(dflag);  // the compute stream cannot finish until the host says so
    gpu::check(cudaGetLastError(), "spin_until");
    auto req = comm.iall_reduce(x.span(), ReduceOp::sum);  // waits on the device for the compute stream
    req.wait();                                            // returns at once: only the compute stream waits
    // The watchdog reports the operation once it is older than the timeout; wait for its report, not for time.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    while (!comm.aborted() && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
    *reinterpret_cast<volatile int*>(flag) = 1;  // release the stream
    CudaBackend::synchronize();
    gpu::check(cudaFreeHost(flag), "cudaFreeHost");
    REQUIRE(comm.aborted());
    CHECK_THROWS_WITH(comm.all_reduce(x.span(), ReduceOp::sum),
                      Catch::Contains("rank 0 of group 'world'") && Catch::Contains("all_reduce #1") &&
                          Catch::Contains("not finished after 200 ms") && Catch::Contains("Fix:"));
  }
}
