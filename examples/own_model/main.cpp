// own_model: train your own model with mpar. Two MLP blocks of tensor-parallel layers learn y = sin(2x) on
// tp x pp x dp CPU threads: the pipeline executor runs 1F1B (interleaved when a rank holds several blocks), the
// distributed optimizer takes AdamW steps, and a checkpoint of the trained model resumes in a fresh one.
//
//   own_model [--tp 2] [--pp 2] [--dp 2] [--steps 60] [--save DIR] [--check-single-rank]
//
// Exits 1 unless the loss falls tenfold and the resumed model repeats the run's next steps bit for bit;
// --check-single-rank also trains on one rank and exits 1 unless the losses and parameters agree.
#include <cmath>
#include <cstdio>
#include <mpar/cli/parser.hpp>
#include <mpar/io.hpp>
#include <mpar/io/training_checkpoint.hpp>
#include <mpar/mpar.hpp>
using namespace mpar;
using C = ThreadsCommunicator;
using Mlp = nn::Stage<nn::ColumnParallel<C>, nn::Gelu, nn::RowParallel<C>>;  // a block of your model
constexpr std::size_t width = 16, ffn = 64, rows = 32;  // features, hidden units, samples per micro-batch
constexpr int blocks = 2, microbatches = 4;             // blocks of the model; micro-batches of a step
struct Layout {
  int tp = 2, pp = 2, dp = 2;
};

// One rank's blocks and what trains them: the executor over the pipeline group, the optimizer over every group.
struct Trainer {
  MeshComms<C>& g;
  std::vector<Mlp> chunks;
  pipeline::Executor<Mlp, C> executor;
  parallel::DistributedOptimizer<C> optimizer;
  Trainer(MeshComms<C>& comms, const Layout& l)
      : g(comms), chunks(make_chunks(comms, l.pp)),
        executor(g.pipeline,
                 pipeline::make_programs<pipeline::Interleaved1F1B>({l.pp, microbatches / l.dp, blocks / l.pp}),
                 chunks),
        optimizer(executor.parameters(), executor.parameters(), {},
                  {&g.world, &g.tensor, &g.pipeline, &g.data, &g.data}) {}
  static std::vector<Mlp> make_chunks(MeshComms<C>& g, int pp) {
    std::vector<Mlp> out;  // pipeline rank r holds blocks r, r + pp, ...; names and ids are the same in every layout
    for (int b = g.pipeline.rank(); b < blocks; b += pp) {
      const std::string name = "block" + std::to_string(b);
      out.emplace_back(nn::ColumnParallel<C>(g.tensor, width, ffn, {7, 4 * std::uint64_t(b), name + ".fc1"}),
                       nn::Gelu{},
                       nn::RowParallel<C>(g.tensor, ffn, width, {7, 4 * std::uint64_t(b) + 2, name + ".fc2"}));
    }
    return out;
  }
  // Step s on this data rank's share of the micro-batches: forwards and backwards in the schedule's order, then AdamW.
  double step(int s) {
    const int m = microbatches / g.data.size();
    std::vector<nn::Act<Replicate>> x;
    std::vector<nn::Activation> y;
    for (int mb = g.data.rank() * m; mb < (g.data.rank() + 1) * m; ++mb) {
      const CounterRng rng{2024, std::uint64_t(s * microbatches + mb)};  // the same samples in every layout
      float* xs = x.emplace_back(nn::Activation({rows, width})).tensor().data();
      float* ys = y.emplace_back(nn::Activation({rows, width})).data();
      for (std::size_t i = 0; i < rows * width; ++i) xs[i] = float(2 * rng.uniform(i) - 1), ys[i] = std::sin(2 * xs[i]);
    }
    optimizer.record_losses(executor.step(x, pipeline::mean_squared_error(y)).loss, 0);
    const double loss = optimizer.step(2e-2).loss;  // gradients averaged over dp, clipped at norm 1; AdamW
    optimizer.zero_grad();
    return loss;
  }
};

// Trains `steps` steps and saves a checkpoint in `dir`; then takes three more steps, each also in a fresh model
// resumed from the checkpoint. Returns the losses: the run's, then pairs (the run's, the resumed model's).
std::vector<double> train(const Layout& l, int steps, const std::string& dir) {
  std::vector<double> losses;
  run_threads(l.tp * l.pp * l.dp, [&](C& world) {
    HostBackend::init_rank();  // one BLAS thread per rank
    auto g = make_mesh_comms(world, DynamicMesh(std::size_t(l.tp), std::size_t(l.pp), std::size_t(l.dp), 1));
    Trainer model(g, l);
    std::vector<double> mine;
    for (int s = 0; s < steps; ++s) mine.push_back(model.step(s));
    (void)io::save_training_checkpoint(dir, model.optimizer, world);
    Trainer resumed(g, l);  // freshly initialised, then loaded: parameters, AdamW moments and step count
    (void)io::load_training_checkpoint(dir, resumed.optimizer, world);
    for (int s = steps; s < steps + 3; ++s) mine.push_back(model.step(s)), mine.push_back(resumed.step(s));
    if (world.rank() == 0) losses = mine;
  });
  return losses;
}

int main(int argc, char** argv) {
  Layout l;
  int steps = 60;
  std::string dir = "own_model.ckpt";
  bool check = false;
  cli::Parser p("own_model", "Trains your own model (two tensor-parallel MLP blocks) on tp x pp x dp threads.");
  p.option("tp", l.tp, "tensor-parallel ranks (dividing 64)").range(1, 64);
  p.option("pp", l.pp, "pipeline ranks (dividing the 2 blocks)").range(1, 2);
  p.option("dp", l.dp, "data-parallel ranks (dividing the 4 micro-batches with pp)").range(1, 2);
  p.option("steps", steps, "training steps").range(1, 100000);
  p.option("save", dir, "checkpoint directory");
  p.flag("check-single-rank", check, "train on one rank too and compare the losses and parameters");
  try {
    if (!p.parse(argc, argv)) return std::printf("%s", p.help().c_str()), 0;
    const std::vector<double> run = train(l, steps, dir);
    for (int s = 0; s < steps; s += 10) std::printf("step %3d  loss %.5f\n", s, run[std::size_t(s)]);
    bool resumed = true;
    for (std::size_t i = std::size_t(steps); i < run.size(); i += 2) resumed = resumed && run[i] == run[i + 1];
    const double first = run.front(), last = run[std::size_t(steps - 1)];
    std::printf("loss %.4f -> %.4f, resumed from %s: %s\n", first, last, dir.c_str(),
                resumed ? "the same losses" : "OTHER LOSSES");
    bool ok = last < first / 10 && resumed;
    if (check) {  // the same model on one rank: every layout trains it alike (up to the order of sums)
      const std::vector<double> one = train({1, 1, 1}, steps, dir + ".single-rank");
      double loss = 0;
      for (std::size_t i = 0; i < one.size(); ++i) loss = std::max(loss, std::abs(run[i] - one[i]) / one[i]);
      const double param = io::largest_difference(dir, dir + ".single-rank").largest;
      std::printf("against one rank: largest difference of a loss %.1e (relative), of a parameter %.1e\n", loss, param);
      ok = ok && loss < 1e-5 && param < 1e-5;
    }
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "own_model: %s\n", e.what());
    return 2;
  }
}
