// io::ExitSignal: a raised signal sets the flag instead of ending the process, the previous action comes back
// when the object goes, and exit_requested gives every rank the same answer when the signal reached only one.
// (train_gpt stopping on a real SIGTERM and resuming to the uninterrupted result: examples/train_gpt.)
#include <catch2/catch.hpp>

#include <atomic>
#include <csignal>
#include <string>
#include <vector>

#include "mpar/comm/threads.hpp"
#include "mpar/io/exit_signal.hpp"

using namespace mpar;

namespace {
// SIGUSR1 and SIGUSR2: Catch2 keeps its own handlers for SIGTERM, SIGINT and the fatal signals.
std::atomic<int> exit_signal_test_previous_calls{0};
extern "C" void exit_signal_test_previous_handler(int) { exit_signal_test_previous_calls.fetch_add(1); }
}  // namespace

TEST_CASE("ExitSignal: a raised signal sets the flag and the process goes on", "[io][exit_signal]") {
  io::ExitSignal held(SIGUSR1);
  CHECK(held.signal() == SIGUSR1);
  CHECK_FALSE(held.received());
  REQUIRE(std::raise(SIGUSR1) == 0);  // without the handler, SIGUSR1 would end the test binary here
  CHECK(held.received());
}

TEST_CASE("ExitSignal: the previous action comes back, and a new holder starts unset", "[io][exit_signal]") {
  struct sigaction mine {
  }, before{}, now{};
  mine.sa_handler = exit_signal_test_previous_handler;
  sigemptyset(&mine.sa_mask);
  REQUIRE(::sigaction(SIGUSR2, &mine, &before) == 0);
  exit_signal_test_previous_calls = 0;
  {
    io::ExitSignal held(SIGUSR2);
    REQUIRE(::sigaction(SIGUSR2, nullptr, &now) == 0);
    CHECK(now.sa_handler != exit_signal_test_previous_handler);
    REQUIRE(std::raise(SIGUSR2) == 0);
    CHECK(held.received());
    CHECK(exit_signal_test_previous_calls == 0);  // taken by the ExitSignal, not passed on
  }
  REQUIRE(::sigaction(SIGUSR2, nullptr, &now) == 0);
  CHECK(now.sa_handler == exit_signal_test_previous_handler);
  REQUIRE(std::raise(SIGUSR2) == 0);
  CHECK(exit_signal_test_previous_calls == 1);
  {
    io::ExitSignal again(SIGUSR2);  // the earlier arrival belongs to the earlier holder
    CHECK_FALSE(again.received());
  }
  REQUIRE(::sigaction(SIGUSR2, &before, nullptr) == 0);
}

TEST_CASE("ExitSignal: a signal held twice, or one that cannot be caught, is refused", "[io][exit_signal]") {
  io::ExitSignal held(SIGUSR1);
  CHECK_THROWS_WITH(io::ExitSignal(SIGUSR1), Catch::Contains("SIGUSR1 is already held by another ExitSignal"));
  CHECK_THROWS_WITH(io::ExitSignal(SIGKILL), Catch::Contains("cannot catch signal 9"));
  CHECK_THROWS_WITH(io::ExitSignal(0), Catch::Contains("0 is not a signal number"));
  CHECK_FALSE(held.received());  // the refusals left the holder as it was
}

TEST_CASE("exit_requested: every rank stops when the signal reached one", "[io][exit_signal]") {
  // Rank 1 holds the signal that arrived, the others one that did not: as in an MPI job where the scheduler's
  // signal reached one process. Every rank must take the same decision.
  io::ExitSignal arrived(SIGUSR1), quiet(SIGUSR2);
  REQUIRE(std::raise(SIGUSR1) == 0);
  std::vector<int> stop(3, -1), stop_before(3, -1);
  run_threads(3, [&](ThreadsCommunicator& comm) {
    const auto r = std::size_t(comm.rank());
    stop[r] = io::exit_requested(comm, r == 1 ? arrived : quiet);
    stop_before[r] = io::exit_requested(comm, quiet);  // no rank received it: nobody stops
  });
  CHECK(stop == std::vector<int>{1, 1, 1});
  CHECK(stop_before == std::vector<int>{0, 0, 0});
}
