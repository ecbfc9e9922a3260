#pragma once
/** @file The device mesh: named axes, rank <-> coordinate mapping with the tensor axis innermost. */
#include <array>
#include <cstddef>
#include <ostream>
#include <string_view>

#include "mpar/core/detail/device_mesh.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/extents.hpp"

namespace mpar {

/**
 * @brief The named axes of a device mesh.
 *
 * `tensor_row` and `tensor_col` are the two factors of the tensor axis when it is arranged as a
 * 2D grid (tensor = rows x cols, column index innermost) for 2D tensor parallelism.
 *
 * `context` splits the sequence dimension (context parallelism, nn/ring_attention.hpp). Like the tensor
 * grid's factors it is a factor of another axis: `DeviceMesh::with_context(cp)` arranges the data axis as
 * data x context, context innermost (Megatron-LM's tp-cp-dp-pp order), because every context rank holds a
 * replica of the weights and the gradients average over the whole data axis. `size(data)` is then that whole
 * group and `size(context)` its cp factor (1 without `with_context`); ring attention takes its context group
 * as a communicator, and the axis names the layout of its zig-zag token shards (`ZigZagShard`).
 */
enum class MeshAxis { tensor, expert, data, pipeline, tensor_row, tensor_col, context };

/** @brief Short spellings for layout arguments: `Shard<1, axis::tensor>`. */
namespace axis {
inline constexpr MeshAxis tensor = MeshAxis::tensor;
inline constexpr MeshAxis expert = MeshAxis::expert;
inline constexpr MeshAxis data = MeshAxis::data;
inline constexpr MeshAxis pipeline = MeshAxis::pipeline;
inline constexpr MeshAxis tensor_row = MeshAxis::tensor_row;
inline constexpr MeshAxis tensor_col = MeshAxis::tensor_col;
inline constexpr MeshAxis context = MeshAxis::context;
}  // namespace axis

inline constexpr std::string_view axis_name(MeshAxis a) {
  switch (a) {
    case MeshAxis::tensor:
      return "tensor";
    case MeshAxis::expert:
      return "expert";
    case MeshAxis::data:
      return "data";
    case MeshAxis::pipeline:
      return "pipeline";
    case MeshAxis::tensor_row:
      return "tensor_row";
    case MeshAxis::tensor_col:
      return "tensor_col";
    case MeshAxis::context:
      return "context";
  }
  return "?";
}
inline std::ostream& operator<<(std::ostream& os, MeshAxis a) { return os << axis_name(a); }

/** @brief One rank's position on every axis of a mesh. */
struct MeshCoord {
  std::size_t tensor = 0, expert = 0, data = 0, pipeline = 0, tensor_row = 0, tensor_col = 0, context = 0;
  [[nodiscard]] constexpr std::size_t operator[](MeshAxis a) const {
    switch (a) {
      case MeshAxis::tensor:
        return tensor;
      case MeshAxis::expert:
        return expert;
      case MeshAxis::data:
        return data;
      case MeshAxis::pipeline:
        return pipeline;
      case MeshAxis::tensor_row:
        return tensor_row;
      case MeshAxis::tensor_col:
        return tensor_col;
      case MeshAxis::context:
        return context;
    }
    return 0;
  }
  friend constexpr bool operator==(const MeshCoord&, const MeshCoord&) = default;
};

/**
 * @brief A device mesh tensor x expert x data x pipeline; each size static or `dyn`.
 *
 * Ranks are numbered with the tensor axis innermost (neighbouring ranks share a tensor group, the
 * closest and fastest links), then expert, then data, with pipeline outermost:
 * `rank = ((pipeline * DP + data) * EP + expert) * TP + tensor`.
 * Static sizes make divisibility of static extents a compile-time check (see `layout.hpp`).
 */
template <std::size_t TP = dyn, std::size_t PP = dyn, std::size_t DP = dyn, std::size_t EP = 1>
class DeviceMesh {
 public:
  using sizes_type = Extents<TP, PP, DP, EP>;
  static constexpr std::size_t static_tensor = TP, static_pipeline = PP, static_data = DP, static_expert = EP;

  constexpr DeviceMesh() requires(sizes_type::rank_dynamic() == 0) : DeviceMesh(sizes_type{}) {}
  template <class... I>
    requires(sizeof...(I) == sizes_type::rank_dynamic() && sizeof...(I) > 0)
  constexpr explicit DeviceMesh(I... dynamic_sizes) : DeviceMesh(sizes_type(dynamic_sizes...)) {}

  /** Arranges the tensor axis as a `rows x cols` grid for 2D tensor parallelism. */
  constexpr DeviceMesh& with_tensor_grid(std::size_t rows, std::size_t cols) {
    require(rows * cols == tensor_size(), "DeviceMesh::with_tensor_grid: ", rows, " x ", cols,
            " does not equal the tensor axis size ", tensor_size());
    grid_rows_ = rows;
    return *this;
  }
  /**
   * Arranges the data axis as `data_size() / cp` data x `cp` context ranks, context innermost: the ranks of one
   * sequence's context group are neighbours on the data axis (see MeshAxis).
   */
  constexpr DeviceMesh& with_context(std::size_t cp) {
    require(cp >= 1 && data_size() % cp == 0, "DeviceMesh::with_context: cp = ", cp,
            " does not divide the data axis size ", data_size(), " (data x context ranks); use a divisor of ",
            data_size());
    context_ = cp;
    return *this;
  }

  [[nodiscard]] constexpr std::size_t tensor_size() const { return sizes_.template extent<0>(); }
  [[nodiscard]] constexpr std::size_t pipeline_size() const { return sizes_.template extent<1>(); }
  [[nodiscard]] constexpr std::size_t data_size() const { return sizes_.template extent<2>(); }
  [[nodiscard]] constexpr std::size_t expert_size() const { return sizes_.template extent<3>(); }
  [[nodiscard]] constexpr std::size_t world_size() const { return sizes_.size(); }
  [[nodiscard]] constexpr std::size_t size(MeshAxis a) const {
    switch (a) {
      case MeshAxis::tensor:
        return tensor_size();
      case MeshAxis::expert:
        return expert_size();
      case MeshAxis::data:
        return data_size();
      case MeshAxis::pipeline:
        return pipeline_size();
      case MeshAxis::tensor_row:
        return grid_rows_;
      case MeshAxis::tensor_col:
        return tensor_size() / grid_rows_;
      case MeshAxis::context:
        return context_;  // a factor of the data axis: see MeshAxis
    }
    return 1;
  }

  [[nodiscard]] constexpr MeshCoord coord(std::size_t rank) const {
    require(rank < world_size(), "DeviceMesh::coord: rank ", rank, " is outside a mesh of ", world_size(), " ranks");
    MeshCoord c;
    c.tensor = rank % tensor_size();
    rank /= tensor_size();
    c.expert = rank % expert_size();
    rank /= expert_size();
    c.data = rank % data_size();
    c.pipeline = rank / data_size();
    const std::size_t cols = tensor_size() / grid_rows_;
    c.tensor_row = c.tensor / cols;
    c.tensor_col = c.tensor % cols;
    c.context = c.data % context_;
    return c;
  }

  [[nodiscard]] constexpr std::size_t rank(const MeshCoord& c) const {
    return ((c.pipeline * data_size() + c.data) * expert_size() + c.expert) * tensor_size() + c.tensor;
  }

  friend std::ostream& operator<<(std::ostream& os, const DeviceMesh& m) {
    os << "DeviceMesh(tensor=" << m.tensor_size() << ", expert=" << m.expert_size() << ", data=" << m.data_size();
    if (m.context_ > 1) os << " (context=" << m.context_ << ")";
    return os << ", pipeline=" << m.pipeline_size() << ")";
  }

 private:
  constexpr explicit DeviceMesh(const sizes_type& s) : sizes_(s) {
    for (std::size_t d = 0; d < 4; ++d) {
      constexpr std::array<std::string_view, 4> names{"tensor", "pipeline", "data", "expert"};
      require(sizes_.extent(d) >= 1, "DeviceMesh: the ", names[d],
              " axis has size 0; every axis needs at least 1 rank");
    }
  }
  [[no_unique_address]] sizes_type sizes_;
  std::size_t grid_rows_ = 1;
  std::size_t context_ = 1;  ///< with_context: the context factor of the data axis
};

/** @brief A mesh whose four sizes are chosen at run time. */
using DynamicMesh = DeviceMesh<dyn, dyn, dyn, dyn>;

/** @brief The static size of `axis` in mesh type `M`, or `dyn`. 2D grid factors are always dynamic. */
template <mpar::detail::device_mesh M>
constexpr std::size_t static_axis_size(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::tensor:
      return M::static_tensor;
    case MeshAxis::pipeline:
      return M::static_pipeline;
    case MeshAxis::data:
      return M::static_data;
    case MeshAxis::expert:
      return M::static_expert;
    default:
      return dyn;
  }
}

}  // namespace mpar
