#pragma once
/**
 * @file NCCL under the emulation (MPAR_CUDA_EMULATION): the calls mpar's NcclCommunicator makes, for ranks that are
 * threads of this process, each on its own emulated device.
 *
 * Like every emulated stream operation, a call runs at once on the calling thread: a collective waits until every
 * rank of the communicator has called it, then one of them computes the result from the peers' device memory (in
 * rank order, the element type's arithmetic) and writes every rank's output. Sends are eager (the bytes wait in a
 * mailbox), receives wait for their message; inside ncclGroupStart/End the sends run first, then the collectives,
 * then the receives, so a group that real NCCL completes cannot deadlock here.
 *
 * What a GPU would hang on or corrupt silently is an error here, reported by the call and ncclGetLastError: a
 * pointer that is not device memory or a range that leaves its allocation, ranks that call different collectives
 * (or different sizes, types, roots, operations) at the same position, a receive that meets a send of another size,
 * two ranks of one communicator on one device, a peer that aborted or destroyed its communicator while others wait,
 * and a wait longer than `nccl_timeout()`. What it does not model: concurrency with the rank's other streams (the
 * stream emulation of backend/stream/ is where that shows), NCCL's own reduction order and its timing.
 */
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mpar/backend/gpu/emulation/capture_state.hpp"
#include "mpar/backend/gpu/emulation/error.hpp"
#include "mpar/backend/gpu/emulation/graphs.hpp"
#include "mpar/backend/gpu/emulation/memory.hpp"
#include "mpar/backend/gpu/emulation/streams.hpp"
#include "mpar/core/dtype.hpp"
#include "mpar/core/error.hpp"

enum ncclResult_t : int {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};
enum ncclDataType_t : int {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9,
  ncclInt = ncclInt32,
  ncclUint = ncclUint32,
  ncclHalf = ncclFloat16,
  ncclFloat = ncclFloat32,
  ncclDouble = ncclFloat64,
};
enum ncclRedOp_t : int { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };

#define NCCL_UNIQUE_ID_BYTES 128
struct ncclUniqueId {
  char internal[NCCL_UNIQUE_ID_BYTES];
};
/** The configuration fields mpar sets; `blocking = 0` makes initialisation return ncclInProgress until all joined. */
struct ncclConfig_t {
  int blocking = 1;
};
#define NCCL_CONFIG_INITIALIZER \
  {}
#define NCCL_SPLIT_NOCOLOR (-1)

struct ncclComm;
using ncclComm_t = ncclComm*;

namespace mpar::gpu::emulation::nccl {

/** How long a call waits for its peers before it fails (a peer that never calls would hang a GPU). */
inline std::chrono::milliseconds& timeout() {
  static std::chrono::milliseconds t{std::chrono::seconds(60)};
  return t;
}

inline const char* type_name(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
      return "int8";
    case ncclUint8:
      return "uint8";
    case ncclInt32:
      return "int32";
    case ncclUint32:
      return "uint32";
    case ncclInt64:
      return "int64";
    case ncclUint64:
      return "uint64";
    case ncclFloat16:
      return "float16";
    case ncclFloat32:
      return "float32";
    case ncclFloat64:
      return "float64";
    case ncclBfloat16:
      return "bfloat16";
  }
  return "an unknown type";
}
/** Bytes per element; 0 for a value that is no NCCL type. */
inline std::size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
  }
  return 0;
}

/**
 * Calls `f((T*)nullptr, (C*)nullptr)` for the element type `T` that `t` names and the type `C` its arithmetic runs
 * in (float for the 16-bit floats, as NCCL computes them; int for 8-bit integers).
 */
template <class F>
void with_type(ncclDataType_t t, F&& f) {
  switch (t) {
    case ncclInt8:
      return f((std::int8_t*)nullptr, (int*)nullptr);
    case ncclUint8:
      return f((std::uint8_t*)nullptr, (int*)nullptr);
    case ncclInt32:
      return f((std::int32_t*)nullptr, (std::int32_t*)nullptr);
    case ncclUint32:
      return f((std::uint32_t*)nullptr, (std::uint32_t*)nullptr);
    case ncclInt64:
      return f((std::int64_t*)nullptr, (std::int64_t*)nullptr);
    case ncclUint64:
      return f((std::uint64_t*)nullptr, (std::uint64_t*)nullptr);
    case ncclFloat16:
      return f((f16*)nullptr, (float*)nullptr);
    case ncclBfloat16:
      return f((bf16*)nullptr, (float*)nullptr);
    case ncclFloat32:
      return f((float*)nullptr, (float*)nullptr);
    case ncclFloat64:
      return f((double*)nullptr, (double*)nullptr);
  }
}

/** `out[i] = out[i] op in[i]` for `n` elements of type `t`, each result rounded to `t`. */
inline void combine(ncclDataType_t t, ncclRedOp_t op, void* out, const void* in, std::size_t n) {
  with_type(t, [&]<class T, class C>(T*, C*) {
    auto* o = static_cast<T*>(out);
    const auto* x = static_cast<const T*>(in);
    for (std::size_t i = 0; i < n; ++i) {
      const C a = C(o[i]), b = C(x[i]);
      C r = a;
      switch (op) {
        case ncclSum:
        case ncclAvg:
          r = C(a + b);
          break;
        case ncclProd:
          r = C(a * b);
          break;
        case ncclMax:
          r = a < b ? b : a;
          break;
        case ncclMin:
          r = b < a ? b : a;
          break;
      }
      o[i] = T(r);
    }
  });
}
/** ncclAvg's last step: the sum divided by the number of ranks (integers truncate, as NCCL's). */
inline void divide(ncclDataType_t t, void* out, std::size_t n, int ranks) {
  with_type(t, [&]<class T, class C>(T*, C*) {
    auto* o = static_cast<T*>(out);
    for (std::size_t i = 0; i < n; ++i) o[i] = T(C(o[i]) / C(ranks));
  });
}

/** One rank's call in a collective: what it asked for, and where its buffers are readable. */
struct Call {
  std::string what;  ///< "ncclAllReduce of 8 float32 (sum)", for the messages
  std::string kind;  ///< the call and every argument that must agree across ranks
  std::size_t send_bytes = 0, recv_bytes = 0;
  const unsigned char* send = nullptr;  ///< readable views of the device buffers (null when empty)
  unsigned char* recv = nullptr;
  std::string problem;                 ///< this rank's own argument error, reported to every rank
  int color = 0, key = 0, device = 0;  ///< ncclCommSplit's arguments
  ncclComm_t* split_out = nullptr;
};

/** A collective in progress: the ranks' calls, and the verdict every rank returns. */
struct Round {
  std::vector<std::optional<Call>> calls;
  int arrived = 0, departed = 0;
  bool done = false;
  ncclResult_t result = ncclSuccess;
  std::string error;
};

/** A message sent and not yet received. */
struct Message {
  ncclDataType_t type;
  std::size_t count;
  std::vector<unsigned char> bytes;
};

/** @brief The ranks of one communicator: their rendezvous, mailboxes and shared failure. */
struct Clique {
  explicit Clique(int n) : nranks(n), devices(std::size_t(n), -1), left(std::size_t(n), false) {}
  const int nranks;
  std::mutex m;
  std::condition_variable cv;
  std::vector<int> devices;  ///< -1 until the rank joined
  std::vector<bool> left;    ///< destroyed its communicator
  int joined = 0;
  std::map<std::uint64_t, Round> rounds;                         ///< by the collective's position
  std::map<std::pair<int, int>, std::deque<Message>> mailboxes;  ///< by (sender, receiver)
  bool aborted = false;
  std::string abort_reason;
};

}  // namespace mpar::gpu::emulation::nccl

/** An emulated communicator: one rank's handle on its clique. */
struct ncclComm {
  std::shared_ptr<::mpar::gpu::emulation::nccl::Clique> clique;
  int rank = 0, nranks = 1, device = 0;
  std::uint64_t collectives = 0;  ///< collectives issued, the position of the next one
  bool initialising = false;
  ncclResult_t async_error = ncclSuccess;
  std::string last_error;
};

namespace mpar::gpu::emulation::nccl {

/** Records `error` as the communicator's last error (and asynchronous error) and returns `r`. */
inline ncclResult_t fail(ncclComm_t comm, ncclResult_t r, std::string error) {
  if (comm) {
    comm->last_error = "emulated NCCL: " + std::move(error);
    comm->async_error = r;
  }
  return r;
}

/**
 * Waits on `lk` until `ready()`, the clique is aborted, a rank in `awaited` (all when empty) left, or the timeout
 * passes; returns the reason it stopped early, empty when `ready()`.
 */
template <class Ready>
std::string wait_for(Clique& c, std::unique_lock<std::mutex>& lk, const std::vector<int>& awaited, Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + timeout();
  for (;;) {
    if (ready()) return {};
    if (c.aborted) return "the communicator was aborted (" + c.abort_reason + ")";
    for (int q = 0; q < c.nranks; ++q)
      if (c.left[std::size_t(q)] && (awaited.empty() || std::find(awaited.begin(), awaited.end(), q) != awaited.end()))
        return mpar::detail::cat("rank ", q, " destroyed its communicator first");
    if (c.cv.wait_until(lk, deadline) == std::cv_status::timeout && !ready())
      return mpar::detail::cat("no answer within ", timeout().count(),
                               " ms (a peer did not make the same call: every rank must call the same collectives in "
                               "the same order)");
  }
}

/** The readable view of `bytes` of device memory at `p`, or the problem with it; empty ranges need no memory. */
inline std::string device_range(const void* p, std::size_t bytes, const char* which, const unsigned char** view) {
  *view = nullptr;
  if (bytes == 0) return {};
  if (!DeviceAllocations::instance().covers(p, bytes))
    return mpar::detail::cat("its ", which, " buffer (", bytes, " bytes at ", p, ") ",
                             device_view(p) ? "leaves its device allocation" : "is not device memory");
  *view = static_cast<const unsigned char*>(device_view(p));
  return {};
}

/**
 * Joins this rank's collective `call` at the communicator's next position; the last rank to arrive checks that every
 * rank made the same call and runs `compute(calls)`. Every rank returns the same verdict.
 */
inline ncclResult_t collective(ncclComm_t comm, Call call,
                               const std::function<void(std::vector<std::optional<Call>>&)>& compute) {
  Clique& c = *comm->clique;
  const std::uint64_t pos = comm->collectives++;
  std::unique_lock lk(c.m);
  if (c.aborted)
    return fail(comm, ncclRemoteError,
                mpar::detail::cat("rank ", comm->rank, "'s ", call.what, " (collective #", pos + 1,
                                  "): the communicator was aborted (", c.abort_reason, ")"));
  Round& round = c.rounds[pos];
  if (round.calls.empty()) round.calls.resize(std::size_t(c.nranks));
  round.calls[std::size_t(comm->rank)] = std::move(call);
  if (++round.arrived == c.nranks) {
    const Call& first = *round.calls[0];
    for (int q = 0; q < c.nranks && round.error.empty(); ++q) {
      const Call& k = *round.calls[std::size_t(q)];
      if (!k.problem.empty()) {
        round.result = ncclInvalidArgument;
        round.error = mpar::detail::cat("collective #", pos + 1, ": rank ", q, "'s ", k.what, ": ", k.problem);
      } else if (k.kind != first.kind) {
        round.result = ncclInvalidUsage;
        round.error =
            mpar::detail::cat("collective #", pos + 1, ": rank 0 called ", first.what, ", rank ", q, " called ", k.what,
                              ": every rank must call the same collectives in the same "
                              "order with the same sizes, types, roots and operations");
      }
    }
    if (round.error.empty()) compute(round.calls);
    round.done = true;
    c.cv.notify_all();
  } else {
    std::vector<int> missing;
    for (int q = 0; q < c.nranks; ++q)
      if (!round.calls[std::size_t(q)]) missing.push_back(q);
    if (std::string why = wait_for(c, lk, missing, [&] { return round.done; }); !why.empty()) {
      const std::string what = round.calls[std::size_t(comm->rank)]->what;
      if (++round.departed == round.arrived && !round.done) c.rounds.erase(pos);
      lk.unlock();
      return fail(comm, ncclRemoteError,
                  mpar::detail::cat("rank ", comm->rank, "'s ", what, " (collective #", pos + 1, "): ", why));
    }
  }
  const ncclResult_t r = round.result;
  std::string error = round.error;
  if (++round.departed == c.nranks) c.rounds.erase(pos);
  lk.unlock();
  return r == ncclSuccess ? r : fail(comm, r, std::move(error));
}

/** The calls of an open ncclGroupStart on this thread, run at the matching ncclGroupEnd. */
struct Group {
  int depth = 0;
  std::vector<std::function<ncclResult_t()>> sends, collectives, receives;
};
inline Group& thread_group() {
  thread_local Group g;
  return g;
}

/**
 * Runs `op` now, defers it to the thread's open group (`lane`), or records it into the capture of `stream`. A call on
 * a stream outside the calling thread's capture is refused: the emulation does not model capture across streams.
 */
inline ncclResult_t submit(ncclComm_t comm, cudaStream_t stream,
                           std::vector<std::function<ncclResult_t()>> Group::*lane, std::function<ncclResult_t()> op) {
  if (comm == nullptr) return ncclInvalidArgument;
  if (comm->initialising) return fail(comm, ncclInvalidUsage, "a call before the communicator finished initialising");
  if (stream == nullptr || stream->capture == nullptr) {
    if (capturing())
      return fail(comm, ncclInvalidUsage,
                  "a call on a stream outside the calling thread's CUDA graph capture (the emulation records NCCL "
                  "calls only on the capturing stream itself)");
  }
  Group& g = thread_group();
  std::function<ncclResult_t()> run = op;
  if (stream != nullptr && stream->capture != nullptr)
    run = [stream, op = std::move(op), comm]() -> ncclResult_t {
      (void)run_or_record(stream, [op, comm] {
        if (op() != ncclSuccess) throw emulation_error(comm->last_error);
      });
      return ncclSuccess;
    };
  if (g.depth > 0) {
    (g.*lane).push_back(std::move(run));
    return ncclSuccess;
  }
  return run();
}

/** The process's communicators being initialised, by unique id. */
inline std::pair<std::mutex&, std::map<std::string, std::weak_ptr<Clique>>&> registry() {
  static std::mutex m;
  static std::map<std::string, std::weak_ptr<Clique>> r;
  return {m, r};
}

}  // namespace mpar::gpu::emulation::nccl

inline const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
  }
  return "unknown result code";
}
inline const char* ncclGetLastError(ncclComm_t comm) { return comm ? comm->last_error.c_str() : ""; }

inline ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  static std::atomic<std::uint64_t> next{1};
  std::memset(id->internal, 0, sizeof id->internal);
  const std::uint64_t n = next++;
  std::memcpy(id->internal, &n, sizeof n);
  return ncclSuccess;
}

inline ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank,
                                           ncclConfig_t* config) {
  namespace nccl = ::mpar::gpu::emulation::nccl;
  if (out == nullptr || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  std::shared_ptr<nccl::Clique> clique;
  {
    auto [m, reg] = nccl::registry();
    std::lock_guard lk(m);
    auto& slot = reg[std::string(id.internal, sizeof id.internal)];
    clique = slot.lock();
    if (!clique) slot = clique = std::make_shared<nccl::Clique>(nranks);
  }
  auto* comm = new ncclComm{clique, rank, nranks, ::mpar::gpu::emulation::detail::current_device()};
  *out = comm;
  std::unique_lock lk(clique->m);
  if (clique->nranks != nranks)
    return nccl::fail(comm, ncclInvalidArgument,
                      mpar::detail::cat("rank ", rank, " initialises a communicator of ", nranks,
                                        " ranks whose unique id other ranks used for ", clique->nranks));
  if (clique->devices[std::size_t(rank)] >= 0)
    return nccl::fail(comm, ncclInvalidUsage, mpar::detail::cat("rank ", rank, " joined the same communicator twice"));
  for (int q = 0; q < nranks; ++q)
    if (clique->devices[std::size_t(q)] == comm->device && !clique->aborted) {
      clique->aborted = true;
      clique->abort_reason =
          mpar::detail::cat("Duplicate GPU detected: rank ", q, " and rank ", rank, " both on CUDA device ",
                            comm->device, " (NCCL needs one GPU per rank of a communicator)");
      clique->cv.notify_all();
    }
  clique->devices[std::size_t(rank)] = comm->device;
  ++clique->joined;
  clique->cv.notify_all();
  if (clique->aborted) return nccl::fail(comm, ncclInvalidUsage, clique->abort_reason);
  if (config != nullptr && config->blocking == 0 && clique->joined < nranks) {
    comm->initialising = true;  // ncclCommGetAsyncError says when every rank has joined
    comm->async_error = ncclInProgress;
    return ncclInProgress;
  }
  if (std::string why = nccl::wait_for(*clique, lk, {}, [&] { return clique->joined == nranks; }); !why.empty())
    return nccl::fail(comm, ncclRemoteError, "initialisation: " + why);
  return ncclSuccess;
}
inline ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(out, nranks, id, rank, nullptr);
}

/** The communicator's asynchronous state: ncclInProgress while initialising, then the last error of a call. */
inline ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* r) {
  if (comm == nullptr || r == nullptr) return ncclInvalidArgument;
  auto& c = *comm->clique;
  std::lock_guard lk(c.m);
  if (c.aborted && comm->async_error == ncclSuccess) {
    comm->async_error = ncclRemoteError;
    comm->last_error = "emulated NCCL: the communicator was aborted (" + c.abort_reason + ")";
  }
  if (comm->initialising) {
    if (c.aborted) {
      comm->initialising = false;
      comm->async_error = ncclInvalidUsage;
      comm->last_error = "emulated NCCL: " + c.abort_reason;
    } else if (c.joined == c.nranks) {
      comm->initialising = false;
      comm->async_error = ncclSuccess;
    }
  }
  *r = comm->async_error;
  return ncclSuccess;
}
inline ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}
inline ncclResult_t ncclCommCount(ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return ncclInvalidArgument;
  *count = comm->nranks;
  return ncclSuccess;
}
/** Nothing is in flight once a call returned, so finalising has nothing to wait for. */
inline ncclResult_t ncclCommFinalize(ncclComm_t comm) { return comm ? ncclSuccess : ncclInvalidArgument; }
/** Frees the handle; peers still waiting for this rank learn that it left instead of waiting for the timeout. */
inline ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  {
    std::lock_guard lk(comm->clique->m);
    comm->clique->left[std::size_t(comm->rank)] = true;
    comm->clique->cv.notify_all();
  }
  delete comm;
  return ncclSuccess;
}
/** Ends the communicator for every rank: calls waiting in it, and later ones, fail with ncclRemoteError. */
inline ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  {
    std::lock_guard lk(comm->clique->m);
    if (!comm->clique->aborted) {
      comm->clique->aborted = true;
      comm->clique->abort_reason = mpar::detail::cat("rank ", comm->rank, " called ncclCommAbort");
    }
    comm->clique->left[std::size_t(comm->rank)] = true;
    comm->clique->cv.notify_all();
  }
  delete comm;
  return ncclSuccess;
}

inline ncclResult_t ncclGroupStart() {
  ++::mpar::gpu::emulation::nccl::thread_group().depth;
  return ncclSuccess;
}
/** Runs the group's calls: its sends, then its collectives, then its receives, each in the order they were made. */
inline ncclResult_t ncclGroupEnd() {
  auto& g = ::mpar::gpu::emulation::nccl::thread_group();
  if (g.depth == 0) return ncclInvalidUsage;
  if (--g.depth > 0) return ncclSuccess;
  const auto sends = std::exchange(g.sends, {});
  const auto collectives = std::exchange(g.collectives, {});
  const auto receives = std::exchange(g.receives, {});
  ncclResult_t r = ncclSuccess;
  for (const auto* lane : {&sends, &collectives, &receives})
    for (const auto& op : *lane)
      if (r == ncclSuccess) r = op();
  return r;
}

namespace mpar::gpu::emulation::nccl {

/** A collective's description and views, with this rank's argument problems noted for every rank to report. */
inline Call describe(const char* name, ncclDataType_t type, std::size_t count, ncclRedOp_t op, int root,
                     const void* send, std::size_t send_count, void* recv, std::size_t recv_count, int nranks) {
  Call k;
  const std::size_t es = type_size(type);
  k.what = mpar::detail::cat(name, " of ", count, " ", type_name(type));
  if (op >= 0)
    k.what += mpar::detail::cat(" (",
                                op == ncclSum    ? "sum"
                                : op == ncclProd ? "prod"
                                : op == ncclMax  ? "max"
                                : op == ncclMin  ? "min"
                                                 : "avg",
                                ")");
  if (root >= 0) k.what += mpar::detail::cat(" rooted at rank ", root);
  k.kind = mpar::detail::cat(name, "/", int(type), "/", count, "/", int(op), "/", root);
  if (es == 0) {
    k.problem = mpar::detail::cat("data type ", int(type), " is no NCCL type");
    return k;
  }
  if (root >= nranks) {
    k.problem = mpar::detail::cat("root ", root, " is outside a communicator of ", nranks);
    return k;
  }
  k.send_bytes = send_count * es;
  k.recv_bytes = recv_count * es;
  k.problem = device_range(send, k.send_bytes, "send", &k.send);
  const unsigned char* rv = nullptr;
  if (k.problem.empty()) k.problem = device_range(recv, k.recv_bytes, "receive", &rv);
  k.recv = const_cast<unsigned char*>(rv);
  return k;
}

/** The reduction of every rank's `count` elements at byte `offset` of its send buffer, in rank order. */
inline std::vector<unsigned char> reduce_all(const std::vector<std::optional<Call>>& calls, ncclDataType_t type,
                                             ncclRedOp_t op, std::size_t offset, std::size_t count) {
  const std::size_t bytes = count * type_size(type);
  std::vector<unsigned char> acc(calls[0]->send + offset, calls[0]->send + offset + bytes);
  for (std::size_t q = 1; q < calls.size(); ++q) combine(type, op, acc.data(), calls[q]->send + offset, count);
  if (op == ncclAvg) divide(type, acc.data(), count, int(calls.size()));
  return acc;
}

}  // namespace mpar::gpu::emulation::nccl

inline ncclResult_t ncclAllReduce(const void* send, void* recv, std::size_t count, ncclDataType_t type, ncclRedOp_t op,
                                  ncclComm_t comm, cudaStream_t stream) {
  namespace nccl = ::mpar::gpu::emulation::nccl;
  return nccl::submit(comm, stream, &nccl::Group::collectives, [=]() {
    auto k = nccl::describe("ncclAllReduce", type, count, op, -1, send, count, recv, count, comm->nranks);
    return nccl::collective(comm, std::move(k), [&](std::vector<std::optional<nccl::Call>>& calls) {
      if (count == 0) return;
      const auto r = nccl::reduce_all(calls, type, op, 0, count);
      for (auto& k2 : calls) std::memcpy(k2->recv, r.data(), r.size());
    });
  });
}
inline ncclResult_t ncclBroadcast(const void* send, void* recv, std::size_t count, ncclDataType_t type, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
  namespace nccl = ::mpar::gpu::emulation::nccl;
  return nccl::submit(comm, stream, &nccl::Group::collectives, [=]() {
    const bool is_root = comm->rank == root;
    auto k = nccl::describe("ncclBroadcast", type, count, ncclRedOp_t(-1), root, is_root ? send : nullptr,
                            is_root ? count : 0, recv, count, comm->nranks);
    return nccl::collective(comm, std::move(k), [&](std::vector<std::optional<nccl::Call>>& calls) {
      if (count == 0) return;
      const std::vector<unsigned char> v(calls[std::size_t(root)]->send,
                                         calls[std::size_t(root)]->send + calls[std::size_t(root)]->send_bytes);
      for (auto& k2 : calls) std::memcpy(k2->recv, v.data(), v.size());
    });
  });
}
inline ncclResult_t ncclReduce(const void* send, void* recv, std::size_t count, ncclDataType_t type, ncclRedOp_t op,
                               int root, ncclComm_t comm, cudaStream_t stream) {
  namespace nccl = ::mpar::gpu::emulation::nccl;
  return nccl::submit(comm, stream, &nccl::Group::collectives, [=]() {
    const bool is_root = comm->rank == root;
    auto k = nccl::describe("ncclReduce", type, count, op, root, send, count, is_root ? recv : nullptr,
                            is_root ? count : 0, comm->nranks);
    return nccl::collective(comm, std::move(k), [&](std::vector<std::optional<nccl::Call>>& calls) {
      if (count == 0) return;
      const auto r = nccl::reduce_all(calls, type, op, 0, count);
      std::memcpy(calls[std::size_t(root)]->recv, r.data(), r.size());
    });
  });
}
inline ncclResult_t ncclAllGather(const void* send, void* recv, std::size_t send_count, ncclDataType_t type,
                                  ncclComm_t comm, cudaStream_t stream) {
  namespace nccl = ::mpar::gpu::emulation::nccl;
  return nccl::submit(comm, stream, &nccl::Group::collectives, [=]() {
    auto k = nccl::describe("ncclAllGather", type, send_count, ncclRedOp_t(-1), -1, send, send_count, recv,
                            send_count * std::size_t(comm->nranks), comm->nranks);
    return nccl::collective(comm, std::move(k), [&](std::vector<std::optional<nccl::Call>>& calls) {
      if (send_count == 0) return;
      std::vector<unsigned char> all;
      for (auto& k2 : calls) all.insert(all.end(), k2->send, k2->send + k2->send_bytes);
      for (auto& k2 : calls) std::memcpy(k2->recv, all.data(), all.size());
    });
  });
}
inline ncclResult_t ncclReduceScatter(const void* send, void* recv, std::size_t recv_count, ncclDataType_t type,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  namespace nccl = ::mpar::gpu::emulation::nccl;
  return nccl::submit(comm, stream, &nccl::Group::collectives, [=]() {
    auto k = nccl::describe("ncclReduceScatter", type, recv_count, op, -1, send, recv_count * std::size_t(comm->nranks),
                            recv, recv_count, comm->nranks);
    return nccl::collective(comm, std::move(k), [&](std::vector<std::optional<nccl::Call>>& calls) {
      if (recv_count == 0) return;
      const std::size_t block = recv_count * nccl::type_size(type);
      std::vector<std::vector<unsigned char>> parts;
      for (std::size_t q = 0; q < calls.size(); ++q)
        parts.push_back(nccl::reduce_all(calls, type, op, q * block, recv_count));
      for (std::size_t q = 0; q < calls.size(); ++q) std::memcpy(calls[q]->recv, parts[q].data(), block);
    });
  });
}

/** Eager: the bytes wait in the receiver's mailbox, so a send completes before its receive is posted. */
inline ncclResult_t ncclSend(const void* send, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
  namespace nccl = ::mpar::gpu::emulation::nccl;
  return nccl::submit(comm, stream, &nccl::Group::sends, [=]() {
    if (peer < 0 || peer >= comm->nranks)
      return nccl::fail(comm, ncclInvalidArgument,
                        mpar::detail::cat("rank ", comm->rank, "'s ncclSend to rank ", peer,
                                          ": outside a communicator of ", comm->nranks));
    const unsigned char* view = nullptr;
    if (std::string why = nccl::device_range(send, count * nccl::type_size(type), "send", &view); !why.empty())
      return nccl::fail(comm, ncclInvalidArgument,
                        mpar::detail::cat("rank ", comm->rank, "'s ncclSend of ", count, " ", nccl::type_name(type),
                                          " to rank ", peer, ": ", why));
    nccl::Message msg{type, count, std::vector<unsigned char>(view, view + count * nccl::type_size(type))};
    std::lock_guard lk(comm->clique->m);
    if (comm->clique->aborted)
      return nccl::fail(comm, ncclRemoteError,
                        mpar::detail::cat("rank ", comm->rank, "'s ncclSend to rank ", peer,
                                          ": the communicator was aborted (", comm->clique->abort_reason, ")"));
    comm->clique->mailboxes[{comm->rank, peer}].push_back(std::move(msg));
    comm->clique->cv.notify_all();
    return ncclSuccess;
  });
}
/** Waits for the next message from `peer`, which must have the same size and type. */
inline ncclResult_t ncclRecv(void* recv, std::size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                             cudaStream_t stream) {
  namespace nccl = ::mpar::gpu::emulation::nccl;
  return nccl::submit(comm, stream, &nccl::Group::receives, [=]() {
    const std::string what = mpar::detail::cat("rank ", comm->rank, "'s ncclRecv of ", count, " ",
                                               nccl::type_name(type), " from rank ", peer);
    if (peer < 0 || peer >= comm->nranks)
      return nccl::fail(comm, ncclInvalidArgument,
                        what + ": outside a communicator of " + std::to_string(comm->nranks));
    const unsigned char* view = nullptr;
    if (std::string why = nccl::device_range(recv, count * nccl::type_size(type), "receive", &view); !why.empty())
      return nccl::fail(comm, ncclInvalidArgument, what + ": " + why);
    auto& c = *comm->clique;
    std::unique_lock lk(c.m);
    auto& box = c.mailboxes[{peer, comm->rank}];
    if (std::string why = nccl::wait_for(c, lk, {peer}, [&] { return !box.empty(); }); !why.empty())
      return nccl::fail(comm, ncclRemoteError, what + ": " + why);
    nccl::Message msg = std::move(box.front());
    box.pop_front();
    lk.unlock();
    if (msg.type != type || msg.count != count)
      return nccl::fail(comm, ncclInvalidUsage,
                        mpar::detail::cat(what, " met rank ", peer, "'s send of ", msg.count, " ",
                                          nccl::type_name(msg.type), ": a send and its receive must agree"));
    if (!msg.bytes.empty()) std::memcpy(const_cast<unsigned char*>(view), msg.bytes.data(), msg.bytes.size());
    return ncclSuccess;
  });
}

/** Collective over `comm`: ranks with the same `color` form a communicator, ordered by `key` (then parent rank). */
inline ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* out, ncclConfig_t*) {
  namespace nccl = ::mpar::gpu::emulation::nccl;
  if (comm == nullptr || out == nullptr) return ncclInvalidArgument;
  *out = nullptr;
  nccl::Call k;
  k.what = mpar::detail::cat("ncclCommSplit (color ", color, ", key ", key, ")");
  k.kind = "ncclCommSplit";
  k.color = color;
  k.key = key;
  k.device = comm->device;
  k.split_out = out;
  if (color < NCCL_SPLIT_NOCOLOR) k.problem = mpar::detail::cat("color ", color, " is negative");
  return nccl::collective(comm, std::move(k), [&](std::vector<std::optional<nccl::Call>>& calls) {
    std::map<int, std::vector<std::pair<std::pair<int, int>, std::size_t>>> by_color;  // ((key, rank), index)
    for (std::size_t q = 0; q < calls.size(); ++q)
      if (calls[q]->color != NCCL_SPLIT_NOCOLOR) by_color[calls[q]->color].push_back({{calls[q]->key, int(q)}, q});
    for (auto& [col, members] : by_color) {
      std::sort(members.begin(), members.end());
      auto clique = std::make_shared<nccl::Clique>(int(members.size()));
      clique->joined = int(members.size());
      for (std::size_t i = 0; i < members.size(); ++i) {
        const nccl::Call& m = *calls[members[i].second];
        clique->devices[i] = m.device;
        *m.split_out = new ncclComm{clique, int(i), int(members.size()), m.device};
      }
    }
  });
}
