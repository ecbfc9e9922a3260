#pragma once
/**
 * @file A named block of a global fp32 tensor (`BlockView`, `SaveBlock`, `LoadBlock`): what a rank saves or loads.
 * Part of `mpar/io/checkpoint.hpp` (docs/checkpoints.md).
 */
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "mpar/io/box.hpp"

namespace mpar::io {

/**
 * @brief A named block of a global fp32 tensor held by this rank: `data` is the row-major content of
 * `box` (one Block per dimension of `global_shape`). `SaveBlock` reads it, `LoadBlock` fills it.
 */
template <class T>
struct BlockView {
  std::string name;
  std::vector<std::size_t> global_shape;
  BoxN box;
  std::string layout = "Replicate";  ///< recorded in the manifest (informative; any layout loads)
  std::span<T> data;
};
using SaveBlock = BlockView<const float>;
using LoadBlock = BlockView<float>;

}  // namespace mpar::io
