// Adaptors over any communicator, tested on threads: the hierarchical all-reduce against the flat
// one, and top-k compression with error feedback against the dense sum.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "comm/collective_tests.hpp"
#include "mpar/comm/hierarchical.hpp"
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
  CHECK_THROWS_WITH(run_threads(6,
                                [](ThreadsCommunicator& c) {
                                  (void)HierarchicalAllReduce<ThreadsCommunicator>::from_world(c, 4);
                                }),
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
        for (std::size_t i = 0; i < n; ++i) e2 += (applied[i] - dense[i]) * (applied[i] - dense[i]), s2 += dense[i] * dense[i];
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
