#pragma once
/**
 * @file Communicators: the `communicator` concept, the shared-memory ThreadsCommunicator with
 * `run_threads`, and the per-axis groups of a device mesh, and the adaptors (HierarchicalAllReduce, TopKCompressor, OrderedP2pCommunicator). The MPI
 * communicator needs MPI and is included explicitly: `#include "mpar/comm/mpi.hpp"` (target mpar::mpi).
 */
#include "mpar/comm/communicator.hpp"
#include "mpar/comm/hierarchical.hpp"
#include "mpar/comm/mesh_comms.hpp"
#include "mpar/comm/ordered_p2p_communicator.hpp"
#include "mpar/comm/threads.hpp"
#include "mpar/comm/topk.hpp"
