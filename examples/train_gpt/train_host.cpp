// train_gpt's host part: the training loop (train.hpp) on the host backend, over MPI under mpirun or over
// thread ranks. GptTrainer itself comes compiled from mpar::trainers (models/gpt_trainer_instances.hpp).
#include <exception>
#include <optional>
#include <regex>
#include <string>

#include <mpar/models/layout_check.hpp>
#include <mpar/mpar.hpp>
#if defined(MPAR_HAVE_MPI)
#include <mpar/comm/mpi.hpp>
#endif

#if defined(TRAIN_GPT_DISCRETE_RANK_MEMORY)
#include <mpar/backend/stream/stream_backend.hpp>
#include <mpar/comm/stream_ordered_communicator.hpp>

#include "rank_world.hpp"  // tests/stream: a communicator that takes rank memory only
#endif

#include "options.hpp"
#include "train.hpp"

namespace train_gpt {

void check_mesh(const models::GptTrainConfig& t) {
  auto probe = t;
  probe.model.vocab = 1;  // the vocabulary is known once the data is read; here it only needs to be positive
  probe.pad_vocab_for_mesh();
  probe.validate(probe.world_size());
}

int run_host(const Options& o, int* argc, char*** argv) {
  if (under_mpirun()) {
#if defined(MPAR_HAVE_MPI)
    MpiEnvironment env(argc, argv);
    const auto exit_signal = hold_exit_signal(o);  // after MPI's start, which may install handlers of its own
    run_mpi([&](MpiCommunicator& world) { train<HostBackend>(world, o, true, exit_signal.get()); });
    return 0;
#else
    (void)argc, (void)argv;
    throw config_error("train_gpt: started under mpirun, but this build has no MPI; rebuild with MPAR_ENABLE_MPI=ON");
#endif
  }
  (void)argc, (void)argv;
  const auto exit_signal = hold_exit_signal(o);
  // The data and the whole configuration are checked before any thread rank starts; the --save
  // directory is locked (and so known to be writable) for the whole run.
  preflight(o);
  std::optional<io::DirectoryLock> save_lock;
  if (!o.save.empty()) save_lock.emplace(o.save);
#if defined(TRAIN_GPT_DISCRETE_RANK_MEMORY)
  // A test build of this program (train_gpt_discrete, never installed): every rank's memory is DiscreteHostBackend's,
  // which the host cannot dereference (a GPU's memory), and the world takes rank memory only (NCCL's contract), so
  // any host access to rank memory in the program faults on the CPU.
  run_threads(int(o.train.world_size()), [&](ThreadsCommunicator& w) {
    DiscreteHostBackend::init_rank();
    testing::RankMemoryOnlyCommunicator<DiscreteHostBackend> world{
        StreamOrderedCommunicator<ThreadsCommunicator, DiscreteHostBackend>(w)};
    train<DiscreteHostBackend>(world, o, false, exit_signal.get());
    DiscreteHostBackend::synchronize();
  });
#else
  run_threads(int(o.train.world_size()),
              [&](ThreadsCommunicator& world) { train<HostBackend>(world, o, false, exit_signal.get()); });
#endif
  return 0;
}

int run_layout_check(const Options& o) {
  preflight(o);  // the data, and the layout's memory per rank
  // The one-rank run holds the whole model while no other rank runs: the budget is the machine's, or --mem-limit-gib.
  models::GptTrainConfig cfg = o.train;
  std::optional<data::CharDataset> chars;
  std::optional<data::TokenFile> tokens;
  if (is_token_file(o.data))
    tokens.emplace(o.data, token_file_vocab(o), cfg.model.seq);
  else
    chars.emplace(o.data, cfg.model.seq);
  const data::SourceRef src = chars ? data::SourceRef(*chars) : data::SourceRef(*tokens);
  cfg.model.vocab = src.vocab_size();
  const models::GptTrainConfig one = models::single_rank_of(cfg);
  const double need = estimate_rank_memory(one).total(),
               budget = o.mem_limit_gib > 0 ? o.mem_limit_gib * double(1ull << 30)
                                            : double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGE_SIZE));
  require(need <= budget, "train_gpt: --check-layout's one-rank run needs about ", need / double(1ull << 30),
          " GiB, more than the ", budget / double(1ull << 30),
          " GiB available; check the layout on a smaller model of the same shape (fewer --layers, a smaller --hidden "
          "or --batch), or raise --mem-limit-gib");
  const int zero = parallel::stage_number(cfg.zero);
  std::printf(
      "check-layout: tp=%zu pp=%zu dp=%zu cp=%zu ep=%zu (%zu thread ranks), schedule %s%s%s%s, %s, against "
      "one rank; %zu steps from the same seeds and data\n",
      cfg.tp, cfg.pp, cfg.dp, cfg.cp, cfg.ep, cfg.world_size(),
      std::string(pipeline::schedule_name(cfg.schedule)).c_str(),
      zero ? (", ZeRO-" + std::to_string(zero)).c_str() : "", cfg.model.sequence_parallel ? ", sequence parallel" : "",
      cfg.recompute ? ", recompute" : "", std::string(parallel::name_of(cfg.precision)).c_str(), o.check_steps);
  std::fflush(stdout);
  const fs::path scratch = fs::temp_directory_path() / ("mpar-check-layout-" + std::to_string(::getpid()));
  struct Remove {
    fs::path dir;
    ~Remove() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } remove{scratch};
  const models::LayoutCheck c = models::check_layout(cfg, one, src, o.check_steps, scratch);
  std::printf("%5s  %14s  %14s  %9s\n", "step", "layout loss", "one-rank loss", "rel diff");
  for (std::size_t s = 0; s < c.losses.size(); ++s)
    std::printf("%5zu  %14.8f  %14.8f  %9.2e\n", s + 1, c.losses[s], c.reference_losses[s],
                std::abs(c.losses[s] - c.reference_losses[s]) / std::max(std::abs(c.reference_losses[s]), 1e-30));
  const auto& t = c.tolerance;
  std::printf("largest loss difference: %.2e (relative) at step %zu, limit %.0e: %s\n", c.loss_difference,
              c.loss_step + 1, t.loss, c.losses_pass() ? "ok" : "TOO LARGE");
  const std::string limit = std::isfinite(t.parameter) ? mpar::detail::cat("limit ", t.parameter) : "not judged";
  std::printf("largest parameter difference after step %zu: %.2e in %s (every parameter as a whole tensor), %s%s\n",
              c.losses.size(), c.parameter_difference.largest,
              c.parameter_difference.tensor.empty() ? "none" : c.parameter_difference.tensor.c_str(), limit.c_str(),
              std::isfinite(t.parameter) ? (c.parameters_pass() ? ": ok" : ": TOO LARGE") : "");
  std::printf("attention key bias (not judged: softmax ignores it, so AdamW moves it by rounding noise): %.2e\n",
              c.key_bias_difference.largest);
  std::printf("tolerance: %s\n", t.reason.c_str());
  std::printf("check-layout: %s\n", c.passed() ? "PASSED" : "FAILED: this layout does not train the one-rank model");
  std::fflush(stdout);
  return c.passed() ? 0 : 1;
}

std::string error_line(const std::exception& e) {
  // One "train_gpt: " in front; a rank's failure keeps its "rank N: " ("train_gpt: rank 0: ran out of memory ...").
  const std::string what = std::regex_replace(e.what(), std::regex("(^|\n)(rank [0-9]+: )train_gpt: "), "$1$2");
  return (what.starts_with("train_gpt") ? "" : "train_gpt: ") + what;
}

}  // namespace train_gpt
