#pragma once
/**
 * @file ThreadsCommunicator: a rank of a group of threads; collectives in shared memory, eager point to point.
 */
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mpar/comm/communicator.hpp"
#include "mpar/comm/detail/collective_check.hpp"
#include "mpar/comm/detail/reduce.hpp"
#include "mpar/comm/threads/group.hpp"
#include "mpar/comm/threads/progress_thread.hpp"
#include "mpar/comm/threads/request.hpp"
#include "mpar/comm/threads/threads_options.hpp"
#include "mpar/comm/threads/world.hpp"
#include "mpar/core/layout.hpp"

namespace mpar {

/**
 * @brief A rank of a group of threads; satisfies `communicator`.
 *
 * Copies share the same rank state (sequence numbers, progress thread), so a communicator can be
 * held by value in several layers. Obtain one from `run_threads` (or `single()`), and
 * sub-communicators from `split`.
 *
 * A class template over the `Group` of ranks and the `Derived` communicator class it makes (split, single):
 * a non-template class's inline bodies, and every standard template they use, are compiled by each file that
 * includes `mpar/mpar.hpp`; a template's only by the programs that run threads (docs/performance.md,
 * "Compile cost of the umbrella header"). `ThreadsCommunicator` below is the class the library uses; a class
 * rather than an alias so that diagnostics keep naming it.
 */
template <class Derived, class Group>
class BasicThreadsCommunicator {
 public:
  using request_type = BasicThreadsRequest<Group>;

  BasicThreadsCommunicator(std::shared_ptr<Group> group, int rank)
      : st_(std::make_shared<State>(std::move(group), rank)) {}

  /** A one-rank world, for serial code paths and tests. */
  [[nodiscard]] static Derived single(const ThreadsOptions& opts = {}) {
    auto world = std::make_shared<typename Group::world_type>(1, opts.timeout, opts.spin);
    return Derived(Group::create(world, opts.name, {0}), 0);
  }

  [[nodiscard]] int rank() const { return st_->rank; }
  [[nodiscard]] int size() const { return st_->group->size(); }
  [[nodiscard]] std::string name() const { return st_->group->name(); }
  /** This rank's index in the `run_threads` world. */
  [[nodiscard]] int world_rank() const { return st_->group->world_rank(st_->rank); }
  /** The number of collectives this rank has issued on this group (the next one is `seq() + 1`). */
  [[nodiscard]] std::uint64_t seq() const { return st_->seq; }

  // ---- blocking collectives ------------------------------------------------------------------

  /** In place: every rank ends with op over all ranks' `data`. */
  template <detail::comm_element T>
  void all_reduce(std::span<T> data, ReduceOp op) {
    drain();
    all_reduce_impl(data, op);
  }
  /** In place: every rank ends with root's `data`. */
  template <detail::comm_element T>
  void broadcast(std::span<T> data, int root) {
    drain();
    auto& s = st_->begin(fp<T>(detail::CollKind::broadcast, data.size(), -1, root));
    s.dst = data.data();
    auto& g = *st_->group;
    collective([&] {
      if (rank() != root && !data.empty()) std::memcpy(data.data(), g.slot(root).dst, data.size_bytes());
    });
  }
  /** `recv` (root only, size = send.size()) receives op over all ranks' `send`. */
  template <detail::comm_element T>
  void reduce(in_span<T> send, std::span<T> recv, ReduceOp op, int root) {
    drain();
    auto& s = st_->begin(fp<T>(detail::CollKind::reduce, send.size(), int(op), root));
    s.src = send.data();
    s.dst = recv.data();
    if (rank() == root && recv.size() != send.size())
      s.error =
          detail::cat("rank ", rank(), " (root) passed recv of ", recv.size(), " elements, expected ", send.size());
    refuse_op<T>(s, op);
    auto& g = *st_->group;
    collective([&] {
      // Every rank reduces its own block into root's recv: the work is spread as in all_reduce.
      const Block b = block_of(send.size(), std::size_t(size()), std::size_t(rank()));
      if (b.extent == 0) return;
      auto srcs = peer_ptrs<T>([&](int q) { return static_cast<const T*>(g.slot(q).src) + b.offset; });
      detail::reduce_into(static_cast<T*>(g.slot(root).dst) + b.offset, srcs.data(), srcs.size(), b.extent, op,
                          std::size_t(size()));
    });
  }
  /** recv.size() = n; rank r contributes block_of(n, p, r). `send` may be that block of `recv`. */
  template <detail::comm_element T>
  void all_gather(in_span<T> send, std::span<T> recv) {
    drain();
    all_gather_impl(send, recv);
  }
  /** send.size() = n; rank r receives block_of(n, p, r), reduced with op. */
  template <detail::comm_element T>
  void reduce_scatter(in_span<T> send, std::span<T> recv, ReduceOp op) {
    drain();
    reduce_scatter_impl(send, recv, op);
  }
  /** recv (root only) has n elements; rank r contributes block_of(n, p, r). */
  template <detail::comm_element T>
  void gather(in_span<T> send, std::span<T> recv, int root) {
    drain();
    auto& s = st_->begin(fp<T>(detail::CollKind::gather, 0, -1, root));
    s.src = send.data();
    s.src_count = send.size();
    s.dst = recv.data();
    s.dst_count = recv.size();
    auto& g = *st_->group;
    collective(
        [&] {
          const Block b = block_of(g.slot(root).dst_count, std::size_t(size()), std::size_t(rank()));
          if (b.extent) std::memcpy(static_cast<T*>(g.slot(root).dst) + b.offset, send.data(), b.extent * sizeof(T));
        },
        [&]() -> std::string { return check_blocks("send", root, [&](int q) { return g.slot(q).src_count; }); });
  }
  /** send (root only) has n elements; rank r receives block_of(n, p, r). */
  template <detail::comm_element T>
  void scatter(in_span<T> send, std::span<T> recv, int root) {
    drain();
    auto& s = st_->begin(fp<T>(detail::CollKind::scatter, 0, -1, root));
    s.src = send.data();
    s.src_count = send.size();
    s.dst_count = recv.size();
    auto& g = *st_->group;
    collective(
        [&] {
          const Block b = block_of(g.slot(root).src_count, std::size_t(size()), std::size_t(rank()));
          if (b.extent)
            std::memcpy(recv.data(), static_cast<const T*>(g.slot(root).src) + b.offset, b.extent * sizeof(T));
        },
        [&]() -> std::string { return check_blocks("recv", root, [&](int q) { return g.slot(q).dst_count; }); });
  }
  /** Equal blocks: send.size() = recv.size() = p*b; recv block q on rank r = send block r of rank q. */
  template <detail::comm_element T>
  void all_to_all(in_span<T> send, std::span<T> recv) {
    drain();
    auto& s = st_->begin(fp<T>(detail::CollKind::all_to_all, send.size(), -1, -1));
    s.src = send.data();
    const auto p = std::size_t(size());
    if (recv.size() != send.size() || send.size() % p != 0)
      s.error = detail::cat("rank ", rank(), " passed send of ", send.size(), " and recv of ", recv.size(),
                            " elements; both must be equal and divisible by the group size ", p);
    auto& g = *st_->group;
    collective([&] {
      const std::size_t b = send.size() / p;
      if (b == 0) return;
      for (int q = 0; q < size(); ++q)
        std::memcpy(recv.data() + std::size_t(q) * b, static_cast<const T*>(g.slot(q).src) + std::size_t(rank()) * b,
                    b * sizeof(T));
    });
  }
  /**
   * Variable blocks: rank r sends send_counts[q] elements to q and receives recv_counts[q] from q,
   * packed in rank order.
   */
  template <detail::comm_element T>
  void all_to_all_v(in_span<T> send, std::span<const std::size_t> send_counts, std::span<T> recv,
                    std::span<const std::size_t> recv_counts) {
    drain();
    auto& s = st_->begin(fp<T>(detail::CollKind::all_to_all_v, 0, -1, -1));
    const auto p = std::size_t(size());
    s.src = send.data();
    s.counts_a = send_counts.data();
    s.counts_b = recv_counts.data();
    if (send_counts.size() != p || recv_counts.size() != p)
      s.error = detail::cat("rank ", rank(), " passed ", send_counts.size(), " send counts and ", recv_counts.size(),
                            " recv counts; the group has ", p, " ranks");
    else if (std::reduce(send_counts.begin(), send_counts.end(), std::size_t(0)) > send.size() ||
             std::reduce(recv_counts.begin(), recv_counts.end(), std::size_t(0)) > recv.size())
      s.error = detail::cat("rank ", rank(), ": the counts exceed the buffers (send ", send.size(), ", recv ",
                            recv.size(), " elements)");
    auto& g = *st_->group;
    collective(
        [&] {
          std::size_t roff = 0;
          for (int q = 0; q < size(); ++q) {
            const std::size_t* sc = g.slot(q).counts_a;
            const std::size_t soff = std::accumulate(sc, sc + rank(), std::size_t(0));
            const std::size_t c = recv_counts[std::size_t(q)];
            if (c) std::memcpy(recv.data() + roff, static_cast<const T*>(g.slot(q).src) + soff, c * sizeof(T));
            roff += c;
          }
        },
        [&]() -> std::string {
          for (int q = 0; q < size(); ++q)
            for (int r = 0; r < size(); ++r)
              if (g.slot(q).counts_a[r] != g.slot(r).counts_b[q])
                return detail::cat("rank ", q, " sends ", g.slot(q).counts_a[r], " elements to rank ", r, " but rank ",
                                   r, " expects ", g.slot(r).counts_b[q]);
          return {};
        });
  }
  void barrier() {
    drain();
    st_->begin(detail::Fingerprint{detail::CollKind::barrier});
    collective([] {});
  }

  // ---- point to point --------------------------------------------------------------------------

  /**
   * Eager: copies `data` straight into the receiver's buffer when its receive is already posted,
   * otherwise into the receiver's mailbox, and returns; two ranks sending to each other first
   * never deadlock.
   */
  template <detail::comm_element T>
  void send(std::span<const T> data, int peer, int tag) {
    check_peer("send", peer);
    auto& mb = st_->group->mailbox(peer);
    {
      std::lock_guard l(mb.m);
      for (auto it = mb.posted.begin(); it != mb.posted.end(); ++it) {
        auto& pr = **it;
        if (pr.src != rank() || pr.tag != tag) continue;
        if (pr.dtype != detail::dtype_code_v<T> || pr.count != data.size())
          pr.error = mismatch_message(pr, peer, detail::dtype_code_v<T>, data.size());
        else if (!data.empty())
          std::memcpy(pr.dst, data.data(), data.size_bytes());
        pr.done = true;
        mb.posted.erase(it);
        mb.cv.notify_all();
        return;
      }
      detail::Message msg{rank(), tag, detail::dtype_code_v<T>, data.size(), std::vector<std::byte>(data.size_bytes())};
      if (!data.empty()) std::memcpy(msg.data.data(), data.data(), data.size_bytes());
      mb.unexpected.push_back(std::move(msg));
    }
    mb.cv.notify_all();
  }
  template <detail::comm_element T>
  void send(std::span<T> data, int peer, int tag) {
    send(std::span<const T>(data), peer, tag);
  }
  /** Blocks until the message with `tag` from `peer` arrived; its element type and count must match. */
  template <detail::comm_element T>
  void recv(std::span<T> data, int peer, int tag) {
    irecv(data, peer, tag).wait();
  }
  /** Completes at once (see send). */
  template <detail::comm_element T>
  [[nodiscard]] request_type isend(std::span<const T> data, int peer, int tag) {
    send(data, peer, tag);
    return {};
  }
  template <detail::comm_element T>
  [[nodiscard]] request_type isend(std::span<T> data, int peer, int tag) {
    return isend(std::span<const T>(data), peer, tag);
  }
  template <detail::comm_element T>
  [[nodiscard]] request_type irecv(std::span<T> data, int peer, int tag) {
    check_peer("recv", peer);
    request_type req;
    auto& mb = st_->group->mailbox(rank());
    const std::uint64_t seq = ++st_->p2p_seq;
    std::lock_guard l(mb.m);
    for (auto it = mb.unexpected.begin(); it != mb.unexpected.end(); ++it) {
      if (it->src != peer || it->tag != tag) continue;
      if (it->dtype != detail::dtype_code_v<T> || it->count != data.size()) {
        detail::PostedRecv pr{data.data(), data.size(), detail::dtype_code_v<T>, peer, tag, seq};
        req.error_ = mismatch_message(pr, rank(), it->dtype, it->count);
      } else if (!data.empty()) {
        std::memcpy(data.data(), it->data.data(), data.size_bytes());
      }
      mb.unexpected.erase(it);
      return req;
    }
    req.recv_ = std::make_shared<detail::PostedRecv>(
        detail::PostedRecv{data.data(), data.size(), detail::dtype_code_v<T>, peer, tag, seq});
    req.group_ = st_->group;
    req.rank_ = rank();
    mb.posted.push_back(req.recv_);
    return req;
  }

  // ---- asynchronous collectives (run on this rank's progress thread, in issue order) ------------

  template <detail::comm_element T>
  [[nodiscard]] request_type iall_reduce(std::span<T> data, ReduceOp op) {
    return submit([data, op](BasicThreadsCommunicator& c) { c.all_reduce_impl(data, op); });
  }
  template <detail::comm_element T>
  [[nodiscard]] request_type iall_gather(in_span<T> send, std::span<T> recv) {
    return submit([send, recv](BasicThreadsCommunicator& c) { c.all_gather_impl(send, recv); });
  }
  template <detail::comm_element T>
  [[nodiscard]] request_type ireduce_scatter(in_span<T> send, std::span<T> recv, ReduceOp op) {
    return submit([send, recv, op](BasicThreadsCommunicator& c) { c.reduce_scatter_impl(send, recv, op); });
  }

  // ---- groups ----------------------------------------------------------------------------------

  /** The ranks with equal `color` (>= 0), ordered by (key, rank); named "<parent>.<color>". */
  [[nodiscard]] Derived split(int color, int key) { return split(color, key, {}); }
  /** As split(color, key), with the new group's name for error messages ("tensor", "data", ...). */
  [[nodiscard]] Derived split(int color, int key, std::string name) {
    drain();
    auto& s = st_->begin(detail::Fingerprint{detail::CollKind::split});
    s.color = color;
    s.key = key;
    if (color < 0) s.error = detail::cat("rank ", rank(), " passed color ", color, "; colors must be >= 0");
    auto& g = *st_->group;
    std::vector<int> members;
    auto me = [&] { return int(std::find(members.begin(), members.end(), rank()) - members.begin()); };
    // Phase 1: agree on the members; the lowest rank of each color creates the group.
    run_phase_checked([] { return std::string{}; });
    for (int q = 0; q < size(); ++q)
      if (g.slot(q).color == color) members.push_back(q);
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return g.slot(a).key < g.slot(b).key; });
    const int leader = *std::min_element(members.begin(), members.end());
    if (leader == rank()) {
      std::vector<int> world_ranks;
      for (int q : members) world_ranks.push_back(g.world_rank(q));
      g.slot(rank()).new_group = Group::create(
          g.world_ptr(), name.empty() ? detail::cat(g.name(), ".", color) : std::move(name), std::move(world_ranks));
    }
    g.arrive_and_wait(rank(), "split", st_->seq);
    Derived sub(std::static_pointer_cast<Group>(g.slot(leader).new_group), me());
    g.arrive_and_wait(rank(), "split", st_->seq);
    g.slot(rank()).new_group.reset();
    return sub;
  }

 private:
  struct State {
    State(std::shared_ptr<Group> g, int r) : group(std::move(g)), rank(r) {}
    /** Starts a collective: bumps the sequence number and publishes its fingerprint. */
    detail::Slot& begin(detail::Fingerprint f) {
      f.seq = ++seq;
      auto& s = group->slot(rank);
      s = detail::Slot{};
      s.fp = f;
      return s;
    }
    std::shared_ptr<Group> group;
    int rank;
    std::uint64_t seq = 0;
    std::uint64_t p2p_seq = 0;
    detail::ProgressThread progress;  // last: joined before the rest is destroyed
  };

  explicit BasicThreadsCommunicator(std::shared_ptr<State> st) : st_(std::move(st)) {}

  template <class T>
  static detail::Fingerprint fp(detail::CollKind k, std::size_t count, int op, int root) {
    return {k, detail::dtype_code_v<T>, std::int8_t(op), root, count, 0};
  }

  void drain() { st_->progress.drain(); }

  /** An op the element type cannot reduce (avg of integers) fails the collective on every rank, as bad arguments do. */
  template <class T>
  void refuse_op(detail::Slot& s, ReduceOp op) const {
    if (std::string why = detail::reduce_op_error<T>(op); !why.empty() && s.error.empty())
      s.error = detail::cat("rank ", rank(), " passed ", why);
  }

  void check_peer(std::string_view op, int peer) const {
    if (peer < 0 || peer >= size())
      throw comm_error(detail::cat(op, " on group ", name(), ": rank ", rank(), " named peer ", peer,
                                   "; the group has ranks 0..", size() - 1));
  }

  /** The receiver's error for a message whose type or count differs from its receive. */
  std::string mismatch_message(const detail::PostedRecv& pr, int receiver, std::uint8_t sent_dtype,
                               std::size_t sent_count) const {
    return detail::cat(detail::op_prefix("recv", pr.seq, name()), ": rank ", receiver, " expected ", pr.count, " ",
                       detail::dtype_name_of(pr.dtype), " from rank ", pr.src, " with tag ", pr.tag, ", but rank ",
                       pr.src, " sent ", sent_count, " ", detail::dtype_name_of(sent_dtype));
  }

  /**
   * Meets the peers, then checks every rank's fingerprint and argument errors (`extra` adds
   * cross-rank checks). Every rank reads the same slots, so all throw the same message; they
   * meet once more first so no rank overwrites its slot while a peer still reads it.
   */
  template <class Extra>
  void run_phase_checked(Extra&& extra) {
    auto& g = *st_->group;
    const auto& mine = g.slot(rank()).fp;
    const auto op = detail::coll_name(mine.kind);
    g.arrive_and_wait(rank(), op, st_->seq);
    std::string err;
    std::vector<int> bad;
    for (int q = 1; q < size(); ++q)
      if (!(g.slot(q).fp == g.slot(0).fp)) bad.push_back(q);
    if (!bad.empty()) {
      err = detail::cat(detail::op_prefix(op, st_->seq, g.name()), ": ranks called different collectives: rank 0 ",
                        detail::describe(g.slot(0).fp));
      for (int q : bad) err += detail::cat("; rank ", q, " ", detail::describe(g.slot(q).fp));
    } else {
      for (int q = 0; q < size() && err.empty(); ++q)
        if (!g.slot(q).error.empty())
          err = detail::cat(detail::op_prefix(op, st_->seq, g.name()), ": ", g.slot(q).error);
      if (err.empty())
        if (std::string x = extra(); !x.empty()) err = detail::cat(detail::op_prefix(op, st_->seq, g.name()), ": ", x);
    }
    if (!err.empty()) {
      g.set_reading(rank(), false);
      g.arrive_and_wait(rank(), op, st_->seq);
      throw comm_error(err);
    }
  }

  /** Flags this rank as reading peers' buffers from the next barrier until `end()` (or unwinding). */
  class ReadingScope {
   public:
    ReadingScope(Group& g, int rank) : g_(g), rank_(rank) { g_.set_reading(rank_, true); }
    ~ReadingScope() { end(); }
    ReadingScope(const ReadingScope&) = delete;
    ReadingScope& operator=(const ReadingScope&) = delete;
    void end() { g_.set_reading(rank_, false); }

   private:
    Group& g_;
    int rank_;
  };

  /** A checked collective whose data movement is `body`, run between two barriers. */
  template <class Body, class Extra>
  void collective(Body&& body, Extra&& extra) {
    auto& g = *st_->group;
    ReadingScope reading(g, rank());
    run_phase_checked(std::forward<Extra>(extra));
    body();
    reading.end();
    g.arrive_and_wait(rank(), detail::coll_name(g.slot(rank()).fp.kind), st_->seq);
  }
  template <class Body>
  void collective(Body&& body) {
    collective(std::forward<Body>(body), [] { return std::string{}; });
  }

  /** gather/scatter: root's count n; every rank's own count must be block_of(n, p, rank). */
  template <class CountOf>
  std::string check_blocks(std::string_view what, int root, CountOf&& count_of) {
    auto& g = *st_->group;
    const std::size_t n = (what == "send") ? g.slot(root).dst_count : g.slot(root).src_count;
    for (int q = 0; q < size(); ++q) {
      const Block b = block_of(n, std::size_t(size()), std::size_t(q));
      if (count_of(q) != b.extent)
        return detail::cat("rank ", q, " passed ", what, " of ", count_of(q), " elements, expected block_of(", n, ", ",
                           size(), ", ", q, ") = ", b.extent, " (root ", root, " has ", n, ")");
    }
    return {};
  }

  template <class T, class F>
  std::vector<const T*> peer_ptrs(F&& f) const {
    std::vector<const T*> v(static_cast<std::size_t>(size()));
    for (int q = 0; q < size(); ++q) v[std::size_t(q)] = f(q);
    return v;
  }

  template <detail::comm_element T>
  void all_reduce_impl(std::span<T> data, ReduceOp op) {
    auto& s = st_->begin(fp<T>(detail::CollKind::all_reduce, data.size(), int(op), -1));
    s.dst = data.data();
    refuse_op<T>(s, op);
    auto& g = *st_->group;
    const auto p = std::size_t(size());
    ReadingScope reading(g, rank());
    run_phase_checked([] { return std::string{}; });
    if (p == 1) return;  // sum, avg, max and min of one buffer are the buffer
    // Reduce-scatter: rank r reduces its block straight from every peer's buffer into its own.
    const Block mine = block_of(data.size(), p, std::size_t(rank()));
    if (mine.extent) {
      auto srcs = peer_ptrs<T>([&](int q) { return static_cast<const T*>(g.slot(q).dst) + mine.offset; });
      detail::reduce_into(data.data() + mine.offset, srcs.data(), p, mine.extent, op, p);
    }
    g.arrive_and_wait(rank(), "all_reduce", st_->seq);
    // All-gather: copy the other reduced blocks from their owners' buffers.
    for (int q = 0; q < size(); ++q) {
      if (q == rank()) continue;
      const Block b = block_of(data.size(), p, std::size_t(q));
      if (b.extent)
        std::memcpy(data.data() + b.offset, static_cast<const T*>(g.slot(q).dst) + b.offset, b.extent * sizeof(T));
    }
    reading.end();
    g.arrive_and_wait(rank(), "all_reduce", st_->seq);  // peers may still read our buffer until here
  }

  template <detail::comm_element T>
  void all_gather_impl(std::span<const T> send, std::span<T> recv) {
    auto& s = st_->begin(fp<T>(detail::CollKind::all_gather, recv.size(), -1, -1));
    s.src = send.data();
    const auto p = std::size_t(size());
    const Block mine = block_of(recv.size(), p, std::size_t(rank()));
    if (send.size() != mine.extent)
      s.error = detail::cat("rank ", rank(), " passed send of ", send.size(), " elements, expected block_of(",
                            recv.size(), ", ", p, ", ", rank(), ") = ", mine.extent);
    auto& g = *st_->group;
    collective([&] {
      for (int q = 0; q < size(); ++q) {
        const Block b = block_of(recv.size(), p, std::size_t(q));
        const T* src = static_cast<const T*>(g.slot(q).src);
        if (b.extent && src != recv.data() + b.offset) std::memcpy(recv.data() + b.offset, src, b.extent * sizeof(T));
      }
    });
  }

  template <detail::comm_element T>
  void reduce_scatter_impl(std::span<const T> send, std::span<T> recv, ReduceOp op) {
    auto& s = st_->begin(fp<T>(detail::CollKind::reduce_scatter, send.size(), int(op), -1));
    s.src = send.data();
    const auto p = std::size_t(size());
    const Block mine = block_of(send.size(), p, std::size_t(rank()));
    if (recv.size() != mine.extent)
      s.error = detail::cat("rank ", rank(), " passed recv of ", recv.size(), " elements, expected block_of(",
                            send.size(), ", ", p, ", ", rank(), ") = ", mine.extent);
    refuse_op<T>(s, op);
    auto& g = *st_->group;
    collective([&] {
      if (!mine.extent) return;
      auto srcs = peer_ptrs<T>([&](int q) { return static_cast<const T*>(g.slot(q).src) + mine.offset; });
      detail::reduce_into(recv.data(), srcs.data(), p, mine.extent, op, p);
    });
  }

  template <class F>
  request_type submit(F&& f) {
    request_type req;
    req.task_ = std::make_shared<detail::TaskState>();
    State* st = st_.get();
    st->progress.submit([st, f = std::forward<F>(f), task = req.task_]() mutable {
      // The task runs through a communicator sharing nothing but the raw state: holding st_
      // here would keep the state (and this thread) alive forever.
      Derived self{std::shared_ptr<State>(std::shared_ptr<State>{}, st)};
      try {
        f(self);
        task->finish({});
      } catch (const std::exception& e) {
        task->finish(*e.what() ? e.what() : "asynchronous operation failed");
      } catch (...) {
        task->finish("unknown exception in an asynchronous operation");
      }
    });
    return req;
  }

  std::shared_ptr<State> st_;
};

/** @brief The threads communicator (see BasicThreadsCommunicator). */
class ThreadsCommunicator : public BasicThreadsCommunicator<ThreadsCommunicator, detail::ThreadsGroup> {
 public:
  using BasicThreadsCommunicator::BasicThreadsCommunicator;
  /** Its collectives read and write the buffers on the host (comm/host_memory_communicator.hpp). */
  static constexpr bool moves_host_memory = true;
};

static_assert(communicator<ThreadsCommunicator>);

}  // namespace mpar
