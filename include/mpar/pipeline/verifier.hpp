#pragma once
/**
 * @file The schedule verifier: replays every rank's program together and proves it sound.
 *
 * Checked: every action names a valid micro-batch, chunk and peer; every data dependency holds
 * (F of stage s after F of stage s-1 for that micro-batch, B after the next stage's B and the own F,
 * W after B, the optimizer step after every backward it consumes); every send meets exactly one
 * matching receive; nothing deadlocks. Reported: the peak number of activations each rank holds.
 *
 * The replay is a work-list over ranks: a rank runs until it blocks on a receive (or, with
 * `SendMode::rendezvous`, on a send whose receiver is not there; with `SendMode::grouped`, on a group
 * whose messages are not all matched), and a send wakes its peer, so the cost is O(total actions). Everything is constexpr: a static configuration is verified by
 * `static_assert` (see static_schedule.hpp).
 */
#include <string>
#include <vector>

#include "mpar/core/error.hpp"
#include "mpar/pipeline/action.hpp"

namespace mpar::pipeline {

/**
 * @brief Point-to-point semantics to verify against.
 * - `buffered`: a send returns at once and messages are matched by tag (isend/irecv over threads or
 *   MPI; what the executor does by default). With a send window w > 0 (`verify`'s third argument) a
 *   rank's n-th send first waits until its (n-w)-th has been received: the executor's bound on the send
 *   buffers in flight (ExecutorOptions::sends_in_flight).
 * - `rendezvous`: a send blocks until its receiver reaches the matching receive (blocking
 *   MPI_Ssend), which also exposes crossed send/recv orders.
 * - `grouped`: NCCL's semantics, what the executor does over a communicator that matches in order
 *   (`ordered_point_to_point`). Every run of consecutive sends and receives in a program is issued as
 *   one group; the messages between two ranks are matched in issue order, without tags; a message
 *   completes once both of its ends are issued, and a rank passes its group only when every message
 *   in it completed (the group is one kernel on the communicator's stream, and the next group or
 *   compute waits for it).
 */
enum class SendMode { buffered, rendezvous, grouped };

/** @brief The verifier's verdict: `ok`, else `error` names the ranks and actions; `peak_activations[r]` counts (micro-batch, chunk) pairs. */
struct VerifyReport {
  bool ok = true;
  std::string error;
  std::vector<int>
      peak_activations;  ///< per rank: forwards whose backward (input half) has not run yet, at the worst moment
};

namespace detail {

/**
 * The replay behind `verify`. A template over the programs' type (always `Programs`) only so that its
 * constexpr bodies, and the vector and string code they instantiate, are compiled by the programs that
 * verify a schedule rather than by every includer of `mpar/mpar.hpp`.
 */
template <class RankPrograms>
struct Replay {
  const RankPrograms& p;
  SendMode mode;
  int P, V, S, N;
  std::vector<std::size_t> pc;
  std::vector<char> f, b, w;            // per (stage, mb)
  std::vector<char> act_msg, grad_msg;  // per (receiving stage, mb): 0 none, 1 in flight, 2 received
  std::vector<int> inflight, peak, opt_steps;
  std::vector<int> queue;
  std::vector<char> queued;
  std::string error;
  // SendMode::grouped: per directed pair (from * P + to) the messages issued by each end, in issue
  // order, and how many are matched; per rank, the end of its issued group and its unmatched messages.
  std::vector<std::vector<int>> sent, received;  // message ids (see message_id)
  std::vector<std::size_t> matched;
  std::vector<std::size_t> group_end;
  std::vector<int> unmatched;
  // SendMode::buffered with a send window: per rank, the slot of each message it sent, in program order.
  std::size_t window = 0;
  std::vector<std::vector<const char*>> sends_of;

  constexpr Replay(const RankPrograms& prog, SendMode m, std::size_t send_window = 0)
      : p(prog), mode(m), P(prog.config.stages), V(prog.config.chunks), S(prog.config.total_stages()),
        N(prog.config.total_microbatches()), window(m == SendMode::buffered ? send_window : 0) {
    const auto sn = std::size_t(S) * std::size_t(N);
    pc.assign(std::size_t(P), 0);
    f.assign(sn, 0);
    b.assign(sn, 0);
    w.assign(sn, 0);
    act_msg.assign(sn, 0);
    grad_msg.assign(sn, 0);
    inflight.assign(std::size_t(P), 0);
    peak.assign(std::size_t(P), 0);
    opt_steps.assign(std::size_t(P), 0);
    queued.assign(std::size_t(P), 0);
    if (window > 0) sends_of.resize(std::size_t(P));
    if (mode == SendMode::grouped) {
      const auto pairs = std::size_t(P) * std::size_t(P);
      sent.resize(pairs);
      received.resize(pairs);
      matched.assign(pairs, 0);
      group_end.assign(std::size_t(P), 0);
      unmatched.assign(std::size_t(P), 0);
    }
  }
  [[nodiscard]] constexpr std::size_t at(int s, int mb) const {
    return std::size_t(s) * std::size_t(N) + std::size_t(mb);
  }
  [[nodiscard]] constexpr std::string where(int r) const {
    const auto i = pc[std::size_t(r)];
    return "rank " + itos(r) + " action #" + itos(static_cast<long long>(i)) + " " +
           describe(p.ranks[std::size_t(r)][i]);
  }
  constexpr void push(int r) {
    if (!queued[std::size_t(r)]) {
      queued[std::size_t(r)] = 1;
      queue.push_back(r);
    }
  }
  constexpr bool fail(int r, const std::string& why) {
    if (error.empty()) error = where(r) + ": " + why;
    return false;
  }

  // The message a send/recv action carries: (receiving stage, mb) and which table it lives in.
  struct Msg {
    bool gradient;
    int stage;
    int mb;
  };
  [[nodiscard]] constexpr Msg message_of(int r, const Action& a) const {
    const int s = global_stage(p.config, r, a.chunk);
    switch (a.op) {
      case Op::send_activation:
        return {false, s + 1, a.mb};
      case Op::recv_activation:
        return {false, s, a.mb};
      case Op::send_gradient:
        return {true, s - 1, a.mb};
      default:
        return {true, s, a.mb};  // recv_gradient
    }
  }
  [[nodiscard]] constexpr bool matches(int q, const Action& send, int r) const {
    if (pc[std::size_t(q)] >= p.ranks[std::size_t(q)].size()) return false;
    const Action& other = p.ranks[std::size_t(q)][pc[std::size_t(q)]];
    if (!is_recv(other.op) || other.peer != r) return false;
    const Msg a = message_of(r, send), bm = message_of(q, other);
    return a.gradient == bm.gradient && a.stage == bm.stage && a.mb == bm.mb;
  }

  /** A message as one number (for the in-order matching of SendMode::grouped) and in words. */
  [[nodiscard]] constexpr int message_id(const Msg& m) const { return ((m.gradient ? 1 : 0) * S + m.stage) * N + m.mb; }
  [[nodiscard]] constexpr std::string describe_message(int id) const {
    const int mb = id % N, stage = (id / N) % S;
    return std::string(id / N / S ? "the gradient" : "the activation") + " of micro-batch " + itos(mb) + " for stage " +
           itos(stage);
  }

  /** Validates fields and the static part of the action (peer, stage range). */
  constexpr bool check_fields(int r, const Action& a) {
    if (a.mb < 0 || a.mb >= N) return fail(r, "micro-batch out of range [0, " + itos(N) + ")");
    if (a.chunk < 0 || a.chunk >= V) return fail(r, "chunk out of range [0, " + itos(V) + ")");
    const int s = global_stage(p.config, r, a.chunk);
    if (a.op == Op::send_activation || a.op == Op::recv_gradient) {
      if (s == S - 1) return fail(r, "the last stage has no next stage to exchange with");
      if (a.peer != stage_rank(p.config, s + 1) || a.peer == r)
        return fail(r, "the next stage " + itos(s + 1) + " lives on rank " + itos(stage_rank(p.config, s + 1)));
    }
    if (a.op == Op::recv_activation || a.op == Op::send_gradient) {
      if (s == 0) return fail(r, "the first stage has no previous stage to exchange with");
      if (a.peer != stage_rank(p.config, s - 1) || a.peer == r)
        return fail(r, "the previous stage " + itos(s - 1) + " lives on rank " + itos(stage_rank(p.config, s - 1)));
    }
    return true;
  }

  /** Has stage s the input of micro-batch mb (own previous stage ran, or its activation arrived)? */
  [[nodiscard]] constexpr bool has_input(int r, int s, int mb) const {
    if (s == 0) return true;
    return stage_rank(p.config, s - 1) == r ? bool(f[at(s - 1, mb)]) : act_msg[at(s, mb)] == 2;
  }
  [[nodiscard]] constexpr bool has_output_grad(int r, int s, int mb) const {
    if (s == S - 1) return true;
    return stage_rank(p.config, s + 1) == r ? bool(b[at(s + 1, mb)]) : grad_msg[at(s, mb)] == 2;
  }

  enum class Step { done, blocked, failed };

  /**
   * SendMode::grouped: issues the run of sends and receives starting at the rank's program counter
   * as one group (once), pairs what both ends have issued, and passes the group when all of it matched.
   */
  constexpr Step step_group(int r) {
    const auto ur = std::size_t(r);
    const auto& prog = p.ranks[ur];
    if (group_end[ur] == 0) {
      std::size_t e = pc[ur];
      while (e < prog.size() && (is_send(prog[e].op) || is_recv(prog[e].op))) ++e;
      std::vector<std::size_t> touched;
      for (std::size_t k = pc[ur]; k < e; ++k) {
        const Action& a = prog[k];
        if (!check_fields(r, a)) return Step::failed;
        const Msg m = message_of(r, a);
        auto& slot = (m.gradient ? grad_msg : act_msg)[at(m.stage, m.mb)];
        const auto pair =
            is_send(a.op) ? ur * std::size_t(P) + std::size_t(a.peer) : std::size_t(a.peer) * std::size_t(P) + ur;
        if (is_send(a.op)) {
          const int s = global_stage(p.config, r, a.chunk);
          if (m.gradient ? !b[at(s, a.mb)] : !f[at(s, a.mb)])
            return fail(r, m.gradient ? "sends a gradient its backward has not produced yet"
                                      : "sends an activation its forward has not produced yet"),
                   Step::failed;
          if (slot != 0) return fail(r, "this message was already sent"), Step::failed;
          slot = 1;
          sent[pair].push_back(message_id(m));
        } else {
          if (slot == 2) return fail(r, "this message was already received"), Step::failed;
          received[pair].push_back(message_id(m));
        }
        ++unmatched[ur];
        touched.push_back(pair);
      }
      group_end[ur] = e;
      for (const std::size_t pair : touched) {
        const int from = int(pair / std::size_t(P)), to = int(pair % std::size_t(P));
        while (matched[pair] < sent[pair].size() && matched[pair] < received[pair].size()) {
          const std::size_t k = matched[pair]++;
          const int ms = sent[pair][k], mr = received[pair][k];
          if (ms != mr)
            return fail(r, "with in-order matching (no tags, as NCCL), send #" + itos(static_cast<long long>(k)) +
                               " from rank " + itos(from) + " to rank " + itos(to) + " (" + describe_message(ms) +
                               ") would be received as " + describe_message(mr) +
                               "; both ranks must order their messages alike"),
                   Step::failed;
          const int stage = (ms / N) % S, mb = ms % N;
          (ms / N / S ? grad_msg : act_msg)[at(stage, mb)] = 2;
          --unmatched[std::size_t(from)];
          --unmatched[std::size_t(to)];
          push(from);
          push(to);
        }
      }
    }
    if (unmatched[ur] > 0) return Step::blocked;
    pc[ur] = group_end[ur] - 1;  // run() steps past the group's last action
    group_end[ur] = 0;
    return Step::done;
  }

  constexpr Step step(int r) {
    const Action& a = p.ranks[std::size_t(r)][pc[std::size_t(r)]];
    if (mode == SendMode::grouped && (is_send(a.op) || is_recv(a.op))) return step_group(r);
    if (!check_fields(r, a)) return Step::failed;
    const int s = global_stage(p.config, r, a.chunk);
    const auto i = at(s, a.mb);
    auto& fl = inflight[std::size_t(r)];
    switch (a.op) {
      case Op::forward:
        if (f[i]) return fail(r, "this forward already ran"), Step::failed;
        if (!has_input(r, s, a.mb))
          return fail(r, stage_rank(p.config, s - 1) == r
                             ? "needs the forward of stage " + itos(s - 1) + " (same rank) first"
                             : "needs the activation from rank " + itos(stage_rank(p.config, s - 1)) +
                                   ", which this rank has not received (missing recv_activation before it)"),
                 Step::failed;
        f[i] = 1;
        if (++fl > peak[std::size_t(r)]) peak[std::size_t(r)] = fl;
        return Step::done;
      case Op::backward:
      case Op::backward_input:
        if (a.op == Op::backward && p.split_backward)
          return fail(r, "this schedule splits the backward; use backward_input and backward_weight"), Step::failed;
        if (b[i]) return fail(r, "this backward already ran"), Step::failed;
        if (!f[i]) return fail(r, "needs its own forward first"), Step::failed;
        if (!has_output_grad(r, s, a.mb))
          return fail(r, stage_rank(p.config, s + 1) == r
                             ? "needs the backward of stage " + itos(s + 1) + " (same rank) first"
                             : "needs the gradient from rank " + itos(stage_rank(p.config, s + 1)) +
                                   ", which this rank has not received (missing recv_gradient before it)"),
                 Step::failed;
        b[i] = 1;
        if (a.op == Op::backward) w[i] = 1;
        --fl;
        return Step::done;
      case Op::backward_weight:
        if (w[i]) return fail(r, "this backward_weight already ran"), Step::failed;
        if (!b[i]) return fail(r, "needs backward_input of the same micro-batch first"), Step::failed;
        w[i] = 1;
        return Step::done;
      case Op::optimizer_step: {
        const int M = p.config.microbatches;
        const int lo = p.asynchronous ? a.mb * M : 0, hi = p.asynchronous ? lo + M : N;
        if (p.asynchronous && a.mb >= p.config.steps)
          return fail(r, "batch index beyond the configured steps"), Step::failed;
        if (a.mb != (p.asynchronous ? opt_steps[std::size_t(r)] : 0) ||
            (!p.asynchronous && opt_steps[std::size_t(r)] > 0))
          return fail(r, "optimizer steps must run once per batch, in order"), Step::failed;
        for (int c = 0; c < V; ++c)
          for (int mb = lo; mb < hi; ++mb)
            if (!w[at(global_stage(p.config, r, c), mb)])
              return fail(r, "the optimizer step needs every weight gradient of its batch; micro-batch " + itos(mb) +
                                 " chunk " + itos(c) + " is missing"),
                     Step::failed;
        ++opt_steps[std::size_t(r)];
        return Step::done;
      }
      case Op::send_activation:
      case Op::send_gradient: {
        const bool grad = a.op == Op::send_gradient;
        if (grad ? !b[i] : !f[i])
          return fail(r, grad ? "sends a gradient its backward has not produced yet"
                              : "sends an activation its forward has not produced yet"),
                 Step::failed;
        const Msg m = message_of(r, a);
        auto& slot = (grad ? grad_msg : act_msg)[at(m.stage, m.mb)];
        if (slot != 0) return fail(r, "this message was already sent"), Step::failed;
        if (mode == SendMode::rendezvous) {
          if (!matches(a.peer, a, r)) return Step::blocked;
          slot = 2;
          ++pc[std::size_t(a.peer)];
          push(a.peer);
          return Step::done;
        }
        if (window > 0) {
          // The bounded send buffers: this send waits until the one `window` sends earlier was received.
          auto& mine = sends_of[std::size_t(r)];
          if (mine.size() >= window && *mine[mine.size() - window] != 2) return Step::blocked;
          mine.push_back(&slot);
        }
        slot = 1;
        push(a.peer);
        return Step::done;
      }
      case Op::recv_activation:
      case Op::recv_gradient: {
        const Msg m = message_of(r, a);
        auto& slot = (m.gradient ? grad_msg : act_msg)[at(m.stage, m.mb)];
        if (slot == 2) return fail(r, "this message was already received"), Step::failed;
        if (mode == SendMode::rendezvous) {
          // The sender completes the pair when it reaches its send (see above); if it is already waiting there, pair now.
          const int q = a.peer;
          if (pc[std::size_t(q)] < p.ranks[std::size_t(q)].size()) {
            const Action& sa = p.ranks[std::size_t(q)][pc[std::size_t(q)]];
            if (is_send(sa.op) && sa.peer == r) {
              const Msg sm = message_of(q, sa);
              if (sm.gradient == m.gradient && sm.stage == m.stage && sm.mb == m.mb) {
                ++pc[std::size_t(q)];
                slot = 2;
                push(q);
                return Step::done;
              }
            }
          }
          return Step::blocked;
        }
        if (slot == 0) return Step::blocked;
        slot = 2;
        if (window > 0) push(a.peer);  // the sender may wait for this message to free its send buffer
        return Step::done;
      }
    }
    return Step::failed;
  }

  constexpr void run() {
    for (int r = 0; r < P; ++r) push(r);
    std::size_t head = 0;
    while (head < queue.size() && error.empty()) {
      const int r = queue[head++];
      queued[std::size_t(r)] = 0;
      const auto& prog = p.ranks[std::size_t(r)];
      while (pc[std::size_t(r)] < prog.size()) {
        const Step st = step(r);
        if (st == Step::failed) return;
        if (st == Step::blocked) break;
        ++pc[std::size_t(r)];
      }
    }
  }

  constexpr std::string finish() {
    if (!error.empty()) return error;
    std::string blocked;
    for (int r = 0; r < P; ++r)
      if (pc[std::size_t(r)] < p.ranks[std::size_t(r)].size()) blocked += (blocked.empty() ? "" : "; ") + where(r);
    if (!blocked.empty()) return "deadlock: every remaining rank waits for a message that never comes: " + blocked;
    const std::string missing_ops[] = {"forward", "backward", "backward_weight"};
    for (int s = 0; s < S; ++s)
      for (int mb = 0; mb < N; ++mb) {
        const std::vector<char>* tabs[] = {&f, &b, &w};
        for (int k = 0; k < 3; ++k)
          if (!(*tabs[k])[at(s, mb)])
            return "incomplete: rank " + itos(stage_rank(p.config, s)) + " never runs the " + missing_ops[k] +
                   " of micro-batch " + itos(mb) + " on chunk " + itos(stage_chunk(p.config, s));
        if (act_msg[at(s, mb)] == 1)
          return "unmatched send: rank " + itos(stage_rank(p.config, s - 1)) + " sends the activation of micro-batch " +
                 itos(mb) + " to rank " + itos(stage_rank(p.config, s)) + ", which never receives it";
        if (grad_msg[at(s, mb)] == 1)
          return "unmatched send: rank " + itos(stage_rank(p.config, s + 1)) + " sends the gradient of micro-batch " +
                 itos(mb) + " to rank " + itos(stage_rank(p.config, s)) + ", which never receives it";
      }
    for (int r = 0; r < P; ++r)
      if (opt_steps[std::size_t(r)] != (p.asynchronous ? p.config.steps : 1))
        return "rank " + itos(r) + " runs " + itos(opt_steps[std::size_t(r)]) + " optimizer steps, expected " +
               itos(p.asynchronous ? p.config.steps : 1);
    return {};
  }
};

}  // namespace detail

/**
 * @brief Replays all ranks' programs together; see the file comment for what is checked. O(total actions).
 * `send_window` (SendMode::buffered only; 0: unbounded) bounds each rank's sends in flight as the executor
 * does (see SendMode). `RankPrograms` is `Programs` (a template for the compile cost only, see detail::Replay).
 */
template <class RankPrograms = Programs>
[[nodiscard]] constexpr VerifyReport verify(const RankPrograms& p, SendMode mode = SendMode::buffered,
                                            std::size_t send_window = 0) {
  VerifyReport rep;
  if (int(p.ranks.size()) != p.config.stages) {
    rep.ok = false;
    rep.error = "the programs hold " + detail::itos(static_cast<long long>(p.ranks.size())) +
                " ranks but P = " + detail::itos(p.config.stages);
    return rep;
  }
  detail::Replay<RankPrograms> rp(p, mode, send_window);
  rp.run();
  rep.error = rp.finish();
  rep.ok = rep.error.empty();
  rep.peak_activations = rp.peak;
  return rep;
}

/** @brief Verifies and throws config_error naming the schedule and the problem; returns the report when sound. */
template <class RankPrograms = Programs>
VerifyReport verify_or_throw(const RankPrograms& p, SendMode mode = SendMode::buffered) {
  VerifyReport rep = verify(p, mode);
  if (!rep.ok)
    throw config_error("pipeline schedule " + std::string(p.schedule) + " (P=" + std::to_string(p.config.stages) +
                       ", M=" + std::to_string(p.config.microbatches) + ", V=" + std::to_string(p.config.chunks) +
                       ") is invalid: " + rep.error);
  return rep;
}

}  // namespace mpar::pipeline
