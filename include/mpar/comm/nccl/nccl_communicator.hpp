#pragma once
/**
 * @file The NCCL communicator: the `communicator` concept on device buffers, for one rank per GPU.
 *
 * Include from code that links mpar::cuda. Buffers are device pointers. Every operation is ordered
 * after the work already queued on the calling thread's compute stream (an event hands it over to
 * the communicator's own stream) and runs on that stream. The host never waits for it (only
 * `barrier()` does): `wait()` makes the compute stream wait for the operation's completion event, so
 * work queued afterwards sees the result, and an `i*` operation — a data-parallel bucket's
 * all-reduce, a pipeline send — overlaps the compute issued until its wait. Blocking calls are their
 * `i*` form and that wait. The host reads results as it reads any rank memory: a stream-ordered copy
 * and an event (the `backend` contract).
 *
 * No rank hangs, and errors reach the host through a watchdog thread per communicator, not by
 * polling in wait(): the communicator is created non-blocking; the watchdog polls
 * ncclCommGetAsyncError and the age of the oldest operation in flight; on an error or a timeout it
 * aborts the communicator (ncclCommAbort, which also releases the peers stuck in the same collective)
 * and the rank's next call throws comm_error naming the rank, the group, the operation, its
 * sequence number, its size and the fix (`check()` asks explicitly).
 */
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/backend/gpu/context.hpp"
#include "mpar/backend/gpu/cuda_error.hpp"
#include "mpar/backend/gpu/memory.hpp"
#include "mpar/backend/gpu/runtime.hpp"  // the CUDA runtime and NCCL, or their emulation
#include "mpar/comm/communicator.hpp"
#include "mpar/comm/detail/comm_element.hpp"
#include "mpar/core/dtype.hpp"
#include "mpar/core/layout.hpp"

#if defined(MPAR_HAVE_MPI)
#include <mpi.h>
#endif

namespace mpar {

/** @brief Options of an NcclCommunicator. */
struct NcclOptions {
  std::string name = "world";                                  ///< the group's name in error messages
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  ///< a wait longer than this aborts the communicator
};

namespace detail {
template <class T>
inline ncclDataType_t nccl_type() {
  if constexpr (std::is_same_v<T, float>)
    return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>)
    return ncclFloat64;
  else if constexpr (std::is_same_v<T, bf16>)
    return ncclBfloat16;
  else if constexpr (std::is_same_v<T, f16>)
    return ncclFloat16;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return ncclInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return ncclInt64;
  else if constexpr (std::is_same_v<T, std::uint32_t>)
    return ncclUint32;
  else if constexpr (std::is_same_v<T, std::uint64_t>)
    return ncclUint64;
  else
    static_assert(sizeof(T) == 0,
                  "NcclCommunicator: element type has no NCCL data type (use float, double, bf16, f16, std::int32_t, "
                  "std::int64_t, std::uint32_t or std::uint64_t)");
}
inline ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

/**
 * The state one NcclCommunicator owns; shared with its outstanding requests so they outlive a move.
 *
 * Errors reach the host through a watchdog thread, not through polling in wait(): it polls
 * ncclCommGetAsyncError and the completion events of the operations in flight; on an asynchronous
 * error, or an operation older than the timeout, it aborts the communicator (ncclCommAbort, which
 * also ends the kernels of the peers stuck in the same collective, so no stream stays blocked) and
 * records the report that the rank's next call on the communicator throws. `mu` serialises the calls
 * on `comm` between the rank's thread and the watchdog (an NCCL communicator is not thread-safe).
 */
struct NcclState {
  ncclComm_t comm = nullptr;
  int rank = 0, size = 1, device = 0;
  NcclOptions opt;
  gpu::Stream stream{-1};  // higher priority than compute: collectives should not queue behind GEMMs
  gpu::Event ready;
  std::uint64_t seq = 0;
  std::atomic<bool> aborted{false};
  std::unique_ptr<gpu::DeviceBuffer<float>> barrier_buf;

  /** An operation in flight, as the watchdog sees it. */
  struct Pending {
    std::shared_ptr<gpu::Event> done;
    const char* op;
    std::size_t count;
    std::uint64_t seq;
    std::chrono::steady_clock::time_point since;
  };
  std::mutex mu;                 // guards comm's calls, pending, failure, stopping
  std::vector<Pending> pending;  // oldest first
  std::string failure;           // the watchdog's (or a failed call's) report
  bool stopping = false;
  std::condition_variable wake;
  std::thread watchdog;

  NcclState() = default;
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;
  ~NcclState() {
    if (watchdog.joinable()) {
      {
        std::lock_guard lk(mu);
        stopping = true;
      }
      wake.notify_all();
      watchdog.join();
    }
    if (!comm || aborted) return;
    // Non-blocking communicator: finalize may stay in progress; wait for it (bounded), else abort.
    ncclResult_t r = ncclCommFinalize(comm);
    const auto t0 = std::chrono::steady_clock::now();
    while (r == ncclInProgress && std::chrono::steady_clock::now() - t0 < opt.timeout) {
      std::this_thread::yield();
      (void)ncclCommGetAsyncError(comm, &r);
    }
    if (r == ncclSuccess)
      (void)ncclCommDestroy(comm);
    else
      (void)ncclCommAbort(comm);
  }

  /** Starts the watchdog once `comm` exists. */
  void start_watchdog() {
    watchdog = std::thread([this] { watch(); });
  }

  /** Point-to-point operations posted but not yet issued: NCCL needs matching sends and receives in one group. */
  struct P2pBatch {
    std::vector<std::function<ncclResult_t(ncclComm_t, cudaStream_t)>> ops;
    std::size_t count = 0;
    std::shared_ptr<gpu::Event> done;  // set when the batch is issued
  };
  std::shared_ptr<P2pBatch> open_batch;

  [[nodiscard]] std::string where(const char* op, std::size_t count, std::uint64_t n) const {
    return detail::cat("rank ", rank, " of group '", opt.name, "' (size ", size, "), ", op, " #", n, " of ", count,
                       " elements");
  }
  [[nodiscard]] std::string where(const char* op, std::size_t count) const { return where(op, count, seq); }
  /** Aborts the communicator (once) and keeps `msg` as the report; `mu` is held. */
  void abort_locked(const std::string& msg) {
    if (aborted) return;
    failure = msg;
    aborted = true;
    if (comm) (void)ncclCommAbort(comm);  // wakes every peer blocked in the same collective with an error
    comm = nullptr;
  }
  /** Aborts and throws (a call of the rank's thread failed); `mu` is held. */
  [[noreturn]] void fail_locked(const std::string& msg) {
    abort_locked(msg);
    throw comm_error(failure);
  }
  /** Throws the watchdog's report if the communicator was aborted. */
  void check_alive(const char* op, std::size_t count) {
    if (!aborted) return;
    std::lock_guard lk(mu);
    throw comm_error(where(op, count) + ": the communicator was aborted by an earlier error: " + failure);
  }
  /** Waits until an enqueue call on the non-blocking communicator has been accepted; `mu` is held. */
  void settle(ncclResult_t r, const char* op, std::size_t count) {
    const auto t0 = std::chrono::steady_clock::now();
    while (r == ncclInProgress) {
      if (std::chrono::steady_clock::now() - t0 > opt.timeout)
        fail_locked(where(op, count) +
                    ": NCCL did not accept the operation within the timeout; communicator aborted. Fix: check that "
                    "every rank of the group reached this call");
      std::this_thread::yield();
      (void)ncclCommGetAsyncError(comm, &r);
    }
    if (r != ncclSuccess)
      fail_locked(where(op, count) + ": " + ncclGetErrorString(r) + " (" + ncclGetLastError(comm) +
                  "); communicator aborted");
  }
  /**
   * Hands the work queued so far on the calling thread's compute stream to the comm stream, enqueues
   * `call` there and returns its completion event, which the watchdog tracks. The compute stream is
   * not made to wait here: work that needs the result comes after the request's wait(), which makes the
   * compute stream (not the host) wait for the event. Posted point-to-point operations are issued first,
   * so every rank issues operations in program order.
   */
  template <class Call>
  std::shared_ptr<gpu::Event> enqueue(const char* op, std::size_t count, Call&& call, bool is_flush = false) {
    check_alive(op, count);
    if (!is_flush) flush_p2p();
    ++seq;
    if (gpu::this_thread().device() != device) gpu::this_thread().bind(device);
    const cudaStream_t compute = gpu::current_stream();
    auto done = std::make_shared<gpu::Event>();
    {
      std::unique_lock lk(mu);
      if (aborted)
        throw comm_error(where(op, count) + ": the communicator was aborted by an earlier error: " + failure);
      ready.record(compute);
      ready.wait_on(stream.get());
      settle(call(comm, stream.get()), op, count);
      done->record(stream.get());
      pending.push_back({done, op, count, seq, std::chrono::steady_clock::now()});
    }
    wake.notify_all();
    return done;
  }
  /** Issues the posted sends and receives as one NCCL group (so a ring of isend/irecv cannot deadlock). */
  void flush_p2p() {
    if (!open_batch) return;
    const std::shared_ptr<P2pBatch> b = std::exchange(open_batch, nullptr);
    b->done = enqueue(
        "send/recv group", b->count,
        [&](ncclComm_t c, cudaStream_t s) {
          ncclResult_t r = ncclGroupStart();
          for (auto& f : b->ops)
            if (r == ncclSuccess) r = f(c, s);
          const ncclResult_t e = ncclGroupEnd();
          return r != ncclSuccess ? r : e;
        },
        true);
    b->ops.clear();
  }

  /** The calling thread's compute stream waits for `done` (the host does not); a reported failure throws. */
  void wait(const gpu::Event& done, const char* op, std::size_t count) {
    check_alive(op, count);
    if (gpu::this_thread().device() != device) gpu::this_thread().bind(device);
    done.wait_on(gpu::current_stream());
  }
  /** The host waits for `done` (the barrier only); the watchdog ends the wait with its report on a failure. */
  void host_wait(const gpu::Event& done, const char* op, std::size_t count) {
    for (unsigned spins = 0; !done.ready(); ++spins) {
      check_alive(op, count);
      if (spins < 1000)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    check_alive(op, count);
  }

 private:
  /** The watchdog: every millisecond, the communicator's asynchronous error and the age of the oldest operation. */
  void watch() {
    (void)cudaSetDevice(device);  // the completion events live on the communicator's device
    std::unique_lock lk(mu);
    while (!stopping) {
      wake.wait_for(lk, std::chrono::milliseconds(1));
      if (stopping || aborted || !comm) continue;
      const Pending* oldest = nullptr;
      try {
        std::erase_if(pending, [](const Pending& p) { return p.done->ready(); });
        oldest = pending.empty() ? nullptr : &pending.front();
      } catch (const std::exception& e) {  // an execution error on the device: the events cannot tell
        abort_locked(where("an operation", 0) + ": the device reported " + e.what() + "; communicator aborted");
        continue;
      }
      ncclResult_t r = ncclSuccess;
      (void)ncclCommGetAsyncError(comm, &r);
      if (r != ncclSuccess && r != ncclInProgress) {
        const std::string at = oldest ? where(oldest->op, oldest->count, oldest->seq) : where("an operation", 0);
        abort_locked(at + ": " + ncclGetErrorString(r) + " (" + ncclGetLastError(comm) +
                     "); communicator aborted by the watchdog. Fix: see the NCCL log (NCCL_DEBUG=WARN) for the "
                     "failed transport or peer");
      } else if (oldest && std::chrono::steady_clock::now() - oldest->since > opt.timeout) {
        abort_locked(where(oldest->op, oldest->count, oldest->seq) + ": not finished after " +
                     std::to_string(opt.timeout.count()) +
                     " ms; communicator aborted by the watchdog. Fix: every rank of the group must issue the same "
                     "collectives in the same order with the same sizes (a peer did not join, or called another "
                     "operation); raise NcclOptions::timeout if a step legitimately takes longer");
      }
    }
  }
};
}  // namespace detail

/**
 * @brief An outstanding NCCL operation: wait() makes the caller's compute stream wait for it (the host does not),
 * test() peeks; both throw comm_error once the watchdog reported a failure.
 */
class NcclRequest {
 public:
  NcclRequest(std::shared_ptr<detail::NcclState> st, std::shared_ptr<gpu::Event> done, const char* op,
              std::size_t count)
      : st_(std::move(st)), done_(std::move(done)), op_(op), count_(count) {}
  /** A posted send or receive: issued with the rest of its batch at the first wait()/test() or collective. */
  NcclRequest(std::shared_ptr<detail::NcclState> st, std::shared_ptr<detail::NcclState::P2pBatch> batch, const char* op,
              std::size_t count)
      : st_(std::move(st)), batch_(std::move(batch)), op_(op), count_(count) {}
  void wait() {
    resolve();
    if (!done_) return;
    st_->wait(*done_, op_, count_);
    done_.reset();
  }
  bool test() {
    resolve();
    if (!done_) return true;
    st_->check_alive(op_, count_);
    if (!done_->ready()) return false;
    done_.reset();
    return true;
  }

 private:
  void resolve() {
    if (!batch_) return;
    if (!batch_->done) st_->flush_p2p();
    done_ = batch_->done;
    batch_.reset();
    if (!done_) throw comm_error(st_->where(op_, count_) + ": its send/recv group failed to start");
  }
  std::shared_ptr<detail::NcclState> st_;
  std::shared_ptr<gpu::Event> done_;
  std::shared_ptr<detail::NcclState::P2pBatch> batch_;
  const char* op_;
  std::size_t count_;
};

/**
 * @brief The `communicator` concept over NCCL: one rank per GPU (NCCL refuses two ranks of one
 * communicator on the same device; for that, use gpu::DeviceCommunicator).
 *
 * Uneven all_gather / reduce_scatter (n not divisible by p) follow mpar's block rule by grouping one
 * broadcast / reduce per block. send/recv match in issue order per peer, as NCCL's do (NCCL has no
 * tags). `isend`/`irecv` are posted and issued together as one NCCL group at the first wait()/test()
 * or collective, so exchanges such as a ring of isend/irecv cannot deadlock; a blocking `send`
 * is stream-ordered like every call: work queued after it runs once the receiver has taken the data.
 */
class NcclCommunicator {
 public:
  /** A fresh id; rank 0 makes it and every rank must receive the same bytes (MPI_Bcast, a file, ...). */
  [[nodiscard]] static ncclUniqueId make_unique_id() {
    ncclUniqueId id;
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) throw comm_error(std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(r));
    return id;
  }

  /** Joins the communicator `id` as `rank` of `size` on `device`; binds the calling thread to `device`. */
  NcclCommunicator(const ncclUniqueId& id, int rank, int size, int device, NcclOptions opt = {})
      : st_(make_state(device)) {
    require(size >= 1 && rank >= 0 && rank < size, "NcclCommunicator: rank ", rank, " is outside a group of ", size);
    init_state(rank, size, device, std::move(opt));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;  // init and collectives return at once; our polling enforces the timeout
    ncclComm_t c = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&c, size, id, rank, &cfg);
    {
      std::lock_guard lk(st_->mu);
      st_->comm = c;
      st_->settle(r, "ncclCommInitRankConfig", 0);
    }
    st_->start_watchdog();
  }

#if defined(MPAR_HAVE_MPI)
  /** The node-local rank of the calling process in `comm` (its index among the ranks sharing its memory). */
  [[nodiscard]] static int node_local_rank(MPI_Comm comm) {
    MPI_Comm local;
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    int lr = 0;
    MPI_Comm_rank(local, &lr);
    MPI_Comm_free(&local);
    return lr;
  }
  /**
   * One NCCL rank per MPI rank of `comm`: rank 0 makes the unique id and broadcasts it over MPI, and
   * each process takes the GPU of its node-local rank (local rank modulo the visible devices).
   */
  [[nodiscard]] static NcclCommunicator from_mpi(MPI_Comm comm, NcclOptions opt = {}) {
    int rank = 0, size = 1;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    const int ndev = gpu::device_count();
    if (ndev == 0) throw comm_error(detail::cat("NcclCommunicator::from_mpi: MPI rank ", rank, " sees no CUDA device"));
    ncclUniqueId id{};
    if (rank == 0) id = make_unique_id();
    MPI_Bcast(&id, int(sizeof id), MPI_BYTE, 0, comm);
    return NcclCommunicator(id, rank, size, node_local_rank(comm) % ndev, std::move(opt));
  }
#endif

  /** NCCL has no tags: messages between two ranks pair in issue order (`ordered_point_to_point`). */
  static constexpr bool matches_in_order = true;

  NcclCommunicator(NcclCommunicator&&) noexcept = default;
  NcclCommunicator& operator=(NcclCommunicator&&) noexcept = default;

  [[nodiscard]] int rank() const { return st_->rank; }
  [[nodiscard]] int size() const { return st_->size; }
  [[nodiscard]] std::string name() const { return st_->opt.name; }
  [[nodiscard]] int device() const { return st_->device; }
  /** The stream collectives run on. */
  [[nodiscard]] cudaStream_t comm_stream() const { return st_->stream.get(); }
  [[nodiscard]] ncclComm_t native() const { return st_->comm; }

  // ---- collectives -----------------------------------------------------------------------------
  template <detail::comm_element T>
  void all_reduce(std::span<T> data, ReduceOp op) {
    iall_reduce(data, op).wait();
  }
  template <detail::comm_element T>
  NcclRequest iall_reduce(std::span<T> data, ReduceOp op) {
    refuse_op<T>("all_reduce", data.size(), op);
    return run("all_reduce", data.size(), [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(data.data(), data.data(), data.size(), detail::nccl_type<T>(), detail::nccl_op(op), c, s);
    });
  }
  template <detail::comm_element T>
  void broadcast(std::span<T> data, int root) {
    check_root("broadcast", root);
    run("broadcast", data.size(), [&](ncclComm_t c, cudaStream_t s) {
      return ncclBroadcast(data.data(), data.data(), data.size(), detail::nccl_type<T>(), root, c, s);
    }).wait();
  }
  template <detail::comm_element T>
  void reduce(std::span<const T> send, std::span<T> recv, ReduceOp op, int root) {
    check_root("reduce", root);
    refuse_op<T>("reduce", send.size(), op);
    require(rank() != root || recv.size() == send.size(), where("reduce", send.size()), ": root's recv holds ",
            recv.size(), " elements, send ", send.size());
    run("reduce", send.size(), [&](ncclComm_t c, cudaStream_t s) {
      return ncclReduce(send.data(), rank() == root ? recv.data() : nullptr, send.size(), detail::nccl_type<T>(),
                        detail::nccl_op(op), root, c, s);
    }).wait();
  }
  template <detail::comm_element T>
  void all_gather(std::span<const T> send, std::span<T> recv) {
    iall_gather(send, recv).wait();
  }
  template <detail::comm_element T>
  NcclRequest iall_gather(std::span<const T> send, std::span<T> recv) {
    const std::size_t n = recv.size(), p = std::size_t(size());
    check_block("all_gather", n, send.size());
    return run("all_gather", n, [&](ncclComm_t c, cudaStream_t s) {
      if (n % p == 0) return ncclAllGather(send.data(), recv.data(), n / p, detail::nccl_type<T>(), c, s);
      ncclResult_t r = ncclGroupStart();
      for (std::size_t q = 0; q < p && r == ncclSuccess; ++q) {
        const Block b = block_of(n, p, q);
        if (b.extent == 0) continue;
        r = ncclBroadcast(int(q) == rank() ? static_cast<const void*>(send.data()) : recv.data() + b.offset,
                          recv.data() + b.offset, b.extent, detail::nccl_type<T>(), int(q), c, s);
      }
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }
  template <detail::comm_element T>
  void reduce_scatter(std::span<const T> send, std::span<T> recv, ReduceOp op) {
    ireduce_scatter(send, recv, op).wait();
  }
  template <detail::comm_element T>
  NcclRequest ireduce_scatter(std::span<const T> send, std::span<T> recv, ReduceOp op) {
    const std::size_t n = send.size(), p = std::size_t(size());
    check_block("reduce_scatter", n, recv.size());
    refuse_op<T>("reduce_scatter", n, op);
    return run("reduce_scatter", n, [&](ncclComm_t c, cudaStream_t s) {
      if (n % p == 0)
        return ncclReduceScatter(send.data(), recv.data(), n / p, detail::nccl_type<T>(), detail::nccl_op(op), c, s);
      ncclResult_t r = ncclGroupStart();
      for (std::size_t q = 0; q < p && r == ncclSuccess; ++q) {
        const Block b = block_of(n, p, q);
        if (b.extent == 0) continue;
        r = ncclReduce(send.data() + b.offset, int(q) == rank() ? recv.data() : nullptr, b.extent,
                       detail::nccl_type<T>(), detail::nccl_op(op), int(q), c, s);
      }
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }
  /** Root receives block q of recv from rank q (block_of(recv.size(), p, q)); others need no recv. */
  template <detail::comm_element T>
  void gather(std::span<const T> send, std::span<T> recv, int root) {
    check_root("gather", root);
    const std::size_t p = std::size_t(size());
    if (rank() == root) check_block("gather", recv.size(), send.size());
    run("gather", send.size(), [&](ncclComm_t c, cudaStream_t s) {
      ncclResult_t r = ncclGroupStart();
      if (rank() != root) {
        if (!send.empty()) r = ncclSend(send.data(), send.size(), detail::nccl_type<T>(), root, c, s);
      } else {
        for (std::size_t q = 0; q < p && r == ncclSuccess; ++q) {
          const Block b = block_of(recv.size(), p, q);
          if (b.extent == 0) continue;
          if (int(q) == root)
            gpu::copy_on_device(send.data(), recv.data() + b.offset, b.extent, s);
          else
            r = ncclRecv(recv.data() + b.offset, b.extent, detail::nccl_type<T>(), int(q), c, s);
        }
      }
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    }).wait();
  }
  /** Rank q receives block q of root's send (block_of(send.size(), p, q)). */
  template <detail::comm_element T>
  void scatter(std::span<const T> send, std::span<T> recv, int root) {
    check_root("scatter", root);
    const std::size_t p = std::size_t(size());
    if (rank() == root) check_block("scatter", send.size(), recv.size());
    run("scatter", recv.size(), [&](ncclComm_t c, cudaStream_t s) {
      ncclResult_t r = ncclGroupStart();
      if (rank() == root) {
        for (std::size_t q = 0; q < p && r == ncclSuccess; ++q) {
          const Block b = block_of(send.size(), p, q);
          if (b.extent == 0) continue;
          if (int(q) == root)
            gpu::copy_on_device(send.data() + b.offset, recv.data(), b.extent, s);
          else
            r = ncclSend(send.data() + b.offset, b.extent, detail::nccl_type<T>(), int(q), c, s);
        }
      } else if (!recv.empty()) {
        r = ncclRecv(recv.data(), recv.size(), detail::nccl_type<T>(), root, c, s);
      }
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    }).wait();
  }
  template <detail::comm_element T>
  void all_to_all(std::span<const T> send, std::span<T> recv) {
    const std::size_t p = std::size_t(size());
    require(send.size() == recv.size() && send.size() % p == 0, where("all_to_all", send.size()), ": send (",
            send.size(), ") and recv (", recv.size(), ") must be equal and divisible by ", p);
    const std::vector<std::size_t> counts(p, send.size() / p);
    all_to_all_v(send, std::span<const std::size_t>(counts), recv, std::span<const std::size_t>(counts));
  }
  template <detail::comm_element T>
  void all_to_all_v(std::span<const T> send, std::span<const std::size_t> send_counts, std::span<T> recv,
                    std::span<const std::size_t> recv_counts) {
    const std::size_t p = std::size_t(size());
    require(send_counts.size() == p && recv_counts.size() == p, where("all_to_all_v", send.size()),
            ": count arrays must have one entry per rank (", p, ")");
    std::size_t so = 0, ro = 0;
    for (std::size_t q = 0; q < p; ++q) so += send_counts[q], ro += recv_counts[q];
    require(so <= send.size() && ro <= recv.size(), where("all_to_all_v", send.size()), ": counts sum to ", so, " / ",
            ro, " but buffers hold ", send.size(), " / ", recv.size());
    run("all_to_all_v", send.size(), [&](ncclComm_t c, cudaStream_t s) {
      ncclResult_t r = ncclGroupStart();
      std::size_t soff = 0, roff = 0;
      for (std::size_t q = 0; q < p && r == ncclSuccess; ++q) {
        if (int(q) == rank()) {  // our own block is a device copy, not a message
          require(send_counts[q] == recv_counts[q], where("all_to_all_v", send.size()), ": sends ", send_counts[q],
                  " elements to itself but expects ", recv_counts[q]);
          gpu::copy_on_device(send.data() + soff, recv.data() + roff, send_counts[q], s);
        } else {
          if (send_counts[q]) r = ncclSend(send.data() + soff, send_counts[q], detail::nccl_type<T>(), int(q), c, s);
          if (r == ncclSuccess && recv_counts[q])
            r = ncclRecv(recv.data() + roff, recv_counts[q], detail::nccl_type<T>(), int(q), c, s);
        }
        soff += send_counts[q];
        roff += recv_counts[q];
      }
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    }).wait();
  }

  // ---- point to point --------------------------------------------------------------------------
  /** Compute queued afterwards waits until the matching receive took the data: order blocking pairs to avoid cycles. */
  template <detail::comm_element T>
  void send(std::span<const T> data, int peer, int tag) {
    isend(data, peer, tag).wait();
  }
  template <detail::comm_element T>
  void recv(std::span<T> data, int peer, int tag) {
    irecv(data, peer, tag).wait();
  }
  /** Posts a send; posted sends and receives are issued together as one NCCL group at the first wait/test. */
  template <detail::comm_element T>
  NcclRequest isend(std::span<const T> data, int peer, int tag) {
    check_root("send", peer);
    (void)tag;  // NCCL matches point-to-point messages in issue order per peer; it has no tags
    return post("send", data.size(), [data, peer](ncclComm_t c, cudaStream_t s) {
      return ncclSend(data.data(), data.size(), detail::nccl_type<T>(), peer, c, s);
    });
  }
  template <detail::comm_element T>
  NcclRequest irecv(std::span<T> data, int peer, int tag) {
    check_root("recv", peer);
    (void)tag;
    return post("recv", data.size(), [data, peer](ncclComm_t c, cudaStream_t s) {
      return ncclRecv(data.data(), data.size(), detail::nccl_type<T>(), peer, c, s);
    });
  }

  /** The one call that blocks the host: it returns once every rank's barrier all-reduce has finished. */
  void barrier() {
    if (!st_->barrier_buf) st_->barrier_buf = std::make_unique<gpu::DeviceBuffer<float>>(1, st_->stream.get());
    const auto done = st_->enqueue("barrier", 1, [&](ncclComm_t c, cudaStream_t s) {
      float* b = st_->barrier_buf->data();
      return ncclAllReduce(b, b, 1, ncclFloat32, ncclSum, c, s);
    });
    st_->host_wait(*done, "barrier", 1);
  }
  /** Throws the watchdog's report if it aborted the communicator (every call checks this first). */
  void check() { st_->check_alive("check", 0); }
  /** Whether the watchdog (or a failed call) aborted the communicator. */
  [[nodiscard]] bool aborted() const { return st_->aborted; }

  /** A communicator over the ranks with equal `color`, ordered by `key` (ncclCommSplit; collective). */
  [[nodiscard]] NcclCommunicator split(int color, int key) {
    require(color >= 0, where("split", 0), ": color ", color, " must be non-negative");
    st_->flush_p2p();
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t nc = nullptr;
    st_->check_alive("split", 0);
    std::unique_lock lk(st_->mu);
    const ncclResult_t r = ncclCommSplit(st_->comm, color, key, &nc, &cfg);
    st_->settle(r, "split", 0);
    ++st_->seq;
    if (nc) {  // the split's own initialisation may still be in flight
      ncclResult_t a = ncclInProgress;
      const auto t0 = std::chrono::steady_clock::now();
      while ((void)ncclCommGetAsyncError(nc, &a), a == ncclInProgress) {
        if (std::chrono::steady_clock::now() - t0 > st_->opt.timeout) {
          (void)ncclCommAbort(nc);
          st_->fail_locked(where("split", 0) + ": the new communicator did not initialise within the timeout");
        }
        std::this_thread::yield();
      }
      if (a != ncclSuccess) {
        (void)ncclCommAbort(nc);
        st_->fail_locked(where("split", 0) + ": " + ncclGetErrorString(a));
      }
    }
    int nr = 0, ns = 1;
    (void)ncclCommUserRank(nc, &nr);
    (void)ncclCommCount(nc, &ns);
    lk.unlock();
    NcclOptions o = st_->opt;
    o.name = st_->opt.name + "/" + std::to_string(color);
    return NcclCommunicator(nc, nr, ns, st_->device, std::move(o));
  }

 private:
  NcclCommunicator(ncclComm_t c, int rank, int size, int device, NcclOptions opt) : st_(make_state(device)) {
    init_state(rank, size, device, std::move(opt));
    st_->comm = c;
    st_->start_watchdog();
  }
  /** Binds the thread to `device` first, so the communicator's stream and events live on it. */
  static std::shared_ptr<detail::NcclState> make_state(int device) {
    gpu::this_thread().bind(device);
    return std::make_shared<detail::NcclState>();
  }
  void init_state(int rank, int size, int device, NcclOptions opt) {
    st_->rank = rank;
    st_->size = size;
    st_->device = device;
    st_->opt = std::move(opt);
  }
  [[nodiscard]] std::string where(const char* op, std::size_t count) const { return st_->where(op, count); }
  void check_root(const char* op, int r) const {
    require(r >= 0 && r < size(), where(op, 0), ": rank argument ", r, " is outside the group");
  }
  /** Before enqueueing: an op `T` cannot reduce (NCCL would average integers by truncating). */
  template <class T>
  void refuse_op(const char* op, std::size_t count, ReduceOp r) const {
    if (std::string why = detail::reduce_op_error<T>(r); !why.empty())
      throw comm_error(detail::cat(where(op, count), ": rank ", rank(), " passed ", why));
  }
  void check_block(const char* op, std::size_t n, std::size_t local) const {
    const Block b = block_of(n, std::size_t(size()), std::size_t(rank()));
    require(local == b.extent, where(op, n), ": this rank's block has ", local, " elements, the block rule gives ",
            b.extent);
  }

  template <class Call>
  NcclRequest run(const char* op, std::size_t count, Call&& call) {
    return NcclRequest(st_, st_->enqueue(op, count, std::forward<Call>(call)), op, count);
  }
  template <class Call>
  NcclRequest post(const char* op, std::size_t count, Call&& call) {
    st_->check_alive(op, count);
    if (!st_->open_batch) st_->open_batch = std::make_shared<detail::NcclState::P2pBatch>();
    st_->open_batch->ops.emplace_back(std::forward<Call>(call));
    st_->open_batch->count += count;
    return NcclRequest(st_, st_->open_batch, op, count);
  }

  std::shared_ptr<detail::NcclState> st_;
};

static_assert(communicator<NcclCommunicator> && detail::ordered_point_to_point<NcclCommunicator>);

}  // namespace mpar
