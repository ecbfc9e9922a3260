#pragma once
/**
 * @file The SIMT core of the emulated CUDA runtime: runs a launch's grid × block threads on the launching
 * host thread, the threads of a block as fibers (ucontext), so that `__syncthreads` and the warp
 * collectives are real rendezvous instead of no-ops.
 *
 * - **Blocks** run one after another; a block's threads are fibers on small reused stacks (guard page below).
 * - **Scheduling** exposes races instead of hiding them: the lowest-numbered runnable thread runs (the highest in
 *   odd blocks) until it blocks (a barrier, a warp collective) or exits, so one warp runs as far ahead of the
 *   others as the barriers let it. A read that is right only when its writer happens to run first, or a write
 *   that is right only when the slower warps have read (a missing barrier), is wrong in one of the two orders.
 * - **Rules are checked, never hung on**: a `__syncthreads` that a thread of the block exits without reaching,
 *   or that threads reach at different places, a warp collective whose mask names a lane that exits, that does
 *   not exist, or that waits elsewhere, and a round in which no thread can move, all throw `emulation_error`
 *   naming the kernel, the block, the thread and the source lines.
 *
 * What a kernel reads (`threadIdx`, `__syncthreads`, the shuffles) is in thread_builtins.hpp and warp.hpp;
 * launch.hpp turns a launch into `Executor::run`.
 */
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <source_location>
#include <string>
#include <vector>

#include "mpar/backend/gpu/emulation/error.hpp"
#include "mpar/backend/gpu/emulation/types.hpp"
#include "mpar/core/error.hpp"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define MPAR_EMULATION_ASAN 1
#endif

namespace mpar::gpu::emulation {

inline constexpr unsigned warp_lanes = 32;

namespace detail {

inline std::string place(const std::source_location& l) { return mpar::detail::cat(l.file_name(), ":", l.line()); }
inline bool same_place(const std::source_location& a, const std::source_location& b) {
  return a.line() == b.line() && a.column() == b.column() && std::strcmp(a.file_name(), b.file_name()) == 0;
}
inline std::string text(uint3 v) { return mpar::detail::cat("(", v.x, ",", v.y, ",", v.z, ")"); }

/** What a fiber waits for when the scheduler looks at it. */
enum class Wait { nothing, barrier, warp, exited };

struct Fiber {
  ucontext_t context{};
  uint3 thread_idx;
  unsigned linear = 0;  // x + blockDim.x (y + blockDim.y z): lane = linear % 32, warp = linear / 32
  Wait wait = Wait::nothing;
  std::uint64_t generation = 0;  // the generation of the barrier or warp collective it waits to see pass
  std::source_location waits_at;
  // A warp collective: what this lane sends, the lane it reads, and what it got.
  std::uint64_t sent = 0, received = 0;
  unsigned source_lane = 0, ballot = 0;
  void* fake_stack = nullptr;  // AddressSanitizer's record of the fiber's stack while it is switched out
};

struct Warp {
  unsigned lanes = 0;    // the lanes that exist (the last warp of a block may be partial)
  unsigned exited = 0;   // lanes that returned
  unsigned arrived = 0;  // lanes waiting in the collective under way
  unsigned mask = 0;     // the collective's mask, as its first lane named it
  const char* operation = "";
  std::source_location at;
  std::uint64_t generation = 0;  // collectives completed
};

/** A fiber stack: `bytes` usable above one PROT_NONE guard page, so an overflow faults instead of corrupting. */
struct FiberStack {
  char* mapping = nullptr;
  std::size_t mapped = 0;
  char* base = nullptr;
  std::size_t bytes = 0;
};

}  // namespace detail

/**
 * @brief Runs kernels on the calling thread (one per host thread: `Executor::here()`), and answers the
 * built-ins of the fiber that is running.
 */
class Executor {
 public:
#if defined(MPAR_EMULATION_ASAN)
  static constexpr std::size_t stack_bytes = std::size_t(256) << 10;  // instrumented frames are larger
#else
  static constexpr std::size_t stack_bytes = std::size_t(64) << 10;
#endif

  [[nodiscard]] static Executor& here() {
    thread_local Executor e;
    return e;
  }
  Executor() = default;
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  ~Executor() {
    for (const detail::FiberStack& s : stacks_) ::munmap(s.mapping, s.mapped);
  }

  /**
   * Runs `body(context)` as every thread of the grid; throws emulation_error for a bad configuration or a
   * broken rule, and rethrows what a thread threw. `dynamic_shared_bytes` are the block's `extern __shared__`.
   */
  void run(const char* kernel, dim3 grid, dim3 block, std::size_t dynamic_shared_bytes, void (*body)(const void*),
           const void* context) {
    const std::uint64_t threads = std::uint64_t(block.x) * block.y * block.z;
    if (running_)
      throw emulation_error(mpar::detail::cat("launch of ", kernel, " from inside kernel ", kernel_,
                                              ": dynamic parallelism is not emulated"));
    if (threads == 0 || threads > 1024 || block.z > 64)
      throw emulation_error(mpar::detail::cat("launch of ", kernel, ": block ",
                                              detail::text({block.x, block.y, block.z}), " has ", threads,
                                              " threads; CUDA allows 1 to 1024 (z at most 64)"));
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
      throw emulation_error(mpar::detail::cat("launch of ", kernel, ": grid ", detail::text({grid.x, grid.y, grid.z}),
                                              " is outside CUDA's limits (x 1..2^31-1, y and z 1..65535)"));
    if (dynamic_shared_bytes > max_dynamic_shared_bytes)
      throw emulation_error(mpar::detail::cat("launch of ", kernel, ": ", dynamic_shared_bytes,
                                              " bytes of dynamic shared memory exceed the ", max_dynamic_shared_bytes,
                                              " an H100 block can have"));
    kernel_ = kernel;
    grid_ = grid;
    block_ = block;
    body_ = body;
    context_ = context;
    dynamic_shared_.resize(dynamic_shared_bytes);
    prepare(unsigned(threads));
    running_ = true;
    try {
      for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
          for (unsigned x = 0; x < grid.x; ++x) run_block({x, y, z});
    } catch (...) {
      running_ = false;
      current_ = nullptr;
      throw;
    }
    running_ = false;
    current_ = nullptr;
  }

  // ---- what the built-ins read (thread_builtins.hpp, warp.hpp) -------------------------------------------

  [[nodiscard]] detail::Fiber& fiber(const char* builtin) {
    if (current_ == nullptr)
      throw emulation_error(mpar::detail::cat(builtin, " used outside a kernel (only a launched thread has it)"));
    return *current_;
  }
  [[nodiscard]] const uint3& block_idx() {
    (void)fiber("blockIdx");
    return block_idx_;
  }
  [[nodiscard]] const dim3& block_dim() {
    (void)fiber("blockDim");
    return block_;
  }
  [[nodiscard]] const dim3& grid_dim() {
    (void)fiber("gridDim");
    return grid_;
  }
  [[nodiscard]] void* dynamic_shared_memory() {
    (void)fiber("dynamic shared memory");
    return dynamic_shared_.data();
  }

  /** `__syncthreads()`: waits until every thread of the block has reached this barrier. */
  void syncthreads(const std::source_location& at) {
    detail::Fiber& f = fiber("__syncthreads");
    if (exited_threads_ > 0)
      fail(mpar::detail::cat("__syncthreads at ", detail::place(at), " reached after thread ",
                             detail::text(first_exited_), " of the block exited: a barrier every thread must reach"));
    if (barrier_arrived_ == 0)
      barrier_at_ = at;
    else if (!detail::same_place(barrier_at_, at))
      fail(mpar::detail::cat("threads of the block wait at two different __syncthreads: ", detail::place(barrier_at_),
                             " and ", detail::place(at), " (a barrier in divergent code)"));
    f.wait = detail::Wait::barrier;
    f.generation = barrier_generation_;
    f.waits_at = at;
    if (++barrier_arrived_ == threads_) {
      barrier_arrived_ = 0;
      ++barrier_generation_;
      ++releases_;
    }
    yield();
  }

  /**
   * One warp collective: this lane sends `value` and reads lane `source_lane`'s, after every lane of `mask`
   * has arrived at the same collective (`operation` at `at`). `ballot` gets the mask's lanes whose value is
   * non-zero. Returns the value read.
   */
  std::uint64_t warp_collective(unsigned mask, std::uint64_t value, unsigned source_lane, const char* operation,
                                const std::source_location& at, unsigned* ballot = nullptr) {
    detail::Fiber& f = fiber(operation);
    const unsigned lane = f.linear % warp_lanes, w = f.linear / warp_lanes;
    detail::Warp& warp = warps_[w];
    if (!(mask >> lane & 1u))
      fail(mpar::detail::cat(operation, " at ", detail::place(at), ": mask 0x", hex(mask),
                             " does not name the calling lane ", lane));
    if (mask & ~warp.lanes)
      fail(mpar::detail::cat(operation, " at ", detail::place(at), ": mask 0x", hex(mask), " names lanes (0x",
                             hex(mask & ~warp.lanes), ") that do not exist in warp ", w, " of a block of ", threads_,
                             " threads"));
    if (mask & warp.exited)
      fail(mpar::detail::cat(operation, " at ", detail::place(at), ": mask 0x", hex(mask),
                             " names lanes that have exited (0x", hex(mask & warp.exited), ")"));
    if (warp.arrived == 0) {
      warp.mask = mask;
      warp.operation = operation;
      warp.at = at;
    } else if (warp.mask != mask || std::strcmp(warp.operation, operation) != 0 || !detail::same_place(warp.at, at)) {
      fail(mpar::detail::cat("lanes of warp ", w, " meet at different warp collectives: ", warp.operation, "(mask 0x",
                             hex(warp.mask), ") at ", detail::place(warp.at), " and ", operation, "(mask 0x", hex(mask),
                             ") at ", detail::place(at)));
    }
    f.sent = value;
    f.source_lane = source_lane;
    f.wait = detail::Wait::warp;
    f.generation = warp.generation;
    f.waits_at = at;
    warp.arrived |= 1u << lane;
    if (warp.arrived == mask) complete(warp, w);
    yield();
    if (ballot) *ballot = f.ballot;
    return f.received;
  }

 private:
  static constexpr std::size_t max_dynamic_shared_bytes = std::size_t(227) << 10;

  static std::string hex(unsigned v) {
    char s[16];
    std::snprintf(s, sizeof s, "%08x", v);
    return s;
  }

  /** Throws from inside a fiber: the fiber's entry catches it and hands it to the scheduler. */
  [[noreturn]] void fail(const std::string& what) { throw emulation_error(what); }

  void prepare(unsigned threads) {
    threads_ = threads;
    if (fibers_.size() < threads) fibers_.resize(threads);
    while (stacks_.size() < threads) stacks_.push_back(new_stack());
    warps_.assign((threads + warp_lanes - 1) / warp_lanes, detail::Warp{});
    for (unsigned w = 0; w < warps_.size(); ++w) {
      const unsigned n = threads - w * warp_lanes < warp_lanes ? threads - w * warp_lanes : warp_lanes;
      warps_[w].lanes = n == 32 ? 0xffffffffu : (1u << n) - 1u;
    }
  }

  static detail::FiberStack new_stack() {
    const std::size_t page = std::size_t(::sysconf(_SC_PAGESIZE));
    detail::FiberStack s;
    s.mapped = stack_bytes + page;
    void* m = ::mmap(nullptr, s.mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    s.mapping = static_cast<char*>(m);
    ::mprotect(s.mapping, page, PROT_NONE);  // the guard: stacks grow down into it
    s.base = s.mapping + page;
    s.bytes = stack_bytes;
    return s;
  }

  void run_block(uint3 block_idx) {
    block_idx_ = block_idx;
    const unsigned n = threads_;
    barrier_arrived_ = 0;
    exited_threads_ = 0;
    for (detail::Warp& w : warps_) w.exited = w.arrived = 0;
    if (!dynamic_shared_.empty())
      std::memset(dynamic_shared_.data(), 0xFF, dynamic_shared_.size());  // NaN: uninitialised reads show
    for (unsigned i = 0; i < n; ++i) {
      detail::Fiber& f = fibers_[i];
      f.linear = i;
      f.thread_idx = {i % block_.x, i / block_.x % block_.y, i / (block_.x * block_.y)};
      f.wait = detail::Wait::nothing;
      f.fake_stack = nullptr;
      ::getcontext(&f.context);
      f.context.uc_stack.ss_sp = stacks_[i].base;
      f.context.uc_stack.ss_size = stacks_[i].bytes;
      f.context.uc_link = &scheduler_;
      ::makecontext(&f.context, &Executor::fiber_entry, 0);
    }
    const std::uint64_t linear_block =
        block_idx.x + std::uint64_t(grid_.x) * (block_idx.y + std::uint64_t(grid_.y) * block_idx.z);
    const bool descending = linear_block % 2 == 1;
    unsigned exited = 0, looked_in_vain = 0, k = 0;
    while (exited < n) {
      if (looked_in_vain == n) throw emulation_error(context_text(nullptr) + ": no thread can move: " + stalled());
      detail::Fiber& f = fibers_[descending ? n - 1 - k : k];
      k = k + 1 < n ? k + 1 : 0;
      if (!runnable(f)) {
        ++looked_in_vain;
        continue;
      }
      looked_in_vain = 0;
      const std::uint64_t releases = releases_;
      resume(f);
      if (error_) rethrow_with_context(f);
      if (f.wait == detail::Wait::exited) ++exited;
      if (releases_ != releases) k = 0;  // a barrier or collective completed: the first threads go on first
    }
  }

  [[nodiscard]] bool runnable(const detail::Fiber& f) const {
    switch (f.wait) {
      case detail::Wait::nothing:
        return true;
      case detail::Wait::barrier:
        return barrier_generation_ > f.generation;
      case detail::Wait::warp:
        return warps_[f.linear / warp_lanes].generation > f.generation;
      case detail::Wait::exited:
        return false;
    }
    return false;
  }

  /** The last lane of `mask` arrived: every lane of it reads its source lane's value. */
  void complete(detail::Warp& warp, unsigned w) {
    detail::Fiber* lanes = &fibers_[std::size_t(w) * warp_lanes];
    unsigned ballot = 0;
    for (unsigned l = 0; l < warp_lanes; ++l)
      if ((warp.mask >> l & 1u) && lanes[l].sent != 0) ballot |= 1u << l;
    for (unsigned l = 0; l < warp_lanes; ++l) {
      if (!(warp.mask >> l & 1u)) continue;
      const unsigned src = lanes[l].source_lane;
      if (!(warp.mask >> src & 1u))
        fail(mpar::detail::cat(warp.operation, " at ", detail::place(warp.at), ": lane ", l, " reads lane ", src,
                               ", which mask 0x", hex(warp.mask), " does not name (its value is undefined)"));
      lanes[l].received = lanes[src].sent;
      lanes[l].ballot = ballot;
    }
    warp.arrived = 0;
    ++warp.generation;
    ++releases_;
  }

  /** Called as a thread returns: a barrier or collective others wait at for it can never complete. */
  void on_exit(detail::Fiber& f) {
    detail::Warp& warp = warps_[f.linear / warp_lanes];
    const unsigned lane = f.linear % warp_lanes;
    if (exited_threads_++ == 0) first_exited_ = f.thread_idx;
    warp.exited |= 1u << lane;
    if (barrier_arrived_ > 0)
      fail(mpar::detail::cat("thread exits while ", barrier_arrived_, " threads of its block wait at __syncthreads at ",
                             detail::place(barrier_at_), ": a barrier every thread must reach"));
    if (warp.arrived != 0 && (warp.mask >> lane & 1u))
      fail(mpar::detail::cat("lane ", lane, " exits while lanes 0x", hex(warp.arrived), " wait for it at ",
                             warp.operation, " at ", detail::place(warp.at), " (mask 0x", hex(warp.mask), ")"));
  }

  static void fiber_entry() {
    Executor& e = here();
    e.entered_fiber();
    detail::Fiber& f = *e.current_;
    try {
      e.body_(e.context_);
      e.on_exit(f);
    } catch (...) {
      e.error_ = std::current_exception();
    }
    f.wait = detail::Wait::exited;
    e.switch_to_scheduler(true);
  }

  void resume(detail::Fiber& f) {
    current_ = &f;
#if defined(MPAR_EMULATION_ASAN)
    void* fake = nullptr;
    const std::size_t i = &f - fibers_.data();
    __sanitizer_start_switch_fiber(&fake, stacks_[i].base, stacks_[i].bytes);
    ::swapcontext(&scheduler_, &f.context);
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
    ::swapcontext(&scheduler_, &f.context);
#endif
    current_ = nullptr;
  }
  void yield() {
    detail::Fiber& f = *current_;
    switch_to_scheduler(false);
    current_ = &f;
    f.wait = detail::Wait::nothing;
  }
  void switch_to_scheduler(bool exiting) {
    detail::Fiber& f = *current_;
#if defined(MPAR_EMULATION_ASAN)
    __sanitizer_start_switch_fiber(exiting ? nullptr : &f.fake_stack, scheduler_stack_, scheduler_stack_bytes_);
    ::swapcontext(&f.context, &scheduler_);
    __sanitizer_finish_switch_fiber(f.fake_stack, &scheduler_stack_, &scheduler_stack_bytes_);
#else
    (void)exiting;
    ::swapcontext(&f.context, &scheduler_);
#endif
  }
  void entered_fiber() {
#if defined(MPAR_EMULATION_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, &scheduler_stack_, &scheduler_stack_bytes_);
#endif
  }

  [[nodiscard]] std::string context_text(const detail::Fiber* f) const {
    return mpar::detail::cat("kernel ", kernel_, ", block ", detail::text(block_idx_),
                             f ? mpar::detail::cat(", thread ", detail::text(f->thread_idx)) : std::string());
  }
  [[noreturn]] void rethrow_with_context(const detail::Fiber& f) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    try {
      std::rethrow_exception(e);
    } catch (const emulation_error& x) {
      throw emulation_error(context_text(&f) + ": " + x.what());
    }
  }

  /** Who waits where, for the error of a launch in which no thread can move. */
  [[nodiscard]] std::string stalled() const {
    std::string s;
    unsigned at_barrier = 0;
    for (unsigned i = 0; i < threads_; ++i) at_barrier += fibers_[i].wait == detail::Wait::barrier;
    if (at_barrier)
      s += mpar::detail::cat(at_barrier, " of ", threads_, " threads wait at __syncthreads at ",
                             detail::place(barrier_at_), "; ");
    for (std::size_t w = 0; w < warps_.size(); ++w)
      if (warps_[w].arrived)
        s += mpar::detail::cat("warp ", w, ": lanes 0x", hex(warps_[w].arrived), " wait at ", warps_[w].operation,
                               " at ", detail::place(warps_[w].at), " for mask 0x", hex(warps_[w].mask), "; ");
    if (exited_threads_) s += mpar::detail::cat(exited_threads_, " threads exited");
    return s;
  }

  ucontext_t scheduler_{};
  const void* scheduler_stack_ = nullptr;  // AddressSanitizer: the launching thread's stack, learnt on the first switch
  std::size_t scheduler_stack_bytes_ = 0;
  std::vector<detail::FiberStack> stacks_;
  std::vector<detail::Fiber> fibers_;
  std::vector<detail::Warp> warps_;
  std::vector<unsigned char> dynamic_shared_;
  detail::Fiber* current_ = nullptr;
  std::exception_ptr error_;
  bool running_ = false;
  const char* kernel_ = "";
  dim3 grid_, block_;
  uint3 block_idx_;
  unsigned threads_ = 0;
  void (*body_)(const void*) = nullptr;
  const void* context_ = nullptr;
  unsigned barrier_arrived_ = 0, exited_threads_ = 0;
  std::uint64_t barrier_generation_ = 0, releases_ = 0;
  std::source_location barrier_at_;
  uint3 first_exited_;
};

}  // namespace mpar::gpu::emulation
