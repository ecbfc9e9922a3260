// pipeline_sim: build a schedule's programs, verify them, simulate them with per-action costs and
// print the bubble, the peak activation memory and the text timeline; optionally write a Chrome
// trace (open it in https://ui.perfetto.dev or chrome://tracing).
//
//   pipeline_sim --schedule zb_h1 --stages 4 --microbatches 8 --cost-f 1 --cost-b 1 --cost-w 1 --trace zb.json
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "mpar/pipeline.hpp"
#include "mpar/pipeline/simulator.hpp"
#include "mpar/pipeline/timeline_trace.hpp"

namespace {
void usage() {
  std::cout << "usage: pipeline_sim [--schedule NAME] [--stages P] [--microbatches M] [--chunks V] [--steps K]\n"
               "                    [--cost-f F] [--cost-b B] [--cost-w W] [--latency L] [--trace FILE]\n"
               "                    [--placement lazy|ordered] [--width COLUMNS] [--no-timeline]\n"
               "schedules:";
  for (auto n : mpar::pipeline::schedule_names) std::cout << ' ' << n;
  std::cout << "\ncosts are per chunk and per micro-batch (B: backward for inputs, W: for weights; the unsplit "
               "backward costs B+W)\n";
}
}  // namespace

int main(int argc, char** argv) {
  using namespace mpar::pipeline;
  std::string schedule = "1f1b", trace;
  ScheduleConfig cfg{4, 8, 1, 1};
  double f = 1, b = 1, w = 1, latency = 0;
  int width = 200;
  bool timeline = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "pipeline_sim: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--schedule")
      schedule = next();
    else if (a == "--stages")
      cfg.stages = std::stoi(next());
    else if (a == "--microbatches")
      cfg.microbatches = std::stoi(next());
    else if (a == "--chunks")
      cfg.chunks = std::stoi(next());
    else if (a == "--steps")
      cfg.steps = std::stoi(next());
    else if (a == "--cost-f")
      f = std::stod(next());
    else if (a == "--cost-b")
      b = std::stod(next());
    else if (a == "--cost-w")
      w = std::stod(next());
    else if (a == "--latency")
      latency = std::stod(next());
    else if (a == "--trace")
      trace = next();
    else if (a == "--width")
      width = std::stoi(next());
    else if (a == "--placement")
      cfg.placement = next() == "ordered" ? CommPlacement::ordered : CommPlacement::lazy;
    else if (a == "--no-timeline")
      timeline = false;
    else {
      usage();
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  try {
    const Programs prog = make_programs(schedule, cfg);
    const VerifyReport rep = verify_or_throw(prog);
    const bool blocking_safe = verify(prog, SendMode::rendezvous).ok;
    const bool nccl_safe = verify(prog, SendMode::grouped).ok;
    const SimResult r = simulate(prog, CostModel::uniform(f, b, w, latency));
    std::printf("schedule %s  P=%d M=%d V=%d%s  costs F=%g B=%g W=%g latency=%g\n", std::string(prog.schedule).c_str(),
                cfg.stages, cfg.microbatches, cfg.chunks,
                prog.asynchronous ? (" steps=" + std::to_string(cfg.steps)).c_str() : "", f, b, w, latency);
    std::printf("verified: %zu actions, no deadlock, every send matched (%s; %s)\n", prog.total_actions(),
                blocking_safe ? "also with blocking sends"
                              : "with blocking sends it would deadlock; --placement ordered avoids that",
                nccl_safe ? "also with NCCL's grouped, in-order messages"
                          : "with NCCL's grouped, in-order messages it would stall; --placement ordered avoids that");
    std::printf("makespan %.4g  bubble time %.4g  bubble ratio %.2f %%  steady-state bubble %.4g\n", r.makespan,
                r.bubble_time, 100 * r.bubble_ratio, r.steady_bubble_time);
    std::printf("peak activations (micro-batches): %.4g on the worst rank; per rank:", r.peak_memory_microbatches);
    for (int x : rep.peak_activations) std::printf(" %g", double(x) / cfg.chunks);
    std::printf("\nthroughput %.4g micro-batches per time unit\n", r.throughput);
    if (timeline) std::cout << '\n' << r.text(0, width);
    if (!trace.empty()) {
      to_chrome_trace(r.timeline, 1e-3).save(trace);  // one cost unit drawn as 1 ms
      std::printf("\ntrace written to %s (one cost unit = 1 ms)\n", trace.c_str());
    }
  } catch (const std::exception& e) {
    std::cerr << "pipeline_sim: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
