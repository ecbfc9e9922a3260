#pragma once
/**
 * @file The Chrome trace of a pipeline timeline (open it in chrome://tracing or https://ui.perfetto.dev).
 * Not in the umbrella header `mpar/mpar.hpp`; `mpar/tools.hpp` includes it.
 */
#include <algorithm>
#include <string>
#include <utility>

#include "mpar/observe/chrome_trace.hpp"
#include "mpar/pipeline/timeline.hpp"

namespace mpar::pipeline {

/**
 * @brief The Chrome trace of a timeline: pid = pipeline rank, tid 0 = compute, tid 1 = communication;
 * names F3 / B3 / W3 (with `.chunk` when V > 1). `seconds_per_unit` converts timeline units to
 * seconds (1 for measured runs; for simulations the time one cost unit stands for).
 */
[[nodiscard]] inline observe::ChromeTrace to_chrome_trace(const Timeline& t, double seconds_per_unit = 1.0) {
  observe::ChromeTrace tr;
  for (int r = 0; r < t.config.stages; ++r) {
    tr.name_process(r, "pipeline rank " + std::to_string(r));
    tr.name_thread(r, 0, "compute");
    tr.name_thread(r, 1, "communication");
  }
  double t0 = t.events.empty() ? 0 : t.events.front().start;
  for (const auto& e : t.events) t0 = std::min(t0, e.start);
  for (const auto& e : t.events) {
    const bool comm = e.lane == Lane::communication;
    std::string name = comm ? std::string(op_name(e.action.op)) + " mb" + std::to_string(e.action.mb)
                            : label(e.action, t.config.chunks);
    tr.add({std::move(name),
            comm ? "p2p" : std::string(op_name(e.action.op)),
            e.rank,
            comm ? 1 : 0,
            (e.start - t0) * seconds_per_unit * 1e6,
            (e.end - e.start) * seconds_per_unit * 1e6,
            {{"microbatch", std::to_string(e.action.mb)}, {"chunk", std::to_string(e.action.chunk)}}});
  }
  return tr;
}

}  // namespace mpar::pipeline
