#pragma once
/**
 * @file `stream::HostAccessTrace`: with `DiscreteHostBackend`, lists every place where host code
 * touches rank memory, instead of stopping at the first fault.
 *
 * A host access of rank memory faults (the host's view is `PROT_NONE`, see emulated_memory.hpp). While
 * a trace is alive, the fault handler records the access (read or write, and the call stack, once per
 * distinct stack), opens the page to the host for one instruction (the same pages, so the access sees
 * the real values), single-steps it (the x86 trap flag) and closes the page again. The program runs on
 * and every host access is found, which is how code is moved onto backend operations and asynchronous
 * copies one place at a time. A debugging aid: Linux on x86-64 only, one trace per process, and slow
 * (two signals and two `mprotect` per access).
 *
 * ```cpp
 * stream::HostAccessTrace trace;          // before the ranks start
 * run_threads(...);                       // over DiscreteHostBackend
 * trace.print(stderr);                    // each distinct stack once, with its count of accesses
 * ```
 */
#if !(defined(__linux__) && defined(__x86_64__))
#error "mpar/backend/stream/host_access_trace.hpp needs Linux on x86-64 (it single-steps with the trap flag)"
#endif

#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>

#include "mpar/backend/stream/emulated_memory.hpp"
#include "mpar/core/error.hpp"

namespace mpar::stream {

/** @brief Records host accesses of discrete rank memory while alive (see the file comment). */
class HostAccessTrace {
 public:
  static constexpr int max_depth = 16;
  static constexpr std::size_t max_sites = 4096;
  /** One distinct access site: its call stack (innermost first) and how often it ran. */
  struct Site {
    bool write = false;
    int depth = 0;
    void* frames[max_depth] = {};
    std::atomic<std::size_t> count{0};
  };

  HostAccessTrace() : sites_(new Site[max_sites]) {
    require(active() == nullptr, "HostAccessTrace: only one trace may be alive at a time");
    void* warm[2];
    (void)backtrace(warm, 2);  // the first call loads the unwinder (allocates): not in a signal handler
    active() = this;
    struct sigaction segv {
    }, trap{};
    segv.sa_sigaction = &HostAccessTrace::on_fault;
    segv.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&segv.sa_mask);
    trap.sa_sigaction = &HostAccessTrace::on_trap;
    trap.sa_flags = SA_SIGINFO;
    sigemptyset(&trap.sa_mask);
    sigaction(SIGSEGV, &segv, &old_segv_);
    sigaction(SIGTRAP, &trap, &old_trap_);
  }
  HostAccessTrace(const HostAccessTrace&) = delete;
  HostAccessTrace& operator=(const HostAccessTrace&) = delete;
  ~HostAccessTrace() {
    sigaction(SIGSEGV, &old_segv_, nullptr);
    sigaction(SIGTRAP, &old_trap_, nullptr);
    active() = nullptr;
  }

  /** The distinct access sites recorded so far. */
  [[nodiscard]] std::size_t site_count() const { return std::min(used_.load(), max_sites); }
  [[nodiscard]] const Site& site(std::size_t i) const { return sites_[i]; }
  /** Host accesses recorded so far (reads and writes, every execution). */
  [[nodiscard]] std::size_t accesses(bool write) const {
    std::size_t n = 0;
    for (std::size_t i = 0; i < site_count(); ++i)
      if (sites_[i].write == write) n += sites_[i].count.load();
    return n;
  }
  /** Prints each site: read or write, its count, and its stack (symbolise with addr2line, or link with -rdynamic). */
  void print(std::FILE* out) const {
    for (std::size_t i = 0; i < site_count(); ++i) {
      const Site& s = sites_[i];
      std::fprintf(out, "host %s of rank memory, %zu times:\n", s.write ? "write" : "read", s.count.load());
      std::fflush(out);
      backtrace_symbols_fd(const_cast<void* const*>(s.frames), s.depth, fileno(out));
    }
  }

 private:
  static HostAccessTrace*& active() {
    static HostAccessTrace* t = nullptr;
    return t;
  }
  static void*& open_page() {
    thread_local void* p = nullptr;
    return p;
  }
  static std::uintptr_t page_of(const void* a) {
    return reinterpret_cast<std::uintptr_t>(a) & ~(std::uintptr_t(::sysconf(_SC_PAGESIZE)) - 1);
  }

  static void on_fault(int sig, siginfo_t* info, void* ucv) {
    HostAccessTrace* t = active();
    if (t == nullptr || discrete_memory_resource().operation_address(info->si_addr) == nullptr) {
      // Not ours: restore the previous disposition; the faulting instruction runs again and faults there.
      if (t)
        sigaction(SIGSEGV, &t->old_segv_, nullptr);
      else
        signal(sig, SIG_DFL);
      return;
    }
    auto* uc = static_cast<ucontext_t*>(ucv);
    void* page = reinterpret_cast<void*>(page_of(info->si_addr));
    ::mprotect(page, std::size_t(::sysconf(_SC_PAGESIZE)), PROT_READ | PROT_WRITE);
    open_page() = page;
    uc->uc_mcontext.gregs[REG_EFL] |= 0x100;  // trap after this one instruction
    t->record((uc->uc_mcontext.gregs[REG_ERR] & 2) != 0);
  }
  static void on_trap(int, siginfo_t*, void* ucv) {
    auto* uc = static_cast<ucontext_t*>(ucv);
    if (void* page = open_page()) ::mprotect(page, std::size_t(::sysconf(_SC_PAGESIZE)), PROT_NONE);
    open_page() = nullptr;
    uc->uc_mcontext.gregs[REG_EFL] &= ~greg_t(0x100);
  }

  void record(bool write) {
    while (lock_.test_and_set(std::memory_order_acquire)) {}
    struct Unlock {
      std::atomic_flag& f;
      ~Unlock() { f.clear(std::memory_order_release); }
    } unlock{lock_};
    void* frames[max_depth + 2];
    const int n = backtrace(frames, max_depth + 2);  // frames[0..1]: this function and the handler
    const int depth = n > 2 ? n - 2 : 0;
    for (std::size_t i = 0; i < site_count(); ++i) {
      Site& s = sites_[i];
      if (s.write == write && s.depth == depth && std::equal(frames + 2, frames + 2 + depth, s.frames)) {
        ++s.count;
        return;
      }
    }
    const std::size_t i = used_.fetch_add(1);
    if (i >= max_sites) return;
    Site& s = sites_[i];
    s.write = write;
    s.depth = depth;
    std::copy(frames + 2, frames + 2 + depth, s.frames);
    s.count = 1;
  }

  struct sigaction old_segv_ {
  }, old_trap_{};
  std::unique_ptr<Site[]> sites_;
  std::atomic<std::size_t> used_{0};
  std::atomic_flag lock_ = ATOMIC_FLAG_INIT;  // recording threads (a fault handler cannot block on a mutex)
};

}  // namespace mpar::stream
