#pragma once
/**
 * @file ThreadsCommunicator: N ranks as threads of one process, collectives in shared memory.
 *
 * Every collective publishes each rank's buffer pointers in a per-group slot table, meets at a
 * barrier, and then every rank reads its peers' buffers directly: all_reduce is a shared-memory
 * reduce-scatter (rank r reduces block_of(n, p, r) straight from all peers' buffers into its own)
 * followed by an all-gather (each rank copies the other reduced blocks from their owners). There is
 * no staging buffer: the only copies are the ones the result needs.
 *
 * Failure semantics (see docs/communicators.md): fingerprints are always compared after the first
 * barrier, so mismatched calls throw the same comm_error on every rank (and leave the group usable);
 * a rank that throws out of `run_threads`, a timeout, or a peer that has already returned poisons
 * the whole run, and every rank blocked in, or later entering, a collective gets a comm_error.
 *
 * The pieces, one per header under mpar/comm/threads/:
 *   threads_options.hpp  ThreadsOptions
 *   world.hpp            ThreadsWorld: what every rank of one run shares
 *   slot.hpp             what a rank publishes for the collective in flight
 *   mailbox.hpp          a rank's point-to-point mailbox
 *   group.hpp            ThreadsGroup: slots, the barrier, mailboxes of one group
 *   progress_thread.hpp  the thread that runs a rank's asynchronous collectives
 *   request.hpp          ThreadsRequest
 *   threads_communicator.hpp  ThreadsCommunicator
 *   run_failure.hpp      rank_failure and the report of a failed run
 *   run_threads.hpp      run_threads
 */
#include "mpar/comm/threads/request.hpp"
#include "mpar/comm/threads/run_failure.hpp"
#include "mpar/comm/threads/run_threads.hpp"
#include "mpar/comm/threads/threads_communicator.hpp"
#include "mpar/comm/threads/threads_options.hpp"
