#pragma once
/**
 * @file `on_fresh_rank<B>(f)`: a backend test's body run as a rank of its own, so that a stream backend's
 * worker, its rank memory and any error it reports belong to that one call.
 */
#include <exception>
#include <optional>
#include <thread>
#include <utility>

namespace mpar::testing {

/**
 * Runs `f` on a fresh thread (a rank: its own stream and rank memory after `B::init_rank()`), waits for the
 * rank's stream, and returns `f`'s result; an exception thrown there, or reported by the wait, is rethrown here.
 */
template <class B, class F>
auto on_fresh_rank(F f) {
  using R = decltype(f());
  std::optional<R> out;
  std::exception_ptr error;
  std::thread t([&] {
    try {
      B::init_rank();
      out.emplace(f());
      B::synchronize();
    } catch (...) {
      error = std::current_exception();
    }
  });
  t.join();
  if (error) std::rethrow_exception(error);
  return std::move(*out);
}

}  // namespace mpar::testing
