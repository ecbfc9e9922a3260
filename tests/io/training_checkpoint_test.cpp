// io::save_training_checkpoint / load_training_checkpoint (a DistributedOptimizer's parameters, states and update
// count in one call each), CheckpointReader::read_whole and io::largest_difference.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "mpar/comm/mesh_comms.hpp"
#include "mpar/comm/threads.hpp"
#include "mpar/core/mesh.hpp"
#include "mpar/io.hpp"
#include "mpar/io/training_checkpoint.hpp"
#include "mpar/nn/mlp.hpp"
#include "mpar/parallel.hpp"

using namespace mpar;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& what) {
  const fs::path d = fs::temp_directory_path() / ("mpar_training_ckpt_" + what + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

struct RunConfig {
  int tp = 1, dp = 1;
  parallel::UpdateRule rule = parallel::UpdateRule::adamw;
  parallel::ZeroStage zero = parallel::ZeroStage::none;
};

/** Element i of sample `r` of step `s` (`stream` 1: input, 2: output gradient). */
nn::Activation sample(int s, int r, std::uint64_t stream) {
  nn::Activation a({4, 8});
  const CounterRng rng{11, stream};
  for (std::size_t i = 0; i < a.size(); ++i) a.data()[i] = float(rng.uniform(std::uint64_t(s * 2 + r) * 100 + i) - 0.5);
  return a;
}

/** A tensor-parallel MLP and the optimizer of its parameters, freshly initialised. */
struct Model {
  nn::MlpStage<ThreadsCommunicator> mlp;
  parallel::DistributedOptimizer<ThreadsCommunicator> opt;
  Model(MeshComms<ThreadsCommunicator>& g, const parallel::OptimizerConfig& oc)
      : mlp(nn::make_mlp(g.tensor, nn::MlpConfig{8, 16, 5, 0, "mlp"})),
        opt(mlp.parameters(), mlp.parameters(), oc, {&g.world, &g.tensor, &g.pipeline, &g.data, &g.data}) {}
};

/**
 * On tp x dp threads: a tensor-parallel MLP trained by a DistributedOptimizer. Each step covers two samples, split
 * over the data ranks (each output gradient scaled so that the data-parallel mean is the step's mean). `body(world,
 * model_factory, step)` drives it; every rank runs it.
 */
template <class Body>
void on_ranks(const RunConfig& c, Body&& body) {
  run_threads(c.tp * c.dp, [&](ThreadsCommunicator& world) {
    auto g = make_mesh_comms(world, DynamicMesh(std::size_t(c.tp), std::size_t(1), std::size_t(c.dp), std::size_t(1)));
    parallel::OptimizerConfig oc;
    oc.rule = c.rule, oc.zero = c.zero, oc.sgd.momentum = 0.9f;
    auto make = [&] { return std::make_unique<Model>(g, oc); };
    auto step = [&](Model& m, int s) {
      const int per = 2 / c.dp;
      for (int r = g.data.rank() * per; r < (g.data.rank() + 1) * per; ++r) {
        (void)m.mlp.forward(nn::Act<Replicate>(sample(s, r, 1)), r);
        nn::Activation dy = sample(s, r, 2);
        for (auto& v : dy.values()) v *= float(c.dp) / 2;
        (void)m.mlp.backward(nn::Act<Replicate>(std::move(dy)), r);
      }
      (void)m.opt.step(0.05);
      m.opt.zero_grad();
    };
    body(world, make, step);
  });
}

}  // namespace

TEST_CASE("a training checkpoint resumes the run bit for bit: parameters, states and the update count",
          "[io][training_checkpoint]") {
  const std::vector<RunConfig> runs{
      {2, 2, parallel::UpdateRule::adamw, parallel::ZeroStage::none},
      {1, 2, parallel::UpdateRule::adamw, parallel::ZeroStage::optimizer_states},
      {2, 1, parallel::UpdateRule::sgd, parallel::ZeroStage::none},
  };
  for (const auto& c : runs) {
    INFO("tp " << c.tp << " dp " << c.dp << " " << parallel::name_of(c.rule) << " ZeRO-"
               << parallel::stage_number(c.zero));
    const fs::path dir = fresh_dir("resume");
    io::LoadResult loaded;
    on_ranks(c, [&](ThreadsCommunicator& world, auto& make, auto& step) {
      auto run = make();
      for (int s = 0; s < 3; ++s) step(*run, s);
      (void)io::save_training_checkpoint(dir / "at3", run->opt, world);
      for (int s = 3; s < 5; ++s) step(*run, s);
      (void)io::save_training_checkpoint(dir / "continued", run->opt, world);
      auto resumed = make();  // freshly initialised: its step 3 would differ without the load
      io::LoadResult r = io::load_training_checkpoint(dir / "at3", resumed->opt, world);
      CHECK(resumed->opt.steps() == 3);
      for (int s = 3; s < 5; ++s) step(*resumed, s);
      (void)io::save_training_checkpoint(dir / "resumed", resumed->opt, world);
      if (world.rank() == 0) loaded = r;
    });
    CHECK(loaded.state.step == 3);
    CHECK(loaded.state.user.at("optimizer") == std::string(parallel::name_of(c.rule)));
    CHECK(loaded.state.user.at(std::string(parallel::name_of(c.rule)) + ".steps") == "3");
    const io::CheckpointDifference d = io::largest_difference(dir / "continued", dir / "resumed", true);
    INFO("largest difference " << d.largest << " in " << d.tensor);
    CHECK(d.largest == 0.0);
    CHECK(io::largest_difference(dir / "at3", dir / "continued").largest > 1e-3);  // the two steps changed something
    fs::remove_all(dir);
  }
}

TEST_CASE("a training checkpoint of tp 2 x dp 2 under ZeRO-1 resumes at one rank without ZeRO",
          "[io][training_checkpoint]") {
  const fs::path dir = fresh_dir("reshard");
  on_ranks({2, 2, parallel::UpdateRule::adamw, parallel::ZeroStage::optimizer_states},
           [&](ThreadsCommunicator& world, auto& make, auto& step) {
             auto run = make();
             for (int s = 0; s < 3; ++s) step(*run, s);
             (void)io::save_training_checkpoint(dir / "at3", run->opt, world);
             for (int s = 3; s < 5; ++s) step(*run, s);
             (void)io::save_training_checkpoint(dir / "continued", run->opt, world);
           });
  on_ranks({}, [&](ThreadsCommunicator& world, auto& make, auto& step) {
    auto resumed = make();
    (void)io::load_training_checkpoint(dir / "at3", resumed->opt, world);
    for (int s = 3; s < 5; ++s) step(*resumed, s);
    (void)io::save_training_checkpoint(dir / "resumed", resumed->opt, world);
  });
  // The same arithmetic up to the order of the tensor-parallel sums.
  const io::CheckpointDifference d = io::largest_difference(dir / "continued", dir / "resumed", true);
  INFO("largest difference " << d.largest << " in " << d.tensor);
  CHECK(d.largest < 1e-5);
  fs::remove_all(dir);
}

TEST_CASE("load_training_checkpoint refuses another update rule, and both refuse ZeRO-3, naming the fix",
          "[io][training_checkpoint][errors]") {
  const fs::path dir = fresh_dir("refuse");
  on_ranks({}, [&](ThreadsCommunicator& world, auto& make, auto& step) {
    auto run = make();
    step(*run, 0);
    (void)io::save_training_checkpoint(dir, run->opt, world);
  });
  CHECK_THROWS_WITH(on_ranks({1, 1, parallel::UpdateRule::sgd},
                             [&](ThreadsCommunicator& world, auto& make, auto&) {
                               auto other = make();
                               (void)io::load_training_checkpoint(dir, other->opt, world);
                             }),
                    Catch::Contains("optimizer 'adamw'") && Catch::Contains("update rule is 'sgd'"));
  CHECK_THROWS_WITH(on_ranks({1, 2, parallel::UpdateRule::adamw, parallel::ZeroStage::parameters},
                             [&](ThreadsCommunicator& world, auto& make, auto&) {
                               auto z3 = make();
                               (void)io::save_training_checkpoint(dir / "z3", z3->opt, world);
                             }),
                    Catch::Contains("save_training_checkpoint: ZeRO-3") && Catch::Contains("ZeRO-1/2"));
  fs::remove_all(dir);
}

TEST_CASE("largest_difference compares checkpoints of any layouts as whole tensors", "[io][training_checkpoint]") {
  const fs::path dir = fresh_dir("difference");
  std::vector<float> w(24), m(24, 0.5f), b{1, 2, 3};
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(i) / 8;
  const std::vector<std::size_t> shape{4, 6};
  auto whole = [&](std::string name, std::vector<float>& v, std::vector<std::size_t> s) {
    return io::SaveBlock{std::move(name), s, io::full_box(s), "Replicate", std::span<const float>(v)};
  };
  // A: w saved as two column blocks (as two tensor ranks hold it), its state and b.
  std::vector<float> left, right;
  for (std::size_t r = 0; r < 4; ++r)
    for (std::size_t c = 0; c < 6; ++c) (c < 3 ? left : right).push_back(w[r * 6 + c]);
  const std::vector<io::SaveBlock> a{
      {"w", shape, {{0, 4}, {0, 3}}, "Shard<1, tensor>", left},
      {"w", shape, {{0, 4}, {3, 3}}, "Shard<1, tensor>", right},
      whole("w/adamw.m", m, shape),
      whole("b", b, {3}),
  };
  (void)io::save_checkpoint(dir / "a", a, {});
  io::CheckpointReader ra(dir / "a");
  CHECK(ra.read_whole("w") == w);  // row-major, whatever the shards
  CHECK_THROWS_WITH(ra.read_whole("v"), Catch::Contains("no tensor 'v'"));

  // B: w whole, one element 0.25 larger; its state 1.0 larger everywhere.
  std::vector<float> w2 = w, m2(24, 1.5f);
  w2[2 * 6 + 5] += 0.25f;
  (void)io::save_checkpoint(dir / "b",
                            std::vector{whole("w", w2, shape), whole("w/adamw.m", m2, shape), whole("b", b, {3})}, {});
  const io::CheckpointDifference d = io::largest_difference(dir / "a", dir / "b");
  CHECK(d.tensor == "w");
  CHECK(d.largest == double(w2[17]) - double(w[17]));
  CHECK(io::largest_difference(dir / "a", dir / "b", true).tensor == "w/adamw.m");
  CHECK(io::largest_difference(dir / "a", dir / "b", true).largest == 1.0);
  CHECK(io::largest_difference(dir / "a", dir / "a").largest == 0.0);
  CHECK(io::largest_difference(dir / "a", dir / "a").tensor.empty());

  // C lacks b; D holds a NaN.
  (void)io::save_checkpoint(dir / "c", std::vector{whole("w", w, shape)}, {});
  CHECK_THROWS_WITH(io::largest_difference(dir / "a", dir / "c"),
                    Catch::Contains("tensor 'b'") && Catch::Contains("is missing from"));
  CHECK_THROWS_WITH(io::largest_difference(dir / "c", dir / "a"), Catch::Contains("tensor 'b'"));
  std::vector<float> w3 = w;
  w3[0] = std::numeric_limits<float>::quiet_NaN();
  (void)io::save_checkpoint(dir / "d", std::vector{whole("w", w3, shape), whole("b", b, {3})}, {});
  CHECK(std::isinf(io::largest_difference(dir / "a", dir / "d").largest));
  fs::remove_all(dir);
}
