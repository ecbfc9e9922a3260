// Checkpoints over the stream-ordered backends (backend/stream/): save, resume and the safetensors export
// stage every block through host memory with the stream-ordered copies (io/staged_blocks.hpp).
// DiscreteHostBackend faults on any host access to rank memory, and StreamHostBackend's operations run later
// on a worker (fresh memory NaN), so a block read or written on the host without the staging either crashes
// or differs. The reference is the uninterrupted run: a trainer that saves after two steps and takes a third
// must agree bit for bit with a fresh trainer that resumes from that checkpoint and takes one step, and both
// with HostBackend's run (whose blocks are handed to the checkpoint as they are).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <type_traits>
#include <vector>

#include <mpar/backend/rank_transfer.hpp>
#include <mpar/backend/stream/stream_backend.hpp>
#include <mpar/comm/stream_ordered_communicator.hpp>
#include <mpar/comm/threads.hpp>
#include <mpar/models/gpt_trainer.hpp>
#include <mpar/observe/counting_backend.hpp>

#include "models/gpt_test_config.hpp"
#include "rank_world.hpp"

using namespace mpar;

namespace {

/** One rank after a step: the step's loss, the step the trainer resumed from (if any), every full parameter. */
struct CkptRankState {
  double loss = 0.0;
  std::uint64_t resumed_step = 0;
  std::vector<std::string> names;
  std::vector<std::vector<float>> values;
};

/** A scratch directory of this process, removed at the end of the test. */
struct CkptScratch {
  explicit CkptScratch(const std::string& tag)
      : path(std::filesystem::temp_directory_path() / ("mpar-ckptstream-" + std::to_string(::getpid()) + "-" + tag)) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~CkptScratch() { std::filesystem::remove_all(path); }
  std::filesystem::path path;
};

/** Takes one step on `t` and returns its loss and every parameter, full (ZeRO-3 gathers), read by the copies. */
template <class B, class Trainer>
CkptRankState ckpt_step_and_read(Trainer& t) {
  CkptRankState s;
  s.loss = t.train_step().loss;
  t.with_full_parameters([&] {
    for (const nn::Parameter* p : t.parameters()) {
      s.names.push_back(p->name);
      std::vector<float> v(p->value.size());
      mpar::copy_to_host<B>(p->value.data(), v.data(), v.size());
      s.values.push_back(std::move(v));
    }
  });
  return s;
}

/**
 * Runs `body(trainer, rank)` with a fresh trainer of `c` on every thread rank over backend B; each rank's result.
 * Without `host_twin` the world is a `RankMemoryOnlyCommunicator`, as NCCL's is.
 */
template <class B, bool host_twin = true, class Body>
std::vector<CkptRankState> ckpt_on_ranks(const models::GptTrainConfig& c, Body body) {
  std::vector<CkptRankState> out(c.world_size());
  run_threads(int(c.world_size()), [&](ThreadsCommunicator& w) {
    B::init_rank();
    auto run = [&](auto& world) {
      models::GptTrainer<std::decay_t<decltype(world)>, B> t(world, c, testing::gpt_dataset());
      out[std::size_t(w.rank())] = body(t, std::size_t(w.rank()));
      B::synchronize();
    };
    if constexpr (host_twin)
      testing::on_rank_world<B>(w, run);
    else
      testing::on_rank_memory_world<B>(w, run);
  });
  return out;
}

/** The uninterrupted run over B: two steps, a save under `dir`, a third step. */
template <class B, bool host_twin = true>
std::vector<CkptRankState> ckpt_save_after_two(const models::GptTrainConfig& c, const std::filesystem::path& dir) {
  return ckpt_on_ranks<B, host_twin>(c, [&](auto& t, std::size_t) {
    (void)t.train_step();
    (void)t.train_step();
    (void)t.save(dir);
    return ckpt_step_and_read<B>(t);
  });
}

/** A fresh trainer over B resumes from `dir` and takes one step. */
template <class B, bool host_twin = true>
std::vector<CkptRankState> ckpt_resume_one(const models::GptTrainConfig& c, const std::filesystem::path& dir) {
  return ckpt_on_ranks<B, host_twin>(c, [&](auto& t, std::size_t) {
    const io::LoadResult r = t.resume(dir);
    CkptRankState s = ckpt_step_and_read<B>(t);
    s.resumed_step = r.state.step;
    return s;
  });
}

/** Bit for bit: the step's loss and every parameter of every rank. */
void ckpt_check_same(const std::string& what, const std::vector<CkptRankState>& got,
                     const std::vector<CkptRankState>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t r = 0; r < want.size(); ++r) {
    INFO(what << ", rank " << r);
    CHECK(got[r].loss == want[r].loss);
    REQUIRE(got[r].names == want[r].names);
    for (std::size_t i = 0; i < want[r].values.size(); ++i) {
      INFO("parameter " << want[r].names[i]);
      CHECK(got[r].values[i] == want[r].values[i]);
    }
  }
}

/** The layouts resumed: one rank, ZeRO-1's sharded moments, tensor parallelism, ZeRO-3's gathered weights. */
std::vector<std::pair<std::string, models::GptTrainConfig>> ckpt_layouts() {
  auto zero1 = testing::small_gpt(1, 1, 2);
  zero1.zero = parallel::ZeroStage::optimizer_states;
  auto zero3 = testing::small_gpt(1, 1, 2);
  zero3.zero = parallel::ZeroStage::parameters;
  zero3.bucket_bytes = 4096;  // several buckets
  return {{"1 rank", testing::small_gpt(1, 1, 1)},
          {"ZeRO-1 dp2", zero1},
          {"tp2", testing::small_gpt(2, 1, 1)},
          {"ZeRO-3 dp2", zero3}};
}

std::string ckpt_file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("Checkpoints over StreamHostBackend and DiscreteHostBackend: a resumed run equals the uninterrupted one",
          "[stream][checkpoint][discrete]") {
  for (const auto& [name, c] : ckpt_layouts()) {
    CkptScratch scratch("resume");
    const auto host_dir = scratch.path / "host", stream_dir = scratch.path / "stream",
               discrete_dir = scratch.path / "discrete";
    // The reference: HostBackend, uninterrupted, saving after two steps.
    const auto want = ckpt_save_after_two<HostBackend>(c, host_dir);
    REQUIRE(want.front().loss > 0.0);

    ckpt_check_same(name + ": StreamHostBackend saving", ckpt_save_after_two<StreamHostBackend>(c, stream_dir), want);
    const auto stream_resumed = ckpt_resume_one<StreamHostBackend>(c, stream_dir);
    CHECK(stream_resumed.front().resumed_step == 2);
    ckpt_check_same(name + ": StreamHostBackend resumed", stream_resumed, want);

    ckpt_check_same(name + ": DiscreteHostBackend saving", ckpt_save_after_two<DiscreteHostBackend>(c, discrete_dir),
                    want);
    ckpt_check_same(name + ": DiscreteHostBackend resumed", ckpt_resume_one<DiscreteHostBackend>(c, discrete_dir),
                    want);

    // Across backends: a checkpoint is host data, whichever backend wrote it.
    ckpt_check_same(name + ": HostBackend's checkpoint resumed over DiscreteHostBackend",
                    ckpt_resume_one<DiscreteHostBackend>(c, host_dir), want);
    ckpt_check_same(name + ": DiscreteHostBackend's checkpoint resumed over HostBackend",
                    ckpt_resume_one<HostBackend>(c, discrete_dir), want);
  }
}

TEST_CASE("export_safetensors over DiscreteHostBackend writes the bytes HostBackend writes",
          "[stream][checkpoint][discrete][safetensors]") {
  for (const auto& [name, c] : ckpt_layouts()) {
    if (name != "1 rank" && name != "ZeRO-3 dp2") continue;  // the plain path, and the gathered weights
    INFO(name);
    CkptScratch scratch("export");
    auto export_after_two = [&](auto backend_tag, const std::filesystem::path& out) {
      using B = typename decltype(backend_tag)::type;
      (void)ckpt_on_ranks<B>(c, [&](auto& t, std::size_t) {
        (void)t.train_step();
        (void)t.train_step();
        t.export_safetensors(out);
        return CkptRankState{};
      });
      return ckpt_file_bytes(out);
    };
    const std::string host = export_after_two(std::type_identity<HostBackend>{}, scratch.path / "host.safetensors");
    const std::string discrete =
        export_after_two(std::type_identity<DiscreteHostBackend>{}, scratch.path / "discrete.safetensors");
    REQUIRE(host.size() > 1000);  // the header and every tensor
    CHECK(discrete == host);
  }
}

TEST_CASE("Checkpoints over CountingBackend<StreamHostBackend>: one host wait per save, two per resume",
          "[stream][checkpoint][counts]") {
  using Counting = observe::CountingBackend<StreamHostBackend>;
  for (const auto& [name, c] : ckpt_layouts()) {
    if (name == "ZeRO-3 dp2") continue;  // its resume waits once more, after its gathers (docs/checkpoints.md)
    CkptScratch scratch("counts");
    std::vector<observe::BackendCounts> save(c.world_size()), resume(c.world_size());
    std::vector<std::size_t> blocks(c.world_size());
    (void)ckpt_on_ranks<Counting>(c, [&](auto& t, std::size_t r) {
      (void)t.train_step();
      const observe::BackendCounts before = Counting::counts();
      const io::SaveResult saved = t.save(scratch.path);
      save[r] = Counting::counts() - before;
      blocks[r] = saved.blocks_written + saved.blocks_replicated;
      return CkptRankState{};
    });
    (void)ckpt_on_ranks<Counting>(c, [&](auto& t, std::size_t r) {
      const observe::BackendCounts before = Counting::counts();
      (void)t.resume(scratch.path);
      resume[r] = Counting::counts() - before;
      return CkptRankState{};
    });
    for (std::size_t r = 0; r < save.size(); ++r) {
      INFO(name << ", rank " << r << " (" << blocks[r] << " blocks)");
      // Whatever the number of blocks: the copies are issued together and waited for once.
      CHECK(save[r].event_waits == 1);
      CHECK(save[r].synchronize_calls == 0);
      // One wait that quiets the communicator for the checkpoint's host messages, one after the uploads.
      CHECK(resume[r].synchronize_calls == 1);
      CHECK(resume[r].event_waits == 1);
    }
    CHECK(blocks.front() > 2);
  }
}

TEST_CASE("Checkpoints over a world without host-memory twin (as NCCL): host messages through rank memory",
          "[stream][checkpoint][discrete]") {
  for (const auto& [name, c] : ckpt_layouts()) {
    CkptScratch scratch("rank-memory-world");
    const auto host_dir = scratch.path / "host", stream_dir = scratch.path / "stream",
               discrete_dir = scratch.path / "discrete";
    const auto want = ckpt_save_after_two<HostBackend>(c, host_dir);
    // DiscreteHostBackend's communicator refuses host buffers: every agreement, fingerprint and the directory's
    // name must reach it in rank memory.
    ckpt_check_same(name + ": StreamHostBackend saving", ckpt_save_after_two<StreamHostBackend, false>(c, stream_dir),
                    want);
    ckpt_check_same(name + ": StreamHostBackend resumed", ckpt_resume_one<StreamHostBackend, false>(c, stream_dir),
                    want);
    ckpt_check_same(name + ": DiscreteHostBackend saving",
                    ckpt_save_after_two<DiscreteHostBackend, false>(c, discrete_dir), want);
    ckpt_check_same(name + ": DiscreteHostBackend resumed",
                    ckpt_resume_one<DiscreteHostBackend, false>(c, discrete_dir), want);
    ckpt_check_same(name + ": HostBackend's checkpoint resumed over DiscreteHostBackend",
                    ckpt_resume_one<DiscreteHostBackend, false>(c, host_dir), want);
  }
}

TEST_CASE("Checkpoints over a world without host-memory twin: one host wait per host message, no synchronize",
          "[stream][checkpoint][counts]") {
  using Counting = observe::CountingBackend<StreamHostBackend>;
  for (const auto& [name, c] : ckpt_layouts()) {
    CkptScratch scratch("counts-rank-memory-world");
    std::vector<observe::BackendCounts> save(c.world_size()), resume(c.world_size());
    (void)ckpt_on_ranks<Counting, false>(c, [&](auto& t, std::size_t r) {
      (void)t.train_step();
      const observe::BackendCounts before = Counting::counts();
      (void)t.save(scratch.path);
      save[r] = Counting::counts() - before;
      return CkptRankState{};
    });
    (void)ckpt_on_ranks<Counting, false>(c, [&](auto& t, std::size_t r) {
      const observe::BackendCounts before = Counting::counts();
      (void)t.resume(scratch.path);
      resume[r] = Counting::counts() - before;
      return CkptRankState{};
    });
    for (std::size_t r = 0; r < save.size(); ++r) {
      INFO(name << ", rank " << r);
      // The blocks' download, then six messages: three agreements, the block counts and fingerprints, the
      // published directory's name.
      CHECK(save[r].event_waits == 7);
      CHECK(save[r].synchronize_calls == 0);
      // Four messages (the manifest read agreed, the counts and names of the blocks this model loads, the load
      // agreed) and the upload.
      CHECK(resume[r].event_waits == 5);
      CHECK(resume[r].synchronize_calls == 0);
    }
  }
}
