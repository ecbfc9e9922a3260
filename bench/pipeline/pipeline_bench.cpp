// Pipeline schedules measured on the threads communicator (P = 2 ranks on 2 cores) with a small
// MLP-stack model, against the simulator's prediction from the same run's measured action costs.
//
// For each schedule: steps of M micro-batches; per step, the ranks' timelines are merged and the
// measured bubble ratio (sum of idle / (P · makespan)) is compared with simulate(programs,
// CostModel::from_timeline(measured)). Schedules alternate round by round so all see the same
// machine conditions; medians over all steps are reported. Last line: JSON with ours = throughput
// of the best schedule, baseline = GPipe's.
//
//   bench_pipeline [--smoke] [--width H] [--tokens T] [--layers L] [--microbatches M] [--rounds R] [--steps S]
//                  [--timeline] [--trace FILE]
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "mlp_stack_stage.hpp"
#include "mpar/comm/threads.hpp"
#include "mpar/pipeline.hpp"
#include "mpar/pipeline/simulator.hpp"
#include "mpar/pipeline/summarise_measured.hpp"
#include "mpar/pipeline/timeline_trace.hpp"

using namespace mpar;
using namespace mpar::pipeline;

namespace {
int arg(int argc, char** argv, const std::string& name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return std::stoi(argv[i + 1]);
  return fallback;
}

struct Sample {
  double measured_bubble, predicted_bubble, throughput;
};
}  // namespace

int main(int argc, char** argv) {
  const bool smoke = bench::has_flag(argc, argv, "--smoke");
  const auto width = std::size_t(arg(argc, argv, "--width", smoke ? 32 : 192));
  const auto tokens = std::size_t(arg(argc, argv, "--tokens", smoke ? 8 : 64));
  const auto layers = std::size_t(arg(argc, argv, "--layers", smoke ? 2 : 4));  // per rank
  const int M = arg(argc, argv, "--microbatches", smoke ? 4 : 8);
  const int rounds = arg(argc, argv, "--rounds", smoke ? 1 : 3);
  const int steps = arg(argc, argv, "--steps", smoke ? 2 : 5);
  const bool show = bench::has_flag(argc, argv, "--timeline");
  std::string trace_path;  // --trace FILE: Chrome trace of zb_h1's last measured step
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--trace") trace_path = argv[i + 1];
  const int P = 2;
  struct Case {
    std::string name;
    int V;
  };
  const std::vector<Case> cases = {{"gpipe", 1}, {"1f1b", 1}, {"interleaved_1f1b", 2}, {"zb_h1", 1}, {"zb_h2", 1}};
  std::map<std::string, std::vector<Sample>> samples;

  for (int round = 0; round < rounds; ++round)
    for (const auto& cs : cases) {
      const Programs prog = make_programs(cs.name, {P, M, cs.V});
      std::vector<std::vector<StepStats>> per_step(std::size_t(steps + 1), std::vector<StepStats>(P));
      std::mutex mu;
      run_threads(P, [&](ThreadsCommunicator& comm) {
        HostBackend::init_rank();
        const int r = comm.rank();
        // The same model for every schedule: P·V chunks of layers/V layers each.
        std::vector<bench::MlpStackStage> chunks;
        const std::size_t per_chunk = layers / std::size_t(cs.V);
        for (int c = 0; c < cs.V; ++c)
          chunks.emplace_back(width, std::size_t(global_stage(prog.config, r, c)) * per_chunk, per_chunk);
        std::vector<bench::MlpStackStage*> ptrs;
        for (auto& c : chunks) ptrs.push_back(&c);
        Executor<bench::MlpStackStage, ThreadsCommunicator> ex(comm, prog, ptrs);
        std::vector<nn::Act<Replicate>> inputs;
        for (int mb = 0; mb < M; ++mb) {
          nn::Activation x({tokens, width});
          init_full(x, 9, std::uint64_t(mb), InitSpec::normal(1.0));
          inputs.emplace_back(std::move(x));
        }
        const LossFn<Replicate> loss = [](const nn::Act<Replicate>& y, int, nn::Act<Replicate>& dy) {
          double l = 0;
          for (std::size_t i = 0; i < y.size(); ++i) {
            l += 0.5 * double(y.data()[i]) * y.data()[i] / double(y.size());
            dy.data()[i] = y.data()[i] / float(y.size());
          }
          return l;
        };
        for (int s = 0; s <= steps; ++s) {  // step 0 warms caches and allocators up
          StepStats st = ex.step(inputs, loss);
          for (auto* p : ex.parameters()) p->zero_grad();
          std::lock_guard l(mu);
          per_step[std::size_t(s)][std::size_t(r)] = std::move(st);
        }
      });
      for (int s = 1; s <= steps; ++s) {
        const SimResult measured = summarise_measured(per_step[std::size_t(s)]);
        const SimResult predicted = simulate(prog, CostModel::from_timeline(measured.timeline));
        if (show && s == steps && round == rounds - 1) {
          const CostModel cm = CostModel::from_timeline(measured.timeline);
          std::printf("\n%s measured (F %.3g ms, B %.3g ms, W %.3g ms, latency %.3g ms):\n%s", cs.name.c_str(),
                      1e3 * cm.forward[0], 1e3 * cm.backward_input[0], 1e3 * cm.backward_weight[0],
                      1e3 * cm.p2p_latency, measured.text(0, 160).c_str());
          std::printf("%s predicted:\n%s", cs.name.c_str(), predicted.text(0, 160).c_str());
        }
        if (!trace_path.empty() && cs.name == "zb_h1" && s == steps && round == rounds - 1)
          to_chrome_trace(measured.timeline).save(trace_path);
        samples[cs.name].push_back(
            {measured.bubble_ratio, predicted.bubble_ratio, double(M) * double(tokens) / measured.makespan});
      }
    }

  std::printf(
      "pipeline bench: P=%d threads, M=%d micro-batches of %zu tokens, width %zu, %zu layers per rank, "
      "%d rounds x %d steps\n",
      P, M, tokens, width, layers, rounds, steps);
  std::printf("%-18s %14s %16s %12s %16s\n", "schedule", "measured bubble", "predicted bubble", "|diff| (pp)",
              "tokens/s");
  std::string best = "gpipe";
  double best_tp = 0, gpipe_tp = 0, worst_diff = 0;
  for (const auto& cs : cases) {
    std::vector<double> mb, pb, tp, diff;
    for (const auto& s : samples[cs.name]) {
      mb.push_back(s.measured_bubble);
      pb.push_back(s.predicted_bubble);
      tp.push_back(s.throughput);
      diff.push_back(std::abs(s.measured_bubble - s.predicted_bubble));
    }
    const double t = bench::median(tp), d = 100 * bench::median(diff);
    std::printf("%-18s %13.1f %% %15.1f %% %12.2f %16.0f\n", cs.name.c_str(), 100 * bench::median(mb),
                100 * bench::median(pb), d, t);
    worst_diff = std::max(worst_diff, d);
    if (cs.name == "gpipe") gpipe_tp = t;
    if (t > best_tp) best_tp = t, best = cs.name;
  }
  bench::print_result_json("pipeline", best_tp, gpipe_tp, "tokens/s", true,
                           "\"best_schedule\": \"" + best + "\", \"max_bubble_prediction_error_pp\": " +
                               std::to_string(worst_diff) + ", \"baseline_name\": \"gpipe\"");
  return 0;
}
