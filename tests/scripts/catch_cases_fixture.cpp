// The cases scripts/run-test-cases.sh is checked against (tests/scripts/CMakeLists.txt): one of each way a case
// can end — passed, a failed check, a crash, a hang, no device (exit 77) — in an order where the crash and the hang
// come before cases that pass, and a name with every character Catch2's test spec reads specially.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <thread>

TEST_CASE("fixture: passes, with [brackets], \"quotes\", a \\ backslash, a ~tilde and a *star") { CHECK(1 + 1 == 2); }

TEST_CASE("fixture: a failed check") {
  const int two = 2;
  CHECK(two == 3);
}

TEST_CASE("fixture: a crash") { std::abort(); }

TEST_CASE("fixture: passes after the crash") { CHECK(true); }

TEST_CASE("fixture: a hang") { std::this_thread::sleep_for(std::chrono::seconds(120)); }

TEST_CASE("fixture: no device") { std::_Exit(77); }

TEST_CASE("fixture: passes, a prefix of the next name") { CHECK(true); }

TEST_CASE("fixture: passes, a prefix of the next name, longer") { CHECK(true); }
