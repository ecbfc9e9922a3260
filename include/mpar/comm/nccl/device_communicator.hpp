#pragma once
/**
 * @file Several ranks on one GPU: N ranks as threads sharing a device, each on its own stream, with
 * a communicator whose collectives are device copies and reduction kernels over the peers' buffers.
 *
 * NCCL refuses two ranks of one communicator on one device, so this is how multi-rank programs
 * (tensor, pipeline, data parallel) are tested on a single-GPU machine, and how small models are
 * debugged. All peers' buffers live in the same device memory, so a rank reads them directly.
 *
 * Protocol of one collective: every rank publishes its buffers and arguments, then a *phase*: each
 * rank records an event on its stream, the threads meet at a host barrier (with a timeout), and each
 * stream waits for every peer's event; now every rank may read its peers' buffers. The work is
 * enqueued, and a closing phase makes every stream wait for every peer's reads before any rank
 * can overwrite its buffers. Calls never block the host on device work: results are ready in the
 * order of the calling thread's compute stream.
 *
 * Arguments are checked collectively: after the first barrier every rank sees all ranks' arguments
 * and reaches the same verdict, so a mismatch throws comm_error on every rank instead of hanging.
 * A rank that does not arrive within the timeout makes the group broken: every waiting and later
 * call throws comm_error naming the operation, its sequence number and the missing ranks.
 */
#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/backend/gpu/context.hpp"
#include "mpar/backend/gpu/cuda_error.hpp"
#include "mpar/backend/gpu/element_types.hpp"
#include "mpar/backend/gpu/memory.hpp"
#include "mpar/backend/gpu/runtime.hpp"  // the CUDA runtime, or its emulation
#include "mpar/comm/communicator.hpp"
#include "mpar/comm/detail/comm_element.hpp"
#include "mpar/core/layout.hpp"

namespace mpar::gpu {

/** The most ranks one DeviceCommunicator group may have (peer pointers travel as a kernel argument). */
inline constexpr int max_device_group = 64;

namespace detail {

template <class T>
struct PeerPointers {
  const T* p[max_device_group];
  /** Each pointer, for a launch that must translate pointers inside a struct (the emulated one, emulation/launch.hpp). */
  template <class F>
  void for_each_device_pointer(F&& f) {
    for (const T*& q : p) f(q);
  }
};

/** An element widened to the type a reduction accumulates in: integers stay themselves, exactly. */
template <class T>
__host__ __device__ inline auto to_accumulator(T v) {
  if constexpr (mpar::detail::comm_integer<T>)
    return v;
  else
    return to_compute(v);
}

/**
 * out[i] = op over ranks q of src_q[offset + i], in rank order (so every rank gets identical bits). Integers
 * accumulate in their own type, sums wrapping modulo 2^bits; they never see `avg` (the caller refuses it).
 */
template <class T>
__global__ void reduce_peers_kernel(PeerPointers<T> src, int npeers, std::size_t offset, std::size_t count, int op,
                                    T* out) {
  using C = mpar::detail::comm_compute_t<T>;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < count;
       i += std::size_t(gridDim.x) * blockDim.x) {
    C acc = to_accumulator(src.p[0][offset + i]);
    for (int q = 1; q < npeers; ++q) {
      const C v = to_accumulator(src.p[q][offset + i]);
      switch (op) {
        case int(ReduceOp::max):
          acc = v > acc ? v : acc;
          break;
        case int(ReduceOp::min):
          acc = v < acc ? v : acc;
          break;
        default:
          acc = mpar::detail::comm_add(acc, v);
      }
    }
    if constexpr (mpar::detail::comm_integer<T>) {
      out[i] = acc;
    } else {
      if (op == int(ReduceOp::avg)) acc /= C(npeers);
      out[i] = from_compute<T>(acc);
    }
  }
}

/** One rank's published arguments for the collective in progress. */
struct Slot {
  const char* op = "";
  std::uint64_t seq = 0;
  std::string_view dtype;
  std::size_t count = 0, count2 = 0;
  std::size_t extra = 0;  // a size only some ranks know (the root's buffer in gather/scatter); not compared
  int root = 0, reduce = 0;
  const void* send = nullptr;
  void* recv = nullptr;
  const std::size_t* counts_send = nullptr;
  const std::size_t* counts_recv = nullptr;
  int color = 0, key = 0;
  std::shared_ptr<void> handoff;  // split: the new group the leader created
  cudaEvent_t ev[2] = {nullptr, nullptr};
  unsigned phase = 0;
};

/** A message posted by an eager send: the sender's copy of the data and the event that says it is there. */
struct Posted {
  void* data = nullptr;  // stream-ordered allocation, freed by the receiver after its copy
  std::size_t count = 0;
  std::string_view dtype;
  cudaEvent_t ready = nullptr;
};

/** State shared by the ranks of one group. */
struct DeviceGroup {
  int size = 1, device = 0;
  std::string name;
  std::chrono::milliseconds timeout;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  std::uint64_t generation = 0;
  std::vector<bool> here;
  bool broken = false;
  std::string why;
  std::vector<Slot> slots;
  std::map<std::tuple<int, int, int>, std::deque<Posted>> mailbox;  // (src, dst, tag) -> messages in order

  DeviceGroup(int n, int dev, std::string nm, std::chrono::milliseconds to)
      : size(n), device(dev), name(std::move(nm)), timeout(to), here(std::size_t(n), false), slots(std::size_t(n)) {
    check(cudaSetDevice(dev), "cudaSetDevice");
    for (auto& s : slots)
      for (auto& e : s.ev) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  }
  DeviceGroup(const DeviceGroup&) = delete;
  DeviceGroup& operator=(const DeviceGroup&) = delete;
  ~DeviceGroup() {
    for (auto& s : slots)
      for (auto e : s.ev)
        if (e) (void)cudaEventDestroy(e);
    for (auto& [k, q] : mailbox)
      for (auto& m : q) {
        if (m.ready) (void)cudaEventDestroy(m.ready);
        if (m.data) (void)cudaFree(m.data);
      }
  }

  /** Host barrier with a timeout; a timeout or a broken group throws comm_error on every waiting rank. */
  void barrier(int rank, const char* op, std::uint64_t seq) {
    std::unique_lock lk(mu);
    if (broken) throw comm_error(why);
    const std::uint64_t gen = generation;
    here[std::size_t(rank)] = true;
    if (++arrived == size) {
      arrived = 0;
      std::fill(here.begin(), here.end(), false);
      ++generation;
      cv.notify_all();
      return;
    }
    if (!cv.wait_for(lk, timeout, [&] { return generation != gen || broken; })) {
      std::string missing;
      for (int r = 0; r < size; ++r)
        if (!here[std::size_t(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      broken = true;
      why = mpar::detail::cat("gpu::DeviceCommunicator: ", op, " #", seq, " in group '", name, "' (size ", size,
                              "): rank(s) ", missing, " did not arrive within ", timeout.count(),
                              " ms (they threw, stopped, or called a different sequence of operations)");
      cv.notify_all();
    }
    if (broken) throw comm_error(why);
  }
  void mark_broken(const std::string& msg) {
    std::lock_guard lk(mu);
    if (!broken) {
      broken = true;
      why = msg;
    }
    cv.notify_all();
  }
};

}  // namespace detail

/** @brief The request of a DeviceCommunicator operation: collectives complete at once; a receive may be deferred. */
class DeviceRequest {
 public:
  DeviceRequest() = default;
  explicit DeviceRequest(std::function<bool(bool)> pending) : pending_(std::move(pending)) {}
  void wait() {
    if (pending_) {
      auto f = std::move(pending_);
      pending_ = nullptr;
      (void)f(true);
    }
  }
  bool test() {
    if (pending_ && pending_(false)) pending_ = nullptr;
    return !pending_;
  }

 private:
  std::function<bool(bool)> pending_;  // f(block): performs the operation; false if it would have to wait
};

/**
 * @brief The `communicator` concept for N ranks as threads sharing one CUDA device (see the file comment).
 *
 * Create all ranks' communicators at once with `create(n, device)` and hand one to each thread. Each
 * thread binds itself to the device (CudaBackend::init_rank(device)) and uses its own compute stream.
 * Sends are eager (buffered in device memory), so send never blocks and any send/recv order that is
 * valid for MPI's buffered mode works; recv waits (up to the timeout) for the matching (peer, tag).
 */
class DeviceCommunicator {
 public:
  /** One communicator per rank of a new group of `n` ranks on `device`. */
  [[nodiscard]] static std::vector<DeviceCommunicator> create(
      int n, int device = 0, std::string name = "world", std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    require(n >= 1 && n <= max_device_group, "gpu::DeviceCommunicator::create: ", n, " ranks; supported are 1 to ",
            max_device_group);
    auto g = std::make_shared<detail::DeviceGroup>(n, device, std::move(name), timeout);
    std::vector<DeviceCommunicator> v;
    for (int r = 0; r < n; ++r) v.push_back(DeviceCommunicator(g, r));
    return v;
  }

  DeviceCommunicator(DeviceCommunicator&&) noexcept = default;
  DeviceCommunicator& operator=(DeviceCommunicator&&) noexcept = default;

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return g_->size; }
  [[nodiscard]] std::string name() const { return g_->name; }
  [[nodiscard]] int device() const { return g_->device; }

  template <mpar::detail::comm_element T>
  void all_reduce(std::span<T> data, ReduceOp op) {
    auto& me = publish<T>("all_reduce", data.size(), 0, int(op), data.data(), data.data());
    phase(true);
    refuse_op<T>("all_reduce", op);
    const std::size_t p = std::size_t(size());
    const Block mine = block_of(data.size(), p, std::size_t(rank_));
    // Reduce-scatter into a private scratch block, then every rank gathers all blocks.
    DeviceBuffer<T> scratch(mine.extent, stream());
    me.handoff = std::shared_ptr<void>(scratch.data(), [](void*) {});
    reduce_into<T>(mine.offset, mine.extent, int(op), scratch.data());
    phase(false);  // scratch blocks complete, and their pointers are published
    for (std::size_t q = 0; q < p; ++q) {
      const Block b = block_of(data.size(), p, q);
      copy_on_device(static_cast<const T*>(g_->slots[q].handoff.get()), data.data() + b.offset, b.extent, stream());
    }
    phase(false);  // nobody frees its scratch while a peer still copies from it
    me.handoff.reset();
  }
  template <mpar::detail::comm_element T>
  void broadcast(std::span<T> data, int root) {
    publish<T>("broadcast", data.size(), root, 0, data.data(), data.data());
    phase(true);
    if (rank_ != root)
      copy_on_device(static_cast<const T*>(g_->slots[std::size_t(root)].send), data.data(), data.size(), stream());
    phase(false);
  }
  template <mpar::detail::comm_element T>
  void reduce(std::span<const T> send, std::span<T> recv, ReduceOp op, int root) {
    publish<T>("reduce", send.size(), root, int(op), send.data(), recv.data(),
               rank_ == root ? recv.size() : send.size());
    phase(true);
    refuse_op<T>("reduce", op);
    if (g_->slots[std::size_t(root)].count2 != send.size())
      fail(where("reduce") + mpar::detail::cat(": the root's recv holds ", g_->slots[std::size_t(root)].count2,
                                               " elements, send ", send.size()));
    if (rank_ == root) reduce_into<T>(0, send.size(), int(op), recv.data());
    phase(false);
  }
  template <mpar::detail::comm_element T>
  void all_gather(std::span<const T> send, std::span<T> recv) {
    publish<T>("all_gather", recv.size(), 0, 0, send.data(), recv.data(), send.size());
    phase(true);
    check_blocks("all_gather", recv.size(), [&](std::size_t q) { return g_->slots[q].count2; });
    for (std::size_t q = 0; q < std::size_t(size()); ++q) {
      const Block b = block_of(recv.size(), std::size_t(size()), q);
      copy_on_device(static_cast<const T*>(g_->slots[q].send), recv.data() + b.offset, b.extent, stream());
    }
    phase(false);
  }
  template <mpar::detail::comm_element T>
  void reduce_scatter(std::span<const T> send, std::span<T> recv, ReduceOp op) {
    publish<T>("reduce_scatter", send.size(), 0, int(op), send.data(), recv.data(), recv.size());
    phase(true);
    refuse_op<T>("reduce_scatter", op);
    check_blocks("reduce_scatter", send.size(), [&](std::size_t q) { return g_->slots[q].count2; });
    const Block mine = block_of(send.size(), std::size_t(size()), std::size_t(rank_));
    reduce_into<T>(mine.offset, mine.extent, int(op), recv.data());
    phase(false);
  }
  template <mpar::detail::comm_element T>
  void gather(std::span<const T> send, std::span<T> recv, int root) {
    // extra = the root's recv size, known to all ranks after publishing; count2 = each rank's block.
    publish<T>("gather", 0, root, 0, send.data(), recv.data(), send.size(), /*count_matters=*/false);
    g_->slots[std::size_t(rank_)].extra = recv.size();
    phase(true);
    const std::size_t n = g_->slots[std::size_t(root)].extra;
    check_blocks("gather", n, [&](std::size_t q) { return g_->slots[q].count2; });
    if (rank_ == root)
      for (std::size_t q = 0; q < std::size_t(size()); ++q) {
        const Block b = block_of(n, std::size_t(size()), q);
        copy_on_device(static_cast<const T*>(g_->slots[q].send), recv.data() + b.offset, b.extent, stream());
      }
    phase(false);
  }
  template <mpar::detail::comm_element T>
  void scatter(std::span<const T> send, std::span<T> recv, int root) {
    publish<T>("scatter", 0, root, 0, send.data(), recv.data(), recv.size(), false);
    g_->slots[std::size_t(rank_)].extra = send.size();
    phase(true);
    const std::size_t n = g_->slots[std::size_t(root)].extra;
    check_blocks("scatter", n, [&](std::size_t q) { return g_->slots[q].count2; });
    const Block mine = block_of(n, std::size_t(size()), std::size_t(rank_));
    copy_on_device(static_cast<const T*>(g_->slots[std::size_t(root)].send) + mine.offset, recv.data(), mine.extent,
                   stream());
    phase(false);
  }
  template <mpar::detail::comm_element T>
  void all_to_all(std::span<const T> send, std::span<T> recv) {
    const std::size_t p = std::size_t(size());
    require(send.size() == recv.size() && send.size() % p == 0, where("all_to_all"), ": send (", send.size(),
            ") and recv (", recv.size(), ") must be equal and divisible by ", p);
    const std::vector<std::size_t> counts(p, send.size() / p);
    all_to_all_v(send, std::span<const std::size_t>(counts), recv, std::span<const std::size_t>(counts));
  }
  template <mpar::detail::comm_element T>
  void all_to_all_v(std::span<const T> send, std::span<const std::size_t> send_counts, std::span<T> recv,
                    std::span<const std::size_t> recv_counts) {
    const std::size_t p = std::size_t(size());
    require(send_counts.size() == p && recv_counts.size() == p, where("all_to_all_v"),
            ": count arrays must have one entry per rank (", p, ")");
    auto& me = publish<T>("all_to_all_v", 0, 0, 0, send.data(), recv.data(), 0, false);
    me.counts_send = send_counts.data();
    me.counts_recv = recv_counts.data();
    phase(true);
    for (std::size_t a = 0; a < p; ++a)  // every rank checks every pair, so all reach the same verdict
      for (std::size_t b = 0; b < p; ++b)
        if (g_->slots[a].counts_send[b] != g_->slots[b].counts_recv[a])
          fail(where("all_to_all_v") + mpar::detail::cat(": rank ", a, " sends ", g_->slots[a].counts_send[b],
                                                         " elements to rank ", b, ", which expects ",
                                                         g_->slots[b].counts_recv[a]));
    std::size_t roff = 0;
    for (std::size_t q = 0; q < p; ++q) {
      std::size_t soff = 0;
      for (std::size_t j = 0; j < std::size_t(rank_); ++j) soff += g_->slots[q].counts_send[j];
      copy_on_device(static_cast<const T*>(g_->slots[q].send) + soff, recv.data() + roff, recv_counts[q], stream());
      roff += recv_counts[q];
    }
    phase(false);
  }

  /** Eager send: the data is copied to a device staging buffer, so it returns at once. */
  template <mpar::detail::comm_element T>
  void send(std::span<const T> data, int peer, int tag) {
    check_peer("send", peer);
    detail::Posted m;
    m.count = data.size();
    m.dtype = mpar::detail::comm_dtype_name_v<T>;
    if (m.count) {
      check(cudaMallocAsync(&m.data, m.count * sizeof(T), stream()), "cudaMallocAsync(send staging)");
      copy_on_device(data.data(), static_cast<T*>(m.data), m.count, stream());
    }
    check(cudaEventCreateWithFlags(&m.ready, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(m.ready, stream()), "cudaEventRecord");
    {
      std::lock_guard lk(g_->mu);
      g_->mailbox[{rank_, peer, tag}].push_back(m);
    }
    g_->cv.notify_all();
  }
  template <mpar::detail::comm_element T>
  void recv(std::span<T> data, int peer, int tag) {
    check_peer("recv", peer);
    (void)try_recv(data, peer, tag, true);
  }
  template <mpar::detail::comm_element T>
  DeviceRequest isend(std::span<const T> data, int peer, int tag) {
    send(data, peer, tag);
    return {};
  }
  template <mpar::detail::comm_element T>
  DeviceRequest irecv(std::span<T> data, int peer, int tag) {
    check_peer("recv", peer);
    return DeviceRequest([this, data, peer, tag](bool block) { return try_recv(data, peer, tag, block); });
  }
  template <mpar::detail::comm_element T>
  DeviceRequest iall_reduce(std::span<T> data, ReduceOp op) {
    all_reduce(data, op);
    return {};
  }
  template <mpar::detail::comm_element T>
  DeviceRequest iall_gather(std::span<const T> send, std::span<T> recv) {
    all_gather(send, recv);
    return {};
  }
  template <mpar::detail::comm_element T>
  DeviceRequest ireduce_scatter(std::span<const T> send, std::span<T> recv, ReduceOp op) {
    reduce_scatter(send, recv, op);
    return {};
  }

  void barrier() {
    publish<float>("barrier", 0, 0, 0, nullptr, nullptr);
    phase(true);
    // A rank past the verifying phase may publish its next call: hold every rank until all have read the slots.
    host_barrier();
  }

  /** Ranks with equal `color` form a new group, ordered by (key, rank); collective over this group. */
  [[nodiscard]] DeviceCommunicator split(int color, int key) {
    auto& me = publish<float>("split", 0, 0, 0, nullptr, nullptr, 0, false);
    me.color = color;
    me.key = key;
    phase(true);  // every rank called split (a rank in another call makes every rank throw, naming both)
    std::vector<std::pair<int, int>> members;  // (key, rank) of my color
    for (int r = 0; r < size(); ++r)
      if (g_->slots[std::size_t(r)].color == color) members.emplace_back(g_->slots[std::size_t(r)].key, r);
    std::sort(members.begin(), members.end());
    const int leader = members.front().second;
    int new_rank = 0;
    while (members[std::size_t(new_rank)].second != rank_) ++new_rank;
    if (rank_ == leader)
      me.handoff = std::make_shared<detail::DeviceGroup>(int(members.size()), g_->device,
                                                         g_->name + "/" + std::to_string(color), g_->timeout);
    host_barrier();
    auto ng = std::static_pointer_cast<detail::DeviceGroup>(g_->slots[std::size_t(leader)].handoff);
    host_barrier();  // the leader keeps its handoff until everyone took a reference
    me.handoff.reset();
    return DeviceCommunicator(std::move(ng), new_rank);
  }

 private:
  DeviceCommunicator(std::shared_ptr<detail::DeviceGroup> g, int rank) : g_(std::move(g)), rank_(rank) {}

  [[nodiscard]] cudaStream_t stream() const {
    ThreadContext& t = this_thread();
    if (t.device() != g_->device) t.bind(g_->device);
    return t.stream();
  }
  [[nodiscard]] std::string where(const char* op) const {
    return mpar::detail::cat("gpu::DeviceCommunicator rank ", rank_, " of group '", g_->name, "' (size ", size(), "), ",
                             op, " #", seq_);
  }
  [[noreturn]] void fail(const std::string& msg) const { throw comm_error(msg); }
  /**
   * After the verifying phase, where every rank saw the same op and type: an op `T` cannot reduce (avg of
   * integers) fails on every rank.
   */
  template <class T>
  void refuse_op(const char* op, ReduceOp r) const {
    if (std::string why = mpar::detail::reduce_op_error<T>(r); !why.empty())
      fail(where(op) + mpar::detail::cat(": ", why));
  }
  void check_peer(const char* op, int peer) const {
    require(peer >= 0 && peer < size(), where(op), ": peer ", peer, " is outside the group");
  }

  /** Publishes this rank's arguments; `count_matters` says whether `count` must agree on every rank. */
  template <class T>
  detail::Slot& publish(const char* op, std::size_t count, int root, int reduce, const void* send, void* recv,
                        std::size_t count2 = 0, bool count_matters = true) {
    ++seq_;
    require(root >= 0 && root < size(), where(op), ": root ", root, " is outside the group");
    detail::Slot& s = g_->slots[std::size_t(rank_)];
    s.op = op;
    s.seq = seq_;
    s.dtype = mpar::detail::comm_dtype_name_v<T>;
    s.count = count_matters ? count : 0;
    s.count2 = count2;
    s.root = root;
    s.reduce = reduce;
    s.send = send;
    s.recv = recv;
    return s;
  }
  void host_barrier() { g_->barrier(rank_, g_->slots[std::size_t(rank_)].op, seq_); }

  /**
   * Record, meet, wait for every peer's stream. With `verify`, first compares every rank's published
   * arguments; every rank sees the same slots, so every rank throws the same comm_error.
   */
  void phase(bool verify) {
    detail::Slot& me = g_->slots[std::size_t(rank_)];
    const unsigned parity = me.phase++ & 1u;
    check(cudaEventRecord(me.ev[parity], stream()), "cudaEventRecord");
    host_barrier();
    if (verify) {
      const detail::Slot& s0 = g_->slots[0];
      for (int r = 1; r < size(); ++r) {
        const detail::Slot& s = g_->slots[std::size_t(r)];
        if (std::string_view(s.op) != s0.op || s.dtype != s0.dtype || s.count != s0.count || s.root != s0.root ||
            s.reduce != s0.reduce)
          fail(where(me.op) + mpar::detail::cat(": ranks disagree: rank 0 called ", s0.op, "<", s0.dtype, ">(count ",
                                                s0.count, ", root ", s0.root, ", op ", s0.reduce, "), rank ", r,
                                                " called ", s.op, "<", s.dtype, ">(count ", s.count, ", root ", s.root,
                                                ", op ", s.reduce, ")"));
      }
    }
    for (int r = 0; r < size(); ++r)
      if (r != rank_)
        check(cudaStreamWaitEvent(stream(), g_->slots[std::size_t(r)].ev[parity], 0), "cudaStreamWaitEvent");
  }
  template <class F>
  void check_blocks(const char* op, std::size_t n, F&& local_of) const {
    for (std::size_t q = 0; q < std::size_t(size()); ++q) {
      const Block b = block_of(n, std::size_t(size()), q);
      if (local_of(q) != b.extent)
        fail(where(op) + mpar::detail::cat(": rank ", q, " passes a block of ", local_of(q),
                                           " elements; the block rule for ", n, " elements over ", size(),
                                           " ranks gives ", b.extent));
    }
  }
  /** out[0, count) = reduction over all ranks' `send` at [offset, offset + count). */
  template <class T>
  void reduce_into(std::size_t offset, std::size_t count, int op, T* out) {
    if (count == 0) return;
    detail::PeerPointers<T> src{};
    for (int q = 0; q < size(); ++q) src.p[q] = static_cast<const T*>(g_->slots[std::size_t(q)].send);
    const std::size_t blocks = std::min<std::size_t>((count + 255) / 256, 4096);
    MPAR_LAUNCH(detail::reduce_peers_kernel, unsigned(blocks), 256, 0, stream(), src, size(), offset, count, op, out);
    check_launch("gpu::DeviceCommunicator reduction");
  }
  template <class T>
  bool try_recv(std::span<T> data, int peer, int tag, bool block) {
    detail::Posted m;
    {
      std::unique_lock lk(g_->mu);
      auto& q = g_->mailbox[{peer, rank_, tag}];
      auto ready = [&] { return !q.empty() || g_->broken; };
      if (!block && !ready()) return false;
      if (!g_->cv.wait_for(lk, g_->timeout, ready)) {
        lk.unlock();
        const std::string msg = where("recv") + mpar::detail::cat(": no message from rank ", peer, " with tag ", tag,
                                                                  " within ", g_->timeout.count(), " ms");
        g_->mark_broken(msg);
        fail(msg);
      }
      if (g_->broken) fail(g_->why);
      m = q.front();
      q.pop_front();
    }
    check(cudaStreamWaitEvent(stream(), m.ready, 0), "cudaStreamWaitEvent");
    (void)cudaEventDestroy(m.ready);  // released once the wait above has been satisfied
    if (m.count != data.size() || m.dtype != mpar::detail::comm_dtype_name_v<T>) {
      if (m.data) (void)cudaFreeAsync(m.data, stream());
      fail(where("recv") + mpar::detail::cat(": rank ", peer, " sent ", m.count, " ", m.dtype, " elements with tag ",
                                             tag, ", this rank expects ", data.size(), " ",
                                             mpar::detail::comm_dtype_name_v<T>));
    }
    if (m.count) {
      copy_on_device(static_cast<const T*>(m.data), data.data(), m.count, stream());
      check(cudaFreeAsync(m.data, stream()), "cudaFreeAsync(send staging)");
    }
    return true;
  }

  std::shared_ptr<detail::DeviceGroup> g_;
  int rank_ = 0;
  std::uint64_t seq_ = 0;
};

static_assert(communicator<DeviceCommunicator>);

}  // namespace mpar::gpu
