#pragma once
// CountingCommunicator<C>: wraps any communicator and counts the collectives (and their element
// counts) issued through it, so tests can assert "exactly one all-reduce forward".
#include <cstddef>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include <mpar/comm/communicator.hpp>

namespace mpar::testing {

struct CollectiveCounts {
  std::map<std::string, std::size_t> calls, elements;
  void add(const std::string& op, std::size_t n) {
    ++calls[op];
    elements[op] += n;
  }
  [[nodiscard]] std::size_t total_calls() const {
    std::size_t t = 0;
    for (const auto& [k, v] : calls) t += v;
    return t;
  }
  [[nodiscard]] std::size_t count(const std::string& op) const {
    auto it = calls.find(op);
    return it == calls.end() ? 0 : it->second;
  }
  [[nodiscard]] std::size_t volume(const std::string& op) const {
    auto it = elements.find(op);
    return it == elements.end() ? 0 : it->second;
  }
  void reset() { calls.clear(), elements.clear(); }
};

/** Forwards every call to the wrapped communicator, counting it first. */
template <communicator C>
class CountingCommunicator {
 public:
  explicit CountingCommunicator(C inner) : inner_(std::move(inner)), counts_(std::make_shared<CollectiveCounts>()) {}

  [[nodiscard]] int rank() const { return inner_.rank(); }
  [[nodiscard]] int size() const { return inner_.size(); }
  [[nodiscard]] std::string name() const { return inner_.name(); }
  [[nodiscard]] CollectiveCounts& counts() { return *counts_; }

  template <class T>
  void all_reduce(std::span<T> d, ReduceOp op) {
    counts_->add("all_reduce", d.size()), inner_.all_reduce(d, op);
  }
  template <class T>
  void broadcast(std::span<T> d, int root) {
    counts_->add("broadcast", d.size()), inner_.broadcast(d, root);
  }
  template <class T>
  void reduce(std::span<const T> s, std::span<T> r, ReduceOp op, int root) {
    counts_->add("reduce", s.size()), inner_.reduce(s, r, op, root);
  }
  template <class T>
  void all_gather(std::span<const T> s, std::span<T> r) {
    counts_->add("all_gather", r.size()), inner_.all_gather(s, r);
  }
  template <class T>
  void reduce_scatter(std::span<const T> s, std::span<T> r, ReduceOp op) {
    counts_->add("reduce_scatter", s.size()), inner_.reduce_scatter(s, r, op);
  }
  template <class T>
  void gather(std::span<const T> s, std::span<T> r, int root) {
    counts_->add("gather", s.size()), inner_.gather(s, r, root);
  }
  template <class T>
  void scatter(std::span<const T> s, std::span<T> r, int root) {
    counts_->add("scatter", r.size()), inner_.scatter(s, r, root);
  }
  template <class T>
  void all_to_all(std::span<const T> s, std::span<T> r) {
    counts_->add("all_to_all", s.size()), inner_.all_to_all(s, r);
  }
  template <class T>
  void all_to_all_v(std::span<const T> s, std::span<const std::size_t> sc, std::span<T> r,
                    std::span<const std::size_t> rc) {
    counts_->add("all_to_all_v", s.size()), inner_.all_to_all_v(s, sc, r, rc);
  }
  template <class T>
  void send(std::span<const T> d, int peer, int tag) {
    counts_->add("send", d.size()), inner_.send(d, peer, tag);
  }
  template <class T>
  void recv(std::span<T> d, int peer, int tag) {
    counts_->add("recv", d.size()), inner_.recv(d, peer, tag);
  }
  void barrier() { counts_->add("barrier", 0), inner_.barrier(); }
  template <class T>
  auto iall_reduce(std::span<T> d, ReduceOp op) {
    return counts_->add("all_reduce", d.size()), inner_.iall_reduce(d, op);
  }
  template <class T>
  auto iall_gather(std::span<const T> s, std::span<T> r) {
    return counts_->add("all_gather", r.size()), inner_.iall_gather(s, r);
  }
  template <class T>
  auto ireduce_scatter(std::span<const T> s, std::span<T> r, ReduceOp op) {
    return counts_->add("reduce_scatter", s.size()), inner_.ireduce_scatter(s, r, op);
  }
  template <class T>
  auto isend(std::span<const T> d, int peer, int tag) {
    return counts_->add("send", d.size()), inner_.isend(d, peer, tag);
  }
  template <class T>
  auto irecv(std::span<T> d, int peer, int tag) {
    return counts_->add("recv", d.size()), inner_.irecv(d, peer, tag);
  }
  CountingCommunicator split(int color, int key) { return CountingCommunicator(inner_.split(color, key)); }

 private:
  C inner_;
  std::shared_ptr<CollectiveCounts> counts_;
};

}  // namespace mpar::testing
