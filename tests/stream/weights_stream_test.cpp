// Weight import over the stream-ordered backends (backend/stream/): `GptTrainer::load_weights` writes every
// parameter's block into host staging and uploads them with the stream-ordered copies (io/staged_blocks.hpp).
// DiscreteHostBackend faults on any host access to rank memory, so a block written on the host without the staging
// crashes. The references: the source's own values cut to each rank's box by naive index arithmetic (HostBackend's
// import), HostBackend's import for the stream backends, and HostBackend's training steps after it.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include <mpar/backend/rank_transfer.hpp>
#include <mpar/backend/stream/stream_backend.hpp>
#include <mpar/comm/threads.hpp>
#include <mpar/io/safetensors.hpp>
#include <mpar/models/gpt_trainer.hpp>
#include <mpar/observe/counting_backend.hpp>

#include "models/gpt_test_config.hpp"
#include "rank_world.hpp"

namespace {

using mpar::DiscreteHostBackend;
using mpar::HostBackend;
using mpar::StreamHostBackend;
using mpar::ThreadsCommunicator;

/** A deterministic whole tensor for `name` of `shape`: values depend on the name and the element index only. */
std::vector<float> weights_source_tensor(const std::string& name, const std::vector<std::size_t>& shape) {
  std::size_t n = 1;
  for (auto d : shape) n *= d;
  const double seed = double(std::hash<std::string>{}(name) % 1000) * 0.013;
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float(0.05 * std::sin(seed + 0.37 * double(i)));
  return v;
}
/** Whether the partial source leaves `name` out (the parameter keeps its initial values). */
bool weights_source_skips(const std::string& name) { return std::hash<std::string>{}(name) % 3 == 0; }

/**
 * One rank's parameters (full under ZeRO-3) and, after training, the last step's loss; what the import returned or
 * threw, and a reference computed on the rank. The main thread checks them (Catch's assertions are not thread-safe).
 */
struct WeightsRankState {
  double loss = 0.0;
  std::vector<std::string> names;
  std::vector<std::vector<float>> values;
  std::size_t loaded = 0;
  std::string error;
  std::vector<std::vector<float>> expected;
};

/** The import's outcome: the number of tensors loaded, or the error it threw. */
template <class Trainer, class Source>
void weights_try_import(Trainer& t, Source&& source, WeightsRankState& s) {
  try {
    s.loaded = t.load_weights(source);
  } catch (const std::exception& e) {
    s.error = e.what();
  }
}

template <class B, class Trainer>
WeightsRankState weights_read(Trainer& t) {
  WeightsRankState s;
  t.with_full_parameters([&] {
    for (const mpar::nn::Parameter* p : t.parameters()) {
      s.names.push_back(p->name);
      std::vector<float> v(p->value.size());
      mpar::copy_to_host<B>(p->value.data(), v.data(), v.size());
      s.values.push_back(std::move(v));
    }
  });
  return s;
}

/** Runs `body(trainer, rank)` on every thread rank over backend B (with a world without host twin if asked). */
template <class B, bool host_twin = true, class Body>
std::vector<WeightsRankState> weights_on_ranks(const mpar::models::GptTrainConfig& c, Body body) {
  std::vector<WeightsRankState> out(c.world_size());
  mpar::run_threads(int(c.world_size()), [&](ThreadsCommunicator& w) {
    B::init_rank();
    auto run = [&](auto& world) {
      mpar::models::GptTrainer<std::decay_t<decltype(world)>, B> t(world, c, mpar::testing::gpt_dataset());
      out[std::size_t(w.rank())] = body(t, std::size_t(w.rank()));
      B::synchronize();
    };
    if constexpr (host_twin)
      mpar::testing::on_rank_world<B>(w, run);
    else
      mpar::testing::on_rank_memory_world<B>(w, run);
  });
  return out;
}

/** Imports the generated weights (all, or the partial source's), reads them, takes two steps and reads again. */
template <class B>
std::pair<std::vector<WeightsRankState>, std::vector<WeightsRankState>> weights_import_and_train(
    const mpar::models::GptTrainConfig& c, bool partial) {
  std::vector<WeightsRankState> imported(c.world_size());
  auto trained = weights_on_ranks<B>(c, [&](auto& t, std::size_t r) {
    std::vector<float> held;
    const std::size_t n = t.load_weights([&](const std::string& name, const std::vector<std::size_t>& shape) {
      if (partial && weights_source_skips(name)) return std::span<const float>();
      held = weights_source_tensor(name, shape);
      return std::span<const float>(held);
    });
    imported[r] = weights_read<B>(t);
    imported[r].loaded = n;
    (void)t.train_step();
    const double loss = t.train_step().loss;
    WeightsRankState s = weights_read<B>(t);
    s.loss = loss;
    return s;
  });
  return {imported, trained};
}

void weights_check_same(const std::string& what, const std::vector<WeightsRankState>& got,
                        const std::vector<WeightsRankState>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t r = 0; r < want.size(); ++r) {
    INFO(what << ", rank " << r);
    CHECK(got[r].loss == want[r].loss);
    CHECK(got[r].loaded == want[r].loaded);
    REQUIRE(got[r].names == want[r].names);
    for (std::size_t i = 0; i < want[r].values.size(); ++i) {
      INFO("parameter " << want[r].names[i]);
      CHECK(got[r].values[i] == want[r].values[i]);
    }
  }
}

/** The layouts imported into: one rank, tensor parallelism, two pipeline stages (tied head), ZeRO-3's shards. */
std::vector<std::pair<std::string, mpar::models::GptTrainConfig>> weights_layouts() {
  auto zero3 = mpar::testing::small_gpt(1, 1, 2);
  zero3.zero = mpar::parallel::ZeroStage::parameters;
  zero3.bucket_bytes = 4096;
  return {{"1 rank", mpar::testing::small_gpt(1, 1, 1)},
          {"tp2", mpar::testing::small_gpt(2, 1, 1)},
          {"pp2", mpar::testing::small_gpt(1, 2, 1)},
          {"ZeRO-3 dp2", zero3}};
}

/**
 * The independent reference for HostBackend's import: each parameter's block of the generated tensor, found by
 * walking the whole tensor and keeping the elements inside the parameter's box (row-major within the box); a
 * parameter the partial source leaves out keeps `kept`'s values.
 */
template <class Trainer>
std::vector<std::vector<float>> weights_blocks_of_source(Trainer& t, const WeightsRankState& kept, bool partial) {
  std::vector<std::vector<float>> out;
  std::size_t i = 0;
  for (const mpar::nn::Parameter* p : t.parameters()) {
    if (partial && weights_source_skips(p->name)) {
      out.push_back(kept.values[i++]);
      continue;
    }
    const auto full = weights_source_tensor(p->name, p->global_shape);
    std::vector<float> want;
    const std::size_t rank = p->global_shape.size();
    std::vector<std::size_t> idx(rank, 0);
    for (std::size_t g = 0; g < full.size(); ++g) {
      std::size_t rem = g;
      bool inside = true;
      for (std::size_t d = rank; d-- > 0;) {
        idx[d] = rem % p->global_shape[d];
        rem /= p->global_shape[d];
        inside = inside && idx[d] >= p->local_box[d].offset && idx[d] < p->local_box[d].offset + p->local_box[d].extent;
      }
      if (inside) want.push_back(full[g]);
    }
    out.push_back(std::move(want));
    ++i;
  }
  return out;
}

}  // namespace

TEST_CASE("load_weights over HostBackend writes each rank's block of the source's tensors", "[stream][weights]") {
  for (const auto& [name, c] : weights_layouts()) {
    for (bool partial : {false, true}) {
      INFO(name << (partial ? ", partial source" : ""));
      const auto got = weights_on_ranks<HostBackend>(c, [&](auto& t, std::size_t) {
        const WeightsRankState initial = weights_read<HostBackend>(t);
        std::vector<float> held;
        WeightsRankState s;
        weights_try_import(
            t,
            [&](const std::string& n, const std::vector<std::size_t>& shape) {
              if (partial && weights_source_skips(n)) return std::span<const float>();
              held = weights_source_tensor(n, shape);
              return std::span<const float>(held);
            },
            s);
        const std::string error = s.error;
        const std::size_t loaded = s.loaded;
        s = weights_read<HostBackend>(t);
        s.error = error;
        s.loaded = loaded;
        s.expected = weights_blocks_of_source(t, initial, partial);
        return s;
      });
      for (std::size_t r = 0; r < got.size(); ++r) {
        INFO("rank " << r);
        CHECK(got[r].error.empty());
        CHECK(got[r].loaded > 0);
        REQUIRE(got[r].values.size() == got[r].expected.size());
        for (std::size_t i = 0; i < got[r].values.size(); ++i) {
          INFO("parameter " << got[r].names[i]);
          CHECK(got[r].values[i] == got[r].expected[i]);
        }
      }
    }
  }
}

TEST_CASE("load_weights over StreamHostBackend and DiscreteHostBackend equals HostBackend's, and so does training",
          "[stream][weights][discrete]") {
  for (const auto& [name, c] : weights_layouts()) {
    for (bool partial : {false, true}) {
      const std::string what = name + (partial ? ", partial source" : "");
      const auto [want_imported, want_trained] = weights_import_and_train<HostBackend>(c, partial);
      REQUIRE(want_trained.front().loss > 0.0);
      const auto [stream_imported, stream_trained] = weights_import_and_train<StreamHostBackend>(c, partial);
      weights_check_same(what + ": StreamHostBackend imported", stream_imported, want_imported);
      weights_check_same(what + ": StreamHostBackend trained", stream_trained, want_trained);
      const auto [discrete_imported, discrete_trained] = weights_import_and_train<DiscreteHostBackend>(c, partial);
      weights_check_same(what + ": DiscreteHostBackend imported", discrete_imported, want_imported);
      weights_check_same(what + ": DiscreteHostBackend trained", discrete_trained, want_trained);
    }
  }
}

TEST_CASE("load_weights over CountingBackend<StreamHostBackend>: one host wait per import",
          "[stream][weights][counts]") {
  using Counting = mpar::observe::CountingBackend<StreamHostBackend>;
  for (const auto& [name, c] : weights_layouts()) {
    if (name == "ZeRO-3 dp2") continue;  // its gathers and the release around the import are ZeRO-3's own
    std::vector<mpar::observe::BackendCounts> counts(c.world_size());
    (void)weights_on_ranks<Counting>(c, [&](auto& t, std::size_t r) {
      std::vector<float> held;
      Counting::synchronize();  // construction's work done: the count is the import's alone
      const mpar::observe::BackendCounts before = Counting::counts();
      (void)t.load_weights([&](const std::string& n, const std::vector<std::size_t>& shape) {
        held = weights_source_tensor(n, shape);
        return std::span<const float>(held);
      });
      counts[r] = Counting::counts() - before;
      return WeightsRankState{};
    });
    for (std::size_t r = 0; r < counts.size(); ++r) {
      INFO(name << ", rank " << r);
      CHECK(counts[r].event_waits == 1);  // every parameter's upload issued together, waited for once
      CHECK(counts[r].synchronize_calls == 0);
    }
  }
}

TEST_CASE("load_weights over DiscreteHostBackend: a mismatched weights file is refused on every rank, nothing written",
          "[stream][weights][discrete][safetensors]") {
  const auto dir = std::filesystem::temp_directory_path() / ("mpar-weightsstream-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto file = dir / "other-sizes.safetensors";
  // The whole model's tensors, one of them with a row too many: a file from a model of other sizes.
  const auto c = mpar::testing::small_gpt(2, 1, 1);
  {
    std::vector<std::vector<float>> values;
    std::vector<mpar::io::NamedTensor> tensors;
    mpar::run_threads(1, [&](ThreadsCommunicator& w) {
      mpar::testing::on_rank_world<HostBackend>(w, [&](auto& world) {
        mpar::models::GptTrainer<std::decay_t<decltype(world)>, HostBackend> t(world, mpar::testing::small_gpt(1, 1, 1),
                                                                               mpar::testing::gpt_dataset());
        for (const auto& [n, p] : t.named_parameters()) {
          auto shape = p->global_shape;
          if (tensors.size() == 3) shape.back() += 1;
          values.push_back(weights_source_tensor(n, shape));
          tensors.push_back(mpar::io::NamedTensor{n, shape, {}});
        }
      });
    });
    for (std::size_t i = 0; i < tensors.size(); ++i) tensors[i].values = values[i];
    mpar::io::write_safetensors(file, std::span<const mpar::io::NamedTensor>(tensors));
  }
  const auto fresh = weights_on_ranks<DiscreteHostBackend>(
      c, [&](auto& t, std::size_t) { return weights_read<DiscreteHostBackend>(t); });
  const auto after = weights_on_ranks<DiscreteHostBackend>(c, [&](auto& t, std::size_t) {
    mpar::io::SafetensorsWeights w(file, mpar::io::WeightNaming::mpar);
    WeightsRankState tried;
    weights_try_import(t, w, tried);
    WeightsRankState s = weights_read<DiscreteHostBackend>(t);
    s.error = tried.error;
    return s;
  });
  for (const auto& s : after)
    CHECK_THAT(s.error, Catch::Contains(file.filename().string()) && Catch::Contains("needs [") &&
                            Catch::Contains("other sizes"));
  weights_check_same("after the refused import", after, fresh);  // the staging was never uploaded
  // A source of the wrong size on one rank only: that rank throws naming the tensor; the other is not held up
  // (an import has no communication).
  const auto one_fails = weights_on_ranks<DiscreteHostBackend>(c, [&](auto& t, std::size_t r) {
    std::vector<float> held;
    WeightsRankState s;
    weights_try_import(
        t,
        [&](const std::string& n, const std::vector<std::size_t>& shape) {
          held = weights_source_tensor(n, shape);
          if (r == 1) held.pop_back();
          return std::span<const float>(held);
        },
        s);
    return s;
  });
  CHECK(one_fails[0].error.empty());
  CHECK(one_fails[0].loaded > 0);
  CHECK_THAT(one_fails[1].error, Catch::Contains("load_weights: '") && Catch::Contains("the source gave"));
  std::filesystem::remove_all(dir);
}
