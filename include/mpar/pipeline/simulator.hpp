#pragma once
/**
 * @file The pipeline simulator: replays a schedule's programs with per-action costs and predicts the
 * timeline, the bubble, peak activation memory and throughput. This is the API the planner calls.
 *
 * Semantics are the executor's: actions run one at a time per rank; a send occupies its rank for
 * `send_overhead` and delivers `p2p_latency` after it starts; a receive waits until its message has
 * arrived (or, if it already has, takes `recv_overhead`). Sends and receives are drawn on the
 * communication lane, a receive's span including its wait. The replay is a work-list over ranks (a blocked
 * receive parks its rank, the matching send wakes it), so a step costs O(total actions): thousands
 * of ranks simulate in milliseconds.
 *
 * ```
 * auto prog = make_programs<OneFOneB>({.stages = 4, .microbatches = 8});
 * SimResult r = simulate(prog, CostModel::uniform(1, 1, 1));
 * // r.bubble_ratio == 3.0 / 11   ((P-1)/(M+P-1))
 * ```
 */
#include <algorithm>
#include <string>
#include <vector>

#include "mpar/core/error.hpp"
#include "mpar/pipeline/action.hpp"
#include "mpar/pipeline/timeline.hpp"
#include "mpar/pipeline/timeline_lanes_text.hpp"
#include "mpar/pipeline/verifier.hpp"

namespace mpar::pipeline {

/**
 * @brief Per-action costs. Each vector holds one entry per global stage (s = chunk·P + rank) or a single
 * entry used for every stage. A whole backward (`Op::backward`) costs backward_input + backward_weight.
 */
struct CostModel {
  std::vector<double> forward{1.0};
  std::vector<double> backward_input{1.0};
  std::vector<double> backward_weight{1.0};
  double p2p_latency = 0.0;    ///< from the start of a send to the moment a waiting receiver has the data
  double send_overhead = 0.0;  ///< time a send occupies its rank (issuing it; an eager copy)
  double recv_overhead = 0.0;  ///< time a receive of an already-arrived message occupies its rank
  double optimizer = 0.0;      ///< one optimizer step on one rank
  /// Each optimizer step is a barrier over the pipeline ranks: its collectives span them (a global gradient norm, a
  /// tied weight's sum between the first and last stage), as a trainer's update does. Matters only where the
  /// update sits inside a program (PipeDream-2BW without a flush); at a program's end every rank has finished.
  bool synchronous_optimizer = false;

  /** @brief The same F, B, W on every stage. */
  [[nodiscard]] static CostModel uniform(double f, double b, double w, double latency = 0.0) {
    return CostModel{{f}, {b}, {w}, latency, 0.0, 0.0, 0.0};
  }
  [[nodiscard]] double cost(Op op, int stage) const {
    auto pick = [stage](const std::vector<double>& v) {
      require(!v.empty(), "CostModel: a cost vector is empty");
      return v.size() == 1 ? v[0] : v.at(std::size_t(stage));
    };
    switch (op) {
      case Op::forward:
        return pick(forward);
      case Op::backward:
        return pick(backward_input) + pick(backward_weight);
      case Op::backward_input:
        return pick(backward_input);
      case Op::backward_weight:
        return pick(backward_weight);
      case Op::optimizer_step:
        return optimizer;
      default:
        return 0.0;
    }
  }

  /**
   * @brief Costs measured from a real run's timeline: the mean duration per (global stage, action
   * kind); a whole backward is split into B and W by `weight_share` (W's fraction of it). The p2p
   * latency is the median, over receives that were already waiting when their send started, of
   * send start to receive end; the overheads are the mean send duration and the median duration
   * of receives whose message had already arrived.
   */
  [[nodiscard]] static CostModel from_timeline(const Timeline& t, double weight_share = 0.5) {
    const int S = t.config.total_stages(), N = t.config.total_microbatches();
    std::vector<double> sum[3], cnt[3];
    for (auto& v : sum) v.assign(std::size_t(S), 0.0);
    for (auto& v : cnt) v.assign(std::size_t(S), 0.0);
    double opt = 0, nopt = 0, send_sum = 0, nsend = 0;
    // Send events by message (kind, receiving stage, mb), to pair them with their receives.
    std::vector<const TimelineEvent*> sends(std::size_t(2 * S * N), nullptr);
    auto msg = [&](const TimelineEvent& e) {
      const int s = global_stage(t.config, e.rank, e.action.chunk);
      const bool grad = e.action.op == Op::send_gradient || e.action.op == Op::recv_gradient;
      const int dst = e.action.op == Op::send_activation ? s + 1 : e.action.op == Op::send_gradient ? s - 1 : s;
      return std::size_t(((grad ? 1 : 0) * S + dst) * N + e.action.mb);
    };
    for (const auto& e : t.events) {
      const double d = e.end - e.start;
      const auto s = std::size_t(global_stage(t.config, e.rank, e.action.chunk));
      if (is_send(e.action.op)) {
        send_sum += d, nsend += 1;
        if (msg(e) < sends.size()) sends[msg(e)] = &e;
        continue;
      }
      switch (e.action.op) {
        case Op::forward:
          sum[0][s] += d, cnt[0][s] += 1;
          break;
        case Op::backward_input:
          sum[1][s] += d, cnt[1][s] += 1;
          break;
        case Op::backward_weight:
          sum[2][s] += d, cnt[2][s] += 1;
          break;
        case Op::backward:
          sum[1][s] += d * (1 - weight_share), cnt[1][s] += 1;
          sum[2][s] += d * weight_share, cnt[2][s] += 1;
          break;
        case Op::optimizer_step:
          opt += d, nopt += 1;
          break;
        default:
          break;
      }
    }
    std::vector<double> latency, ready;
    for (const auto& e : t.events) {
      if (!is_recv(e.action.op) || msg(e) >= sends.size() || sends[msg(e)] == nullptr) continue;
      const TimelineEvent& snd = *sends[msg(e)];
      if (e.start <= snd.start)
        latency.push_back(e.end - snd.start);
      else if (e.start >= snd.end)
        ready.push_back(e.end - e.start);
    }
    auto median = [](std::vector<double> v) {
      if (v.empty()) return 0.0;
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    CostModel m;
    std::vector<double>* out[3] = {&m.forward, &m.backward_input, &m.backward_weight};
    for (int k = 0; k < 3; ++k) {
      out[k]->assign(std::size_t(S), 0.0);
      for (int s = 0; s < S; ++s)
        (*out[k])[std::size_t(s)] = cnt[k][std::size_t(s)] > 0 ? sum[k][std::size_t(s)] / cnt[k][std::size_t(s)] : 0.0;
    }
    m.send_overhead = nsend > 0 ? send_sum / nsend : 0.0;
    m.p2p_latency = std::max(median(latency), m.send_overhead);
    m.recv_overhead = median(ready);
    m.optimizer = nopt > 0 ? opt / nopt : 0.0;
    return m;
  }
};

/** @brief What a simulated (or measured) step looks like. Times in the cost model's units. */
struct SimResult {
  Timeline timeline;
  double makespan = 0;       ///< first start to last end over all ranks
  std::vector<double> busy;  ///< per rank: time on the compute lane
  std::vector<double> idle;  ///< per rank: makespan - busy
  std::vector<double> span;  ///< per rank: its last compute's end - its first compute's start
  double bubble_time = 0;    ///< makespan - the busiest rank's work: (P-1)(F+B+W) for 1F1B
  double bubble_ratio = 0;   ///< sum of idle / (P · makespan): (P-1)/(M+P-1) for uniform 1F1B
  double steady_bubble_time =
      0;  ///< max over ranks of span - busy: the bubble when consecutive steps overlap (ZB-H2's parallelogram)
  std::vector<int> peak_activations;  ///< per rank, in (micro-batch, chunk) activations
  double peak_memory_microbatches =
      0;                  ///< max over ranks of peak_activations / V (a chunk holds 1/V of a rank's layers)
  double throughput = 0;  ///< micro-batches per time unit

  /** @brief The compute lanes as text. */
  [[nodiscard]] std::string text(double unit = 0, int max_width = 200) const {
    return text_timeline(timeline, unit, max_width);
  }
};

namespace detail {
/** Fills the summary fields of a result from its timeline. */
inline void summarise(SimResult& r) {
  const auto& t = r.timeline;
  const int P = t.config.stages;
  std::vector<double> first(std::size_t(P), 0), last(std::size_t(P), 0);
  std::vector<char> seen(std::size_t(P), 0);
  r.busy.assign(std::size_t(P), 0);
  double lo = 0, hi = 0;
  bool any = false;
  for (const auto& e : t.events) {
    const auto ur = std::size_t(e.rank);
    if (e.lane == Lane::compute) {
      r.busy[ur] += e.end - e.start;
      first[ur] = seen[ur] ? std::min(first[ur], e.start) : e.start;
      last[ur] = seen[ur] ? std::max(last[ur], e.end) : e.end;
      seen[ur] = 1;
    }
    lo = any ? std::min(lo, e.start) : e.start;
    hi = any ? std::max(hi, e.end) : e.end;
    any = true;
  }
  r.makespan = hi - lo;
  r.idle.assign(std::size_t(P), 0);
  r.span.assign(std::size_t(P), 0);
  double idle_sum = 0, max_busy = 0;
  r.steady_bubble_time = 0;
  for (int k = 0; k < P; ++k) {
    const auto u = std::size_t(k);
    r.idle[u] = r.makespan - r.busy[u];
    r.span[u] = last[u] - first[u];
    idle_sum += r.idle[u];
    max_busy = std::max(max_busy, r.busy[u]);
    r.steady_bubble_time = std::max(r.steady_bubble_time, r.span[u] - r.busy[u]);
  }
  r.bubble_time = r.makespan - max_busy;
  r.bubble_ratio = r.makespan > 0 ? idle_sum / (P * r.makespan) : 0;
  r.throughput = r.makespan > 0 ? t.config.total_microbatches() / r.makespan : 0;
}
}  // namespace detail

/**
 * @brief Replays `p` with `costs`. Throws config_error (with the verifier's message naming the
 * blocked ranks and actions) when the programs deadlock or break a dependency.
 */
[[nodiscard]] inline SimResult simulate(const Programs& p, const CostModel& costs) {
  const ScheduleConfig& c = p.config;
  const int P = c.stages, S = c.total_stages(), N = c.total_microbatches();
  require(int(p.ranks.size()) == P, "simulate: programs for ", p.ranks.size(), " ranks but P = ", P);
  SimResult res;
  res.timeline.config = c;
  res.timeline.events.reserve(p.total_actions());
  const auto sn = std::size_t(S) * std::size_t(N);
  std::vector<double> act_arrival(sn, -1.0), grad_arrival(sn, -1.0);
  std::vector<double> clock(std::size_t(P), 0.0);
  std::vector<std::size_t> pc(std::size_t(P), 0);
  std::vector<int> inflight(std::size_t(P), 0);
  res.peak_activations.assign(std::size_t(P), 0);
  std::vector<int> queue;
  std::vector<char> queued(std::size_t(P), 1);
  for (int r = 0; r < P; ++r) queue.push_back(r);
  auto at = [N](int s, int mb) { return std::size_t(s) * std::size_t(N) + std::size_t(mb); };
  // CostModel::synchronous_optimizer: per optimizer step (batch), the ranks arrived and the latest arrival.
  std::vector<int> arrived(std::size_t(std::max(1, c.steps)), 0), arrived_at(std::size_t(P), -1);
  std::vector<double> latest(arrived.size(), 0.0);
  for (std::size_t head = 0; head < queue.size(); ++head) {
    const int r = queue[head];
    const auto ur = std::size_t(r);
    queued[ur] = 0;
    const auto& prog = p.ranks[ur];
    while (pc[ur] < prog.size()) {
      const Action& a = prog[pc[ur]];
      const int s = global_stage(c, r, a.chunk);
      if (a.mb < 0 || a.mb >= N || a.chunk < 0 || a.chunk >= c.chunks) break;  // the verifier names it below
      if (is_recv(a.op)) {
        const double arr = (a.op == Op::recv_activation ? act_arrival : grad_arrival)[at(s, a.mb)];
        if (arr < 0) break;  // parked until the sender runs
        // Waiting for a message in flight ends at its arrival; an arrived message costs the copy.
        const double done = arr > clock[ur] ? arr : clock[ur] + costs.recv_overhead;
        res.timeline.events.push_back({r, Lane::communication, a, clock[ur], done});
        clock[ur] = done;
      } else if (is_send(a.op)) {
        const bool grad = a.op == Op::send_gradient;
        const int dst = grad ? s - 1 : s + 1;
        if (dst < 0 || dst >= S) break;
        (grad ? grad_arrival : act_arrival)[at(dst, a.mb)] =
            clock[ur] + std::max(costs.p2p_latency, costs.send_overhead);
        res.timeline.events.push_back({r, Lane::communication, a, clock[ur], clock[ur] + costs.send_overhead});
        clock[ur] += costs.send_overhead;
        const auto q = std::size_t(stage_rank(c, dst));
        if (!queued[q]) {
          queued[q] = 1;
          queue.push_back(int(q));
        }
      } else if (a.op == Op::optimizer_step && costs.synchronous_optimizer) {
        const auto b = std::size_t(std::clamp(a.mb, 0, int(arrived.size()) - 1));
        if (arrived_at[ur] != int(b)) {  // first visit: arrive, and release everyone when the last one does
          arrived_at[ur] = int(b);
          latest[b] = arrived[b]++ == 0 ? clock[ur] : std::max(latest[b], clock[ur]);
          if (arrived[b] == P)
            for (int q = 0; q < P; ++q)
              if (!queued[std::size_t(q)] && q != r) {
                queued[std::size_t(q)] = 1;
                queue.push_back(q);
              }
        }
        if (arrived[b] < P) break;  // parked until the last rank arrives
        const double d = costs.cost(a.op, s);
        res.timeline.events.push_back({r, Lane::compute, a, latest[b], latest[b] + d});
        clock[ur] = latest[b] + d;
      } else {
        const double d = costs.cost(a.op, s);
        res.timeline.events.push_back({r, Lane::compute, a, clock[ur], clock[ur] + d});
        clock[ur] += d;
        if (a.op == Op::forward && ++inflight[ur] > res.peak_activations[ur]) res.peak_activations[ur] = inflight[ur];
        if (a.op == Op::backward || a.op == Op::backward_input) --inflight[ur];
      }
      ++pc[ur];
    }
  }
  for (int r = 0; r < P; ++r)
    if (pc[std::size_t(r)] < p.ranks[std::size_t(r)].size()) {
      const VerifyReport v = verify(p);
      throw config_error("simulate: schedule " + std::string(p.schedule) +
                         " cannot run: " + (v.ok ? std::string("rank ") + std::to_string(r) + " is stuck" : v.error));
    }
  detail::summarise(res);
  int peak = 0;
  for (int x : res.peak_activations) peak = std::max(peak, x);
  res.peak_memory_microbatches = double(peak) / c.chunks;
  return res;
}

/**
 * @brief The bubble of one run of `p` as a count: idle slots summed over the ranks, where a forward takes one
 * slot, a whole backward two (a split one B and W one each), the optimizer and messages none; divided by the
 * optimizer steps the program covers. It depends on the order of the programs only, so a trainer reports it
 * for the programs it runs and a planner predicts it from the same programs: 1F1B has 3 (P-1) per rank.
 * `synchronous_optimizer`: each optimizer step is a barrier over the ranks (CostModel::synchronous_optimizer).
 */
[[nodiscard]] inline double idle_slots(const Programs& p, bool synchronous_optimizer = false) {
  CostModel unit = CostModel::uniform(1, 1, 1);
  unit.optimizer = 0;
  unit.synchronous_optimizer = synchronous_optimizer;
  const SimResult r = simulate(p, unit);
  double idle = 0;
  for (double x : r.idle) idle += x;
  return idle / double(std::max(1, p.config.steps));
}

}  // namespace mpar::pipeline
