// Parameter construction over the stream backends: the rank's backend writes the initial values in rank
// memory (`init_values`, a kernel on a device), so constructing a GptTrainer moves no parameter bytes from the
// host, and over DiscreteHostBackend, whose rank memory faults on any host access, it does not fault; the
// values equal a HostBackend construction's bit for bit.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
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

struct Construction {
  observe::BackendCounts counts;  // what constructing the trainer issued and touched
  std::uint64_t parameter_bytes = 0, parameters = 0;
  std::uint64_t vocab_mask_bytes = 0;  // this rank's mask of the padded vocabulary, if its head block has padding
};

/**
 * Constructs a GptTrainer for `c` on thread ranks over CountingBackend<StreamHostBackend> and takes no step;
 * `written` receives the bytes all ranks wrote from the host into rank memory by `write_initial` meanwhile.
 */
std::vector<Construction> construct_counting(const models::GptTrainConfig& c, std::uint64_t& written) {
  using B = observe::CountingBackend<StreamHostBackend>;
  std::vector<Construction> out(c.world_size());
  const std::uint64_t before_all = stream::shared_memory_resource().initial_bytes_written();
  run_threads(int(c.world_size()), [&](ThreadsCommunicator& w) {
    B::init_rank();
    StreamOrderedCommunicator<ThreadsCommunicator, B> world(w);
    Construction& r = out[std::size_t(w.rank())];
    const observe::BackendCounts before = B::counts();
    {
      models::GptTrainer<StreamOrderedCommunicator<ThreadsCommunicator, B>, B> t(world, c, testing::gpt_dataset());
      r.counts = B::counts() - before;
      for (const nn::Parameter* p : t.parameters()) {
        ++r.parameters;
        r.parameter_bytes += 2 * p->value.size() * sizeof(float);  // the value and its gradient
        // The last stage's head is the tied token embedding; a block reaching past the real vocabulary has padding
        // columns, which models/gpt.hpp masks with a host-built constant uploaded once (pipeline: outermost axis).
        const bool last_stage = std::size_t(w.rank()) >= c.world_size() - c.world_size() / c.pp;
        if (last_stage && p->name == "embed.token.weight" &&
            p->local_box[0].offset + p->local_box[0].extent > c.model.vocab)
          r.vocab_mask_bytes = p->local_box[0].extent * sizeof(float);
      }
      B::synchronize();
    }
    B::synchronize();
  });
  written = stream::shared_memory_resource().initial_bytes_written() - before_all;
  return out;
}

/** Every rank's parameters right after constructing a trainer over B (copied to the host after a wait). */
template <class B>
std::vector<std::vector<std::vector<float>>> initial_values(const models::GptTrainConfig& c) {
  std::vector<std::vector<std::vector<float>>> out(c.world_size());
  run_threads(int(c.world_size()), [&](ThreadsCommunicator& w) {
    auto run = [&](auto& world) {
      models::GptTrainer<std::decay_t<decltype(world)>, B> t(world, c, testing::gpt_dataset());
      for (const nn::Parameter* p : t.parameters()) {
        std::vector<float> v(p->value.size());
        mpar::copy_to_host<B>(p->value.data(), v.data(), v.size());
        out[std::size_t(w.rank())].push_back(std::move(v));
      }
      B::synchronize();
    };
    if constexpr (!std::is_same_v<B, HostBackend>) B::init_rank();
    testing::on_rank_world<B>(w, run);
  });
  return out;
}

std::vector<std::pair<std::string, models::GptTrainConfig>> construction_layouts() {
  auto moe = testing::small_gpt(1, 1, 1);
  moe.ep = 2;
  moe.model.experts = 4;
  moe.model.moe_top_k = 2;
  moe.model.moe_every = 2;
  auto zero = testing::small_gpt(1, 1, 2);
  zero.zero = parallel::ZeroStage::optimizer_states;
  auto bf16 = testing::small_gpt(1, 2, 1);
  bf16.precision = parallel::Precision::bf16;
  return {{"1 rank", testing::small_gpt(1, 1, 1)},
          {"tp2 x pp2", testing::small_gpt(2, 2, 1)},
          {"ZeRO-1 dp2", zero},
          {"bf16 pp2", bf16},
          {"moe ep2", moe}};
}

}  // namespace

TEST_CASE(
    "GPT construction over CountingBackend<StreamHostBackend>: parameters initialised by init_values, "
    "no parameter bytes from the host",
    "[stream][gpt][init]") {
  for (const auto& [name, c] : construction_layouts()) {
    std::uint64_t written = 0;
    const auto ranks = construct_counting(c, written);
    std::uint64_t parameter_bytes = 0, masks = 0;
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      const Construction& k = ranks[r];
      INFO(name << ", rank " << r << ": " << k.counts.by_kind());
      REQUIRE(k.parameters > 0);
      // One init_values per parameter block (a GPT parameter's block is never empty).
      CHECK(k.counts[observe::Op::init_values] == k.parameters);
      // No host loop over rank memory announced itself during construction.
      CHECK(k.counts.host_bytes == 0);
      parameter_bytes += k.parameter_bytes;
      masks += k.vocab_mask_bytes;
      std::printf(
          "%-12s rank %zu: %llu parameters, %llu init_values, %llu parameter bytes (value + gradient), "
          "vocabulary mask %llu bytes\n",
          name.c_str(), r, (unsigned long long)k.parameters, (unsigned long long)k.counts[observe::Op::init_values],
          (unsigned long long)k.parameter_bytes, (unsigned long long)k.vocab_mask_bytes);
    }
    // What the host still writes into rank memory: the padded vocabulary's mask, a constant only the host builds,
    // not a parameter. Before init_values every parameter's value and zero gradient came this way too.
    INFO(name << ": " << written << " bytes written from the host, " << parameter_bytes << " bytes of parameters");
    std::printf("%-12s all ranks: %llu bytes written from the host into rank memory, %llu bytes of parameters\n",
                name.c_str(), (unsigned long long)written, (unsigned long long)parameter_bytes);
    CHECK(masks > 0);  // the test vocabulary is padded: the comparison below counts something
    CHECK(written == masks);
  }
}

TEST_CASE("GPT construction over DiscreteHostBackend does not fault; initial values equal HostBackend bit for bit",
          "[stream][gpt][init][discrete]") {
  for (const auto& [name, c] : construction_layouts()) {
    INFO(name);
    const auto want = initial_values<HostBackend>(c);
    const auto got = initial_values<DiscreteHostBackend>(c);
    REQUIRE(got.size() == want.size());
    for (std::size_t r = 0; r < want.size(); ++r) {
      REQUIRE(got[r].size() == want[r].size());
      for (std::size_t i = 0; i < want[r].size(); ++i) {
        INFO("rank " << r << ", parameter " << i);
        CHECK(got[r][i] == want[r][i]);
      }
    }
  }
}
