#pragma once
/**
 * @file OrderedP2pCommunicator: NCCL's point-to-point semantics on any tag-matching communicator, so
 * that code written for NCCL is tested on CPU threads or MPI processes.
 *
 * NCCL differs from MPI and the threads communicator in three ways that decide whether a program
 * deadlocks, and this adaptor reproduces all three:
 * 1. no tags: the k-th send from rank a to rank b meets the k-th receive on b from a;
 * 2. groups: posted sends and receives are issued together at the next wait, test or collective,
 *    and the group completes as a whole (waiting for any request waits for the whole group); the
 *    next group or collective starts only after it, as on NCCL's stream;
 * 3. rendezvous: a message completes only when both of its ends are issued; nothing is buffered.
 * A program that runs over `OrderedP2pCommunicator<ThreadsCommunicator>` therefore runs over
 * `NcclCommunicator` as far as the ordering of messages is concerned; one that would deadlock on
 * NCCL stops here with the inner communicator's timeout error instead of hanging.
 */
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mpar/comm/communicator.hpp"
#include "mpar/comm/detail/comm_element.hpp"
#include "mpar/comm/host_memory_communicator.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/memory_resource.hpp"

namespace mpar {

namespace detail {

/** One group of posted point-to-point operations and, once issued, the inner requests it became. */
template <class InnerRequest>
struct P2pGroup {
  std::vector<std::function<void(P2pGroup&)>> post;  ///< each posts its inner operations at issue
  std::vector<InnerRequest> requests;
  Buffer<float> tokens;  ///< one rendezvous token per operation (see OrderedP2pCommunicator::isend)
  bool issued = false, complete = false;
};

}  // namespace detail

/**
 * @brief Wraps a tag-matching communicator `Comm` and gives its point-to-point calls NCCL's
 * semantics (see the file comment); collectives are forwarded after the pending group completes.
 * Copies share one state (and one inner communicator), as copies of a communicator share one group.
 */
template <communicator Comm>
class OrderedP2pCommunicator {
  using InnerRequest = decltype(std::declval<Comm&>().irecv(std::span<float>{}, 0, 0));

 public:
  static constexpr bool moves_host_memory = host_memory_communicator<Comm>;

 private:
  using Group = detail::P2pGroup<InnerRequest>;

  struct State {
    Comm inner;
    std::shared_ptr<Group> open;                ///< posted, not yet issued
    std::shared_ptr<Group> last;                ///< the most recently issued group
    std::vector<std::uint32_t> sent, received;  ///< messages to / from each peer so far (the matching order)

    /** Issues `g` (the open group) once the previous group completed: groups run one after another. */
    void issue(const std::shared_ptr<Group>& g) {
      if (g->issued) return;
      if (last) complete(*last);
      g->tokens.assign(g->post.size(), 0.0f);
      g->issued = true;
      for (auto& p : g->post) p(*g);
      g->post.clear();
      last = g;
      if (open == g) open.reset();
    }
    static void complete(Group& g) {
      if (g.complete) return;
      for (auto& r : g.requests) r.wait();
      g.complete = true;
    }
    /** Issues the open group and waits for it: what a collective on NCCL's stream waits for. */
    void settle() {
      if (open) issue(open);
      if (last) complete(*last);
    }
  };

 public:
  /** @brief A posted send or receive: `wait()` issues its group if needed and waits for the whole group, as NCCL's event does. */
  class Request {
   public:
    Request(std::shared_ptr<State> st, std::shared_ptr<Group> g) : st_(std::move(st)), group_(std::move(g)) {}
    void wait() {
      st_->issue(group_);
      State::complete(*group_);
    }
    [[nodiscard]] bool test() {
      st_->issue(group_);
      for (auto& r : group_->requests)
        if (!r.test()) return false;
      State::complete(*group_);
      return true;
    }

   private:
    std::shared_ptr<State> st_;
    std::shared_ptr<Group> group_;
  };

  /** NCCL's matching rule (`ordered_point_to_point`). */
  static constexpr bool matches_in_order = true;

  explicit OrderedP2pCommunicator(Comm inner) : st_(std::make_shared<State>(State{std::move(inner), {}, {}, {}, {}})) {
    st_->sent.assign(std::size_t(size()), 0);
    st_->received.assign(std::size_t(size()), 0);
  }

  [[nodiscard]] int rank() const { return st_->inner.rank(); }
  [[nodiscard]] int size() const { return st_->inner.size(); }
  [[nodiscard]] std::string name() const { return st_->inner.name(); }
  [[nodiscard]] Comm& inner() { return st_->inner; }

  // Collectives run after every posted point-to-point operation, as on NCCL's stream.
  template <class... A>
  void all_reduce(A&&... a) {
    settled().all_reduce(std::forward<A>(a)...);
  }
  template <class... A>
  void broadcast(A&&... a) {
    settled().broadcast(std::forward<A>(a)...);
  }
  template <class... A>
  void reduce(A&&... a) {
    settled().reduce(std::forward<A>(a)...);
  }
  template <class... A>
  void all_gather(A&&... a) {
    settled().all_gather(std::forward<A>(a)...);
  }
  template <class... A>
  void reduce_scatter(A&&... a) {
    settled().reduce_scatter(std::forward<A>(a)...);
  }
  template <class... A>
  void gather(A&&... a) {
    settled().gather(std::forward<A>(a)...);
  }
  template <class... A>
  void scatter(A&&... a) {
    settled().scatter(std::forward<A>(a)...);
  }
  template <class... A>
  void all_to_all(A&&... a) {
    settled().all_to_all(std::forward<A>(a)...);
  }
  template <class... A>
  void all_to_all_v(A&&... a) {
    settled().all_to_all_v(std::forward<A>(a)...);
  }
  void barrier() { settled().barrier(); }
  template <class... A>
  auto iall_reduce(A&&... a) {
    return settled().iall_reduce(std::forward<A>(a)...);
  }
  template <class... A>
  auto iall_gather(A&&... a) {
    return settled().iall_gather(std::forward<A>(a)...);
  }
  template <class... A>
  auto ireduce_scatter(A&&... a) {
    return settled().ireduce_scatter(std::forward<A>(a)...);
  }

  /**
   * Posts a send (issued with its group). The tag is ignored, as NCCL has none: the message pairs
   * with the receive of the same sequence number on the peer. Rendezvous: the send completes when
   * the receiver issues that receive, which sends back a token.
   */
  template <detail::comm_element T>
  Request isend(std::span<const T> data, int peer, int /*tag*/) {
    check_peer("send", peer);
    const int tag = sequence_tag(st_->sent[std::size_t(peer)]++);
    return post([data, peer, tag](Comm& c, Group& g, std::size_t op) {
      g.requests.push_back(c.isend(data, peer, tag));
      g.requests.push_back(c.irecv(std::span<float>(g.tokens.data() + op, 1), peer, tag + 1));
    });
  }
  template <detail::comm_element T>
  Request irecv(std::span<T> data, int peer, int /*tag*/) {
    check_peer("recv", peer);
    const int tag = sequence_tag(st_->received[std::size_t(peer)]++);
    return post([data, peer, tag](Comm& c, Group& g, std::size_t op) {
      g.requests.push_back(c.irecv(data, peer, tag));
      g.requests.push_back(c.isend(std::span<const float>(g.tokens.data() + op, 1), peer, tag + 1));
    });
  }
  template <detail::comm_element T>
  void send(std::span<const T> data, int peer, int tag) {
    isend(data, peer, tag).wait();
  }
  template <detail::comm_element T>
  void recv(std::span<T> data, int peer, int tag) {
    irecv(data, peer, tag).wait();
  }

  [[nodiscard]] OrderedP2pCommunicator split(int color, int key) {
    return OrderedP2pCommunicator(settled().split(color, key));
  }

 private:
  /** Inner tags: even for data, odd for its rendezvous token; sequence numbers wrap far beyond any backlog. */
  static int sequence_tag(std::uint32_t seq) { return int(seq % 16384u) * 2; }

  void check_peer(const char* op, int peer) const {
    require(peer >= 0 && peer < size(), "OrderedP2pCommunicator: rank ", rank(), " of group '", name(), "': ", op,
            " with rank ", peer, ", outside the group of ", size());
  }

  template <class PostInner>
  Request post(PostInner&& post_inner) {
    if (!st_->open) st_->open = std::make_shared<Group>();
    Group& g = *st_->open;
    const std::size_t op = g.post.size();
    g.post.emplace_back(
        [f = std::forward<PostInner>(post_inner), op, st = st_.get()](Group& grp) { f(st->inner, grp, op); });
    return Request(st_, st_->open);
  }

  /** The inner communicator, once every posted point-to-point operation completed. */
  Comm& settled() {
    st_->settle();
    return st_->inner;
  }

  std::shared_ptr<State> st_;
};

}  // namespace mpar
