#pragma once
/** @file HierarchicalAllReduce: a two-level all-reduce over node-local and cross-node communicators. */
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mpar/comm/communicator.hpp"
#include "mpar/comm/detail/comm_element.hpp"
#include "mpar/core/error.hpp"

namespace mpar {

/**
 * @brief All-reduce in three steps that keep most traffic on the fast links inside a node:
 * reduce-scatter inside the node, all-reduce of each block across nodes (1/L of the data per
 * rank, L ranks per node), all-gather inside the node.
 *
 * `local` holds the ranks of this node; `cross` the ranks with the same local rank on every node.
 * Every node must have the same number of ranks (so `avg` of averages is the global average).
 * 16-bit types are rounded once per level (twice in all); float and double results equal a flat
 * all-reduce up to summation order.
 */
template <communicator Comm>
class HierarchicalAllReduce {
 public:
  HierarchicalAllReduce(Comm local, Comm cross) : local_(std::move(local)), cross_(std::move(cross)) {}

  /**
   * Splits `world` (collective) into nodes of `ranks_per_node` consecutive ranks, as launchers
   * number ranks node by node.
   */
  [[nodiscard]] static HierarchicalAllReduce from_world(Comm& world, int ranks_per_node) {
    require(ranks_per_node >= 1 && world.size() % ranks_per_node == 0, "HierarchicalAllReduce: ", world.size(),
            " ranks do not split into nodes of ", ranks_per_node);
    Comm local = split_named(world, world.rank() / ranks_per_node, world.rank(), "node");
    Comm cross = split_named(world, world.rank() % ranks_per_node, world.rank(), "cross_node");
    return HierarchicalAllReduce(std::move(local), std::move(cross));
  }

  [[nodiscard]] int rank() const { return cross_.rank() * local_.size() + local_.rank(); }
  [[nodiscard]] int size() const { return local_.size() * cross_.size(); }
  [[nodiscard]] Comm& local() { return local_; }
  [[nodiscard]] Comm& cross() { return cross_; }

  /** In place, like `communicator::all_reduce`. */
  template <detail::comm_element T>
  void all_reduce(std::span<T> data, ReduceOp op) {
    const auto L = std::size_t(local_.size());
    const Block b = block_of(data.size(), L, std::size_t(local_.rank()));
    block_.resize(b.extent * sizeof(T));
    std::span<T> mine(reinterpret_cast<T*>(block_.data()), b.extent);
    local_.reduce_scatter(std::span<const T>(data), mine, op);
    cross_.all_reduce(mine, op);
    local_.all_gather(std::span<const T>(mine), data);
  }

 private:
  template <class C>
  static C split_named(C& c, int color, int key, const char* name) {
    if constexpr (requires { c.split(color, key, std::string(name)); })
      return c.split(color, key, std::string(name));
    else
      return c.split(color, key);
  }
  Comm local_, cross_;
  std::vector<std::byte> block_;  // this rank's reduced block between the steps, reused across calls
};

}  // namespace mpar
