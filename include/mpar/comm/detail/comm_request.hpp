#pragma once
/**
 * @file The `comm_request` concept: the handle of an asynchronous communication.
 */
#include <concepts>

namespace mpar::detail {

/**
 * @brief A handle to an asynchronous operation: `wait()` blocks until done (rethrowing its error),
 * `test()` returns whether it is done without blocking.
 */
template <class R>
concept comm_request = std::movable<R> && requires(R& r) {
  { r.wait() } -> std::same_as<void>;
  { r.test() } -> std::convertible_to<bool>;
};

}  // namespace mpar::detail
