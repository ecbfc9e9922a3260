#pragma once
/**
 * @file The `graph_backend` concept: a backend that can capture the operations a rank issues and
 * replay them with one launch (CUDA Graphs; the stream-emulating host backends model it).
 */
#include <concepts>

namespace mpar::detail {

/**
 * @brief A backend whose rank stream can be captured into a graph and replayed:
 * - `graph_type`: movable, default-constructible (empty); dropping it releases what the capture kept;
 * - `begin_capture()`: from now on, the calling rank's operations are recorded, not run; what the
 *   operations read is read at each replay from the same addresses, so a value that must change between
 *   replays (a learning rate, a step count, the input tokens) has to live in rank memory, written by an
 *   asynchronous copy or an operation, never passed as a host scalar;
 * - `end_capture() -> graph_type`: stops recording and returns the graph;
 * - `launch(g)`: issues one replay of `g` on the calling rank's stream (the one that captured it); returns
 *   at once, like any operation.
 * During a capture, a host wait (`synchronize`, `wait_event`, an operation that returns a value) and an
 * event recorded or waited for across streams throw, naming the call: a graph cannot wait on the host.
 * Memory allocated and freed during the capture stays reserved for the replays until the graph is dropped
 * (CUDA's graph memory nodes). A block allocated before the capture must not be freed during it: on CUDA its
 * free becomes a node of the graph, which a second launch would repeat (the emulation keeps such a free with
 * the graph instead, so it cannot show this).
 */
template <class B>
concept graph_backend = requires(const typename B::graph_type& g) {
  requires std::movable<typename B::graph_type>;
  requires std::default_initializable<typename B::graph_type>;
  B::begin_capture();
  { B::end_capture() } -> std::same_as<typename B::graph_type>;
  B::launch(g);
};

}  // namespace mpar::detail
