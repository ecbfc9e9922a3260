#pragma once
/**
 * @file A pipeline timeline — what ran where and when — shared by the simulator (predicted) and the
 * executor (measured). Its text picture is `mpar/pipeline/timeline_lanes_text.hpp` and its Chrome trace
 * `mpar/pipeline/timeline_trace.hpp`, both kept apart (and in `mpar/tools.hpp`): the renderers are a compile
 * cost every training program would pay.
 */
#include <algorithm>
#include <vector>

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

}  // namespace mpar::pipeline
