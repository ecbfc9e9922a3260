#pragma once
/**
 * @file Where the tensor, data and pipeline groups of a configuration land on nodes, for a given
 * rank ordering. mpar's DeviceMesh numbers ranks tensor-innermost, so tensor groups are neighbouring
 * GPUs of one node; `data_innermost` is the ordering that breaks this (for comparison).
 */
#include <cstddef>
#include <string_view>

#include "mpar/core/error.hpp"
#include "mpar/plan/collective_cost.hpp"
#include "mpar/plan/parallel_config.hpp"

namespace mpar::plan {

/** @brief Rank ordering: which axis varies fastest over consecutive ranks (pipeline is always outermost). */
enum class Placement { tensor_innermost, data_innermost };

[[nodiscard]] constexpr std::string_view placement_name(Placement p) {
  return p == Placement::tensor_innermost ? "tensor-innermost" : "data-innermost";
}

/**
 * The nodes a group of `size` ranks, `stride` apart, occupies with `per_node` GPUs per node
 * (nodes aligned to multiples of per_node). Throws when the group would sit unevenly on nodes.
 */
[[nodiscard]] inline GroupShape group_shape(std::size_t size, std::size_t stride, std::size_t per_node) {
  if (size <= 1) return {1, 1};
  const std::size_t span = size * stride;  // consecutive ranks from the group's first to past its last
  if (span <= per_node) {
    require(per_node % span == 0 || span == per_node, "plan: a group of ", size, " ranks with stride ", stride,
            " straddles a node boundary of ", per_node, " GPUs; choose sizes that divide --gpus-per-node");
    return {size, 1};
  }
  if (stride >= per_node) {
    require(stride % per_node == 0, "plan: a group with rank stride ", stride, " is not aligned to nodes of ", per_node,
            " GPUs; choose sizes that divide --gpus-per-node");
    return {size, size};
  }
  require(per_node % stride == 0 && span % per_node == 0, "plan: a group of ", size, " ranks with stride ", stride,
          " does not sit evenly on nodes of ", per_node, " GPUs; choose sizes that divide --gpus-per-node");
  return {size, span / per_node};
}

/** @brief The node footprint of one configuration's groups. */
struct GroupPlacement {
  GroupShape tensor, data;           ///< data: the gradient-reduction group, data x context ranks
  GroupShape context;                ///< the ring of context parallelism (size 1 without it)
  GroupShape expert;                 ///< the ep ranks an MoE layer's all-to-all spans (size 1 without it)
  GroupShape expert_data;            ///< the dp / ep ranks holding the same experts: their gradient reduction
  bool pipeline_cross_node = false;  ///< neighbouring pipeline stages sit on different nodes
  [[nodiscard]] constexpr bool tensor_inside_node() const { return tensor.nodes == 1; }
};

/** How `c`'s groups land on nodes of `gpus_per_node` GPUs under ordering `p`. */
[[nodiscard]] inline GroupPlacement place(const ParallelConfig& c, std::size_t gpus_per_node, Placement p) {
  GroupPlacement g;
  const bool tensor_first = p == Placement::tensor_innermost;
  // The context axis sits just outside tensor (tensor_innermost) or innermost (data_innermost), and inside
  // data in both: the data x context ranks of one tensor coordinate are one contiguous, strided group.
  g.tensor = group_shape(c.tp, tensor_first ? 1 : c.data_group(), gpus_per_node);
  g.data = group_shape(c.data_group(), tensor_first ? c.tp : 1, gpus_per_node);
  g.context = group_shape(c.cp, tensor_first ? c.tp : 1, gpus_per_node);
  // The expert ranks are the innermost data ranks (DeviceMesh: tensor, expert, data, pipeline), so one expert
  // group is ep neighbouring data ranks and the ranks holding the same experts are ep data ranks apart.
  g.expert = group_shape(c.ep, tensor_first ? c.tp : 1, gpus_per_node);
  g.expert_data = group_shape(c.expert_data_group(), (tensor_first ? c.tp : 1) * c.ep, gpus_per_node);
  g.pipeline_cross_node = c.tp * c.data_group() >= gpus_per_node;
  return g;
}

}  // namespace mpar::plan
