#pragma once
/**
 * @file text_timeline: a pipeline timeline's compute lanes as text, one line per rank. Kept out of
 * `mpar/pipeline/timeline.hpp` (which the executor needs) because only tools, examples and tests draw it;
 * in `mpar/tools.hpp`.
 */
#include <algorithm>
#include <string>
#include <vector>

#include "mpar/observe/text_timeline.hpp"
#include "mpar/pipeline/action.hpp"
#include "mpar/pipeline/timeline.hpp"

namespace mpar::pipeline {

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
