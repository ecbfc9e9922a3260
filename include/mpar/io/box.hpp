#pragma once
/**
 * @file Boxes: a block of every dimension of a global tensor, the geometry checkpoints reshard with.
 *
 * A box is `std::vector<Block>` (core/layout.hpp) with global offsets. Checkpoint code intersects the
 * box a rank needs with the boxes that were saved, and copies the intersection row by row (the last
 * dimension is contiguous in every row-major block).
 */
#include <cstddef>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "mpar/core/layout.hpp"

namespace mpar::io {

/** @brief One block per dimension, offsets global; a rank-0 (scalar) tensor has an empty box. */
using BoxN = std::vector<Block>;

/** @brief The whole of a tensor of `shape`. */
[[nodiscard]] inline BoxN full_box(const std::vector<std::size_t>& shape) {
  BoxN b;
  for (auto e : shape) b.push_back({0, e});
  return b;
}

/** @brief Element count of `box`, or nullopt if it overflows `std::size_t`. */
[[nodiscard]] inline std::optional<std::size_t> checked_volume(const BoxN& box) {
  std::size_t n = 1;
  for (const auto& b : box) {
    if (b.extent != 0 && n > std::numeric_limits<std::size_t>::max() / b.extent) return std::nullopt;
    n *= b.extent;
  }
  return n;
}
[[nodiscard]] inline std::size_t volume(const BoxN& box) {
  std::size_t n = 1;
  for (const auto& b : box) n *= b.extent;
  return n;
}
[[nodiscard]] inline std::size_t volume(const std::vector<std::size_t>& shape) {
  std::size_t n = 1;
  for (auto e : shape) n *= e;
  return n;
}

/** @brief Whether `box` lies inside a tensor of `shape` (same rank, no overflow). */
[[nodiscard]] inline bool box_within(const BoxN& box, const std::vector<std::size_t>& shape) {
  if (box.size() != shape.size()) return false;
  for (std::size_t d = 0; d < box.size(); ++d)
    if (box[d].offset > shape[d] || box[d].extent > shape[d] - box[d].offset) return false;
  return true;
}

/** @brief The common part of two boxes of the same rank; nullopt when it is empty. */
[[nodiscard]] inline std::optional<BoxN> intersect(const BoxN& a, const BoxN& b) {
  BoxN r(a.size());
  for (std::size_t d = 0; d < a.size(); ++d) {
    const std::size_t lo = std::max(a[d].offset, b[d].offset);
    const std::size_t hi = std::min(a[d].offset + a[d].extent, b[d].offset + b[d].extent);
    if (hi <= lo) return std::nullopt;
    r[d] = {lo, hi - lo};
  }
  return r;
}

/** @brief Prints `[0:4, 8:16]` (half-open ranges). */
[[nodiscard]] inline std::string box_string(const BoxN& box) {
  std::ostringstream os;
  os << '[';
  for (std::size_t d = 0; d < box.size(); ++d)
    os << (d ? ", " : "") << box[d].offset << ':' << box[d].offset + box[d].extent;
  os << ']';
  return os.str();
}
[[nodiscard]] inline std::string shape_string(const std::vector<std::size_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (std::size_t d = 0; d < shape.size(); ++d) os << (d ? ", " : "") << shape[d];
  os << ']';
  return os.str();
}

/**
 * @brief Calls `f(src_index, dst_index, count)` for every row of `inter` (a sub-box of both `src` and
 * `dst`): `count` consecutive elements that start at flat row-major index `src_index` of `src` and
 * `dst_index` of `dst`. Rows follow the last dimension, which is contiguous in both blocks.
 */
template <class F>
void for_each_row(const BoxN& src, const BoxN& dst, const BoxN& inter, F&& f) {
  const std::size_t rank = inter.size();
  if (rank == 0) {
    f(std::size_t(0), std::size_t(0), std::size_t(1));
    return;
  }
  const std::size_t len = inter[rank - 1].extent;
  std::vector<std::size_t> idx(rank, 0);  // position inside `inter`, last dimension fixed at 0
  const std::size_t rows = volume(inter) / len;
  for (std::size_t r = 0; r < rows; ++r) {
    std::size_t si = 0, di = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      const std::size_t g = inter[d].offset + idx[d];
      si = si * src[d].extent + (g - src[d].offset);
      di = di * dst[d].extent + (g - dst[d].offset);
    }
    f(si, di, len);
    for (std::size_t d = rank - 1; d-- > 0;) {  // odometer over all but the last dimension
      if (++idx[d] < inter[d].extent) break;
      idx[d] = 0;
    }
  }
}

/** @brief A box together with where its elements start in a flat range (see `flat_range_boxes`). */
struct FlatPiece {
  BoxN box;
  std::size_t flat_offset = 0;  ///< index, within the flat range, of the box's first element
};

namespace detail {
inline void flat_pieces(const BoxN& local, std::size_t d, BoxN& prefix, std::size_t begin, std::size_t end,
                        std::size_t base, std::vector<FlatPiece>& out) {
  if (begin >= end) return;
  std::size_t stride = 1;  // elements per index of dimension d
  for (std::size_t k = d + 1; k < local.size(); ++k) stride *= local[k].extent;
  auto emit = [&](std::size_t i0, std::size_t count) {  // whole sub-arrays i0 .. i0+count of dimension d
    BoxN b = prefix;
    b.push_back({local[d].offset + i0, count});
    for (std::size_t k = d + 1; k < local.size(); ++k) b.push_back(local[k]);
    out.push_back({std::move(b), base + i0 * stride});
  };
  auto descend = [&](std::size_t i, std::size_t b, std::size_t e) {  // part [b, e) of sub-array i
    prefix.push_back({local[d].offset + i, 1});
    flat_pieces(local, d + 1, prefix, b, e, base + i * stride, out);
    prefix.pop_back();
  };
  std::size_t first = begin / stride;
  const std::size_t last_end = end / stride;  // sub-arrays [first, last_end) may be whole
  if (first == (end - 1) / stride && (begin % stride != 0 || end % stride != 0)) {
    descend(first, begin % stride, begin % stride + (end - begin));
    return;
  }
  if (begin % stride != 0) descend(first++, begin % stride, stride);
  if (last_end > first) emit(first, last_end - first);
  if (end % stride != 0) descend(last_end, 0, end % stride);
}
}  // namespace detail

/**
 * @brief Splits the flat row-major range `[begin, end)` of a rank's block `local` into at most
 * `2 * rank + 1` boxes, in order. This is how flat optimizer-state shards (ZeRO-1) are saved as
 * boxes of the parameter's global tensor, so they reshard like any other block.
 */
[[nodiscard]] inline std::vector<FlatPiece> flat_range_boxes(const BoxN& local, std::size_t begin, std::size_t end) {
  std::vector<FlatPiece> out;
  if (local.empty()) {
    if (begin < end) out.push_back({{}, 0});
    return out;
  }
  BoxN prefix;
  detail::flat_pieces(local, 0, prefix, begin, end, 0, out);
  for (auto& p : out) p.flat_offset -= begin;  // relative to the start of the range
  return out;
}

}  // namespace mpar::io
