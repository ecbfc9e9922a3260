// Communication ordered with the compute stream (comm/stream_ordered_communicator.hpp): tensor-parallel layers over
// the stream-emulating backend, whose collectives run on a communication stream after the producing
// operations and before the consuming ones, reproduce the host backend bit for bit — with no host
// synchronisation between a layer's GEMM, its all-reduce and its bias addition.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <mpar/backend/stream/stream_backend.hpp>
#include <mpar/comm/stream_ordered_communicator.hpp>
#include <mpar/comm/threads.hpp>
#include <mpar/core/init.hpp>
#include <mpar/nn/column_parallel.hpp>
#include <mpar/nn/row_parallel.hpp>

#include "support/rank_checks.hpp"

using namespace mpar;

namespace {

struct RankResult {
  std::vector<float> y, dx, col_w, col_b, row_w, row_b;
};

std::vector<float> to_vector(std::span<const float> s) { return {s.begin(), s.end()}; }

/** A column-parallel then row-parallel MLP (no nonlinearity: the collectives are what is tested), forward and backward. */
template <class B, class Comm>
RankResult column_then_row(Comm& tp) {
  constexpr std::size_t tokens = 5, in = 6, hidden = 8, out = 7;
  using Col = nn::ColumnParallel<Comm, dyn, dyn, dyn, nn::ColumnOptions{}, B>;
  using Row = nn::RowParallel<Comm, dyn, dyn, dyn, nn::RowReduce::all_reduce, B>;
  Col col(tp, in, hidden, {.seed = 11, .id_base = 0, .name = "fc1", .bias = true});
  Row row(tp, hidden, out, {.seed = 11, .id_base = 2, .name = "fc2", .bias = true});
  nn::Activation x({tokens, in}), dy({tokens, out});
  init_shard(x.view(), {tokens, in}, Box<2>{Block{0, tokens}, Block{0, in}}, 5, 100, InitSpec::normal(1.0));
  init_shard(dy.view(), {tokens, out}, Box<2>{Block{0, tokens}, Block{0, out}}, 5, 101, InitSpec::normal(1.0));

  // Each layer's entry copies its input on the host (Act from a const Activation&), a host read of
  // rank memory: hence a synchronisation between layers. Inside a layer — GEMM, all-reduce, bias —
  // nothing waits on the host.
  nn::Act<nn::FeatureShard> h = col.forward(nn::Act<Replicate>(x));
  B::synchronize();
  nn::Act<Replicate> y = row.forward(h);
  B::synchronize();
  nn::Act<nn::FeatureShard> dh = row.backward(nn::Act<Replicate>(dy));
  B::synchronize();
  nn::Act<Replicate> dx = col.backward(dh);
  B::synchronize();
  return {to_vector(y.tensor().span()), to_vector(dx.tensor().span()), to_vector(col.weight().grad),
          to_vector(col.bias().grad),   to_vector(row.weight().grad),  to_vector(row.bias().grad)};
}

template <class B, class Wrap>
std::vector<RankResult> run_two_ranks(Wrap wrap) {
  std::vector<RankResult> results(2);
  run_threads(2, [&](ThreadsCommunicator& world) {
    B::init_rank();
    auto tp = wrap(world);
    results[std::size_t(world.rank())] = column_then_row<B>(tp);
    B::synchronize();
  });
  return results;
}

}  // namespace

TEST_CASE("StreamOrderedCommunicator: ColumnParallel + RowParallel over StreamHostBackend equal HostBackend exactly",
          "[backend][stream][comm]") {
  const auto want = run_two_ranks<HostBackend>([](ThreadsCommunicator& w) { return w; });
  const auto got = run_two_ranks<StreamHostBackend>(
      [](ThreadsCommunicator& w) { return StreamOrderedCommunicator<ThreadsCommunicator, StreamHostBackend>(w); });
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(got[r].y == want[r].y);
    CHECK(got[r].dx == want[r].dx);
    CHECK(got[r].col_w == want[r].col_w);
    CHECK(got[r].col_b == want[r].col_b);
    CHECK(got[r].row_w == want[r].row_w);
    CHECK(got[r].row_b == want[r].row_b);
    CHECK(!want[r].y.empty());
  }
  // The two ranks hold different weight shards but the same (replicated) output.
  CHECK(got[0].y == got[1].y);
  CHECK(got[0].col_w != got[1].col_w);
}

TEST_CASE(
    "StreamOrderedCommunicator: a collective runs after the producing operation and before the consumer, "
    "without a host wait; i* requests order the compute stream",
    "[backend][stream][comm]") {
  using B = StreamHostBackend;
  using SC = StreamOrderedCommunicator<ThreadsCommunicator, B>;
  static_assert(communicator<SC>);
  const std::size_t n = 300;
  std::vector<std::vector<float>> summed(2), gathered(2);
  run_threads(2, [&](ThreadsCommunicator& world) {
    B::init_rank();
    SC comm(world);
    const int r = comm.rank();
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = float(r + 1) * (0.5f + float(i));
    Buffer<float> x = B::allocate<float>(n), g = B::allocate<float>(2 * n);
    B::copy_from_host_async<float>(n, v.data(), x.data());
    B::run(ops::scale{.n = n, .factor = 2.0f, .x = x.data()});  // producer: the all-reduce must see 2v
    comm.all_reduce(std::span<float>(x), ReduceOp::sum);        // returns at once
    B::run(ops::scale{.n = n, .factor = 0.5f, .x = x.data()});  // consumer: runs after the all-reduce
    auto req = comm.iall_gather(std::span<const float>(x), std::span<float>(g));
    req.wait();  // orders the compute stream, does not block the host
    B::run(ops::scale{.n = 2 * n, .factor = 2.0f, .x = g.data()});
    summed[std::size_t(r)].resize(n);
    gathered[std::size_t(r)].resize(2 * n);
    B::copy_to_host_async<float>(n, x.data(), summed[std::size_t(r)].data());
    B::copy_to_host_async<float>(2 * n, g.data(), gathered[std::size_t(r)].data());
    B::synchronize();
  });
  for (std::size_t r = 0; r < 2; ++r) {
    for (std::size_t i = 0; i < n; ++i) {
      const float sum = (0.5f + float(i)) * 3.0f;  // 1 v + 2 v over the two ranks, doubled then halved
      REQUIRE(summed[r][i] == sum);
      REQUIRE(gathered[r][i] == 2.0f * sum);
      REQUIRE(gathered[r][n + i] == 2.0f * sum);
    }
  }
}

TEST_CASE("StreamOrderedCommunicator: a failing collective is reported at the compute stream's synchronisation",
          "[backend][stream][comm]") {
  using B = StreamHostBackend;
  std::vector<std::string> messages(2);
  run_threads(2, [&](ThreadsCommunicator& world) {
    B::init_rank();
    StreamOrderedCommunicator<ThreadsCommunicator, B> comm(world);
    const int r = comm.rank();
    Buffer<float> x = B::allocate<float>(4 + std::size_t(r));  // mismatched counts: an error on every rank
    comm.all_reduce(std::span<float>(x), ReduceOp::sum);
    try {
      B::synchronize();
    } catch (const std::exception& e) {
      messages[std::size_t(r)] = e.what();
    }
  });
  for (const auto& m : messages) CHECK_THAT(m, Catch::Contains("all_reduce") && Catch::Contains("communication"));
}
