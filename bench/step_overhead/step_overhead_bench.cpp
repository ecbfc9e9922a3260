// What one GPT training step asks of its backend on one rank: operations issued, host synchronisations
// and bytes of tensor memory touched by host code, counted by observe::CountingBackend around the real
// GptTrainer (steady state: the second step). Counts, not times: they do not depend on the machine's load.
//
// Models: train_gpt's default (hidden 64, 4 heads, 4 layers, seq 64, 16 sequences in 4 micro-batches) and
// a hidden-1024, 16-head, 24-layer model with the same batch. The large one is not run at 24 layers: on
// one rank every count is affine in the number of layers (each block issues the same work), so it runs 1
// and 2 layers and reports count(1) + 23 * (count(2) - count(1)).
//
// Two backends: HostBackend (every operation finishes before it returns, so each launch is a host
// synchronisation) and StreamHostBackend (operations return at once, as on a GPU), whose host
// synchronisations are the step's explicit waits only: `stream_syncs_per_step`.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include <mpar/backend/stream/stream_backend.hpp>
#include <mpar/cli/parser.hpp>
#include <mpar/comm/stream_ordered_communicator.hpp>
#include <mpar/comm/threads.hpp>
#include <mpar/data/char_dataset.hpp>
#include <mpar/models/gpt_trainer.hpp>
#include <mpar/observe/counting_backend.hpp>

#include "bench_util.hpp"

using namespace mpar;
using Counting = observe::CountingBackend<HostBackend>;

namespace {

/**
 * Host synchronisations per step of the default model measured by this benchmark on the layers before
 * their host work was cut (one GEMM per sequence and head, host loops; docs/performance.md).
 */
constexpr double baseline_syncs_default = 2280;

using StreamCounting = observe::CountingBackend<StreamHostBackend>;
observe::BackendCounts steady_step(const models::GptTrainConfig& c, const data::CharDataset& ds) {
  observe::BackendCounts out;
  run_threads(1, [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator, Counting> t(world, c, ds);
    (void)t.train_step();
    const auto a = Counting::counts();
    (void)t.train_step();
    out = Counting::counts() - a;
  });
  return out;
}
/** The host synchronisations of a steady step over the stream-emulating backend (its explicit waits only). */
double stream_syncs(const models::GptTrainConfig& c, const data::CharDataset& ds) {
  observe::BackendCounts out;
  run_threads(1, [&](ThreadsCommunicator& w) {
    StreamCounting::init_rank();
    using World = StreamOrderedCommunicator<ThreadsCommunicator, StreamCounting>;
    World world(w);
    models::GptTrainer<World, StreamCounting> t(world, c, ds);
    (void)t.train_step();
    (void)t.train_step();
    const auto a = StreamCounting::counts();
    (void)t.train_step();
    out = StreamCounting::counts() - a;
    StreamCounting::synchronize();
  });
  return double(out.host_syncs());
}

struct Scaled {
  double launches = 0, gemms = 0, syncs = 0, host_bytes = 0;
  double stream_syncs = 0;  ///< host synchronisations over StreamHostBackend
};
Scaled of(const observe::BackendCounts& c) {
  return {double(c.total_launches()), double(c.gemms()), double(c.host_syncs()), double(c.host_bytes)};
}
void print_row(const char* name, const Scaled& s) {
  std::printf("| %s | %.0f | %.0f | %.0f | %.0f | %.2f |\n", name, s.launches, s.gemms, s.syncs, s.stream_syncs,
              s.host_bytes / double(1 << 20));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    bool smoke = false;
    std::string data = data::default_text_path;
    std::size_t big_hidden = 1024, big_heads = 16, big_layers = 24;
    cli::Parser p("bench_step_overhead",
                  "Backend operations, host synchronisations and host-touched bytes per GPT training step.");
    p.option("data", data, "training text");
    p.option("big-hidden", big_hidden, "width of the large model").range(16, 1 << 16);
    p.option("big-heads", big_heads, "heads of the large model").range(1, 1024);
    p.option("big-layers", big_layers, "layers the large model's counts are scaled to").range(2, 4096);
    p.flag("smoke", smoke, "a small 'large' model (for ctest)");
    if (!p.parse(argc, argv)) {
      std::printf("%s", p.help().c_str());
      return 0;
    }
    if (smoke) big_hidden = 128;

    models::GptTrainConfig c;  // train_gpt's default model and batch
    c.model.hidden = 64;
    c.model.heads = 4;
    c.model.layers = 4;
    c.model.seq = 64;
    c.global_batch = 16;
    c.microbatches = 4;
    c.steps = 10;
    c.warmup = 1;
    const data::CharDataset ds(data, c.model.seq);
    c.model.vocab = ds.vocab_size();

    std::printf(
        "Per training step, one rank (CountingBackend<HostBackend>, steady state)\n\n"
        "| model | launches | GEMMs | host syncs | host syncs (stream-ordered) | host MiB "
        "|\n|---|---|---|---|---|---|\n");
    Scaled small = of(steady_step(c, ds));
    small.stream_syncs = stream_syncs(c, ds);
    print_row("train_gpt default (h64, 4 layers)", small);

    auto big = c;
    big.model.hidden = big_hidden;
    big.model.heads = big_heads;
    big.model.layers = 1;
    Scaled one = of(steady_step(big, ds));
    one.stream_syncs = stream_syncs(big, ds);
    big.model.layers = 2;
    Scaled two = of(steady_step(big, ds));
    two.stream_syncs = stream_syncs(big, ds);
    const double k = double(big_layers - 1);
    const Scaled large{one.launches + k * (two.launches - one.launches), one.gemms + k * (two.gemms - one.gemms),
                       one.syncs + k * (two.syncs - one.syncs), one.host_bytes + k * (two.host_bytes - one.host_bytes),
                       one.stream_syncs + k * (two.stream_syncs - one.stream_syncs)};
    const std::string big_name =
        "h" + std::to_string(big_hidden) + ", " + std::to_string(big_layers) + " layers (scaled)";
    print_row(big_name.c_str(), large);

    const std::string extra = "\"syncs_per_step\": " + std::to_string(std::llround(small.syncs)) +
                              ", \"launches_per_step\": " + std::to_string(std::llround(small.launches)) +
                              ", \"host_bytes_per_step\": " + std::to_string(std::llround(small.host_bytes)) +
                              ", \"stream_syncs_per_step\": " + std::to_string(std::llround(small.stream_syncs)) +
                              ", \"large\": {\"hidden\": " + std::to_string(big_hidden) +
                              ", \"layers\": " + std::to_string(big_layers) +
                              ", \"syncs_per_step\": " + std::to_string(std::llround(large.syncs)) +
                              ", \"launches_per_step\": " + std::to_string(std::llround(large.launches)) +
                              ", \"host_bytes_per_step\": " + std::to_string(std::llround(large.host_bytes)) +
                              ", \"stream_syncs_per_step\": " + std::to_string(std::llround(large.stream_syncs)) + "}" +
                              ", \"baseline_is\": \"host synchronisations per step of the default model measured "
                              "before the layers' host work was cut\"" +
                              ", \"loadavg\": " + mpar::bench::load_average();
    bench::print_result_json("step_overhead", small.syncs, baseline_syncs_default, "host syncs per step", false, extra);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_step_overhead: %s\n", e.what());
    return 2;
  }
}
