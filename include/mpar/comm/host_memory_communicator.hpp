#pragma once
/**
 * @file Which communicators move host memory only, and the check that refuses one for a backend whose rank memory
 * is a device's: the threads and MPI communicators read and write their buffers on the host, so over CudaBackend's
 * device memory their first collective would fault (a pointer the host cannot dereference).
 *
 * A communicator says so with `static constexpr bool moves_host_memory = true;` (ThreadsCommunicator,
 * MpiCommunicator); wrappers forward their inner communicator's (observe::TimedCommunicator,
 * OrderedP2pCommunicator). One without the member is not checked: NCCL, the device communicator and the
 * stream-ordered communicator carry their backend's memory.
 */
#include <string_view>

#include "mpar/backend/rank_transfer.hpp"
#include "mpar/comm/detail/comm_group.hpp"
#include "mpar/core/error.hpp"

namespace mpar {

/** @brief Whether `C` declares that it moves host memory only (`C::moves_host_memory`). */
template <class C>
inline constexpr bool host_memory_communicator = requires {
  requires C::moves_host_memory;
};

/**
 * @brief Throws (naming `who`, the rank, the group and the fix) when `comm` moves host memory, `B`'s rank memory is
 * a device's and the group has more than one rank; a one-rank group moves nothing, so it may stay.
 */
template <backend B, detail::comm_group C>
void require_reaches_rank_memory(const C& comm, std::string_view who) {
  if constexpr (host_memory_communicator<C> && device_rank_memory<B>)
    require(comm.size() == 1, who, " (rank ", comm.rank(), " of ", comm.size(), " in group '", comm.name(),
            "'): this communicator moves host memory, and the backend's rank memory (", B::memory_space::name,
            ") is a device's: its first collective would fault. Fix: use gpu::DeviceCommunicator (thread ranks "
            "sharing a GPU) or NcclCommunicator (one GPU per rank)");
}

}  // namespace mpar
