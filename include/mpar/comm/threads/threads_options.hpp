#pragma once
/**
 * @file ThreadsOptions: how a threads run is set up (group name, collective timeout, barrier spin).
 */
#include <chrono>
#include <string>

#include "mpar/comm/detail/collective_check.hpp"

namespace mpar {

/** @brief Options of a threads run: the world group's name, the collective timeout, the barrier spin. */
struct ThreadsOptions {
  std::string name = "world";
  /**
   * A collective or receive that waits longer than this for a peer fails on every rank; and once the
   * run has failed, a rank that has not returned this long afterwards is stuck outside the
   * communicator, so `run_threads` reports and ends the process (see run_threads). At least 1e9 s
   * (`MPAR_COMM_TIMEOUT_S=inf`) means no timeout.
   */
  std::chrono::duration<double> timeout = detail::default_comm_timeout();
  /** How long a rank spins at a barrier before it sleeps (MPAR_THREADS_SPIN_US; 0: never spin). */
  std::chrono::microseconds spin = detail::default_spin_time();
};

}  // namespace mpar
