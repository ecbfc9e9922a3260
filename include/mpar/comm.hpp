#pragma once
/**
 * @file Communicators: the `communicator` concept, the shared-memory ThreadsCommunicator with
 * `run_threads`, and the per-axis groups of a device mesh. The MPI communicator needs MPI and is
 * included explicitly: `#include "mpar/comm/mpi.hpp"` (target mpar::mpi).
 */
#include "mpar/comm/communicator.hpp"
#include "mpar/comm/mesh_comms.hpp"
#include "mpar/comm/threads.hpp"
