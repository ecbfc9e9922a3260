#pragma once
/**
 * @file The vocabulary of pipeline schedules: actions, per-rank programs and the (P, M, V) configuration.
 *
 * A schedule is data, not code: for every pipeline rank an ordered list of actions. The verifier,
 * the simulator and the executor all read the same lists, so what is verified is what runs.
 *
 * Stage numbering: with P ranks and V chunks (virtual stages) per rank there are S = P·V model
 * stages; rank r holds the chunks c = 0..V-1, chunk c of rank r being global stage `c·P + r`
 * (Megatron's interleaved placement; with V = 1, stage = rank).
 */
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mpar::pipeline {

/** @brief What one action does. `backward` is the whole backward; `backward_input` / `backward_weight` its two halves. */
enum class Op : std::uint8_t {
  forward,
  backward,
  backward_input,
  backward_weight,
  send_activation,
  recv_activation,
  send_gradient,
  recv_gradient,
  optimizer_step,
};

/** @brief Whether the op runs on the compute lane (as opposed to point-to-point communication). */
[[nodiscard]] constexpr bool is_compute(Op op) {
  return op == Op::forward || op == Op::backward || op == Op::backward_input || op == Op::backward_weight ||
         op == Op::optimizer_step;
}
[[nodiscard]] constexpr bool is_send(Op op) { return op == Op::send_activation || op == Op::send_gradient; }
[[nodiscard]] constexpr bool is_recv(Op op) { return op == Op::recv_activation || op == Op::recv_gradient; }

/** @brief Short names used in traces and error messages: F, B, Bi (as "B" in timelines), W, ... */
[[nodiscard]] constexpr std::string_view op_name(Op op) {
  switch (op) {
    case Op::forward:
      return "forward";
    case Op::backward:
      return "backward";
    case Op::backward_input:
      return "backward_input";
    case Op::backward_weight:
      return "backward_weight";
    case Op::send_activation:
      return "send_activation";
    case Op::recv_activation:
      return "recv_activation";
    case Op::send_gradient:
      return "send_gradient";
    case Op::recv_gradient:
      return "recv_gradient";
    case Op::optimizer_step:
      return "optimizer_step";
  }
  return "?";
}
/** @brief One-letter label for timelines: F, B (whole or input half), W, S (send), R (recv), O (optimizer). */
[[nodiscard]] constexpr char op_letter(Op op) {
  switch (op) {
    case Op::forward:
      return 'F';
    case Op::backward:
    case Op::backward_input:
      return 'B';
    case Op::backward_weight:
      return 'W';
    case Op::send_activation:
    case Op::send_gradient:
      return 'S';
    case Op::recv_activation:
    case Op::recv_gradient:
      return 'R';
    case Op::optimizer_step:
      return 'O';
  }
  return '?';
}

/**
 * @brief One step of a rank's program. `mb` is the micro-batch (for `optimizer_step`: the batch
 * index, 0 for synchronous schedules); `chunk` the local chunk; `peer` the other rank of a send/recv
 * (-1 for compute).
 */
struct Action {
  Op op = Op::forward;
  int mb = 0;
  int chunk = 0;
  int peer = -1;
  friend constexpr bool operator==(const Action&, const Action&) = default;
};

/**
 * @brief Where sends and receives go in the programs. `lazy`: each receive right before the compute
 * that needs it, each send right after the compute that produced it (least waiting; safe with
 * asynchronous sends). `ordered`: every message at the same position of one global order on both
 * ranks (safe with blocking sends too; a receive may come earlier than strictly needed).
 */
enum class CommPlacement : std::uint8_t { lazy, ordered };

/** @brief The shape of a pipeline: P ranks, M micro-batches per step, V chunks per rank, and (for asynchronous schedules) steps. */
struct ScheduleConfig {
  int stages = 1;        ///< P: pipeline ranks
  int microbatches = 1;  ///< M: micro-batches per optimizer step
  int chunks = 1;        ///< V: model chunks (virtual stages) per rank
  int steps = 1;  ///< optimizer steps covered by one program (asynchronous schedules run several without a flush)
  CommPlacement placement = CommPlacement::lazy;  ///< see CommPlacement
  [[nodiscard]] constexpr int total_stages() const { return stages * chunks; }
  [[nodiscard]] constexpr int total_microbatches() const { return microbatches * steps; }
  friend constexpr bool operator==(const ScheduleConfig&, const ScheduleConfig&) = default;
};

/** @brief Global stage index of `chunk` on `rank`. */
[[nodiscard]] constexpr int global_stage(const ScheduleConfig& c, int rank, int chunk) {
  return chunk * c.stages + rank;
}
/** @brief The rank holding global stage `s`. */
[[nodiscard]] constexpr int stage_rank(const ScheduleConfig& c, int s) { return s % c.stages; }
/** @brief The local chunk index of global stage `s`. */
[[nodiscard]] constexpr int stage_chunk(const ScheduleConfig& c, int s) { return s / c.stages; }

/**
 * @brief Every rank's program for one configuration. `split_backward`: backward is B then W;
 * `asynchronous`: no flush, weights are versioned (PipeDream-2BW) and `optimizer_step` actions
 * carry the batch index.
 */
struct Programs {
  std::string_view schedule;
  ScheduleConfig config;
  bool split_backward = false;
  bool asynchronous = false;
  std::vector<std::vector<Action>> ranks;

  [[nodiscard]] constexpr std::size_t total_actions() const {
    std::size_t n = 0;
    for (const auto& r : ranks) n += r.size();
    return n;
  }
};

namespace detail {
/** constexpr integer formatting (std::to_string is not constexpr), for messages built inside constant evaluation. */
[[nodiscard]] constexpr std::string itos(long long v) {
  if (v == 0) return "0";
  const bool neg = v < 0;
  unsigned long long u = neg ? 0ull - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
  std::string s;
  while (u) {
    s.insert(s.begin(), char('0' + u % 10));
    u /= 10;
  }
  if (neg) s.insert(s.begin(), '-');
  return s;
}
}  // namespace detail

/** @brief Human-readable action, e.g. `recv_gradient(mb 3, chunk 0) from rank 1`. */
[[nodiscard]] constexpr std::string describe(const Action& a) {
  std::string s(op_name(a.op));
  s += "(mb " + detail::itos(a.mb) + ", chunk " + detail::itos(a.chunk) + ")";
  if (is_send(a.op)) s += " to rank " + detail::itos(a.peer);
  if (is_recv(a.op)) s += " from rank " + detail::itos(a.peer);
  return s;
}

/** @brief Timeline label, e.g. `F3`, `B3`, `W3`; with V > 1 the chunk is appended as `F3.1`. */
[[nodiscard]] inline std::string label(const Action& a, int chunks) {
  std::string s(1, op_letter(a.op));
  s += std::to_string(a.mb);
  if (chunks > 1 && a.op != Op::optimizer_step) s += "." + std::to_string(a.chunk);
  return s;
}

}  // namespace mpar::pipeline
