// The explicit instantiations that mpar/models/gpt_trainer_instances.hpp declares (library mpar::trainers).
#include <mpar/models/gpt_trainer_instances.hpp>

#if !defined(MPAR_EXPLICIT_TRAINERS)
#error "src/gpt_trainers.cpp is built by the mpar_trainers target, which defines MPAR_EXPLICIT_TRAINERS"
#endif

namespace mpar::models {
template class GptTrainer<ThreadsCommunicator, HostBackend>;
template class GptPipelinePart<observe::TimedCommunicator<ThreadsCommunicator>, HostBackend>;
template std::vector<std::int32_t> generate(HostGptPipelinePart<ThreadsCommunicator>&, std::span<const std::int32_t>,
                                            std::size_t, const SamplingConfig&, const GenerateProgress&);
#if defined(MPAR_HAVE_MPI)
template class GptTrainer<MpiCommunicator, HostBackend>;
template class GptPipelinePart<observe::TimedCommunicator<MpiCommunicator>, HostBackend>;
template std::vector<std::int32_t> generate(HostGptPipelinePart<MpiCommunicator>&, std::span<const std::int32_t>,
                                            std::size_t, const SamplingConfig&, const GenerateProgress&);
#endif
}  // namespace mpar::models
