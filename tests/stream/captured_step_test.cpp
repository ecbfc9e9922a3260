// The trainer's captured-step component (train/captured_step.hpp) over the stream backend's emulated capture: warm-up
// steps issued eagerly, one capture, launches after it that read each step's new input through rank memory; a failed
// capture dropped and the next step capturing again; `reset` warming up again.
#include <catch2/catch.hpp>

#include <cstddef>
#include <exception>
#include <stdexcept>
#include <vector>

#include <mpar/backend/stream/stream_backend.hpp>
#include <mpar/train/captured_step.hpp>

#include "rank_world.hpp"

using namespace mpar;

namespace {

/** A step that adds the sum of its input (copied in from pinned staging) into a running total in rank memory. */
struct SummingStep {
  static constexpr std::size_t n = 4;
  Buffer<float> in = StreamHostBackend::allocate<float>(n);
  Buffer<double> sum = StreamHostBackend::allocate<double>(1);
  StreamHostBackend::pinned_buffer<float> staging = StreamHostBackend::pinned_buffer<float>(n);  // n elements
  int issued = 0;  // how often the host ran the issuing code

  SummingStep() { StreamHostBackend::run(ops::zero<double>{.n = 1, .x = sum.data()}); }
  /** The host's part of step t: its input into staging (after the previous step's copy read it). */
  void stage(int t) {
    StreamHostBackend::synchronize();
    for (std::size_t i = 0; i < n; ++i) staging[i] = float(t * 10 + int(i));
  }
  void issue() {
    ++issued;
    StreamHostBackend::copy_from_host_async<float>(n, staging.data(), in.data());
    StreamHostBackend::run(ops::accumulate{.n = n, .x = in.data(), .scale = 1.0, .acc = sum.data()});
  }
  /** The total the steps 0 .. steps-1 give, by hand. */
  static double expected(int steps) {
    double s = 0;
    for (int t = 0; t < steps; ++t)
      for (std::size_t i = 0; i < n; ++i) s += double(t * 10 + int(i));
    return s;
  }
  double read() {
    StreamHostBackend::synchronize();
    return sum[0];
  }
};

}  // namespace

TEST_CASE("captured step: warm-up steps eager, one capture, then launches that read each step's input",
          "[captured_step]") {
  testing::on_own_thread([] {
    SummingStep s;
    train::CapturedStep<StreamHostBackend> step(2);
    std::vector<bool> launched;
    for (int t = 0; t < 6; ++t) {
      s.stage(t);
      launched.push_back(step.run([&] { s.issue(); }));
      CHECK(step.captured() == (t >= 2));
    }
    CHECK(launched == std::vector<bool>{false, false, true, true, true, true});
    CHECK(s.issued == 3);  // two eager steps and the capture; the launches run no host code
    CHECK(step.operations() == 2);
    CHECK(s.read() == SummingStep::expected(6));  // every launch read its own step's input

    step.reset();  // warms up again: two eager steps, a new capture
    for (int t = 6; t < 9; ++t) {
      s.stage(t);
      CHECK(step.run([&] { s.issue(); }) == (t == 8));
    }
    CHECK(s.issued == 6);
    CHECK(s.read() == SummingStep::expected(9));
  });
}

TEST_CASE("captured step: a capture that fails is dropped and the next step captures again", "[captured_step]") {
  testing::on_own_thread([] {
    SummingStep s;
    train::CapturedStep<StreamHostBackend> step(1);
    s.stage(0);
    CHECK_FALSE(step.run([&] { s.issue(); }));
    s.stage(1);
    // A host wait cannot be captured: the backend throws, naming it, and the capture ends.
    CHECK_THROWS_AS(step.run([&] {
      s.issue();
      StreamHostBackend::synchronize();
    }),
                    std::exception);
    CHECK_FALSE(step.captured());
    CHECK(step.run([&] { s.issue(); }));  // step 1 again, captured cleanly
    CHECK(step.captured());
    CHECK(s.read() == SummingStep::expected(2));
  });
}
