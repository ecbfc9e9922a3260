#pragma once
/**
 * @file Schedule types: GPipe, 1F1B (PipeDream-Flush), interleaved 1F1B, ZB-H1, ZB-H2 and PipeDream-2BW.
 *
 * Each type turns a ScheduleConfig into every rank's Programs. Everything is `constexpr` (C++20
 * transient std::vector), so a configuration known at compile time is built and verified by the
 * compiler (see StaticSchedule in static_schedule.hpp); a dynamic one is built and verified before
 * the first step.
 *
 * Communication placement (ScheduleConfig::placement): `lazy` (default) puts each receive right
 * before its consumer and each send right after its producer — deadlock-free with asynchronous
 * sends (isend, what the executor does); `ordered` puts every message at one position of a global
 * order in both programs — deadlock-free with blocking (rendezvous) sends as well. The verifier
 * checks either semantics.
 */
#include <algorithm>
#include <concepts>
#include <string>
#include <string_view>
#include <vector>

#include "mpar/core/error.hpp"
#include "mpar/pipeline/action.hpp"
#include "mpar/pipeline/pipeline_schedule.hpp"
#include "mpar/pipeline/schedule_kind.hpp"

namespace mpar::pipeline {

namespace detail {

/** Checks shared by every schedule; returns "" or the reason. */
constexpr std::string check_common(std::string_view name, const ScheduleConfig& c, bool supports_chunks) {
  std::string n(name);
  if (c.stages < 1) return n + ": P (stages) must be at least 1, got " + itos(c.stages);
  if (c.microbatches < 1) return n + ": M (micro-batches) must be at least 1, got " + itos(c.microbatches);
  if (c.chunks < 1) return n + ": V (chunks per rank) must be at least 1, got " + itos(c.chunks);
  if (c.steps < 1) return n + ": steps must be at least 1, got " + itos(c.steps);
  if (!supports_chunks && c.chunks != 1)
    return n + ": this schedule runs one chunk per rank (V = 1), got V = " + itos(c.chunks) +
           "; use interleaved_1f1b for virtual stages";
  return {};
}

/**
 * CommPlacement::lazy: each receive right before the compute that consumes it, each send right
 * after the compute that produces it — the least waiting with asynchronous sends.
 */
constexpr Programs assemble_lazy(std::string_view name, const ScheduleConfig& c, bool split, bool async,
                                 const std::vector<std::vector<Action>>& compute) {
  Programs out{name, c, split, async, {}};
  out.ranks.resize(static_cast<std::size_t>(c.stages));
  const int S = c.total_stages();
  for (int r = 0; r < c.stages; ++r) {
    auto& prog = out.ranks[std::size_t(r)];
    for (const Action& a : compute[std::size_t(r)]) {
      const int s = global_stage(c, r, a.chunk);
      const bool prev_remote = s > 0 && stage_rank(c, s - 1) != r;
      const bool next_remote = s < S - 1 && stage_rank(c, s + 1) != r;
      switch (a.op) {
        case Op::forward:
          if (prev_remote) prog.push_back({Op::recv_activation, a.mb, a.chunk, stage_rank(c, s - 1)});
          prog.push_back(a);
          if (next_remote) prog.push_back({Op::send_activation, a.mb, a.chunk, stage_rank(c, s + 1)});
          break;
        case Op::backward:
        case Op::backward_input:
          if (next_remote) prog.push_back({Op::recv_gradient, a.mb, a.chunk, stage_rank(c, s + 1)});
          prog.push_back(a);
          if (prev_remote) prog.push_back({Op::send_gradient, a.mb, a.chunk, stage_rank(c, s - 1)});
          break;
        default:
          prog.push_back(a);
      }
    }
    if (!async) prog.push_back({Op::optimizer_step, 0, 0, -1});
  }
  return out;
}

/**
 * CommPlacement::ordered: turns per-rank compute orders into full programs by placing the sends and receives.
 *
 * The compute orders are first replayed with unit costs (F = B = W = 1, a whole backward 2) to give
 * every compute a start time and every message the time `k` its producer finishes. Each message is
 * then placed in *both* its sender's and its receiver's program right before the first compute
 * that starts at or after `k`, messages at equal `k` ordered by one global key. So every rank meets
 * its messages in one global order, which makes the programs deadlock-free even with blocking
 * (rendezvous) sends: the earliest unfinished message has both ends reachable, because everything
 * before it on either rank is either an earlier message or a compute whose inputs are earlier
 * messages. The send still follows its producer (which ends at k) and the receive still precedes
 * its consumer (which starts at or after k), so the buffered semantics hold as well.
 */
constexpr Programs assemble_ordered(std::string_view name, const ScheduleConfig& c, bool split, bool async,
                                    const std::vector<std::vector<Action>>& compute) {
  const int P = c.stages, S = c.total_stages(), N = c.total_microbatches();
  constexpr long long unknown = -1;
  const auto sn = static_cast<std::size_t>(S) * static_cast<std::size_t>(N);
  std::vector<long long> f_end(sn, unknown), b_end(sn, unknown);
  auto at = [N](int s, int mb) {
    return static_cast<std::size_t>(s) * static_cast<std::size_t>(N) + static_cast<std::size_t>(mb);
  };
  // 1. Unit-cost replay of the compute orders (each pass advances every rank as far as it can).
  std::vector<std::vector<long long>> start(static_cast<std::size_t>(P));
  std::vector<std::size_t> next(static_cast<std::size_t>(P), 0);
  std::vector<long long> clock(static_cast<std::size_t>(P), 0);
  for (int r = 0; r < P; ++r) start[std::size_t(r)].assign(compute[std::size_t(r)].size(), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      const auto ur = std::size_t(r);
      while (next[ur] < compute[ur].size()) {
        const Action& a = compute[ur][next[ur]];
        const int s = global_stage(c, r, a.chunk);
        long long ready = clock[ur];
        if (a.op == Op::forward && s > 0) {
          if (f_end[at(s - 1, a.mb)] == unknown) break;
          ready = std::max(ready, f_end[at(s - 1, a.mb)]);
        }
        if ((a.op == Op::backward || a.op == Op::backward_input) && s < S - 1) {
          if (b_end[at(s + 1, a.mb)] == unknown) break;
          ready = std::max(ready, b_end[at(s + 1, a.mb)]);
        }
        const long long cost = a.op == Op::backward && !split ? 2 : 1;
        start[ur][next[ur]] = ready;
        clock[ur] = ready + cost;
        if (a.op == Op::forward) f_end[at(s, a.mb)] = clock[ur];
        if (a.op == Op::backward || a.op == Op::backward_input) b_end[at(s, a.mb)] = clock[ur];
        ++next[ur];
        progress = true;
      }
    }
  }
  // (Orders that cannot complete are still assembled; the verifier then names the stuck ranks.)
  // 2. Every rank's items: computes keyed by (start, 1), messages by (k, 0, global key).
  struct Item {
    long long time;
    int kind;  // 0 message, 1 compute
    long long key;
    Action action;
  };
  std::vector<std::vector<Item>> items(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) {
    const auto ur = std::size_t(r);
    for (std::size_t i = 0; i < compute[ur].size(); ++i) {
      const Action& a = compute[ur][i];
      const long long t = i < next[ur] ? start[ur][i] : (1ll << 60) + static_cast<long long>(i);
      items[ur].push_back({t, 1, 0, a});
      const int s = global_stage(c, r, a.chunk);
      const bool fwd = a.op == Op::forward, bwd = a.op == Op::backward || a.op == Op::backward_input;
      const int dst = fwd ? s + 1 : s - 1;
      if (!(fwd || bwd) || dst < 0 || dst >= S || stage_rank(c, dst) == r) continue;
      const int q = stage_rank(c, dst);
      const long long k = i < next[ur] ? (fwd ? f_end : b_end)[at(s, a.mb)] : (1ll << 60) + static_cast<long long>(i);
      const long long key = (static_cast<long long>(fwd ? 0 : 1) * S + dst) * N + a.mb;
      items[ur].push_back({k, 0, key, {fwd ? Op::send_activation : Op::send_gradient, a.mb, a.chunk, q}});
      items[std::size_t(q)].push_back(
          {k, 0, key, {fwd ? Op::recv_activation : Op::recv_gradient, a.mb, stage_chunk(c, dst), r}});
    }
  }
  Programs out{name, c, split, async, {}};
  out.ranks.resize(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) {
    auto& v = items[std::size_t(r)];
    std::sort(v.begin(), v.end(), [](const Item& x, const Item& y) {  // a total order: keys are unique per rank
      if (x.time != y.time) return x.time < y.time;
      if (x.kind != y.kind) return x.kind < y.kind;
      return x.key < y.key;
    });
    auto& prog = out.ranks[std::size_t(r)];
    for (const Item& it : v) prog.push_back(it.action);
    if (!async) prog.push_back({Op::optimizer_step, 0, 0, -1});
  }
  return out;
}

/** Places the communication as `c.placement` asks. */
constexpr Programs assemble(std::string_view name, const ScheduleConfig& c, bool split, bool async,
                            const std::vector<std::vector<Action>>& compute) {
  // (if/else rather than ?: — GCC 12's constant evaluator mishandles the conditional's temporary)
  if (c.placement == CommPlacement::ordered) return assemble_ordered(name, c, split, async, compute);
  return assemble_lazy(name, c, split, async, compute);
}

/** 1F1B order over `total` micro-batches for rank r: P-r-1 warm-up forwards, then alternate, then drain. */
constexpr std::vector<Action> one_f_one_b_order(int P, int r, int total) {
  std::vector<Action> v;
  const int warm = std::min(P - r - 1, total);
  for (int i = 0; i < warm; ++i) v.push_back({Op::forward, i, 0, -1});
  for (int i = 0; i < total - warm; ++i) {
    v.push_back({Op::forward, warm + i, 0, -1});
    v.push_back({Op::backward, i, 0, -1});
  }
  for (int i = std::max(total - warm, 0); i < total; ++i) v.push_back({Op::backward, i, 0, -1});
  return v;
}

/**
 * Zero-bubble orders (B and W split), built the way the paper hand-crafts them: a list schedule
 * under unit costs F = B = W = 1. The F/B sequence of each rank is fixed in advance — `warm`
 * forwards, then B and F alternating, then the remaining B — and a rank fills every moment in
 * which its next F or B is not ready with a deferred W (oldest first); W passes nobody waited for
 * run at the end. A forward waits (running a W instead) while `cap` micro-batches still wait for
 * their W, which bounds the memory W passes hold. ZB-H1 keeps 1F1B's warm-up (P - r forwards before the first B: the memory of
 * 1F1B); ZB-H2 warms up with 2(P - r) - 1 forwards, holding up to 2P - 1 activations to fill the
 * warm-up bubble as well.
 */
constexpr std::vector<std::vector<Action>> zero_bubble_orders(const ScheduleConfig& c, bool h2) {
  const int P = c.stages, M = c.microbatches;
  std::vector<std::vector<Action>> order(static_cast<std::size_t>(P));
  // The fixed F/B sequence per rank.
  std::vector<std::vector<Action>> fb(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r) {
    auto& v = fb[std::size_t(r)];
    const int warm = std::min(M, h2 ? 2 * (P - r) - 1 : P - r);
    for (int i = 0; i < warm; ++i) v.push_back({Op::forward, i, 0, -1});
    for (int i = 0; i < M; ++i) {
      v.push_back({Op::backward_input, i, 0, -1});
      if (warm + i < M) v.push_back({Op::forward, warm + i, 0, -1});
    }
  }
  constexpr int never = 1 << 30;
  std::vector<int> f_done(static_cast<std::size_t>(P * M), never), b_done(f_done);
  std::vector<std::size_t> next(static_cast<std::size_t>(P), 0);
  std::vector<int> next_w(static_cast<std::size_t>(P), 0), b_count(next_w);
  auto at = [M](int s, int mb) { return std::size_t(s * M + mb); };
  const int cap = h2 ? 2 * P - 1 : P;
  int remaining = 3 * P * M;
  for (int t = 0; remaining > 0; ++t) {
    for (int r = 0; r < P; ++r) {
      const auto ur = std::size_t(r);
      bool ran = false;
      if (next[ur] < fb[ur].size()) {
        const Action a = fb[ur][next[ur]];
        // Memory cap: a forward may not start while `cap` micro-batches still hold activations for their W.
        const bool over_cap = a.op == Op::forward && a.mb - next_w[ur] >= cap && next_w[ur] < b_count[ur];
        const bool ready = !over_cap && (a.op == Op::forward ? (r == 0 || f_done[at(r - 1, a.mb)] <= t)
                                                             : (r == P - 1 || b_done[at(r + 1, a.mb)] <= t));
        if (ready) {
          order[ur].push_back(a);
          (a.op == Op::forward ? f_done : b_done)[at(r, a.mb)] = t + 1;
          if (a.op == Op::backward_input) ++b_count[ur];
          ++next[ur];
          ran = true;
        }
      }
      if (!ran && next_w[ur] < b_count[ur]) {
        order[ur].push_back({Op::backward_weight, next_w[ur]++, 0, -1});
        ran = true;
      }
      if (ran) --remaining;
    }
  }
  return order;
}

}  // namespace detail

/** @brief GPipe: all forwards, then all backwards, then the optimizer step (flush). Peak activations M. */
struct GPipe {
  static constexpr std::string_view name = "gpipe";
  static constexpr bool split_backward = false, asynchronous = false, supports_chunks = false;
  static constexpr std::string check(const ScheduleConfig& c) { return detail::check_common(name, c, supports_chunks); }
  static constexpr Programs build(const ScheduleConfig& c) {
    std::vector<std::vector<Action>> order(std::size_t(c.stages));
    for (auto& o : order) {
      for (int i = 0; i < c.microbatches; ++i) o.push_back({Op::forward, i, 0, -1});
      for (int i = 0; i < c.microbatches; ++i) o.push_back({Op::backward, i, 0, -1});
    }
    return detail::assemble(name, c, false, false, order);
  }
};

/** @brief 1F1B (PipeDream-Flush): P-r-1 warm-up forwards, one forward one backward, drain, flush. Peak activations P. */
struct OneFOneB {
  static constexpr std::string_view name = "1f1b";
  static constexpr bool split_backward = false, asynchronous = false, supports_chunks = false;
  static constexpr std::string check(const ScheduleConfig& c) { return detail::check_common(name, c, supports_chunks); }
  static constexpr Programs build(const ScheduleConfig& c) {
    std::vector<std::vector<Action>> order;
    for (int r = 0; r < c.stages; ++r) order.push_back(detail::one_f_one_b_order(c.stages, r, c.microbatches));
    return detail::assemble(name, c, false, false, order);
  }
};

/**
 * @brief Interleaved 1F1B (Megatron-LM): V chunks per rank, micro-batches advance in groups of P
 * through the chunks; the bubble shrinks by V at the price of V times more messages. Needs M a multiple of P.
 */
struct Interleaved1F1B {
  static constexpr std::string_view name = "interleaved_1f1b";
  static constexpr bool split_backward = false, asynchronous = false, supports_chunks = true;
  static constexpr std::string check(const ScheduleConfig& c) {
    if (auto e = detail::check_common(name, c, supports_chunks); !e.empty()) return e;
    if (c.microbatches % c.stages != 0)
      return std::string(name) +
             ": M (micro-batches) must be a multiple of P (stages); got M = " + detail::itos(c.microbatches) +
             ", P = " + detail::itos(c.stages) +
             "; use M = " + detail::itos((c.microbatches / c.stages + 1) * c.stages);
    return {};
  }
  static constexpr Programs build(const ScheduleConfig& c) {
    const int P = c.stages, M = c.microbatches, V = c.chunks, total = M * V;
    // Virtual micro-batch k: groups of P micro-batches sweep the chunks in order (backward: reverse order).
    auto mb_of = [&](int k) { return (k / (P * V)) * P + k % P; };
    auto fchunk = [&](int k) { return (k / P) % V; };
    auto bchunk = [&](int k) { return V - 1 - (k / P) % V; };
    std::vector<std::vector<Action>> order(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) {
      auto& o = order[std::size_t(r)];
      // Megatron's warm-up: enough chunk forwards that the first backward finds its gradient ready.
      const int warm = V == 1   ? std::min(P - r - 1, total)
                       : M == P ? total
                                : std::min((P - r - 1) * 2 + (V - 1) * P, total);
      for (int k = 0; k < warm; ++k) o.push_back({Op::forward, mb_of(k), fchunk(k), -1});
      for (int i = 0; i < total - warm; ++i) {
        o.push_back({Op::forward, mb_of(warm + i), fchunk(warm + i), -1});
        o.push_back({Op::backward, mb_of(i), bchunk(i), -1});
      }
      for (int k = total - warm; k < total; ++k) o.push_back({Op::backward, mb_of(k), bchunk(k), -1});
    }
    return detail::assemble(name, c, false, false, order);
  }
};

/** @brief ZB-H1 (zero bubble, 1F1B memory): backward split into B and W, W deferred into the bubble. */
struct ZBH1 {
  static constexpr std::string_view name = "zb_h1";
  static constexpr bool split_backward = true, asynchronous = false, supports_chunks = false;
  static constexpr std::string check(const ScheduleConfig& c) { return detail::check_common(name, c, supports_chunks); }
  static constexpr Programs build(const ScheduleConfig& c) {
    return detail::assemble(name, c, true, false, detail::zero_bubble_orders(c, false));
  }
};

/** @brief ZB-H2: like ZB-H1 but with up to 2P-1 activations held, filling the warm-up bubble too. */
struct ZBH2 {
  static constexpr std::string_view name = "zb_h2";
  static constexpr bool split_backward = true, asynchronous = false, supports_chunks = false;
  static constexpr std::string check(const ScheduleConfig& c) { return detail::check_common(name, c, supports_chunks); }
  static constexpr Programs build(const ScheduleConfig& c) {
    return detail::assemble(name, c, true, false, detail::zero_bubble_orders(c, true));
  }
};

/**
 * @brief PipeDream-2BW: 1F1B over `steps`·M micro-batches with no flush. Each stage keeps two weight
 * versions: a micro-batch's backward uses the version its forward used, and the optimizer step of
 * batch t (after the stage's last backward of that batch) produces the version later forwards use.
 * Needs M ≥ P so that at most two versions are ever alive.
 */
struct PipeDream2BW {
  static constexpr std::string_view name = "2bw";
  static constexpr bool split_backward = false, asynchronous = true, supports_chunks = false;
  /// The most optimizer steps `train_gpt` runs as one program (`GptTrainer::train_steps`), and what the planner
  /// times: the flush between programs is paid once in this many steps.
  static constexpr int steps_per_program = 16;
  static constexpr std::string check(const ScheduleConfig& c) {
    if (auto e = detail::check_common(name, c, supports_chunks); !e.empty()) return e;
    if (c.microbatches < c.stages)
      return std::string(name) +
             ": M (micro-batches per weight update) must be at least P (stages) so that two "
             "weight versions suffice; got M = " +
             detail::itos(c.microbatches) + ", P = " + detail::itos(c.stages);
    return {};
  }
  static constexpr Programs build(const ScheduleConfig& c) {
    std::vector<std::vector<Action>> order;
    for (int r = 0; r < c.stages; ++r) {
      std::vector<Action> o;
      for (const Action& a : detail::one_f_one_b_order(c.stages, r, c.total_microbatches())) {
        o.push_back(a);
        if (a.op == Op::backward && a.mb % c.microbatches == c.microbatches - 1)
          o.push_back({Op::optimizer_step, a.mb / c.microbatches, 0, -1});
      }
      order.push_back(std::move(o));
    }
    return detail::assemble(name, c, false, true, order);
  }
};

static_assert(pipeline_schedule<GPipe> && pipeline_schedule<OneFOneB> && pipeline_schedule<Interleaved1F1B> &&
              pipeline_schedule<ZBH1> && pipeline_schedule<ZBH2> && pipeline_schedule<PipeDream2BW>);

/** @brief Builds schedule `S`'s programs, throwing config_error with the schedule's sentence when `c` is invalid. */
template <pipeline_schedule S>
[[nodiscard]] Programs make_programs(const ScheduleConfig& c) {
  const std::string err = S::check(c);
  if (!err.empty()) throw config_error(err);
  return S::build(c);
}

/** @brief The names `make_programs(name, c)` accepts. */
inline constexpr std::string_view schedule_names[] = {GPipe::name, OneFOneB::name, Interleaved1F1B::name,
                                                      ZBH1::name,  ZBH2::name,     PipeDream2BW::name};
static_assert(schedule_name(ScheduleKind::gpipe) == GPipe::name &&
                  schedule_name(ScheduleKind::one_f_one_b) == OneFOneB::name &&
                  schedule_name(ScheduleKind::interleaved) == Interleaved1F1B::name &&
                  schedule_name(ScheduleKind::zb_h1) == ZBH1::name &&
                  schedule_name(ScheduleKind::zb_h2) == ZBH2::name &&
                  schedule_name(ScheduleKind::two_bw) == PipeDream2BW::name,
              "ScheduleKind's names are the schedule types' names");

/** @brief Builds programs for a schedule chosen at run time. */
[[nodiscard]] inline Programs make_programs(ScheduleKind kind, const ScheduleConfig& c) {
  switch (kind) {
    case ScheduleKind::gpipe:
      return make_programs<GPipe>(c);
    case ScheduleKind::one_f_one_b:
      return make_programs<OneFOneB>(c);
    case ScheduleKind::interleaved:
      return make_programs<Interleaved1F1B>(c);
    case ScheduleKind::zb_h1:
      return make_programs<ZBH1>(c);
    case ScheduleKind::zb_h2:
      return make_programs<ZBH2>(c);
    case ScheduleKind::two_bw:
      return make_programs<PipeDream2BW>(c);
  }
  throw config_error("make_programs: not a ScheduleKind");
}

/** @brief The schedule named `name` (gpipe, 1f1b, interleaved_1f1b, zb_h1, zb_h2, 2bw); throws naming the choices. */
[[nodiscard]] inline ScheduleKind schedule_kind(std::string_view name) {
  if (auto k = parse_schedule(name)) return *k;
  std::string known;
  for (auto n : schedule_names) known += std::string(known.empty() ? "" : ", ") + std::string(n);
  throw config_error("unknown pipeline schedule '" + std::string(name) + "'; known: " + known);
}

/** @brief Builds programs for a schedule chosen at run time by name (gpipe, 1f1b, interleaved_1f1b, zb_h1, zb_h2, 2bw). */
[[nodiscard]] inline Programs make_programs(std::string_view name, const ScheduleConfig& c) {
  return make_programs(schedule_kind(name), c);
}

}  // namespace mpar::pipeline
