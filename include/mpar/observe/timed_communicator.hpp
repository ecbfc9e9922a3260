#pragma once
/**
 * @file A communicator adaptor that measures the time spent inside collectives, so a training step can
 * report its communication share without instrumenting every layer.
 */
#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "mpar/comm/communicator.hpp"
#include "mpar/comm/host_memory_communicator.hpp"

namespace mpar::observe {

/**
 * @brief Wraps any communicator; every blocking call adds its wall time to `seconds()`. Asynchronous
 * calls count the time to issue them (their transfer overlaps compute by design; the caller's `wait`
 * counts where the caller measures it). Sub-communicators from `split` get their own clock.
 */
template <communicator Comm>
class TimedCommunicator {
 public:
  explicit TimedCommunicator(Comm inner) : inner_(std::move(inner)), seconds_(std::make_shared<double>(0.0)) {}
  static constexpr bool moves_host_memory = host_memory_communicator<Comm>;

  [[nodiscard]] int rank() const { return inner_.rank(); }
  [[nodiscard]] int size() const { return inner_.size(); }
  [[nodiscard]] std::string name() const { return inner_.name(); }
  [[nodiscard]] Comm& inner() { return inner_; }
  /** Seconds spent in this communicator's calls since construction or the last `reset()`. */
  [[nodiscard]] double seconds() const { return *seconds_; }
  void reset() { *seconds_ = 0.0; }

  template <class... A>
  void all_reduce(A&&... a) {
    timed([&] { inner_.all_reduce(std::forward<A>(a)...); });
  }
  template <class... A>
  void broadcast(A&&... a) {
    timed([&] { inner_.broadcast(std::forward<A>(a)...); });
  }
  template <class... A>
  void reduce(A&&... a) {
    timed([&] { inner_.reduce(std::forward<A>(a)...); });
  }
  template <class... A>
  void all_gather(A&&... a) {
    timed([&] { inner_.all_gather(std::forward<A>(a)...); });
  }
  template <class... A>
  void reduce_scatter(A&&... a) {
    timed([&] { inner_.reduce_scatter(std::forward<A>(a)...); });
  }
  template <class... A>
  void gather(A&&... a) {
    timed([&] { inner_.gather(std::forward<A>(a)...); });
  }
  template <class... A>
  void scatter(A&&... a) {
    timed([&] { inner_.scatter(std::forward<A>(a)...); });
  }
  template <class... A>
  void all_to_all(A&&... a) {
    timed([&] { inner_.all_to_all(std::forward<A>(a)...); });
  }
  template <class... A>
  void all_to_all_v(A&&... a) {
    timed([&] { inner_.all_to_all_v(std::forward<A>(a)...); });
  }
  template <class... A>
  void send(A&&... a) {
    timed([&] { inner_.send(std::forward<A>(a)...); });
  }
  template <class... A>
  void recv(A&&... a) {
    timed([&] { inner_.recv(std::forward<A>(a)...); });
  }
  void barrier() {
    timed([&] { inner_.barrier(); });
  }
  template <class... A>
  auto iall_reduce(A&&... a) {
    return timed([&] { return inner_.iall_reduce(std::forward<A>(a)...); });
  }
  template <class... A>
  auto iall_gather(A&&... a) {
    return timed([&] { return inner_.iall_gather(std::forward<A>(a)...); });
  }
  template <class... A>
  auto ireduce_scatter(A&&... a) {
    return timed([&] { return inner_.ireduce_scatter(std::forward<A>(a)...); });
  }
  template <class... A>
  auto isend(A&&... a) {
    return timed([&] { return inner_.isend(std::forward<A>(a)...); });
  }
  template <class... A>
  auto irecv(A&&... a) {
    return timed([&] { return inner_.irecv(std::forward<A>(a)...); });
  }
  [[nodiscard]] TimedCommunicator split(int color, int key) { return TimedCommunicator(inner_.split(color, key)); }

 private:
  template <class F>
  decltype(auto) timed(F&& f) {
    struct Clock {
      double* acc;
      std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
      ~Clock() { *acc += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
    } clock{seconds_.get()};
    return f();
  }

  Comm inner_;
  std::shared_ptr<double> seconds_;
};

}  // namespace mpar::observe
