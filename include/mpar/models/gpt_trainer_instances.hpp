#pragma once
/**
 * @file `GptTrainer` for the common (communicator, backend) pairs, compiled once instead of in every program
 * that trains: `GptTrainer<ThreadsCommunicator, HostBackend>` and, in a build with MPI,
 * `GptTrainer<MpiCommunicator, HostBackend>`, with the model they build (`GptPipelinePart` over the trainer's timed
 * tensor communicator) and `models::generate` on that model (train_gpt samples from a single-rank copy).
 *
 * With `MPAR_EXPLICIT_TRAINERS` defined — by linking the static library `mpar::trainers` of the build tree
 * (CMake option `MPAR_EXPLICIT_TRAINERS`, on by default; examples/train_gpt links it) — this header declares
 * those specialisations `extern template`, and src/gpt_trainers.cpp instantiates them: a program including it
 * compiles none of the trainer's member functions itself (docs/performance.md, "Compile cost"). Without the
 * macro it is `mpar/models/gpt_trainer.hpp` and nothing else, so the installed package stays header-only.
 * Other pairs (a counting or CUDA backend, another communicator) are instantiated where they are used, as
 * always.
 */
#include "mpar/backend/host/host_backend.hpp"
#include "mpar/comm/threads.hpp"
#include "mpar/models/gpt_generate.hpp"
#include "mpar/models/gpt_trainer.hpp"
#include "mpar/observe/timed_communicator.hpp"
#if defined(MPAR_EXPLICIT_TRAINERS) && defined(MPAR_HAVE_MPI)
#include "mpar/comm/mpi.hpp"
#endif

#if defined(MPAR_EXPLICIT_TRAINERS)
namespace mpar::models {
/** The model a `GptTrainer<Comm, HostBackend>` builds: its stages run over the timed tensor communicator. */
template <class Comm>
using HostGptPipelinePart = GptPipelinePart<observe::TimedCommunicator<Comm>, HostBackend>;

extern template class GptTrainer<ThreadsCommunicator, HostBackend>;
extern template class GptPipelinePart<observe::TimedCommunicator<ThreadsCommunicator>, HostBackend>;
extern template std::vector<std::int32_t> generate(HostGptPipelinePart<ThreadsCommunicator>&,
                                                   std::span<const std::int32_t>, std::size_t, const SamplingConfig&,
                                                   const GenerateProgress&);
#if defined(MPAR_HAVE_MPI)
extern template class GptTrainer<MpiCommunicator, HostBackend>;
extern template class GptPipelinePart<observe::TimedCommunicator<MpiCommunicator>, HostBackend>;
extern template std::vector<std::int32_t> generate(HostGptPipelinePart<MpiCommunicator>&, std::span<const std::int32_t>,
                                                   std::size_t, const SamplingConfig&, const GenerateProgress&);
#endif
}  // namespace mpar::models
#endif
