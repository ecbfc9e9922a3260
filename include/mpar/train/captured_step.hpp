#pragma once
/**
 * @file `CapturedStep`: a training step issued eagerly for a few warm-up steps, then captured once and replayed with
 * one launch per step (CUDA Graphs; PyTorch's warm-up-then-capture pattern) — the trainer component behind
 * `GptTrainConfig::graph` (docs/training.md, "A captured training step").
 */
#include <cstddef>
#include <type_traits>
#include <utility>
#include <variant>

#include "mpar/backend/detail/graph_backend.hpp"

namespace mpar::train {

/**
 * @brief Runs a step that `issue()` issues on the calling rank's stream: the first `warmup` calls of `run` issue it
 * eagerly (they allocate what the step keeps and carry host state into rank memory), the next one captures it and
 * launches the capture, and every later one only launches it. What changes between steps must reach the step through
 * rank memory (`graph_backend`'s rule): `issue` runs on the host during the warm-up and the capture only.
 */
template <mpar::detail::graph_backend B>
class CapturedStep {
 public:
  explicit CapturedStep(std::size_t warmup = 1) : warmup_(warmup) {}

  /** Runs one step; returns whether it was a launch of the capture (false: issued eagerly). */
  template <class Issue>
  bool run(Issue&& issue) {
    if (eager_steps_ < warmup_) {
      std::forward<Issue>(issue)();
      ++eager_steps_;
      return false;
    }
    if (!captured_) {
      B::begin_capture();
      try {
        std::forward<Issue>(issue)();
      } catch (...) {
        (void)B::end_capture();  // a failed capture is dropped; the error names what broke it
        throw;
      }
      graph_ = B::end_capture();
      captured_ = true;
    }
    B::launch(graph_);
    return true;
  }
  /** Warm up and capture again from the next step (host state the capture froze has changed: a load, a resume). */
  void reset() {
    graph_ = {};
    captured_ = false;
    eager_steps_ = 0;
  }
  [[nodiscard]] bool captured() const { return captured_; }
  /** The operations the capture holds, where the backend counts them (0 before the capture). */
  [[nodiscard]] std::size_t operations() const {
    if constexpr (requires { graph_.nodes(); })
      return captured_ ? graph_.nodes() : 0;
    else
      return 0;
  }

 private:
  std::size_t warmup_;
  typename B::graph_type graph_;
  bool captured_ = false;
  std::size_t eager_steps_ = 0;
};

namespace detail {
template <class B, bool = mpar::detail::graph_backend<B>>
struct captured_step_of {
  using type = std::monostate;
};
template <class B>
struct captured_step_of<B, true> {
  using type = CapturedStep<B>;
};
}  // namespace detail

/** `CapturedStep<B>` where `B` models `graph_backend`, else nothing (a trainer refuses capture there). */
template <class B>
using captured_step_for = typename detail::captured_step_of<B>::type;

}  // namespace mpar::train
