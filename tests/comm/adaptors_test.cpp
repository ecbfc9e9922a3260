// Adaptors over any communicator, tested on threads: the hierarchical all-reduce against the flat
// one, top-k compression with error feedback against the dense sum, and NCCL's point-to-point
// semantics (OrderedP2pCommunicator).
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <vector>

#include "comm/collective_tests.hpp"
#include "mpar/comm/hierarchical.hpp"
#include "mpar/comm/ordered_p2p_communicator.hpp"
#include "mpar/comm/threads.hpp"
#include "mpar/comm/topk.hpp"

using namespace mpar;

namespace {

/** A deterministic pseudo-random value in [-1, 1) for (step, rank, index). */
double noise(std::uint64_t step, std::uint64_t rank, std::uint64_t i) {
  std::uint64_t x = (step * 0x9E3779B97F4A7C15ull) ^ (rank * 0xBF58476D1CE4E5B9ull) ^ (i * 0x94D049BB133111EBull);
  x ^= x >> 31;
  x *= 0xD6E9F8CC1B4E2A5Bull;
  x ^= x >> 29;
  return double(x >> 11) / double(1ull << 52) - 1.0;
}

template <class T>
void hierarchical_matches_flat(int world_size, int per_node) {
  std::vector<test::Checker> ck(static_cast<std::size_t>(world_size));
  run_threads(world_size, [&](ThreadsCommunicator& c) {
    auto& chk = ck[std::size_t(c.rank())];
    auto h = HierarchicalAllReduce<ThreadsCommunicator>::from_world(c, per_node);
    chk.expect(h.size() == c.size() && h.rank() == c.rank(), "hierarchical rank ", h.rank(), " of ", h.size());
    chk.expect(h.local().name() == "node" && h.local().size() == per_node, "node group");
    int salt = 0;
    for (std::size_t n : test::test_counts(world_size))
      for (ReduceOp op : test::all_ops) {
        ++salt;
        std::vector<T> x(n);
        for (std::size_t i = 0; i < n; ++i) x[i] = test::value<T>(c.rank(), i, salt);
        h.all_reduce(std::span<T>(x), op);
        for (std::size_t i = 0; i < n; ++i)
          chk.expect(test::close(x[i], test::reference<T>(world_size, i, op, salt)),
                     test::where<T>("hierarchical all_reduce", c.rank(), world_size, n, i), " op ", reduce_op_name(op),
                     ": got ", float(x[i]), ", want ", float(test::reference<T>(world_size, i, op, salt)));
      }
  });
  for (auto& k : ck)
    for (auto& m : k.failures) FAIL_CHECK(m);
}

}  // namespace

TEST_CASE("HierarchicalAllReduce equals the flat all-reduce on threads split into nodes", "[comm][adaptors]") {
  hierarchical_matches_flat<float>(4, 2);
  hierarchical_matches_flat<double>(8, 4);
  hierarchical_matches_flat<float>(8, 2);
  hierarchical_matches_flat<bf16>(6, 3);
  hierarchical_matches_flat<f16>(4, 1);
  CHECK_THROWS_WITH(
      run_threads(6,
                  [](ThreadsCommunicator& c) { (void)HierarchicalAllReduce<ThreadsCommunicator>::from_world(c, 4); }),
      Catch::Matchers::Contains("6 ranks do not split into nodes of 4"));
}

TEST_CASE("TopKCompressor: with error feedback the applied updates converge to the dense sum", "[comm][adaptors]") {
  constexpr int ranks = 4, steps = 400;
  constexpr std::size_t n = 2000;
  constexpr double density = 0.02;
  std::vector<double> rel_err_at(steps + 1, 0.0), invariant_err(ranks, 0.0), ratio(ranks, 0.0);
  std::vector<std::size_t> ks(ranks);
  run_threads(ranks, [&](ThreadsCommunicator& c) {
    TopKCompressor<ThreadsCommunicator> topk(c, n, density);
    std::vector<double> dense(n, 0.0), applied(n, 0.0);
    std::vector<float> g(n);
    for (int t = 1; t <= steps; ++t) {
      // a per-element mean (the signal an optimizer follows) plus per-rank noise
      std::vector<double> gd(n);
      for (std::size_t i = 0; i < n; ++i) {
        g[i] = float(0.5 * noise(0, 99, i) + noise(std::uint64_t(t), std::uint64_t(c.rank()), i));
        gd[i] = double(g[i]);
      }
      c.all_reduce(std::span<double>(gd), ReduceOp::sum);
      for (std::size_t i = 0; i < n; ++i) dense[i] += gd[i];
      const TopKStats st = topk.all_reduce(std::span<float>(g));
      for (std::size_t i = 0; i < n; ++i) applied[i] += double(g[i]);
      if (c.rank() == 0) {
        double e2 = 0, s2 = 0;
        for (std::size_t i = 0; i < n; ++i)
          e2 += (applied[i] - dense[i]) * (applied[i] - dense[i]), s2 += dense[i] * dense[i];
        rel_err_at[std::size_t(t)] = std::sqrt(e2 / s2);
        ratio[0] = st.compression_ratio;
      }
    }
    // Nothing is lost: applied + every rank's residual == dense sum (up to float rounding of updates).
    std::vector<double> res(topk.residual().begin(), topk.residual().end());
    c.all_reduce(std::span<double>(res), ReduceOp::sum);
    double worst = 0;
    for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(applied[i] + res[i] - dense[i]));
    invariant_err[std::size_t(c.rank())] = worst;
    ks[std::size_t(c.rank())] = topk.k();
  });
  CHECK(ks[0] == 40);
  CHECK(ratio[0] == Approx(2000.0 * 4 / (40 * 16)));  // 12.5x fewer bytes per rank
  for (double e : invariant_err) CHECK(e < 1e-3);
  // The relative error shrinks as steps accumulate, and is small at the end.
  INFO("relative error after 50 / 200 / 400 steps: " << rel_err_at[50] << " / " << rel_err_at[200] << " / "
                                                     << rel_err_at[400]);
  CHECK(rel_err_at[400] < 0.05);
  CHECK(rel_err_at[400] < rel_err_at[50]);
}

TEST_CASE("OrderedP2pCommunicator: messages pair in issue order, tags ignored, a group completes as a whole",
          "[comm][adaptors][nccl-semantics]") {
  using Nccl = OrderedP2pCommunicator<ThreadsCommunicator>;
  static_assert(mpar::detail::ordered_point_to_point<Nccl> &&
                !mpar::detail::ordered_point_to_point<ThreadsCommunicator>);
  // Catch's assertions are not thread-safe: each rank records, the main thread checks.
  std::vector<std::vector<float>> got(2);
  std::vector<std::vector<bool>> done(2);
  run_threads(2, [&](ThreadsCommunicator& world) {
    Nccl c(world);
    const int peer = 1 - c.rank();
    Buffer<float> a(3, float(10 * c.rank() + 1)), b(2, float(10 * c.rank() + 2)), ra(3, 0.0f), rb(2, 0.0f);
    // One group each way, a ring: both ranks send before they receive. The tags disagree on
    // purpose; NCCL has none, so the first send meets the first receive.
    auto s1 = c.isend(std::span<const float>(a), peer, 7);
    auto s2 = c.isend(std::span<const float>(b), peer, 8);
    auto r1 = c.irecv(std::span<float>(ra), peer, 99);
    auto r2 = c.irecv(std::span<float>(rb), peer, 98);
    r1.wait();  // waits for the whole group: the other three are done too
    std::vector<bool> finished{s1.test(), s2.test(), r2.test()};
    // A collective runs after the posted group.
    Buffer<float> posted(1, float(c.rank()));
    auto late = c.isend(std::span<const float>(posted), peer, 0);
    Buffer<float> arrived(1, -1.0f);
    auto late_recv = c.irecv(std::span<float>(arrived), peer, 0);
    Buffer<float> sum(1, 1.0f);
    c.all_reduce(std::span<float>(sum), ReduceOp::sum);
    finished.push_back(late_recv.test());
    late.wait();
    got[std::size_t(c.rank())] = {ra[0], rb[0], arrived[0], sum[0]};
    done[std::size_t(c.rank())] = finished;
  });
  for (const auto& f : done) CHECK(f == std::vector<bool>{true, true, true, true});
  CHECK(got[0] == std::vector<float>{11, 12, 1, 2});
  CHECK(got[1] == std::vector<float>{1, 2, 0, 2});
}

TEST_CASE("OrderedP2pCommunicator: crossed blocking sends are a rendezvous deadlock, reported as an error",
          "[comm][adaptors][nccl-semantics]") {
  ThreadsOptions quick;
  quick.timeout = std::chrono::milliseconds(300);
  // Both ranks send before they receive, each send its own group: on NCCL neither send completes.
  // The threads communicator under it buffers sends, so only the rendezvous makes this fail, as it must.
  CHECK_THROWS_WITH(run_threads(2, quick,
                                [](ThreadsCommunicator& world) {
                                  OrderedP2pCommunicator<ThreadsCommunicator> c(world);
                                  Buffer<float> x(4, 1.0f), y(4, 0.0f);
                                  c.send(std::span<const float>(x), 1 - c.rank(), 0);
                                  c.recv(std::span<float>(y), 1 - c.rank(), 0);
                                }),
                    Catch::Contains("timed out after 0.3 s"));
  // The same exchange as one group completes.
  std::vector<float> last(2, 0.0f);
  run_threads(2, quick, [&](ThreadsCommunicator& world) {
    OrderedP2pCommunicator<ThreadsCommunicator> c(world);
    Buffer<float> x(4, 1.0f), y(4, 0.0f);
    auto s = c.isend(std::span<const float>(x), 1 - c.rank(), 0);
    c.irecv(std::span<float>(y), 1 - c.rank(), 0).wait();
    s.wait();
    last[std::size_t(c.rank())] = y[3];
  });
  CHECK(last == std::vector<float>{1.0f, 1.0f});
}
