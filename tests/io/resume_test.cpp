// GptTrainer::resume refuses a checkpoint holding tensors the model lacks, instead of dropping them.
// (The refusals of another run's data, seeds and model shape, the optimizer warning and SGD's exact
// resume are tested end to end through train_gpt: examples/train_gpt/CMakeLists.txt.)
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "mpar/comm/threads.hpp"
#include "mpar/io.hpp"
#include "mpar/models/gpt_trainer.hpp"

using namespace mpar;
namespace fs = std::filesystem;

TEST_CASE("resume refuses a checkpoint holding tensors the model lacks", "[io][resume]") {
  const fs::path dir = fs::temp_directory_path() / ("mpar_io_resume_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path text = dir / "text.txt";
  {
    std::ofstream f(text);
    for (int i = 0; i < 200; ++i) f << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  models::GptTrainConfig cfg;
  cfg.model.hidden = 16, cfg.model.heads = 2, cfg.model.layers = 2, cfg.model.seq = 8;
  cfg.global_batch = 2, cfg.microbatches = 1, cfg.steps = 3, cfg.warmup = 0;
  const data::CharDataset ds(text.string(), cfg.model.seq);
  cfg.model.vocab = ds.vocab_size();
  auto trainer_at = [&](const fs::path& resume, const fs::path& save) {
    std::string error;
    try {
      run_threads(1, [&](ThreadsCommunicator& world) {
        models::GptTrainer<ThreadsCommunicator> t(world, cfg, ds);
        if (!resume.empty()) t.resume(resume);
        (void)t.train_step();
        if (!save.empty()) t.save(save);
      });
    } catch (const std::exception& e) {
      error = e.what();
    }
    return error;
  };
  REQUIRE(trainer_at({}, dir / "ckpt").empty());
  REQUIRE(trainer_at(dir / "ckpt", {}).empty());  // control: the checkpoint itself resumes

  // The same checkpoint with one tensor more, as a deeper model would have saved it.
  io::CheckpointReader reader(dir / "ckpt");
  const auto& tensors = reader.manifest().tensors;
  std::vector<std::vector<float>> values;
  values.reserve(tensors.size() + 1);
  std::vector<io::LoadBlock> load;
  for (const auto& t : tensors) {
    values.emplace_back(io::volume(t.shape));
    load.push_back({t.name, t.shape, io::full_box(t.shape), t.layout, values.back()});
  }
  reader.read(load);
  std::vector<io::SaveBlock> save;
  for (const auto& b : load) save.push_back({b.name, b.global_shape, b.box, b.layout, std::span<const float>(b.data)});
  values.emplace_back(16, 0.5f);
  save.push_back(
      {"block7.fc1.weight", {4, 4}, io::full_box({4, 4}), "Replicate", std::span<const float>(values.back())});
  (void)io::save_checkpoint(dir / "deeper", save, reader.manifest().state);

  const std::string error = trainer_at(dir / "deeper", {});
  CHECK_THAT(error, Catch::Contains("holds 1 tensor(s) this model lacks (block7.fc1.weight)") &&
                        Catch::Contains("resuming would drop them"));
  fs::remove_all(dir);
}
