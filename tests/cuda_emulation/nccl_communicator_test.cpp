// NcclCommunicator on the emulated runtime: thread ranks, each on its own emulated device, over the emulated NCCL
// (emulation/nccl.hpp). Every collective equals what the ranks contributed, computed here with plain loops (block
// rule for uneven sizes, rank-order sums); grouped sends and receives in a ring, splits into sub-groups. Mistakes a GPU
// would hang on or corrupt silently throw comm_error on every rank instead: collectives that differ across ranks,
// host memory handed to NCCL, two ranks on one device, a peer that left.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "mpar/backend/gpu/cuda_backend.hpp"
#include "mpar/backend/gpu/memory.hpp"
#include "mpar/comm/nccl/nccl_communicator.hpp"
#include "mpar/core/layout.hpp"

namespace mpar::nccl_emulation_test {

/**
 * Runs `body(comm)` on `n` thread ranks, rank r on emulated device `device_of(r)`, joined to one NcclCommunicator;
 * returns each rank's exception message (empty when it finished).
 */
std::vector<std::string> on_nccl_ranks(
    int n, const std::function<void(NcclCommunicator&)>& body,
    const std::function<int(int)>& device_of = [](int r) { return r; }) {
  const ncclUniqueId id = NcclCommunicator::make_unique_id();
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      try {
        CudaBackend::init_rank(device_of(r));
        NcclCommunicator comm(id, r, n, device_of(r), NcclOptions{"world", std::chrono::seconds(30)});
        body(comm);
        CudaBackend::synchronize();
      } catch (const std::exception& e) {
        errors[std::size_t(r)] = e.what();
        if (errors[std::size_t(r)].empty()) errors[std::size_t(r)] = "(an exception without a message)";
      }
    });
  for (auto& t : ranks) t.join();
  return errors;
}
void require_all_finished(const std::vector<std::string>& errors) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r << ": " << errors[r]);
    REQUIRE(errors[r].empty());
  }
}

template <class T>
gpu::DeviceBuffer<T> on_device(const std::vector<T>& host) {
  return gpu::to_device<T>(std::span<const T>(host), gpu::current_stream());
}
template <class T>
std::vector<T> on_host(const gpu::DeviceBuffer<T>& d) {
  return gpu::to_host(d.data(), d.size(), gpu::current_stream());
}

/** Rank r's contribution: element i is r + 0.25 i, exactly representable in every float type used here. */
std::vector<float> contribution(int r, std::size_t n, std::size_t offset = 0) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float(r) + 0.25f * float(i + offset);
  return v;
}

TEST_CASE("NcclCommunicator on the emulated NCCL: every collective equals the ranks' contributions",
          "[cuda][comm][nccl]") {
  constexpr int p = 4;
  constexpr std::size_t n = 10;  // not divisible by 4: the block rule's uneven blocks (3, 3, 2, 2)
  std::vector<std::vector<float>> sum(p), avg(p), bcast(p), reduced(p), gathered(p), scattered_sum(p), gather_root(p),
      scattered(p), alltoall(p), ring(p);
  std::vector<std::vector<std::int64_t>> maxed(p);
  std::vector<std::vector<bf16>> bf16_sum(p);
  require_all_finished(on_nccl_ranks(p, [&](NcclCommunicator& comm) {
    const int r = comm.rank();
    const auto ur = std::size_t(r);
    {
      auto x = on_device(contribution(r, n));
      comm.all_reduce(x.span(), ReduceOp::sum);
      sum[ur] = on_host(x);
      auto y = on_device(contribution(r, n));
      comm.all_reduce(y.span(), ReduceOp::avg);
      avg[ur] = on_host(y);
    }
    {
      std::vector<std::int64_t> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = std::int64_t((r * 7 + int(i) * 3) % 11) - 5;
      auto x = on_device(v);
      comm.all_reduce(x.span(), ReduceOp::max);
      maxed[ur] = on_host(x);
    }
    {
      std::vector<bf16> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = bf16(float(r) + 0.5f * float(i));
      auto x = on_device(v);
      comm.all_reduce(x.span(), ReduceOp::sum);
      bf16_sum[ur] = on_host(x);
    }
    {
      auto x = on_device(contribution(r, n));
      comm.broadcast(x.span(), 2);
      bcast[ur] = on_host(x);
    }
    {
      auto s = on_device(contribution(r, n));
      gpu::DeviceBuffer<float> out(r == 1 ? n : 0, gpu::current_stream());
      comm.reduce(std::span<const float>(s.span()), out.span(), ReduceOp::sum, 1);
      if (r == 1) reduced[ur] = on_host(out);
    }
    const Block mine = block_of(n, p, ur);
    {
      auto s = on_device(contribution(r, mine.extent));
      gpu::DeviceBuffer<float> all(n, gpu::current_stream());
      comm.all_gather(std::span<const float>(s.span()), all.span());
      gathered[ur] = on_host(all);
    }
    {
      auto s = on_device(contribution(r, n));
      gpu::DeviceBuffer<float> part(mine.extent, gpu::current_stream());
      comm.reduce_scatter(std::span<const float>(s.span()), part.span(), ReduceOp::sum);
      scattered_sum[ur] = on_host(part);
    }
    {
      auto s = on_device(contribution(r, mine.extent));
      gpu::DeviceBuffer<float> all(r == 0 ? n : 0, gpu::current_stream());
      comm.gather(std::span<const float>(s.span()), all.span(), 0);
      if (r == 0) gather_root[ur] = on_host(all);
    }
    {
      auto s = on_device(r == 3 ? contribution(3, n) : std::vector<float>(n, 0.0f));
      gpu::DeviceBuffer<float> part(mine.extent, gpu::current_stream());
      comm.scatter(std::span<const float>(s.span()), part.span(), 3);
      scattered[ur] = on_host(part);
    }
    {
      // Rank r sends q + 1 elements to rank q, each valued 100 r + q.
      std::vector<std::size_t> send_counts(p), recv_counts(p);
      std::vector<float> send;
      for (int q = 0; q < p; ++q) {
        send_counts[std::size_t(q)] = std::size_t(q) + 1;
        recv_counts[std::size_t(q)] = ur + 1;
        send.insert(send.end(), std::size_t(q) + 1, float(100 * r + q));
      }
      auto s = on_device(send);
      gpu::DeviceBuffer<float> out(p * (ur + 1), gpu::current_stream());
      comm.all_to_all_v(std::span<const float>(s.span()), std::span<const std::size_t>(send_counts), out.span(),
                        std::span<const std::size_t>(recv_counts));
      alltoall[ur] = on_host(out);
    }
    {
      // A ring of posted sends and receives, issued as one group at the first wait: no rank waits for another.
      auto s = on_device(contribution(r, 3));
      gpu::DeviceBuffer<float> from_left(3, gpu::current_stream());
      auto rq = comm.irecv(from_left.span(), (r + p - 1) % p, 0);
      auto sq = comm.isend(std::span<const float>(s.span()), (r + 1) % p, 0);
      rq.wait();
      sq.wait();
      ring[ur] = on_host(from_left);
    }
    comm.barrier();
  }));

  for (int r = 0; r < p; ++r) {
    const auto ur = std::size_t(r);
    INFO("rank " << r);
    for (std::size_t i = 0; i < n; ++i) {
      const float total = float(0 + 1 + 2 + 3) + 4 * 0.25f * float(i);
      CHECK(sum[ur][i] == total);
      CHECK(avg[ur][i] == total / 4);
      std::int64_t m = -100;
      for (int q = 0; q < p; ++q) m = std::max<std::int64_t>(m, std::int64_t((q * 7 + int(i) * 3) % 11) - 5);
      CHECK(maxed[ur][i] == m);
      float b = 0;  // rank order, rounded to bf16 after each addition
      for (int q = 0; q < p; ++q) b = float(bf16(b + float(bf16(float(q) + 0.5f * float(i)))));
      CHECK(float(bf16_sum[ur][i]) == b);
      CHECK(bcast[ur][i] == 2 + 0.25f * float(i));
    }
    const Block mine = block_of(n, p, ur);
    for (std::size_t i = 0; i < n; ++i) {
      std::size_t owner = 0;
      while (block_of(n, p, owner).offset + block_of(n, p, owner).extent <= i) ++owner;
      CHECK(gathered[ur][i] == float(owner) + 0.25f * float(i - block_of(n, p, owner).offset));
    }
    for (std::size_t i = 0; i < mine.extent; ++i) {
      CHECK(scattered_sum[ur][i] == float(6) + 0.25f * 4 * float(mine.offset + i));
      CHECK(scattered[ur][i] == 3 + 0.25f * float(mine.offset + i));
    }
    for (int q = 0; q < p; ++q)
      for (std::size_t j = 0; j < ur + 1; ++j) CHECK(alltoall[ur][std::size_t(q) * (ur + 1) + j] == float(100 * q + r));
    for (std::size_t i = 0; i < 3; ++i) CHECK(ring[ur][i] == float((r + p - 1) % p) + 0.25f * float(i));
  }
  REQUIRE(reduced[1].size() == n);
  REQUIRE(gather_root[0] == gathered[0]);
  for (std::size_t i = 0; i < n; ++i) CHECK(reduced[1][i] == float(6) + 0.25f * 4 * float(i));
}

TEST_CASE("NcclCommunicator on the emulated NCCL: split into rows and columns of a 2 x 2 mesh", "[cuda][comm][nccl]") {
  std::vector<float> row_sum(4), col_sum(4);
  std::vector<int> row_rank(4), col_rank(4);
  require_all_finished(on_nccl_ranks(4, [&](NcclCommunicator& world) {
    const int r = world.rank();
    NcclCommunicator row = world.split(r / 2, r);
    NcclCommunicator col = world.split(r % 2, -r);  // keys in reverse: rank order inside the column reversed
    auto x = on_device(std::vector<float>{float(1 << r)});
    row.all_reduce(x.span(), ReduceOp::sum);
    row_sum[std::size_t(r)] = on_host(x)[0];
    auto y = on_device(std::vector<float>{float(1 << r)});
    col.all_reduce(y.span(), ReduceOp::sum);
    col_sum[std::size_t(r)] = on_host(y)[0];
    row_rank[std::size_t(r)] = row.rank();
    col_rank[std::size_t(r)] = col.rank();
  }));
  CHECK(row_sum == std::vector<float>{3, 3, 12, 12});
  CHECK(col_sum == std::vector<float>{5, 10, 5, 10});
  CHECK(row_rank == std::vector<int>{0, 1, 0, 1});
  CHECK(col_rank == std::vector<int>{1, 1, 0, 0});
}

TEST_CASE("NcclCommunicator on the emulated NCCL: what a GPU would hang on or corrupt throws on every rank",
          "[cuda][comm][nccl]") {
  SECTION("ranks calling collectives of different sizes") {
    const auto errors = on_nccl_ranks(2, [](NcclCommunicator& comm) {
      auto x = on_device(std::vector<float>(comm.rank() == 0 ? 8 : 4, 1.0f));
      comm.all_reduce(x.span(), ReduceOp::sum);
      CudaBackend::synchronize();
    });
    for (const auto& e : errors) {
      INFO(e);
      CHECK_THAT(e, Catch::Contains("all_reduce #1") && Catch::Contains("ncclAllReduce of 8 float32") &&
                        Catch::Contains("ncclAllReduce of 4 float32") && Catch::Contains("same sizes"));
    }
  }
  SECTION("host memory handed to NCCL") {
    const auto errors = on_nccl_ranks(2, [](NcclCommunicator& comm) {
      std::vector<float> host(4, 1.0f);
      comm.all_reduce(std::span<float>(host), ReduceOp::sum);
    });
    for (const auto& e : errors) {
      INFO(e);
      CHECK_THAT(e, Catch::Contains("all_reduce") && Catch::Contains("rank 0's ncclAllReduce of 4 float32") &&
                        Catch::Contains("is not device memory"));
    }
  }
  SECTION("two ranks of one communicator on one device") {
    const auto errors = on_nccl_ranks(
        2, [](NcclCommunicator&) {}, [](int) { return 0; });
    for (const auto& e : errors) {
      INFO(e);
      CHECK_THAT(e, Catch::Contains("Duplicate GPU detected") && Catch::Contains("device 0"));
    }
  }
  SECTION("a rank that leaves: its peer's collective fails at once, naming it") {
    const auto errors = on_nccl_ranks(2, [](NcclCommunicator& comm) {
      if (comm.rank() == 1) throw std::runtime_error("rank 1 gave up before its first collective");
      auto x = on_device(std::vector<float>(4, 1.0f));
      comm.all_reduce(x.span(), ReduceOp::sum);
    });
    CHECK_THAT(errors[0], Catch::Contains("rank 0 of group 'world'") && Catch::Contains("all_reduce #1") &&
                              Catch::Contains("rank 1 destroyed its communicator first"));
    CHECK(errors[1] == "rank 1 gave up before its first collective");
  }
  SECTION("a receive that meets a send of another size") {
    const auto errors = on_nccl_ranks(2, [](NcclCommunicator& comm) {
      auto x = on_device(std::vector<float>(comm.rank() == 0 ? 5 : 6, 1.0f));
      if (comm.rank() == 0)
        comm.send(std::span<const float>(x.span()), 1, 0);
      else
        comm.recv(x.span(), 0, 0);
      CudaBackend::synchronize();
    });
    // The send is eager, so rank 0 may finish before rank 1 fails; if its watchdog sees rank 1's abort first, its
    // send's wait fails naming it. Either is right: what must not happen is a hang or silent success on rank 1.
    if (!errors[0].empty())
      CHECK_THAT(errors[0], Catch::Contains("aborted") && Catch::Contains("rank 1 called ncclCommAbort"));
    CHECK_THAT(errors[1], Catch::Contains("ncclRecv of 6 float32 from rank 0 met rank 0's send of 5 float32"));
  }
}

}  // namespace mpar::nccl_emulation_test
