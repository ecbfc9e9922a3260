// MpiCommunicator: the generic collective tests of collective_tests.hpp on every group size the
// job allows (sub-communicators of 1..N ranks), run under mpirun by CTest (label mpi).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "comm/collective_tests.hpp"
#include "mpar/backend/stream/stream_backend.hpp"
#include "mpar/comm/mpi.hpp"
#include "mpar/comm/stream_ordered_communicator.hpp"

using namespace mpar;
using Catch::Matchers::Contains;

namespace {

MpiCommunicator& world() {
  static MpiCommunicator w;
  return w;
}

/** Every rank checks its own failures: each process is single-threaded, so Catch is safe here. */
void require_clean(const test::Checker& ck) {
  for (auto& m : ck.failures) UNSCOPED_INFO(m);
  CHECK(ck.failures.empty());
}

}  // namespace

TEST_CASE("mpi: every collective matches the serial reference on every group size", "[comm][mpi]") {
  for (int n = 1; n <= world().size(); ++n) {
    INFO("ranks " << n);
    auto sub = world().split(world().rank() < n ? 0 : 1, world().rank());
    test::Checker ck;
    if (world().rank() < n) test::check_everything(sub, ck);
    require_clean(ck);
    world().barrier();
  }
}

TEST_CASE("mpi: make_mesh_comms", "[comm][mpi]") {
  if (world().size() != 4) return;
  test::Checker ck;
  test::check_mesh_comms(world(), ck, 2, 2, 1);
  test::check_mesh_comms(world(), ck, 1, 2, 2);
  require_clean(ck);
}

TEST_CASE("mpi: with checking on, mismatched calls fail on every rank and the group stays usable", "[comm][mpi]") {
  auto c = world().split(0, world().rank(), "checked");
  c.set_checking(true);
  std::vector<float> v(c.rank() == 1 ? 5 : 4, 1.0f);
  std::string msg;
  try {
    c.all_reduce(std::span<float>(v), ReduceOp::sum);
  } catch (const comm_error& e) {
    msg = e.what();
  }
  if (c.size() > 1) {
    CHECK_THAT(msg, Contains("all_reduce #1 on group checked: ranks called different collectives"));
    CHECK_THAT(msg, Contains("rank 1 all_reduce(f32, count=5, op=sum) #1"));
  }
  std::vector<float> send(
      c.rank() == 0 && c.size() > 1 ? 3 : mpar::block_of(16, std::size_t(c.size()), std::size_t(c.rank())).extent),
      recv(16);
  msg.clear();
  try {
    c.all_gather(send, std::span<float>(recv));
  } catch (const comm_error& e) {
    msg = e.what();
  }
  if (c.size() > 1) CHECK_THAT(msg, Contains("all_gather #2 on group checked: rank 0 passed send of 3 elements"));
  std::vector<float> w(3, 1.0f);
  c.all_reduce(std::span<float>(w), ReduceOp::sum);
  CHECK(w[0] == float(c.size()));
}

TEST_CASE("mpi: integer types are told apart on every rank with checking on, and avg of integers is refused",
          "[comm][mpi]") {
  auto c = world().split(0, world().rank(), "typed");
  c.set_checking(true);
  std::string msg;
  try {
    if (c.rank() == 0) {
      std::vector<std::int64_t> v(4, (std::int64_t(1) << 60) + 1);
      c.all_reduce(std::span<std::int64_t>(v), ReduceOp::sum);
    } else {
      std::vector<float> v(4, 1.0f);
      c.all_reduce(std::span<float>(v), ReduceOp::sum);
    }
  } catch (const comm_error& e) {
    msg = e.what();
  }
  if (c.size() > 1)
    CHECK_THAT(msg, Contains("all_reduce #1 on group typed: ranks called different collectives: rank 0 "
                             "all_reduce(i64, count=4, op=sum) #1; rank 1 all_reduce(f32, count=4, op=sum) #1"));
  msg.clear();
  try {
    std::vector<std::uint32_t> v(3, 7u);
    c.all_reduce(std::span<std::uint32_t>(v), ReduceOp::avg);
  } catch (const comm_error& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, Contains("all_reduce #2 on group typed: rank " + std::to_string(c.rank()) +
                           " passed op=avg over u32 elements"));
  // Still usable, and exact above 2^53.
  std::vector<std::int64_t> w(2, (std::int64_t(1) << 55) + 1);
  c.all_reduce(std::span<std::int64_t>(w), ReduceOp::sum);
  CHECK(w[1] == std::int64_t(c.size()) * ((std::int64_t(1) << 55) + 1));
}

TEST_CASE(
    "mpi: ordered with a stream backend's compute stream, a collective runs after its producer and before "
    "its consumer",
    "[comm][mpi][stream]") {
  using B = StreamHostBackend;
  static_assert(communicator<StreamOrderedCommunicator<MpiCommunicator, B>>);
  B::init_rank();
  {
    StreamOrderedCommunicator<MpiCommunicator, B> comm(world());
    const std::size_t n = 100;
    const int r = comm.rank(), p = comm.size();
    std::vector<float> v(n), out(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = float(r + 1) * float(i + 1);
    Buffer<float> x = B::allocate<float>(n);
    B::copy_from_host_async<float>(n, v.data(), x.data());
    B::run(ops::scale{.n = n, .factor = 2.0f, .x = x.data()});
    comm.all_reduce(std::span<float>(x), ReduceOp::sum);
    B::run(ops::scale{.n = n, .factor = 0.5f, .x = x.data()});
    B::copy_to_host_async<float>(n, x.data(), out.data());
    B::synchronize();
    const float ranks_sum = float(p * (p + 1) / 2);
    bool ok = true;
    for (std::size_t i = 0; i < n; ++i) ok = ok && out[i] == ranks_sum * float(i + 1);
    CHECK(ok);
    comm.barrier();
  }
  set_current_memory_resource(detail::host_memory_resource());
}

int main(int argc, char** argv) {
  MpiEnvironment env(&argc, &argv);
  int rc = 0;
  run_mpi([&](MpiCommunicator&) { rc = Catch::Session().run(argc, argv); });
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}
