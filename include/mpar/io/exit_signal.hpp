#pragma once
/**
 * @file ExitSignal: a signal that asks a training job to stop, taken at a step boundary.
 *
 * A cluster scheduler ends a job with a signal (SIGTERM, or the one SLURM's `--signal` names) and, a grace
 * period later, SIGKILL. While an ExitSignal holds a signal, its arrival only sets a flag (a lock-free atomic,
 * so the handler is async-signal-safe and any thread may poll it); the training loop polls the flag between
 * steps, where it can save a checkpoint and exit. The signal may reach one process of an MPI job, and thread
 * ranks poll the process's flag at slightly different moments, so `exit_requested(comm, signal)` turns the
 * flags into one decision that every rank takes at the same step (docs/checkpoints.md, "Preemption").
 */
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "mpar/comm/detail/collective_communicator.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/layout.hpp"

namespace mpar::io {

namespace detail {
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");
/** Per signal number: whether it arrived while an ExitSignal held it, and whether one holds it. */
inline std::atomic<int> exit_signal_received[NSIG]{};
inline std::atomic<int> exit_signal_held[NSIG]{};
extern "C" inline void on_exit_signal(int sig) { exit_signal_received[sig].store(1, std::memory_order_relaxed); }
}  // namespace detail

/** "SIGTERM" for SIGTERM (the common ones by name), else "signal N". */
inline std::string signal_name(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    case SIGHUP:
      return "SIGHUP";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGXCPU:
      return "SIGXCPU";
    default:
      return "signal " + std::to_string(sig);
  }
}

/**
 * @brief Holds a signal for as long as the object lives: its arrival sets `received()` instead of ending the
 * process; the destructor restores the action the signal had before. One ExitSignal per signal at a time
 * (a second one for the same signal throws, as does a signal that cannot be caught, such as SIGKILL).
 * Interrupted system calls restart (SA_RESTART), so a checkpoint being written when the signal arrives is
 * not cut short.
 */
class ExitSignal {
 public:
  explicit ExitSignal(int sig) : signal_(sig) {
    require(sig > 0 && sig < NSIG, "ExitSignal: ", sig, " is not a signal number (1 to ", NSIG - 1, ")");
    require(detail::exit_signal_held[sig].exchange(1) == 0, "ExitSignal: ", signal_name(sig),
            " is already held by another ExitSignal of this process; hold each signal once");
    detail::exit_signal_received[sig].store(0);
    struct sigaction action {};
    action.sa_handler = detail::on_exit_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    if (::sigaction(sig, &action, &previous_) != 0) {
      const int err = errno;
      detail::exit_signal_held[sig].store(0);
      throw config_error(mpar::detail::cat("ExitSignal: cannot catch ", signal_name(sig), ": ", std::strerror(err)));
    }
  }
  ExitSignal(const ExitSignal&) = delete;
  ExitSignal& operator=(const ExitSignal&) = delete;
  ~ExitSignal() {
    ::sigaction(signal_, &previous_, nullptr);
    detail::exit_signal_held[signal_].store(0);
  }

  /** The signal held. */
  [[nodiscard]] int signal() const noexcept { return signal_; }
  /** Whether the signal arrived since this object was made (this process only; see `exit_requested`). */
  [[nodiscard]] bool received() const noexcept {
    return detail::exit_signal_received[signal_].load(std::memory_order_relaxed) != 0;
  }

 private:
  int signal_;
  struct sigaction previous_ {};
};

/**
 * Whether any rank of `comm` has received `signal` (collective: one max all-reduce of a std::int32_t flag). Every rank
 * returns the same answer, so called at the end of each step it stops every rank after the same step, whichever
 * process or thread the signal reached and when. The flag is a host value: `comm` must take host buffers (a
 * host communicator, or a trainer's `host_messages` world over a device).
 */
template <mpar::detail::collective_communicator C>
bool exit_requested(C& comm, const ExitSignal& signal) {
  std::int32_t flag[1] = {signal.received() ? 1 : 0};
  comm.all_reduce(std::span<std::int32_t>(flag), ReduceOp::max);
  return flag[0] != 0;
}

}  // namespace mpar::io
