#pragma once
/** @file The per-axis sub-communicators of a device mesh, built from a world communicator. */
#include <cstddef>
#include <string>
#include <utility>

#include "mpar/comm/communicator.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/mesh.hpp"

namespace mpar {

/**
 * @brief One rank's communicators along every axis of a DeviceMesh.
 *
 * `tensor` holds the ranks that differ only in their tensor coordinate (neighbouring world ranks,
 * since the tensor axis is innermost), ordered by tensor coordinate; likewise `pipeline`, `data` and
 * `expert`. Each group's `rank()` is this rank's coordinate on that axis.
 */
template <communicator Comm>
struct MeshComms {
  Comm world, tensor, pipeline, data, expert;

  /** The communicator of one mesh axis (tensor, pipeline, data or expert). */
  [[nodiscard]] Comm& axis(MeshAxis a) {
    switch (a) {
      case MeshAxis::tensor:
        return tensor;
      case MeshAxis::pipeline:
        return pipeline;
      case MeshAxis::data:
        return data;
      case MeshAxis::expert:
        return expert;
      default:
        break;
    }
    throw config_error(detail::cat("MeshComms::axis: no communicator for axis ", axis_name(a),
                                   "; 2D tensor grids split the tensor communicator themselves"));
  }
};

namespace detail {
/** Splits with a group name when the communicator supports one (error messages then say "tensor"). */
template <communicator Comm>
Comm split_named(Comm& c, int color, int key, const std::string& name) {
  if constexpr (requires { c.split(color, key, name); })
    return c.split(color, key, name);
  else
    return c.split(color, key);
}
}  // namespace detail

/**
 * @brief Builds every axis communicator of `mesh` from `world` (collective over `world`; every rank
 * must call it with the same mesh). `world.size()` must equal `mesh.world_size()`.
 */
template <communicator Comm, detail::device_mesh Mesh>
[[nodiscard]] MeshComms<Comm> make_mesh_comms(Comm& world, const Mesh& mesh) {
  require(std::size_t(world.size()) == mesh.world_size(), "make_mesh_comms: the world communicator '", world.name(),
          "' has ", world.size(), " ranks but ", mesh, " needs ", mesh.world_size());
  const MeshCoord c = mesh.coord(std::size_t(world.rank()));
  const std::size_t tp = mesh.tensor_size(), ep = mesh.expert_size(), dp = mesh.data_size();
  // color = the rank's coordinates on every other axis, flattened; key = its coordinate on this axis.
  const auto tensor_color = int((c.pipeline * dp + c.data) * ep + c.expert);
  const auto pipeline_color = int((c.data * ep + c.expert) * tp + c.tensor);
  const auto data_color = int((c.pipeline * ep + c.expert) * tp + c.tensor);
  const auto expert_color = int((c.pipeline * dp + c.data) * tp + c.tensor);
  Comm world_copy = [&] {
    if constexpr (std::copy_constructible<Comm>)
      return world;
    else
      return detail::split_named(world, 0, world.rank(), world.name());
  }();
  Comm tensor = detail::split_named(world, tensor_color, int(c.tensor), "tensor");
  Comm pipeline = detail::split_named(world, pipeline_color, int(c.pipeline), "pipeline");
  Comm data = detail::split_named(world, data_color, int(c.data), "data");
  Comm expert = detail::split_named(world, expert_color, int(c.expert), "expert");
  return MeshComms<Comm>{std::move(world_copy), std::move(tensor), std::move(pipeline), std::move(data),
                         std::move(expert)};
}

}  // namespace mpar
