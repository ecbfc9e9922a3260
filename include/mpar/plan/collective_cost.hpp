#pragma once
/**
 * @file An alpha-beta model of collectives: time = hops * latency + bytes on the slowest link / its
 * bandwidth, for ring, tree and hierarchical (intra-node, then inter-node) algorithms, with separate
 * intra-node and inter-node links.
 */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string_view>

#include "mpar/core/error.hpp"

namespace mpar::plan {

/** @brief A link class: achievable bandwidth (bytes/s, per direction, per GPU) and per-message latency (s). */
struct Link {
  double bandwidth = 0;
  double latency = 0;
};

/** @brief The two link classes a collective can cross. `inter` is one GPU's share of its node's NICs. */
struct Network {
  Link intra, inter;
};

/**
 * @brief Which collective. Volumes follow nccl-tests: all-reduce moves 2(n-1)/n of the buffer per rank, the others
 * (n-1)/n. For all-to-all the buffer is what one rank sends in all (n blocks, one per rank, its own staying home).
 */
enum class Collective { all_reduce, reduce_scatter, all_gather, broadcast, all_to_all };
/** @brief Collective algorithm: ring, (double binary) tree, or hierarchical (intra-node reduce-scatter, inter-node, intra-node all-gather). */
enum class Algorithm { ring, tree, hierarchical };

[[nodiscard]] constexpr std::string_view algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::ring:
      return "ring";
    case Algorithm::tree:
      return "tree";
    case Algorithm::hierarchical:
      return "hierarchical";
  }
  return "?";
}
[[nodiscard]] constexpr std::string_view collective_name(Collective c) {
  switch (c) {
    case Collective::all_reduce:
      return "all_reduce";
    case Collective::reduce_scatter:
      return "reduce_scatter";
    case Collective::all_gather:
      return "all_gather";
    case Collective::broadcast:
      return "broadcast";
    case Collective::all_to_all:
      return "all_to_all";
  }
  return "?";
}

/**
 * @brief Where a group's ranks sit: `ranks` in total on `nodes` nodes, the same number on each.
 * A group inside one node has nodes = 1.
 */
struct GroupShape {
  std::size_t ranks = 1, nodes = 1;
  [[nodiscard]] constexpr std::size_t per_node() const { return ranks / nodes; }
};

/** @brief A predicted collective time and the algorithm that achieves it. */
struct CollectiveTime {
  double seconds = 0;
  Algorithm algorithm = Algorithm::ring;
};

namespace detail {
/** Bandwidth of a ring through `g`: inside a node the NVLink; across nodes each of the per_node rings (NCCL channels) owns one NIC. */
[[nodiscard]] constexpr Link ring_link(const GroupShape& g, const Network& net) {
  if (g.nodes <= 1) return net.intra;
  return {std::min(net.intra.bandwidth, double(g.per_node()) * net.inter.bandwidth),
          std::max(net.intra.latency, net.inter.latency)};
}
/**
 * All-to-all as NCCL runs it (every pair exchanges its block at once, `ncclSend`/`ncclRecv` grouped): one
 * latency per peer, and each rank's n - 1 outgoing blocks share its links. Inside a node they all go over the
 * NVLink; across nodes the blocks for the other nodes' ranks go over the GPU's NIC share while the ones for its
 * own node go over NVLink at the same time, so the slower of the two decides. There is no other algorithm.
 */
[[nodiscard]] constexpr double all_to_all(double bytes, const GroupShape& g, const Network& net) {
  const std::size_t n = g.ranks, m = g.per_node();
  if (n <= 1) return 0.0;
  const double block = bytes / double(n);
  const double intra = double(m - 1) * block / net.intra.bandwidth;
  const double inter = g.nodes > 1 ? double(n - m) * block / net.inter.bandwidth : 0.0;
  const double latency = g.nodes > 1 ? std::max(net.intra.latency, net.inter.latency) : net.intra.latency;
  return double(n - 1) * latency + std::max(intra, inter);
}
/** Ring reduce-scatter or all-gather: n-1 steps of bytes/n. */
[[nodiscard]] constexpr double ring_half(double bytes, std::size_t n, const Link& l) {
  if (n <= 1) return 0.0;
  return double(n - 1) * l.latency + double(n - 1) / double(n) * bytes / l.bandwidth;
}
}  // namespace detail

/** Time of one collective over `bytes` (the full buffer per rank) with a given algorithm. */
[[nodiscard]] inline double collective_seconds(Collective c, Algorithm a, double bytes, const GroupShape& g,
                                               const Network& net) {
  require(g.ranks >= 1 && g.nodes >= 1 && g.ranks % g.nodes == 0, "plan::collective_seconds: a group of ", g.ranks,
          " ranks cannot sit evenly on ", g.nodes, " nodes");
  require(bytes >= 0, "plan::collective_seconds: negative size ", bytes, " bytes for ", collective_name(c));
  const std::size_t n = g.ranks;
  if (n <= 1) return 0.0;
  if (c == Collective::all_to_all) return detail::all_to_all(bytes, g, net);  // the same for every algorithm
  const Link ring = detail::ring_link(g, net);
  const double passes = c == Collective::all_reduce ? 2.0 : 1.0;  // reduce-scatter + all-gather
  switch (a) {
    case Algorithm::ring:
      if (c == Collective::broadcast) return double(n - 1) * ring.latency + bytes / ring.bandwidth;  // pipelined chain
      return passes * detail::ring_half(bytes, n, ring);
    case Algorithm::tree: {
      // Double binary tree: log2(n) hops up (and down for all-reduce); each rank moves the whole buffer per pass.
      const double hops = std::ceil(std::log2(double(n)));
      if (c == Collective::reduce_scatter || c == Collective::all_gather)
        return passes * detail::ring_half(bytes, n, ring);
      return passes * (hops * ring.latency + bytes / ring.bandwidth);
    }
    case Algorithm::hierarchical: {
      if (g.nodes <= 1 || g.per_node() <= 1) return collective_seconds(c, Algorithm::ring, bytes, g, net);
      const std::size_t m = g.per_node(), k = g.nodes;
      // Inside a node the buffer is split m ways; each of the m slices then crosses nodes on its own NIC.
      const double intra = detail::ring_half(bytes, m, net.intra);
      const double inter = detail::ring_half(bytes / double(m), k, net.inter);
      if (c == Collective::broadcast)
        return double(k - 1) * net.inter.latency + bytes / double(m) / net.inter.bandwidth + intra;
      return passes * (intra + inter);
    }
  }
  return 0.0;
}

/** The fastest algorithm for this collective, as NCCL's tuner would pick it. */
[[nodiscard]] inline CollectiveTime best_collective(Collective c, double bytes, const GroupShape& g,
                                                    const Network& net) {
  CollectiveTime best{collective_seconds(c, Algorithm::ring, bytes, g, net), Algorithm::ring};
  for (Algorithm a : {Algorithm::tree, Algorithm::hierarchical}) {
    const double t = collective_seconds(c, a, bytes, g, net);
    if (t < best.seconds) best = {t, a};
  }
  return best;
}

/** Point-to-point transfer between two ranks, inside a node or across nodes. */
[[nodiscard]] constexpr double send_recv_seconds(double bytes, bool cross_node, const Network& net) {
  const Link& l = cross_node ? net.inter : net.intra;
  return l.latency + bytes / l.bandwidth;
}

}  // namespace mpar::plan
