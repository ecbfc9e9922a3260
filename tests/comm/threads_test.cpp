// ThreadsCommunicator: the generic collective tests for 1-8 ranks, plus the failure semantics
// (a rank throwing, mismatched calls, missing peers, timeouts) that only threads can test in-process.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <latch>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/collective_tests.hpp"
#include "mpar/comm/same_on_every_rank.hpp"
#include "mpar/comm/threads.hpp"

using namespace mpar;
using Catch::Matchers::Contains;
using std::chrono::duration;

namespace {

ThreadsOptions with_timeout(double seconds) {
  ThreadsOptions o;
  o.timeout = duration<double>(seconds);
  return o;
}

/** Runs `f(comm, checker)` on n threads and checks the collected failures on this thread. */
template <class F>
void on_threads(int n, F&& f, const ThreadsOptions& opts = {}) {
  std::vector<test::Checker> ck(static_cast<std::size_t>(n));
  run_threads(n, opts, [&](ThreadsCommunicator& c) { f(c, ck[std::size_t(c.rank())]); });
  std::size_t failures = 0;
  for (int r = 0; r < n; ++r)
    for (auto& msg : ck[std::size_t(r)].failures) {
      ++failures;
      UNSCOPED_INFO(msg);
    }
  CHECK(failures == 0);
}

/** Runs `f` on n ranks; returns each rank's comm_error message (empty where none was thrown). */
template <class F>
std::vector<std::string> errors_on_every_rank(int n, F&& f, const ThreadsOptions& opts = {}) {
  std::vector<std::string> msg(static_cast<std::size_t>(n));
  try {
    run_threads(n, opts, [&](ThreadsCommunicator& c) {
      try {
        f(c);
      } catch (const comm_error& e) {
        msg[std::size_t(c.rank())] = e.what();
        throw;  // poisons the run, as an uncaught error would
      }
    });
  } catch (const rank_failure&) {}
  return msg;
}

}  // namespace

TEST_CASE("threads: every collective matches the serial reference on 1-4 ranks", "[comm]") {
  for (int n = 1; n <= 4; ++n) {
    INFO("ranks " << n);
    on_threads(n, [](ThreadsCommunicator& c, test::Checker& ck) { test::check_everything(c, ck); });
  }
}

TEST_CASE("threads: every collective matches the serial reference on 5-8 ranks", "[comm]") {
  for (int n = 5; n <= 8; ++n) {
    INFO("ranks " << n);
    on_threads(n, [](ThreadsCommunicator& c, test::Checker& ck) { test::check_everything(c, ck); });
  }
}

TEST_CASE("threads: make_mesh_comms builds the tensor, pipeline, data and expert groups", "[comm]") {
  on_threads(8, [](ThreadsCommunicator& c, test::Checker& ck) { test::check_mesh_comms(c, ck, 2, 2, 2); });
  on_threads(6, [](ThreadsCommunicator& c, test::Checker& ck) { test::check_mesh_comms(c, ck, 3, 1, 2); });
  run_threads(4, [](ThreadsCommunicator& c) {
    auto mc = make_mesh_comms(c, DeviceMesh<2, 2, 1>{});
    if (mc.tensor.name() != "tensor" || mc.pipeline.name() != "pipeline" || mc.data.name() != "data")
      throw std::logic_error("axis groups are not named after their axes: " + mc.tensor.name());
  });
  CHECK_THROWS_WITH(run_threads(3, [](ThreadsCommunicator& c) { (void)make_mesh_comms(c, DeviceMesh<2, 2, 1>{}); }),
                    Contains("has 3 ranks but DeviceMesh(tensor=2, expert=1, data=1, pipeline=2) needs 4"));
}

TEST_CASE("threads: split names groups and orders by key", "[comm]") {
  run_threads(4, [](ThreadsCommunicator& c) {
    auto tp = c.split(c.rank() / 2, c.rank(), "tensor");
    auto other = c.split(c.rank() % 2, 0);
    if (tp.name() != "tensor" || other.name() != "world." + std::to_string(c.rank() % 2) || tp.world_rank() != c.rank())
      throw std::logic_error("unexpected group names " + tp.name() + ", " + other.name());
    // equal keys keep the parent order
    if (other.rank() != c.rank() / 2) throw std::logic_error("equal keys must keep parent order");
  });
}

TEST_CASE("threads: a single-rank communicator works without threads", "[comm]") {
  auto c = ThreadsCommunicator::single();
  test::Checker ck;
  test::check_everything(c, ck);
  CHECK(ck.failures.empty());
  CHECK(c.size() == 1);
}

TEST_CASE("threads: asynchronous collectives overlap with the caller", "[comm]") {
  // Rank 1 is held back until rank 0 has issued its all_reduce and looked at it: issuing must not
  // wait for the peer (else this deadlocks, and CTest's timeout fails the test), and the collective
  // cannot be complete while the peer has not arrived.
  std::latch issued(1);
  std::vector<int> pending_before_peer(2, -1);
  std::vector<float> result(2);
  run_threads(2, [&](ThreadsCommunicator& c) {
    std::vector<float> x(1 << 16, float(c.rank() + 1));
    if (c.rank() == 1) issued.wait();  // a late peer
    auto req = c.iall_reduce(std::span<float>(x), ReduceOp::sum);
    if (c.rank() == 0) {
      pending_before_peer[0] = req.test() ? 0 : 1;
      issued.count_down();
    }
    req.wait();
    result[std::size_t(c.rank())] = x[12345];
  });
  CHECK(pending_before_peer[0] == 1);  // rank 0 was free to compute while its all_reduce was in flight
  CHECK(result[0] == 3.0f);
  CHECK(result[1] == 3.0f);
}

TEST_CASE("threads: a rank that throws fails every rank's collective and run_threads rethrows it", "[comm][fault]") {
  std::vector<std::string> msg(4);
  try {
    run_threads(4, with_timeout(30), [&](ThreadsCommunicator& c) {
      std::vector<float> v(1000, 1.0f);
      c.all_reduce(std::span<float>(v), ReduceOp::sum);
      if (c.rank() == 2) throw std::runtime_error("boom");
      try {
        c.all_reduce(std::span<float>(v), ReduceOp::sum);
      } catch (const comm_error& e) {
        msg[std::size_t(c.rank())] = e.what();
        throw;
      }
    });
    FAIL("run_threads did not throw");
  } catch (const rank_failure& e) {
    CHECK(e.rank() == 2);
    CHECK_THAT(e.what(), Contains("rank 2: boom"));
    CHECK_THROWS_WITH(e.rethrow_nested(), "boom");
  }
  // "aborted: rank 2 threw" (not "timed out") shows the peers were released by the failure itself.
  for (int r : {0, 1, 3})
    CHECK_THAT(msg[std::size_t(r)], Contains("all_reduce #2 on group world aborted: rank 2 threw: boom"));
}

TEST_CASE("threads: buffers of a failing rank are not read after it unwinds", "[comm][fault]") {
  // Each iteration allocates fresh buffers, so a peer still reading a failed rank's buffer would
  // touch freed memory (reported by the sanitizers); the run must end with rank 3's error.
  for (int round = 0; round < 3; ++round) {
    CHECK_THROWS_WITH(run_threads(4, with_timeout(30),
                                  [&](ThreadsCommunicator& c) {
                                    for (int it = 0; it < 40; ++it) {
                                      std::vector<float> v(std::size_t(1) << 15, 1.0f);
                                      if (c.rank() == 3 && it == 10 + round) throw std::runtime_error("late failure");
                                      c.all_reduce(std::span<float>(v), ReduceOp::sum);
                                      std::vector<float> part(v.size() / 4);
                                      c.reduce_scatter(v, std::span<float>(part), ReduceOp::sum);
                                    }
                                  }),
                      Contains("rank 3: late failure"));
  }
}

TEST_CASE("threads: mismatched counts, types, ops and roots fail on every rank", "[comm][fault]") {
  auto counts = errors_on_every_rank(3, [](ThreadsCommunicator& c) {
    std::vector<float> v(c.rank() == 1 ? 5 : 4, 1.0f);
    c.all_reduce(std::span<float>(v), ReduceOp::sum);
  });
  for (auto& m : counts) {
    CHECK_THAT(m, Contains("all_reduce #1 on group world: ranks called different collectives"));
    CHECK_THAT(m, Contains("rank 0 all_reduce(f32, count=4, op=sum) #1; rank 1 all_reduce(f32, count=5, op=sum) #1"));
  }
  auto types = errors_on_every_rank(2, [](ThreadsCommunicator& c) {
    if (c.rank() == 0) {
      std::vector<double> v(4);
      c.all_reduce(std::span<double>(v), ReduceOp::sum);
    } else {
      std::vector<bf16> v(4);
      c.all_reduce(std::span<bf16>(v), ReduceOp::sum);
    }
  });
  for (auto& m : types) CHECK_THAT(m, Contains("rank 1 all_reduce(bf16, count=4, op=sum) #1"));
  auto ops = errors_on_every_rank(3, [](ThreadsCommunicator& c) {
    std::vector<float> v(4);
    c.all_reduce(std::span<float>(v), c.rank() == 2 ? ReduceOp::max : ReduceOp::sum);
  });
  for (auto& m : ops) CHECK_THAT(m, Contains("rank 2 all_reduce(f32, count=4, op=max) #1"));
  auto roots = errors_on_every_rank(2, [](ThreadsCommunicator& c) {
    std::vector<float> v(4);
    c.broadcast(std::span<float>(v), c.rank());
  });
  for (auto& m : roots) CHECK_THAT(m, Contains("broadcast #1 on group world: ranks called different collectives"));
  auto kinds = errors_on_every_rank(2, [](ThreadsCommunicator& c) {
    std::vector<float> v(4);
    if (c.rank() == 0)
      c.barrier();
    else
      c.all_reduce(std::span<float>(v), ReduceOp::sum);
  });
  for (auto& m : kinds) CHECK_THAT(m, Contains("rank 0 barrier(-) #1; rank 1 all_reduce(f32, count=4, op=sum) #1"));
  auto blocks = errors_on_every_rank(4, [](ThreadsCommunicator& c) {
    std::vector<float> send(c.rank() == 1 ? 3 : 4), recv(16);
    c.all_gather(send, std::span<float>(recv));
  });
  for (auto& m : blocks)
    CHECK_THAT(
        m, Contains("all_gather #1 on group world: rank 1 passed send of 3 elements, expected block_of(16, 4, 1) = 4"));
  auto a2av = errors_on_every_rank(2, [](ThreadsCommunicator& c) {
    std::vector<float> send(4), recv(4);
    std::vector<std::size_t> sc{1, 1}, rc{1, std::size_t(c.rank() == 0 ? 2 : 1)};
    c.all_to_all_v(send, std::span<const std::size_t>(sc), std::span<float>(recv), std::span<const std::size_t>(rc));
  });
  for (auto& m : a2av) CHECK_THAT(m, Contains("rank 1 sends 1 elements to rank 0 but rank 0 expects 2"));
}

TEST_CASE("threads: integer elements move and reduce exactly on 2 and 3 ranks", "[comm]") {
  for (int n : {2, 3}) {
    INFO("ranks " << n);
    on_threads(n, [](ThreadsCommunicator& c, test::Checker& ck) { test::check_integers(c, ck); });
  }
}

TEST_CASE("threads: integer element types are told apart from each other and from floats, on every rank",
          "[comm][fault]") {
  // An int64 all_reduce on rank 0 against a float one: the same 4 elements, never reinterpreted.
  auto int_float = errors_on_every_rank(2, [](ThreadsCommunicator& c) {
    if (c.rank() == 0) {
      std::vector<std::int64_t> v(4, std::int64_t(1) << 60);
      c.all_reduce(std::span<std::int64_t>(v), ReduceOp::sum);
    } else {
      std::vector<float> v(4, 1.0f);
      c.all_reduce(std::span<float>(v), ReduceOp::sum);
    }
  });
  for (auto& m : int_float)
    CHECK_THAT(m, Contains("all_reduce #1 on group world: ranks called different collectives: rank 0 "
                           "all_reduce(i64, count=4, op=sum) #1; rank 1 all_reduce(f32, count=4, op=sum) #1"));
  // Same width, other signedness: int32 against uint32 in an all_gather of 3 ranks.
  auto sign = errors_on_every_rank(3, [](ThreadsCommunicator& c) {
    std::vector<std::int32_t> s(2, -1), r(6);
    std::vector<std::uint32_t> us(2), ur(6);
    if (c.rank() == 2)
      c.all_gather(std::span<const std::uint32_t>(us), std::span<std::uint32_t>(ur));
    else
      c.all_gather(std::span<const std::int32_t>(s), std::span<std::int32_t>(r));
  });
  for (auto& m : sign) CHECK_THAT(m, Contains("rank 2 all_gather(u32, count=6) #1"));
  // Point to point: the receiver names both types.
  auto p2p = errors_on_every_rank(2, [](ThreadsCommunicator& c) {
    if (c.rank() == 0) {
      std::vector<std::int64_t> v(3, -5);
      c.send(std::span<const std::int64_t>(v), 1, 4);
    } else {
      std::vector<std::uint64_t> v(3);
      c.recv(std::span<std::uint64_t>(v), 0, 4);
    }
  });
  CHECK(p2p[0].empty());
  CHECK_THAT(p2p[1], Contains("rank 1 expected 3 u64 from rank 0 with tag 4, but rank 0 sent 3 i64"));
}

TEST_CASE("threads: avg of integers is refused on every rank, naming the type and the fix", "[comm][fault]") {
  auto all_reduce = errors_on_every_rank(3, [](ThreadsCommunicator& c) {
    std::vector<std::int32_t> v(5, -3);
    c.all_reduce(std::span<std::int32_t>(v), ReduceOp::avg);
  });
  for (auto& m : all_reduce)
    CHECK_THAT(m, Contains("all_reduce #1 on group world: rank 0 passed op=avg over i32 elements") &&
                      Contains("reduce by sum and divide"));
  auto scatter = errors_on_every_rank(2, [](ThreadsCommunicator& c) {
    std::vector<std::uint64_t> s(4), r(2);
    c.reduce_scatter(std::span<const std::uint64_t>(s), std::span<std::uint64_t>(r), ReduceOp::avg);
  });
  for (auto& m : scatter) CHECK_THAT(m, Contains("reduce_scatter #1 on group world: rank 0 passed op=avg over u64"));
  auto reduce = errors_on_every_rank(2, [](ThreadsCommunicator& c) {
    std::vector<std::int64_t> s(4), r(c.rank() == 0 ? 4 : 0);
    c.reduce(std::span<const std::int64_t>(s), std::span<std::int64_t>(r), ReduceOp::avg, 0);
  });
  for (auto& m : reduce) CHECK_THAT(m, Contains("reduce #1 on group world: rank 0 passed op=avg over i64"));
}

TEST_CASE("threads: a group stays usable after a mismatch is reported", "[comm][fault]") {
  on_threads(3, [](ThreadsCommunicator& c, test::Checker& ck) {
    std::vector<float> v(c.rank() == 0 ? 2 : 3, 1.0f);
    bool threw = false;
    try {
      c.all_reduce(std::span<float>(v), ReduceOp::sum);
    } catch (const comm_error&) {
      threw = true;
    }
    ck.expect(threw, "the mismatch was not reported on rank ", c.rank());
    std::vector<float> w(3, 1.0f);
    c.all_reduce(std::span<float>(w), ReduceOp::sum);
    ck.expect(w[2] == 3.0f && c.seq() == 2, "all_reduce after a mismatch: ", w[2], " seq ", c.seq());
  });
}

TEST_CASE("threads: a peer that never arrives times out on every rank, naming the missing ranks", "[comm][fault]") {
  // Ranks 1 and 3 are held until both others have timed out, so the timeout is the only way out.
  std::latch timed_out(2);
  auto msg = errors_on_every_rank(
      4,
      [&](ThreadsCommunicator& c) {
        std::vector<float> v(8, 1.0f);
        if (c.rank() % 2 == 1) {
          timed_out.wait();
          c.all_reduce(std::span<float>(v), ReduceOp::sum);
          return;
        }
        try {
          c.all_reduce(std::span<float>(v), ReduceOp::sum);
        } catch (const comm_error&) {
          timed_out.count_down();
          throw;
        }
      },
      with_timeout(0.25));
  for (auto& m : msg)
    CHECK_THAT(m, Contains("all_reduce #1 on group world timed out after 0.25 s: ranks 1, 3 never arrived"));
  CHECK_THAT(msg[1], Contains("all_reduce #1 on group world aborted:"));
}

TEST_CASE("threads: timeouts in a sub-group name the group", "[comm][fault]") {
  std::latch timed_out(1);
  auto msg = errors_on_every_rank(
      4,
      [&](ThreadsCommunicator& c) {
        auto tp = c.split(c.rank() / 2, c.rank(), "tensor");
        std::vector<float> v(8, 1.0f);
        if (c.rank() == 3) timed_out.wait();
        try {
          tp.all_reduce(std::span<float>(v), ReduceOp::sum);
          tp.all_reduce(std::span<float>(v), ReduceOp::sum);
        } catch (const comm_error&) {
          if (c.rank() == 2) timed_out.count_down();
          throw;
        }
      },
      with_timeout(0.2));
  CHECK_THAT(msg[2], Contains("on group tensor timed out after 0.2 s: rank 1 never arrived"));
  CHECK_THAT(msg[3], Contains("on group tensor aborted:"));
}

TEST_CASE("threads: a peer that has returned fails the collective at once", "[comm][fault]") {
  // The default timeout (300 s) is far away: "already returned" can only come from the departure.
  auto msg = errors_on_every_rank(3, [](ThreadsCommunicator& c) {
    if (c.rank() == 2) return;
    std::vector<float> v(8, 1.0f);
    c.all_reduce(std::span<float>(v), ReduceOp::sum);
  });
  for (int r : {0, 1}) CHECK_THAT(msg[std::size_t(r)], Contains("all_reduce #1 on group world"));
  for (int r : {0, 1}) CHECK_THAT(msg[std::size_t(r)], Contains("rank 2 has already returned and will never arrive"));
}

TEST_CASE("threads: point-to-point mismatches and timeouts", "[comm][fault]") {
  auto sizes = errors_on_every_rank(2, [](ThreadsCommunicator& c) {
    std::vector<float> v(c.rank() == 0 ? 5 : 4);
    if (c.rank() == 0)
      c.send(std::span<const float>(v), 1, 3);
    else
      c.recv(std::span<float>(v), 0, 3);
    c.barrier();
  });
  CHECK_THAT(sizes[1],
             Contains("recv #1 on group world: rank 1 expected 4 f32 from rank 0 with tag 3, but rank 0 sent 5 f32"));
  CHECK_THAT(sizes[0], Contains("barrier #1 on group world aborted: rank 1 threw: recv #1"));
  std::latch recv_failed(1);
  auto never = errors_on_every_rank(
      2,
      [&](ThreadsCommunicator& c) {
        std::vector<float> v(4);
        if (c.rank() == 1) {
          try {
            c.recv(std::span<float>(v), 0, 9);
          } catch (const comm_error&) {
            recv_failed.count_down();
            throw;
          }
        } else {
          recv_failed.wait();
        }
        c.barrier();
      },
      with_timeout(0.2));
  CHECK_THAT(never[1], Contains("recv #1 on group world timed out after 0.2 s: rank 0 never sent tag 9 to rank 1"));
  CHECK_THAT(never[0], Contains("barrier #1 on group world aborted: recv #1 on group world timed out"));
}

TEST_CASE("threads: run_threads fails when ranks fail only through communicator errors", "[comm][fault]") {
  // Nobody throws an error of their own: the receive times out and poisons the run, and the
  // other rank's barrier fails from that. The run must still end in an exception.
  CHECK_THROWS_WITH(run_threads(2, with_timeout(0.2),
                                [](ThreadsCommunicator& c) {
                                  std::vector<float> v(4);
                                  if (c.rank() == 1) c.recv(std::span<float>(v), 0, 9);
                                  c.barrier();
                                }),
                    Contains("never sent tag 9") || Contains("timed out"));
}

TEST_CASE("threads: errors of asynchronous collectives surface in wait()", "[comm][fault]") {
  auto msg = errors_on_every_rank(2, [](ThreadsCommunicator& c) {
    std::vector<float> v(c.rank() == 0 ? 6 : 7);
    auto req = c.iall_reduce(std::span<float>(v), ReduceOp::sum);
    req.wait();
  });
  for (auto& m : msg) CHECK_THAT(m, Contains("all_reduce #1 on group world: ranks called different collectives"));
}

TEST_CASE("threads: MPAR_COMM_TIMEOUT_S sets the default timeout", "[comm]") {
  ::setenv("MPAR_COMM_TIMEOUT_S", "0.5", 1);
  CHECK(ThreadsOptions{}.timeout.count() == 0.5);
  for (const char* bad : {"soon", "0", "-5", "nan", "1e3x"}) {
    ::setenv("MPAR_COMM_TIMEOUT_S", bad, 1);
    CHECK_THROWS_WITH(ThreadsOptions{},
                      Contains(std::string("MPAR_COMM_TIMEOUT_S='") + bad +
                               "' is not a positive number of seconds (use e.g. 60, or inf for no timeout)"));
  }
  ::unsetenv("MPAR_COMM_TIMEOUT_S");
  CHECK(ThreadsOptions{}.timeout.count() == 300.0);
}

TEST_CASE("threads: MPAR_COMM_TIMEOUT_S=inf and huge timeouts mean no timeout, not an instant one", "[comm][fault]") {
  // A deadline is a steady_clock time point: now + 1e10 s overflowed into the past and timed out at once.
  for (const char* v : {"inf", "1e10", "1e300"}) {
    ::setenv("MPAR_COMM_TIMEOUT_S", v, 1);
    const ThreadsOptions o;
    ::unsetenv("MPAR_COMM_TIMEOUT_S");
    INFO("MPAR_COMM_TIMEOUT_S=" << v);
    CHECK(detail::is_no_timeout(o.timeout));
    const auto now = std::chrono::steady_clock::now();
    CHECK(detail::deadline_after(o.timeout) > now + std::chrono::hours(24 * 365 * 30));
    // A collective whose peer is late: it must wait for the peer, not fail "after inf s".
    std::latch go(1);
    std::vector<float> got(2);
    run_threads(2, o, [&](ThreadsCommunicator& c) {
      std::vector<float> x(4, float(c.rank() + 1));
      if (c.rank() == 0)
        go.count_down();
      else
        go.wait();
      c.all_reduce(std::span<float>(x), ReduceOp::sum);
      got[std::size_t(c.rank())] = x[0];
    });
    CHECK(got == std::vector<float>{3.0f, 3.0f});
  }
}

TEST_CASE("threads: MPAR_THREADS_SPIN_US is a whole number of microseconds or refused", "[comm][fault]") {
  ::setenv("MPAR_THREADS_SPIN_US", "0", 1);
  CHECK(ThreadsOptions{}.spin.count() == 0);
  ::setenv("MPAR_THREADS_SPIN_US", "250", 1);
  CHECK(ThreadsOptions{}.spin.count() == 250);
  for (const char* bad : {"abc", "-5", "1.5", "20000000", "12us"}) {
    ::setenv("MPAR_THREADS_SPIN_US", bad, 1);
    CHECK_THROWS_WITH(ThreadsOptions{}, Contains(std::string("MPAR_THREADS_SPIN_US='") + bad +
                                                 "' is not a whole number of microseconds from 0 to 10000000"));
  }
  ::unsetenv("MPAR_THREADS_SPIN_US");
  CHECK(ThreadsOptions{}.spin.count() == 1000);
  // Spinning off: collectives still work (every barrier sleeps).
  ThreadsOptions no_spin;
  no_spin.spin = std::chrono::microseconds(0);
  on_threads(
      3, [](ThreadsCommunicator& c, test::Checker& ck) { test::check_everything(c, ck); }, no_spin);
  // Spinning on, as a run whose ranks all have a core gets it by default (the test presets switch it off with
  // MPAR_THREADS_SPIN_US=0, since ctest runs tests side by side): two ranks, each barrier spun on before it sleeps.
  ThreadsOptions spin;
  spin.spin = std::chrono::microseconds(1000);
  on_threads(
      2, [](ThreadsCommunicator& c, test::Checker& ck) { test::check_everything(c, ck); }, spin);
}

TEST_CASE("threads: the run's error carries every failing rank's own message", "[comm][fault]") {
  // As load_checkpoint does: the ranks agree that rank 1 failed, then rank 0 reports the agreement and
  // rank 1 its own error. Whichever throws first, the message must hold rank 1's own words.
  for (int round = 0; round < 5; ++round) {
    CHECK_THROWS_WITH(run_threads(3,
                                  [](ThreadsCommunicator& c) {
                                    std::vector<float> failed{c.rank() == 1 ? 1.0f : 0.0f};
                                    c.all_reduce(std::span<float>(failed), ReduceOp::sum);
                                    if (c.rank() == 1) throw std::runtime_error("checksum mismatch in shard 1");
                                    if (c.rank() == 0)
                                      throw std::runtime_error("load failed on rank(s) 1; see their errors");
                                    c.barrier();  // rank 2: fails as a consequence, and is not listed
                                  }),
                      Contains("rank 1: checksum mismatch in shard 1") &&
                          Contains("load failed on rank(s) 1; see their errors") && !Contains("rank 2:"));
  }
}

namespace {

/** A rank's error that only names the ranks that failed, as load_checkpoint's agreement throws it. */
class summary_error : public std::runtime_error, public peer_failure_report {
 public:
  using std::runtime_error::runtime_error;
};

/** What run_threads reports for a run, or "" when it did not fail; `rank` gets rank_failure::rank(). */
template <class F>
std::string run_failure(int n, F&& f, int& rank, std::string& nested) {
  try {
    run_threads(n, std::forward<F>(f));
  } catch (const rank_failure& e) {
    rank = e.rank();
    try {
      e.rethrow_nested();
    } catch (const std::exception& x) {
      nested = x.what();
    }
    return e.what();
  }
  return {};
}

/** Whether `needle` occurs in `text` before `later` (both must occur). */
bool occurs_before(const std::string& text, const std::string& needle, const std::string& later) {
  const auto a = text.find(needle), b = text.find(later);
  return a != std::string::npos && b != std::string::npos && a < b;
}

}  // namespace

TEST_CASE("threads: the failing rank's own error comes before the ranks' report of it, in either order",
          "[comm][fault]") {
  const std::string own = "rank 1: checksum mismatch in shard 1";
  const std::string report = "load_checkpoint failed on rank(s) 1 of group 'world'; see their errors";
  // Which rank throws first is forced: the later one waits in a receive that only the run's abort
  // (the earlier one's exception) ends, swallows that error and throws its own.
  auto forced = [&](int first_to_throw) {
    return [=](ThreadsCommunicator& c) {
      std::vector<float> failed{c.rank() == 1 ? 1.0f : 0.0f};
      c.all_reduce(std::span<float>(failed), ReduceOp::sum);
      if (c.rank() == 2) {
        c.barrier();  // fails only as a consequence of the abort, and is not listed
        return;
      }
      if (c.rank() != first_to_throw) {
        std::vector<float> never(1);
        try {
          c.recv(std::span<float>(never), first_to_throw, 99);
        } catch (const comm_error&) {}
      }
      if (c.rank() == 1) throw std::runtime_error("checksum mismatch in shard 1");
      throw summary_error("load_checkpoint failed on rank(s) 1 of group 'world'; see their errors");
    };
  };
  for (int first_to_throw : {0, 1}) {
    CAPTURE(first_to_throw);
    int rank = -1;
    std::string nested;
    const std::string msg = run_failure(3, forced(first_to_throw), rank, nested);
    CAPTURE(msg);
    CHECK(msg.starts_with(own));
    CHECK(occurs_before(msg, own, "rank 0: " + report));
    CHECK(msg.find("rank 2:") == std::string::npos);
    CHECK(rank == 1);
    CHECK(nested == "checksum mismatch in shard 1");
  }
  // Unforced, the two ranks race; every repetition must report in the same order.
  for (int round = 0; round < 20; ++round) {
    int rank = -1;
    std::string nested;
    const std::string msg = run_failure(
        4,
        [&](ThreadsCommunicator& c) {
          std::vector<float> failed{c.rank() == 1 ? 1.0f : 0.0f};
          c.all_reduce(std::span<float>(failed), ReduceOp::sum);
          if (c.rank() == 1) throw std::runtime_error("checksum mismatch in shard 1");
          throw summary_error(report);  // ranks 0, 2 and 3: the same report, listed once
        },
        rank, nested);
    CAPTURE(round, msg);
    CHECK(msg.starts_with(own));
    CHECK(rank == 1);
    const auto at = msg.find("see their errors");
    CHECK(at != std::string::npos);
    CHECK(msg.find("see their errors", at + 1) == std::string::npos);
  }
}

TEST_CASE("threads: a run whose ranks only report peers' failures still fails with the root cause", "[comm][fault]") {
  // No rank's own error: the report that poisoned the run comes first.
  int rank = -1;
  std::string nested;
  const std::string msg = run_failure(
      2,
      [](ThreadsCommunicator& c) {
        if (c.rank() == 1) {
          std::vector<float> never(1);
          try {
            c.recv(std::span<float>(never), 0, 7);
          } catch (const comm_error&) {}
          throw summary_error("rank 1 reports: save failed on rank(s) 0");
        }
        throw summary_error("rank 0 reports: save failed on rank(s) 1");
      },
      rank, nested);
  CHECK(msg.starts_with("rank 0: rank 0 reports: save failed on rank(s) 1"));
  CHECK(occurs_before(msg, "rank 0 reports", "rank 1: rank 1 reports"));
  CHECK(rank == 0);
}

// Run by the CTest entry "comm: a stuck rank ends the process" (tests/comm/threads/CMakeLists.txt),
// which expects exit status 3 and the report: rank 1 never returns (it waits on a latch nobody
// counts down), rank 0 times out waiting for it, and run_threads must not wait for rank 1 forever.
TEST_CASE("threads: a rank stuck outside the communicator ends the process with a report", "[.stuck-rank]") {
  static std::latch never(1);
  run_threads(2, with_timeout(0.2), [](ThreadsCommunicator& c) {
    if (c.rank() == 1) never.wait();
    std::vector<float> v(4, 1.0f);
    c.all_reduce(std::span<float>(v), ReduceOp::sum);
  });
  FAIL("run_threads returned although rank 1 is stuck");
}

TEST_CASE("threads: exceptions of any type are reported with the rank", "[comm][fault]") {
  CHECK_THROWS_WITH(run_threads(2,
                                [](ThreadsCommunicator& c) {
                                  if (c.rank() == 1) throw 42;
                                }),
                    Contains("rank 1: an exception not derived from std::exception"));
  CHECK_THROWS_WITH(run_threads(0, [](ThreadsCommunicator&) {}),
                    Contains("run_threads: needs at least one rank, got 0"));
}

TEST_CASE("require_same_on_every_rank: equal settings pass; any difference is refused on every rank, named",
          "[comm][threads][errors]") {
  auto outcome = [](int ranks, auto&& settings_of) {
    std::vector<std::string> what(std::size_t(ranks), "agreed");
    run_threads(ranks, [&](ThreadsCommunicator& world) {
      try {
        require_same_on_every_rank(world, settings_of(world.rank()), "job");
      } catch (const config_error& e) {
        what[std::size_t(world.rank())] = e.what();
      }
    });
    return what;
  };
  auto settings = [](std::string layers, std::string data) {
    return std::vector<RankSetting>{{"--layers", layers}, {"--lr", "0.1"}, {"--data", data}};
  };
  CHECK(outcome(3, [&](int) { return settings("4", "a.txt"); }) == std::vector<std::string>(3, "agreed"));
  // Rank 2 of 3 differs in two settings: every rank says which, with its own value.
  const auto two = outcome(3, [&](int r) { return r == 2 ? settings("8", "b.txt") : settings("4", "a.txt"); });
  for (int r = 0; r < 3; ++r) {
    INFO(two[std::size_t(r)]);
    CHECK_THAT(two[std::size_t(r)],
               Contains("job: the ranks were started with different settings") &&
                   Contains("--layers (" + std::string(r == 2 ? "8" : "4") + " on rank " + std::to_string(r) + ")") &&
                   Contains("--data") && !Contains("--lr"));
  }
  // Lists of different lengths cannot be compared element by element: refused before that.
  const auto lengths = outcome(2, [&](int r) {
    auto s = settings("4", "a.txt");
    if (r == 1) s.push_back({"--extra", "1"});
    return s;
  });
  for (const auto& w : lengths) CHECK_THAT(w, Contains("every rank must run the same program"));
}

TEST_CASE("require_same_on_every_rank: full 64-bit FNV-1a hashes, compared exactly by maximum and minimum",
          "[comm][threads][errors]") {
  // The published FNV-1a 64 test vectors: no bit of the hash is dropped.
  CHECK(detail::setting_hash("") == 0xcbf29ce484222325ull);
  CHECK(detail::setting_hash("a") == 0xaf63dc4c8601ec8cull);
  CHECK(detail::setting_hash("foobar") == 0x85944171f73967e8ull);
  // Hashes that differ only in the lowest bit, far above 2^53, are told apart on every rank.
  std::vector<std::uint64_t> hi(3), lo(3);
  run_threads(3, [&](ThreadsCommunicator& world) {
    const std::uint64_t top = 0xfedcba9876543210ull;
    const auto [h, l] = detail::max_and_min(world, Buffer<std::uint64_t>{top + (world.rank() == 1 ? 1u : 0u)});
    hi[std::size_t(world.rank())] = h[0];
    lo[std::size_t(world.rank())] = l[0];
  });
  CHECK(hi == std::vector<std::uint64_t>(3, 0xfedcba9876543211ull));
  CHECK(lo == std::vector<std::uint64_t>(3, 0xfedcba9876543210ull));
}
