#pragma once
/**
 * @file MpiCommunicator: the `communicator` concept over an MPI communicator (OpenMPI tested).
 *
 * Include explicitly and link `mpar::mpi`; the header is empty unless MPAR_HAVE_MPI is defined.
 *
 * - No extra copies for float and double: all_reduce and broadcast run in place (MPI_IN_PLACE),
 *   uneven blocks map to the v-collectives with counts from `block_of`, and an all_gather whose
 *   send is its own block of recv uses MPI_IN_PLACE.
 * - bf16/f16 reductions convert into a float buffer, reduce with MPI_FLOAT and convert back once:
 *   the result is a float accumulation rounded once, as on threads. Data movement of 16-bit types
 *   needs no conversion (MPI_UINT16_T).
 * - Integers (std::int32_t, std::int64_t, std::uint32_t, std::uint64_t) move and reduce as MPI_INT32_T,
 *   MPI_INT64_T, MPI_UINT32_T and MPI_UINT64_T, exactly; `avg` of integers is refused (comm/detail/comm_element.hpp).
 * - Errors: the communicator's MPI error handler is MPI_ERRORS_RETURN; a failing call throws a
 *   comm_error naming the operation, group, sequence number and rank. `run_mpi` turns any exception
 *   escaping a rank into MPI_Abort, so the other ranks die instead of hanging.
 * - Timeouts: a watchdog thread aborts the job (MPI_Abort) when one blocking call or wait() takes
 *   longer than the timeout (MPAR_COMM_TIMEOUT_S, default 300 s), printing which call timed out.
 *   MPI does not say which peers are missing; the message names the operation and group.
 * - Fingerprint checks (MPAR_CHECK_COLLECTIVES=1 or `set_checking(true)`): one MPI_Allgather of
 *   every rank's fingerprint before each collective; a mismatch throws the same comm_error on
 *   every rank (the communicator stays usable).
 */
#ifdef MPAR_HAVE_MPI
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the deprecated C++ bindings: unused, and they warn
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "mpar/comm/communicator.hpp"
#include "mpar/comm/detail/collective_check.hpp"
#include "mpar/comm/detail/comm_element.hpp"
#include "mpar/core/error.hpp"

namespace mpar {

namespace detail {

/** The MPI datatype of an element type; a type without one fails to compile instead of moving as other words. */
template <class T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, float>)
    return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>)
    return MPI_DOUBLE;
  else if constexpr (detail::half_precision<T>)
    return MPI_UINT16_T;  // bf16/f16 move as raw 16-bit words; reductions go through float
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return MPI_INT32_T;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return MPI_INT64_T;
  else if constexpr (std::is_same_v<T, std::uint32_t>)
    return MPI_UINT32_T;
  else if constexpr (std::is_same_v<T, std::uint64_t>)
    return MPI_UINT64_T;
  else
    static_assert(sizeof(T) == 0,
                  "MpiCommunicator: this element type has no MPI datatype (use float, double, bf16, f16, "
                  "std::int32_t, std::int64_t, std::uint32_t or std::uint64_t)");
}

inline MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
    default:
      return MPI_SUM;  // avg = sum, then divided by the group size
  }
}

inline bool mpi_alive() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

/**
 * One watchdog per process: every blocking MPI call registers a deadline; a call that passes it
 * aborts the whole job, because a rank blocked inside MPI cannot be interrupted any other way.
 */
class MpiWatchdog {
 public:
  static MpiWatchdog& instance() {
    static MpiWatchdog w;
    return w;
  }
  using Id = std::list<std::pair<std::chrono::steady_clock::time_point, std::string>>::iterator;
  Id enter(std::string what, std::chrono::duration<double> timeout) {
    std::lock_guard l(m_);
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    calls_.emplace_front(detail::deadline_after(timeout),  // saturates: MPAR_COMM_TIMEOUT_S=inf never fires
                         detail::cat(std::move(what), " timed out after ", timeout.count(), " s"));
    return calls_.begin();
  }
  void leave(Id id) {
    std::lock_guard l(m_);
    calls_.erase(id);
  }
  ~MpiWatchdog() {
    {
      std::lock_guard l(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    std::unique_lock l(m_);
    while (!stop_) {
      cv_.wait_for(l, std::chrono::milliseconds(100));
      const auto now = std::chrono::steady_clock::now();
      for (auto& [deadline, what] : calls_)
        if (now >= deadline) {
          int rank = -1;
          MPI_Comm_rank(MPI_COMM_WORLD, &rank);
          std::fprintf(stderr, "mpar: rank %d: %s; aborting the job\n", rank, what.c_str());
          std::fflush(stderr);
          MPI_Abort(MPI_COMM_WORLD, 3);
        }
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::list<std::pair<std::chrono::steady_clock::time_point, std::string>> calls_;
  bool stop_ = false;
  std::thread thread_;
};

/** RAII registration of one blocking call with the watchdog. */
class WatchdogScope {
 public:
  WatchdogScope(std::string what, std::chrono::duration<double> timeout)
      : id_(MpiWatchdog::instance().enter(std::move(what), timeout)) {}
  ~WatchdogScope() { MpiWatchdog::instance().leave(id_); }
  WatchdogScope(const WatchdogScope&) = delete;
  WatchdogScope& operator=(const WatchdogScope&) = delete;

 private:
  MpiWatchdog::Id id_;
};

/** Shared state of one MPI group: the MPI_Comm (freed with the last copy) and its settings. */
struct MpiState {
  MPI_Comm comm = MPI_COMM_NULL;
  bool owned = false;
  std::string name;
  int rank = 0, size = 1;
  std::uint64_t seq = 0, p2p_seq = 0;
  bool check = check_collectives_enabled();
  std::chrono::duration<double> timeout = default_comm_timeout();
  /** Eager sends still in flight: the copy stays alive until MPI is done with it. */
  std::list<std::pair<MPI_Request, std::vector<std::byte>>> eager;
  ~MpiState() {
    if (!mpi_alive()) return;
    for (auto& [req, buf] : eager) MPI_Wait(&req, MPI_STATUS_IGNORE);
    if (owned) MPI_Comm_free(&comm);
  }
};

}  // namespace detail

/**
 * @brief The request of an asynchronous MpiCommunicator operation: an MPI_Request plus whatever
 * must outlive it (the float staging buffer of a 16-bit reduction) and run after it (the
 * conversion back, the division of `avg`, the count check of a receive).
 */
class MpiRequest {
 public:
  MpiRequest() = default;
  MpiRequest(MpiRequest&& o) noexcept { *this = std::move(o); }
  MpiRequest& operator=(MpiRequest&& o) noexcept {
    std::swap(req_, o.req_);
    std::swap(finish_, o.finish_);
    std::swap(what_, o.what_);
    std::swap(timeout_, o.timeout_);
    return *this;
  }
  MpiRequest(const MpiRequest&) = delete;
  MpiRequest& operator=(const MpiRequest&) = delete;
  /** An unfinished request is waited for: MPI still owns its buffers. */
  ~MpiRequest() {
    if (req_ != MPI_REQUEST_NULL && detail::mpi_alive()) MPI_Wait(&req_, MPI_STATUS_IGNORE);
  }

  void wait() {
    if (req_ == MPI_REQUEST_NULL && !finish_) return;
    MPI_Status st;
    {
      detail::WatchdogScope guard(what_, timeout_);
      check(MPI_Wait(&req_, &st));
    }
    complete(st);
  }
  [[nodiscard]] bool test() {
    if (req_ == MPI_REQUEST_NULL && !finish_) return true;
    int flag = 0;
    MPI_Status st;
    check(MPI_Test(&req_, &flag, &st));
    if (flag) complete(st);
    return flag != 0;
  }

 private:
  friend class MpiCommunicator;
  void check(int rc) const {
    if (rc == MPI_SUCCESS) return;
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, s, &len);
    throw comm_error(detail::cat(what_, ": MPI error: ", std::string(s, std::size_t(len))));
  }
  void complete(const MPI_Status& st) {
    auto f = std::move(finish_);
    finish_ = nullptr;
    if (f) f(st);
  }
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::function<void(const MPI_Status&)> finish_;
  std::string what_;
  std::chrono::duration<double> timeout_{300.0};
};

/**
 * @brief A rank of an MPI communicator; satisfies `communicator`. Copies share the MPI_Comm.
 *
 * `MpiCommunicator()` wraps MPI_COMM_WORLD (MPI must be initialised, e.g. by MpiEnvironment);
 * `split` uses MPI_Comm_split and owns the result.
 */
class MpiCommunicator {
 public:
  using request_type = MpiRequest;
  /** MPI reads and writes the buffers on the host (comm/host_memory_communicator.hpp). */
  static constexpr bool moves_host_memory = true;

  explicit MpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD, std::string name = "world")
      : st_(std::make_shared<detail::MpiState>()) {
    require(detail::mpi_alive(), "MpiCommunicator: MPI is not initialised (construct an mpar::MpiEnvironment first)");
    st_->comm = comm;
    st_->name = std::move(name);
    MPI_Comm_rank(comm, &st_->rank);
    MPI_Comm_size(comm, &st_->size);
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  }

  [[nodiscard]] int rank() const { return st_->rank; }
  [[nodiscard]] int size() const { return st_->size; }
  [[nodiscard]] std::string name() const { return st_->name; }
  [[nodiscard]] MPI_Comm native() const { return st_->comm; }
  [[nodiscard]] std::uint64_t seq() const { return st_->seq; }
  /** Compare every collective's fingerprint across ranks first (costs one small all-gather each). */
  void set_checking(bool on) { st_->check = on; }
  [[nodiscard]] bool checking() const { return st_->check; }
  void set_timeout(std::chrono::duration<double> t) { st_->timeout = t; }

  template <detail::comm_element T>
  void all_reduce(std::span<T> data, ReduceOp op) {
    const auto pre = begin<T>(detail::CollKind::all_reduce, data.size(), op, -1, 0, 0);
    refuse_op<T>(pre, op);
    if constexpr (detail::half_precision<T>) {
      std::vector<float> tmp(data.begin(), data.end());
      call(pre, [&] {
        return MPI_Allreduce(MPI_IN_PLACE, tmp.data(), icount(tmp.size(), pre), MPI_FLOAT, detail::mpi_op(op),
                             st_->comm);
      });
      finish_avg(std::span<float>(tmp), op);
      for (std::size_t i = 0; i < tmp.size(); ++i) data[i] = T(tmp[i]);
    } else {
      call(pre, [&] {
        return MPI_Allreduce(MPI_IN_PLACE, data.data(), icount(data.size(), pre), detail::mpi_type<T>(),
                             detail::mpi_op(op), st_->comm);
      });
      finish_avg(data, op);
    }
  }
  template <detail::comm_element T>
  void broadcast(std::span<T> data, int root) {
    const auto pre = begin<T>(detail::CollKind::broadcast, data.size(), std::nullopt, root, 0, 0);
    call(pre, [&] { return MPI_Bcast(data.data(), icount(data.size(), pre), detail::mpi_type<T>(), root, st_->comm); });
  }
  template <detail::comm_element T>
  void reduce(in_span<T> send, std::span<T> recv, ReduceOp op, int root) {
    const auto pre =
        begin<T>(detail::CollKind::reduce, send.size(), op, root, rank() == root ? recv.size() : send.size(), 0);
    refuse_op<T>(pre, op);
    const bool is_root = rank() == root;
    if (is_root && recv.size() != send.size())
      throw comm_error(detail::cat(pre, ": root's recv has ", recv.size(), " elements, expected ", send.size()));
    if constexpr (detail::half_precision<T>) {
      std::vector<float> s(send.begin(), send.end()), r(is_root ? send.size() : 0);
      call(pre, [&] {
        return MPI_Reduce(s.data(), r.data(), icount(s.size(), pre), MPI_FLOAT, detail::mpi_op(op), root, st_->comm);
      });
      finish_avg(std::span<float>(r), op);
      for (std::size_t i = 0; i < r.size(); ++i) recv[i] = T(r[i]);
    } else {
      call(pre, [&] {
        return MPI_Reduce(send.data(), is_root ? recv.data() : nullptr, icount(send.size(), pre), detail::mpi_type<T>(),
                          detail::mpi_op(op), root, st_->comm);
      });
      if (is_root) finish_avg(recv, op);
    }
  }
  template <detail::comm_element T>
  void all_gather(in_span<T> send, std::span<T> recv) {
    const auto pre = begin<T>(detail::CollKind::all_gather, recv.size(), std::nullopt, -1, send.size(), 0);
    auto [counts, displs] = blocks(recv.size(), pre);
    check_own_block(pre, "send", send.size(), recv.size());
    const bool in_place = send.data() == recv.data() + displs[std::size_t(rank())] && !send.empty();
    call(pre, [&] {
      return MPI_Allgatherv(in_place ? MPI_IN_PLACE : send.data(), int(send.size()), detail::mpi_type<T>(), recv.data(),
                            counts.data(), displs.data(), detail::mpi_type<T>(), st_->comm);
    });
  }
  template <detail::comm_element T>
  void reduce_scatter(in_span<T> send, std::span<T> recv, ReduceOp op) {
    const auto pre = begin<T>(detail::CollKind::reduce_scatter, send.size(), op, -1, recv.size(), 0);
    refuse_op<T>(pre, op);
    auto [counts, displs] = blocks(send.size(), pre);
    check_own_block(pre, "recv", recv.size(), send.size());
    if constexpr (detail::half_precision<T>) {
      std::vector<float> s(send.begin(), send.end()), r(recv.size());
      call(pre, [&] {
        return MPI_Reduce_scatter(s.data(), r.data(), counts.data(), MPI_FLOAT, detail::mpi_op(op), st_->comm);
      });
      finish_avg(std::span<float>(r), op);
      for (std::size_t i = 0; i < r.size(); ++i) recv[i] = T(r[i]);
    } else {
      call(pre, [&] {
        return MPI_Reduce_scatter(send.data(), recv.data(), counts.data(), detail::mpi_type<T>(), detail::mpi_op(op),
                                  st_->comm);
      });
      finish_avg(recv, op);
    }
  }
  template <detail::comm_element T>
  void gather(in_span<T> send, std::span<T> recv, int root) {
    const auto pre = begin<T>(detail::CollKind::gather, 0, std::nullopt, root, send.size(), recv.size());
    const bool is_root = rank() == root;
    std::vector<int> counts, displs;
    if (is_root) std::tie(counts, displs) = blocks(recv.size(), pre);
    if (is_root) check_own_block(pre, "send", send.size(), recv.size());
    call(pre, [&] {
      return MPI_Gatherv(send.data(), int(send.size()), detail::mpi_type<T>(), recv.data(), counts.data(),
                         displs.data(), detail::mpi_type<T>(), root, st_->comm);
    });
  }
  template <detail::comm_element T>
  void scatter(in_span<T> send, std::span<T> recv, int root) {
    const auto pre = begin<T>(detail::CollKind::scatter, 0, std::nullopt, root, recv.size(), send.size());
    const bool is_root = rank() == root;
    std::vector<int> counts, displs;
    if (is_root) std::tie(counts, displs) = blocks(send.size(), pre);
    if (is_root) check_own_block(pre, "recv", recv.size(), send.size());
    call(pre, [&] {
      return MPI_Scatterv(send.data(), counts.data(), displs.data(), detail::mpi_type<T>(), recv.data(),
                          int(recv.size()), detail::mpi_type<T>(), root, st_->comm);
    });
  }
  template <detail::comm_element T>
  void all_to_all(in_span<T> send, std::span<T> recv) {
    const auto pre = begin<T>(detail::CollKind::all_to_all, send.size(), std::nullopt, -1, recv.size(), 0);
    const auto p = std::size_t(size());
    if (recv.size() != send.size() || send.size() % p != 0)
      throw comm_error(detail::cat(pre, ": rank ", rank(), " passed send of ", send.size(), " and recv of ",
                                   recv.size(), " elements; both must be equal and divisible by the group size ", p));
    const int b = icount(send.size() / p, pre);
    call(pre, [&] {
      return MPI_Alltoall(send.data(), b, detail::mpi_type<T>(), recv.data(), b, detail::mpi_type<T>(), st_->comm);
    });
  }
  template <detail::comm_element T>
  void all_to_all_v(in_span<T> send, std::span<const std::size_t> send_counts, std::span<T> recv,
                    std::span<const std::size_t> recv_counts) {
    const auto pre = begin<T>(detail::CollKind::all_to_all_v, 0, std::nullopt, -1, 0, 0);
    const auto p = std::size_t(size());
    if (send_counts.size() != p || recv_counts.size() != p)
      throw comm_error(detail::cat(pre, ": rank ", rank(), " passed ", send_counts.size(), " send counts and ",
                                   recv_counts.size(), " recv counts; the group has ", p, " ranks"));
    std::vector<int> sc(p), sd(p), rc(p), rd(p);
    std::size_t so = 0, ro = 0;
    for (std::size_t q = 0; q < p; ++q) {
      sc[q] = icount(send_counts[q], pre), sd[q] = icount(so, pre), so += send_counts[q];
      rc[q] = icount(recv_counts[q], pre), rd[q] = icount(ro, pre), ro += recv_counts[q];
    }
    if (so > send.size() || ro > recv.size())
      throw comm_error(detail::cat(pre, ": rank ", rank(), ": the counts exceed the buffers (send ", send.size(),
                                   ", recv ", recv.size(), " elements)"));
    if (st_->check) {  // every rank learns what its peers will send it
      std::vector<int> incoming(p);
      call(pre, [&] { return MPI_Alltoall(sc.data(), 1, MPI_INT, incoming.data(), 1, MPI_INT, st_->comm); });
      int bad = -1;
      for (std::size_t q = 0; q < p && bad < 0; ++q)
        if (incoming[q] != rc[q]) bad = int(q);
      int any = bad >= 0 ? rank() : -1;
      call(pre, [&] { return MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, st_->comm); });
      if (any >= 0) {
        std::vector<int> all_in(p * p), all_rc(p * p);
        call(pre, [&] {
          return MPI_Allgather(incoming.data(), int(p), MPI_INT, all_in.data(), int(p), MPI_INT, st_->comm);
        });
        call(pre, [&] { return MPI_Allgather(rc.data(), int(p), MPI_INT, all_rc.data(), int(p), MPI_INT, st_->comm); });
        for (std::size_t q = 0; q < p; ++q) {
          const std::size_t i = std::size_t(any) * p + q;
          if (all_in[i] != all_rc[i])
            throw comm_error(detail::cat(pre, ": rank ", q, " sends ", all_in[i], " elements to rank ", any,
                                         " but rank ", any, " expects ", all_rc[i]));
        }
      }
    }
    call(pre, [&] {
      return MPI_Alltoallv(send.data(), sc.data(), sd.data(), detail::mpi_type<T>(), recv.data(), rc.data(), rd.data(),
                           detail::mpi_type<T>(), st_->comm);
    });
  }
  void barrier() {
    const auto pre = begin<float>(detail::CollKind::barrier, 0, std::nullopt, -1, 0, 0);
    call(pre, [&] { return MPI_Barrier(st_->comm); });
  }

  /**
   * Eager: copies `data` and starts an MPI_Isend of the copy, then returns; two ranks sending to
   * each other first never deadlock. The copy is freed when MPI completes it.
   */
  template <detail::comm_element T>
  void send(std::span<const T> data, int peer, int tag) {
    const auto pre = detail::op_prefix("send", ++st_->p2p_seq, st_->name);
    reap_eager();
    auto& [req, buf] = st_->eager.emplace_back(MPI_REQUEST_NULL, std::vector<std::byte>(data.size_bytes()));
    if (!data.empty()) std::memcpy(buf.data(), data.data(), data.size_bytes());
    call(pre, [&] {
      return MPI_Isend(buf.data(), icount(data.size(), pre), detail::mpi_type<T>(), peer, tag, st_->comm, &req);
    });
  }
  template <detail::comm_element T>
  void send(std::span<T> data, int peer, int tag) {
    send(std::span<const T>(data), peer, tag);
  }
  template <detail::comm_element T>
  void recv(std::span<T> data, int peer, int tag) {
    irecv(data, peer, tag).wait();
  }
  /** Zero-copy MPI_Isend: keep `data` unchanged until wait(), which may block until the receive is posted. */
  template <detail::comm_element T>
  [[nodiscard]] MpiRequest isend(std::span<const T> data, int peer, int tag) {
    MpiRequest r;
    r.what_ = detail::op_prefix("isend", ++st_->p2p_seq, st_->name);
    r.timeout_ = st_->timeout;
    call(r.what_, [&] {
      return MPI_Isend(data.data(), icount(data.size(), r.what_), detail::mpi_type<T>(), peer, tag, st_->comm, &r.req_);
    });
    return r;
  }
  template <detail::comm_element T>
  [[nodiscard]] MpiRequest isend(std::span<T> data, int peer, int tag) {
    return isend(std::span<const T>(data), peer, tag);
  }
  /** The message's element count must equal data.size(). */
  template <detail::comm_element T>
  [[nodiscard]] MpiRequest irecv(std::span<T> data, int peer, int tag) {
    MpiRequest r;
    r.what_ = detail::op_prefix("recv", ++st_->p2p_seq, st_->name);
    r.timeout_ = st_->timeout;
    call(r.what_, [&] {
      return MPI_Irecv(data.data(), icount(data.size(), r.what_), detail::mpi_type<T>(), peer, tag, st_->comm, &r.req_);
    });
    r.finish_ = [what = r.what_, n = data.size(), peer, tag, me = rank()](const MPI_Status& st) {
      int got = 0;
      MPI_Get_count(&st, detail::mpi_type<T>(), &got);
      if (std::size_t(got) != n)
        throw comm_error(detail::cat(what, ": rank ", me, " expected ", n, " ", detail::comm_dtype_name_v<T>,
                                     " from rank ", peer, " with tag ", tag, ", but rank ", peer, " sent ", got));
    };
    return r;
  }

  template <detail::comm_element T>
  [[nodiscard]] MpiRequest iall_reduce(std::span<T> data, ReduceOp op) {
    MpiRequest r;
    r.what_ = begin<T>(detail::CollKind::all_reduce, data.size(), op, -1, 0, 0);
    refuse_op<T>(r.what_, op);
    r.timeout_ = st_->timeout;
    const int p = size();
    if constexpr (detail::half_precision<T>) {
      auto tmp = std::make_shared<std::vector<float>>(data.begin(), data.end());
      call(r.what_, [&] {
        return MPI_Iallreduce(MPI_IN_PLACE, tmp->data(), icount(tmp->size(), r.what_), MPI_FLOAT, detail::mpi_op(op),
                              st_->comm, &r.req_);
      });
      r.finish_ = [tmp, data, op, p](const MPI_Status&) {
        for (std::size_t i = 0; i < data.size(); ++i)
          data[i] = T(op == ReduceOp::avg ? (*tmp)[i] / float(p) : (*tmp)[i]);
      };
    } else {
      call(r.what_, [&] {
        return MPI_Iallreduce(MPI_IN_PLACE, data.data(), icount(data.size(), r.what_), detail::mpi_type<T>(),
                              detail::mpi_op(op), st_->comm, &r.req_);
      });
      if (op == ReduceOp::avg)
        r.finish_ = [data, p](const MPI_Status&) {
          for (auto& x : data) x /= T(p);
        };
    }
    return r;
  }
  template <detail::comm_element T>
  [[nodiscard]] MpiRequest iall_gather(in_span<T> send, std::span<T> recv) {
    MpiRequest r;
    r.what_ = begin<T>(detail::CollKind::all_gather, recv.size(), std::nullopt, -1, send.size(), 0);
    r.timeout_ = st_->timeout;
    auto cd = std::make_shared<std::pair<std::vector<int>, std::vector<int>>>(blocks(recv.size(), r.what_));
    check_own_block(r.what_, "send", send.size(), recv.size());
    const bool in_place = send.data() == recv.data() + cd->second[std::size_t(rank())] && !send.empty();
    call(r.what_, [&] {
      return MPI_Iallgatherv(in_place ? MPI_IN_PLACE : send.data(), int(send.size()), detail::mpi_type<T>(),
                             recv.data(), cd->first.data(), cd->second.data(), detail::mpi_type<T>(), st_->comm,
                             &r.req_);
    });
    r.finish_ = [cd](const MPI_Status&) {};  // keeps the counts alive until completion
    return r;
  }
  template <detail::comm_element T>
  [[nodiscard]] MpiRequest ireduce_scatter(in_span<T> send, std::span<T> recv, ReduceOp op) {
    MpiRequest r;
    r.what_ = begin<T>(detail::CollKind::reduce_scatter, send.size(), op, -1, recv.size(), 0);
    refuse_op<T>(r.what_, op);
    r.timeout_ = st_->timeout;
    auto counts = std::make_shared<std::vector<int>>(blocks(send.size(), r.what_).first);
    check_own_block(r.what_, "recv", recv.size(), send.size());
    const int p = size();
    if constexpr (detail::half_precision<T>) {
      auto s = std::make_shared<std::vector<float>>(send.begin(), send.end());
      auto d = std::make_shared<std::vector<float>>(recv.size());
      call(r.what_, [&] {
        return MPI_Ireduce_scatter(s->data(), d->data(), counts->data(), MPI_FLOAT, detail::mpi_op(op), st_->comm,
                                   &r.req_);
      });
      r.finish_ = [s, d, counts, recv, op, p](const MPI_Status&) {
        for (std::size_t i = 0; i < recv.size(); ++i) recv[i] = T(op == ReduceOp::avg ? (*d)[i] / float(p) : (*d)[i]);
      };
    } else {
      call(r.what_, [&] {
        return MPI_Ireduce_scatter(send.data(), recv.data(), counts->data(), detail::mpi_type<T>(), detail::mpi_op(op),
                                   st_->comm, &r.req_);
      });
      r.finish_ = [counts, recv, op, p](const MPI_Status&) {
        if (op == ReduceOp::avg)
          for (auto& x : recv) x /= T(p);
      };
    }
    return r;
  }

  [[nodiscard]] MpiCommunicator split(int color, int key) { return split(color, key, {}); }
  /** MPI_Comm_split; `name` names the new group in error messages (default "<parent>.<color>"). */
  [[nodiscard]] MpiCommunicator split(int color, int key, std::string name) {
    const auto pre = begin<float>(detail::CollKind::split, 0, std::nullopt, -1, 0, 0);
    if (color < 0)
      throw comm_error(detail::cat(pre, ": rank ", rank(), " passed color ", color, "; colors must be >= 0"));
    MPI_Comm sub = MPI_COMM_NULL;
    call(pre, [&] { return MPI_Comm_split(st_->comm, color, key, &sub); });
    MpiCommunicator c(sub, name.empty() ? detail::cat(st_->name, ".", color) : std::move(name));
    c.st_->owned = true;
    c.st_->check = st_->check;
    c.st_->timeout = st_->timeout;
    return c;
  }

 private:
  /**
   * Runs one MPI call under the watchdog and throws comm_error if it fails (the error handler
   * returns codes instead of aborting).
   */
  template <class Fn>
  void call(const std::string& what, Fn&& mpi_call) const {
    int rc = MPI_SUCCESS;
    {
      detail::WatchdogScope guard(what, st_->timeout);
      rc = mpi_call();
    }
    if (rc == MPI_SUCCESS) return;
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, s, &len);
    throw comm_error(detail::cat(what, ": MPI error on rank ", rank(), ": ", std::string(s, std::size_t(len))));
  }
  static int icount(std::size_t n, const std::string& what) {
    if (n > std::size_t(INT_MAX))
      throw comm_error(detail::cat(what, ": ", n, " elements exceed MPI's int count; split the buffer"));
    return int(n);
  }
  std::pair<std::vector<int>, std::vector<int>> blocks(std::size_t n, const std::string& what) const {
    std::vector<int> counts(static_cast<std::size_t>(size())), displs(static_cast<std::size_t>(size()));
    for (int q = 0; q < size(); ++q) {
      const Block b = block_of(n, std::size_t(size()), std::size_t(q));
      counts[std::size_t(q)] = icount(b.extent, what);
      displs[std::size_t(q)] = icount(b.offset, what);
    }
    return {counts, displs};
  }
  void check_own_block(const std::string& pre, const char* what, std::size_t got, std::size_t n) const {
    const Block b = block_of(n, std::size_t(size()), std::size_t(rank()));
    if (got != b.extent)
      throw comm_error(detail::cat(pre, ": rank ", rank(), " passed ", what, " of ", got,
                                   " elements, expected block_of(", n, ", ", size(), ", ", rank(), ") = ", b.extent));
  }
  /** After `begin` (whose check, when on, meets every rank first): an op `T` cannot reduce (avg of integers). */
  template <class T>
  void refuse_op(const std::string& pre, ReduceOp op) const {
    if (std::string why = detail::reduce_op_error<T>(op); !why.empty())
      throw comm_error(detail::cat(pre, ": rank ", rank(), " passed ", why));
  }
  /** MPI has no average: sum, then divide by the group size. */
  template <class T>
  void finish_avg(std::span<T> data, ReduceOp op) const {
    if (op != ReduceOp::avg) return;
    for (auto& x : data) x /= T(size());
  }
  void reap_eager() {
    for (auto it = st_->eager.begin(); it != st_->eager.end();) {
      int done = 0;
      MPI_Test(&it->first, &done, MPI_STATUS_IGNORE);
      it = done ? st_->eager.erase(it) : std::next(it);
    }
  }

  /**
   * Starts a collective: bumps the sequence number, returns the message prefix and, when checking,
   * compares fingerprints (and each rank's local counts `a`, `b`) across the group.
   */
  template <class T>
  std::string begin(detail::CollKind kind, std::size_t count, std::optional<ReduceOp> op, int root, std::size_t a,
                    std::size_t b) {
    detail::Fingerprint f{kind,
                          (kind == detail::CollKind::barrier || kind == detail::CollKind::split)
                              ? std::uint8_t(0)
                              : detail::dtype_code_v<T>,
                          std::int8_t(op ? int(*op) : -1),
                          root,
                          count,
                          ++st_->seq};
    std::string pre = detail::op_prefix(detail::coll_name(kind), f.seq, st_->name);
    if (st_->check && size() > 1) {
      struct Wire {
        detail::Fingerprint fp;
        std::uint64_t a, b;
      } mine{f, a, b};
      std::vector<Wire> all(static_cast<std::size_t>(size()));
      call(pre, [&] {
        return MPI_Allgather(&mine, int(sizeof(Wire)), MPI_BYTE, all.data(), int(sizeof(Wire)), MPI_BYTE, st_->comm);
      });
      std::string err;
      for (int q = 1; q < size(); ++q)
        if (!(all[std::size_t(q)].fp == all[0].fp))
          err += detail::cat("; rank ", q, " ", detail::describe(all[std::size_t(q)].fp));
      if (!err.empty())
        throw comm_error(
            detail::cat(pre, ": ranks called different collectives: rank 0 ", detail::describe(all[0].fp), err));
      // Block sizes of the uneven collectives, checked on every rank with every rank's counts.
      const std::size_t n = kind == detail::CollKind::gather || kind == detail::CollKind::scatter
                                ? std::size_t(all[std::size_t(root)].b)
                                : count;
      const char* what = kind == detail::CollKind::all_gather || kind == detail::CollKind::gather ? "send" : "recv";
      if (kind == detail::CollKind::all_gather || kind == detail::CollKind::reduce_scatter ||
          kind == detail::CollKind::gather || kind == detail::CollKind::scatter)
        for (int q = 0; q < size(); ++q) {
          const Block bl = block_of(n, std::size_t(size()), std::size_t(q));
          if (all[std::size_t(q)].a != bl.extent)
            throw comm_error(detail::cat(pre, ": rank ", q, " passed ", what, " of ", all[std::size_t(q)].a,
                                         " elements, expected block_of(", n, ", ", size(), ", ", q, ") = ", bl.extent));
        }
    }
    return pre;
  }

  std::shared_ptr<detail::MpiState> st_;
};

static_assert(communicator<MpiCommunicator>);

/** @brief MPI_Init_thread / MPI_Finalize for the lifetime of the object (no-op parts when already done). */
class MpiEnvironment {
 public:
  MpiEnvironment(int* argc, char*** argv) {
    int init = 0;
    MPI_Initialized(&init);
    if (!init) {
      int provided = 0;
      MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
      owned_ = true;
    }
  }
  ~MpiEnvironment() {
    if (owned_ && detail::mpi_alive()) MPI_Finalize();
  }
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

 private:
  bool owned_ = false;
};

/**
 * @brief Runs `f(MpiCommunicator&)` on this process's rank of MPI_COMM_WORLD; any exception that
 * escapes is printed with the rank and turned into MPI_Abort, so no other rank waits forever.
 */
template <class F>
  requires std::invocable<F&, MpiCommunicator&>
void run_mpi(F&& f, std::string name = "world") {
  MpiCommunicator world(MPI_COMM_WORLD, std::move(name));
  try {
    f(world);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpar: rank %d: %s; aborting the job\n", world.rank(), e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
  } catch (...) {
    std::fprintf(stderr, "mpar: rank %d: unknown exception; aborting the job\n", world.rank());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
}

}  // namespace mpar

#endif  // MPAR_HAVE_MPI
