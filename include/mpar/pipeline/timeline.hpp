#pragma once
/**
 * @file A pipeline timeline — what ran where and when — shared by the simulator (predicted) and the
 * executor (measured), with its text picture. Its Chrome trace is `mpar/pipeline/timeline_trace.hpp`
 * (kept apart: the trace writer's file streams are a compile cost every training program would pay).
 */
#include <algorithm>
#include <string>
#include <vector>

#include "mpar/observe/text_timeline.hpp"
#include "mpar/pipeline/action.hpp"

namespace mpar::pipeline {

/** @brief Which row of a rank an event belongs to. */
enum class Lane : int { compute = 0, communication = 1 };

/** @brief One action that ran on `rank`, from `start` to `end` (seconds for measured runs, cost units for simulations). */
struct TimelineEvent {
  int rank = 0;
  Lane lane = Lane::compute;
  Action action;
  double start = 0;
  double end = 0;
};

/** @brief Every event of one step plus the configuration that produced them. */
struct Timeline {
  ScheduleConfig config;
  std::vector<TimelineEvent> events;

  [[nodiscard]] double makespan() const {
    double lo = 0, hi = 0;
    bool first = true;
    for (const auto& e : events) {
      lo = first ? e.start : std::min(lo, e.start);
      hi = first ? e.end : std::max(hi, e.end);
      first = false;
    }
    return hi - lo;
  }
};

/**
 * @brief The compute lanes as text, one line per rank. `unit` is the time one cell stands for
 * (0: the shortest compute action), so with uniform costs every F is one cell.
 */
[[nodiscard]] inline std::string text_timeline(const Timeline& t, double unit = 0, int max_width = 200) {
  std::vector<observe::TimelineSpan> spans;
  double t0 = 0, shortest = 0;
  bool first = true;
  for (const auto& e : t.events) {
    t0 = first ? e.start : std::min(t0, e.start);
    first = false;
  }
  for (const auto& e : t.events) {
    if (e.lane != Lane::compute || e.end <= e.start) continue;
    spans.push_back({e.rank, e.start - t0, e.end - t0, label(e.action, t.config.chunks)});
    shortest = shortest == 0 ? e.end - e.start : std::min(shortest, e.end - e.start);
  }
  std::vector<std::string> rows;
  for (int r = 0; r < t.config.stages; ++r) rows.push_back("rank " + std::to_string(r));
  const int cell = t.config.chunks > 1 ? 5 : (t.config.total_microbatches() > 10 ? 4 : 3);
  return observe::render_text_timeline(rows, spans, unit > 0 ? unit : shortest, cell, max_width);
}

}  // namespace mpar::pipeline
