// pipedream_2bw: PipeDream-2BW without a flush between batches (ExecutorOptions::versions =
// WeightVersions::per_batch), against 1F1B's flush after every batch.
//
// P pipeline ranks (threads), each a Linear + GeLU part, learn a fixed random map by SGD. One program covers
// --batches batches of --microbatches micro-batches: batch b runs on the weights of batch b - 1 on every stage
// (two weight versions), and each update applies to the newest version, so no rank waits for the pipe to
// drain between batches. The program prints the bubble of each schedule as idle slots per batch (a forward
// one slot, a backward two: pipeline::idle_slots), and the mean loss of the first and the last batch.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <mpar/cli/parser.hpp>
#include <mpar/mpar.hpp>
#include <mpar/pipeline/run_pipeline_threads.hpp>
#include <mpar/pipeline/simulator.hpp>

using namespace mpar;
using Part = nn::Stage<nn::Linear<>, nn::Gelu>;
using X = nn::Act<Replicate>;

namespace {

constexpr std::size_t width = 16, tokens = 4;

/** A micro-batch of the data set: inputs in [-1, 1] (`stream` 1) or targets in [-0.5, 0.5] (`stream` 2). */
nn::Activation sample(int mb, std::uint64_t stream) {
  nn::Activation a({tokens, width});
  const CounterRng rng{7, stream};
  for (std::size_t i = 0; i < a.size(); ++i)
    a.data()[i] = float((2 * rng.uniform(std::uint64_t(mb % 4) * 1000 + i) - 1) / double(stream));
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  int stages = 4, microbatches = 4, batches = 8;
  double lr = 0.2;
  cli::Parser p("pipedream_2bw", "PipeDream-2BW without a flush between batches, against 1F1B.");
  p.option("stages", stages, "pipeline ranks (threads)").range(2, 16);
  p.option("microbatches", microbatches, "micro-batches per batch (at least --stages)").range(1, 64);
  p.option("batches", batches, "batches (optimizer steps) in one program").range(2, 256);
  p.option("lr", lr, "SGD learning rate").range(0, 10);
  try {
    if (!p.parse(argc, argv)) {
      std::printf("%s", p.help().c_str());
      return 0;
    }
    const pipeline::Programs flushed = pipeline::make_programs<pipeline::OneFOneB>({stages, microbatches});
    const pipeline::Programs two_bw =
        pipeline::make_programs<pipeline::PipeDream2BW>({stages, microbatches, 1, batches});
    pipeline::verify_or_throw(two_bw);
    std::printf("P = %d, M = %d, %d batches\n", stages, microbatches, batches);
    std::printf("idle slots per batch: 1F1B %.2f, 2BW per_batch %.2f\n", pipeline::idle_slots(flushed),
                pipeline::idle_slots(two_bw));

    const int total = microbatches * batches;
    std::vector<X> inputs;
    std::vector<nn::Activation> targets;
    for (int mb = 0; mb < total; ++mb) inputs.emplace_back(sample(mb, 1)), targets.push_back(sample(mb, 2));
    std::vector<double> losses(std::size_t(total), 0.0);  // written by the last rank, one entry per micro-batch
    const pipeline::LossFn<Replicate> mse = [&](const X& y, int mb, X& dy) {
      const nn::Activation& t = targets[std::size_t(mb)];
      const double n = double(y.tensor().size());
      double l = 0;
      for (std::size_t i = 0; i < t.size(); ++i) {
        const double d = double(y.tensor().data()[i]) - double(t.data()[i]);
        l += d * d / n;
        dy.tensor().data()[i] = float(2 * d / n / microbatches);
      }
      losses[std::size_t(mb)] = l;
      return l;
    };
    const pipeline::OptimizerFn sgd = [&](const std::vector<nn::Parameter*>& ps) {
      for (auto* q : ps)
        for (std::size_t i = 0; i < q->value.size(); ++i) q->value[i] -= float(lr) * q->grad[i];
    };
    pipeline::ExecutorOptions o;
    o.versions = pipeline::WeightVersions::per_batch;
    (void)pipeline::run_pipeline_threads(
        two_bw,
        [](int rank, int, int) {
          const auto r = std::uint64_t(rank);
          return Part(nn::Linear<>(width, width, {.seed = 3, .id_base = 2 * r, .name = "fc" + std::to_string(r)}),
                      nn::Gelu{});
        },
        inputs, mse, 1, sgd, o);
    auto batch_loss = [&](int b) {
      double s = 0;
      for (int mb = b * microbatches; mb < (b + 1) * microbatches; ++mb) s += losses[std::size_t(mb)];
      return s / microbatches;
    };
    const double first = batch_loss(0), last = batch_loss(batches - 1);
    std::printf("mean loss: batch 0 %.5f, batch %d %.5f (%s)\n", first, batches - 1, last,
                last < first ? "lower" : "not lower");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipedream_2bw: %s\n", e.what());
    return 2;
  }
}
