// train_gpt's host part: the training loop (train.hpp) on the host backend, over MPI under mpirun or over
// thread ranks. GptTrainer itself comes compiled from mpar::trainers (models/gpt_trainer_instances.hpp).
#include <exception>
#include <optional>
#include <regex>
#include <string>

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

std::string error_line(const std::exception& e) {
  // One "train_gpt: " in front; a rank's failure keeps its "rank N: " ("train_gpt: rank 0: ran out of memory ...").
  const std::string what = std::regex_replace(e.what(), std::regex("(^|\n)(rank [0-9]+: )train_gpt: "), "$1$2");
  return (what.starts_with("train_gpt") ? "" : "train_gpt: ") + what;
}

}  // namespace train_gpt
