#pragma once
/**
 * @file Layout types: how a global tensor is placed on a mesh axis.
 *
 * `Replicate` (every rank holds the whole tensor), `Shard<Dim, Axis>` (dimension `Dim` is split
 * into contiguous blocks along mesh axis `Axis`), `Partial<Op, Axis>` (every rank holds a
 * full-size addend; the value is their `Op`-reduction over `Axis`) and `Layout2D<A, B>` (two of the
 * above on two different axes, e.g. a 2D-sharded weight).
 *
 * Uneven splits follow one documented rule everywhere in mpar (layouts and collectives alike):
 * `n` elements over `p` ranks give the first `n % p` ranks `n / p + 1` elements and the others
 * `n / p`, in rank order.
 */
#include <array>
#include <cstddef>
#include <ostream>
#include <string>
#include <type_traits>

#include "mpar/core/error.hpp"
#include "mpar/core/mesh.hpp"

namespace mpar {

/** @brief Reduction applied to partial values (and by collectives). */
enum class ReduceOp { sum, avg, max, min };
inline constexpr const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

/** @brief A contiguous block `[offset, offset + extent)` of one dimension. */
struct Block {
  std::size_t offset = 0, extent = 0;
  friend constexpr bool operator==(const Block&, const Block&) = default;
};

/** @brief The block-partition rule: part `i` of `n` elements split over `parts`. */
[[nodiscard]] constexpr Block block_of(std::size_t n, std::size_t parts, std::size_t i) {
  const std::size_t base = n / parts, rem = n % parts;
  return {i * base + (i < rem ? i : rem), base + (i < rem ? 1 : 0)};
}

/** @brief The local box of a tensor: one block per dimension. */
template <std::size_t R>
using Box = std::array<Block, R>;

struct layout_tag {};

/** @brief Every rank holds the entire tensor. */
struct Replicate final : layout_tag {
  static constexpr bool is_replicated = true;
  static constexpr bool is_partial = false;
  static constexpr bool is_sharded = false;
  static constexpr int sharded_dim = -1;
  static std::string name() { return "Replicate"; }
  template <std::size_t R, detail::device_mesh M>
  static constexpr Box<R> local_box(const std::array<std::size_t, R>& global, const M&, const MeshCoord&) {
    Box<R> b{};
    for (std::size_t d = 0; d < R; ++d) b[d] = {0, global[d]};
    return b;
  }
};

/** @brief Dimension `Dim` is split into contiguous blocks along mesh axis `Axis` (block rule above). */
template <std::size_t Dim, MeshAxis Axis>
struct Shard final : layout_tag {
  static constexpr bool is_replicated = false;
  static constexpr bool is_partial = false;
  static constexpr bool is_sharded = true;
  static constexpr int sharded_dim = int(Dim);
  static constexpr MeshAxis axis = Axis;
  static std::string name() { return "Shard<" + std::to_string(Dim) + ", " + std::string(axis_name(Axis)) + ">"; }
  template <std::size_t R, detail::device_mesh M>
  static constexpr Box<R> local_box(const std::array<std::size_t, R>& global, const M& mesh, const MeshCoord& c) {
    static_assert(Dim < R,
                  "mpar::Shard<Dim, Axis>: Dim is not a dimension of the tensor; shard a dimension below its rank");
    Box<R> b = Replicate::local_box<R>(global, mesh, c);
    b[Dim] = block_of(global[Dim], mesh.size(Axis), c[Axis]);
    return b;
  }
};

/** @brief Every rank holds a full-size addend; the tensor is their `Op`-reduction over `Axis`. */
template <ReduceOp Op, MeshAxis Axis>
struct Partial final : layout_tag {
  static constexpr bool is_replicated = false;
  static constexpr bool is_partial = true;
  static constexpr bool is_sharded = false;
  static constexpr int sharded_dim = -1;
  static constexpr ReduceOp op = Op;
  static constexpr MeshAxis axis = Axis;
  static std::string name() {
    return std::string("Partial<") + reduce_op_name(Op) + ", " + std::string(axis_name(Axis)) + ">";
  }
  template <std::size_t R, detail::device_mesh M>
  static constexpr Box<R> local_box(const std::array<std::size_t, R>& global, const M& mesh, const MeshCoord& c) {
    return Replicate::local_box<R>(global, mesh, c);
  }
};

/**
 * @brief Dimension `Dim` cut into `2p` equal chunks over the `p` ranks of `Axis`, rank `r` holding chunks
 * `r` and `2p - 1 - r` in that order (zig-zag). Under a causal mask the early chunks see few keys and
 * the late ones many; pairing them gives every rank the same work (ring attention, nn/ring_attention.hpp).
 * A rank's share is two blocks, so the layout has `local_blocks` instead of a one-block `local_box`.
 */
template <std::size_t Dim, MeshAxis Axis>
struct ZigZagShard final : layout_tag {
  static constexpr bool is_replicated = false;
  static constexpr bool is_partial = false;
  static constexpr bool is_sharded = true;
  static constexpr int sharded_dim = int(Dim);
  static constexpr MeshAxis axis = Axis;
  static std::string name() { return "ZigZagShard<" + std::to_string(Dim) + ", " + std::string(axis_name(Axis)) + ">"; }
  /** The two chunks `{r, 2p - 1 - r}` of `n` elements on rank `r` of `p`; `n` must be a multiple of `2p`. */
  static constexpr std::array<Block, 2> local_blocks(std::size_t n, std::size_t p, std::size_t r) {
    require(p > 0 && n % (2 * p) == 0, "ZigZagShard: ", n, " elements do not split into 2 x ", p,
            " equal chunks; choose a size that is a multiple of ", 2 * p);
    const std::size_t c = n / (2 * p);
    return {Block{r * c, c}, Block{(2 * p - 1 - r) * c, c}};
  }
};

template <class T>
inline constexpr bool is_layout_v = std::is_base_of_v<layout_tag, T>&& std::is_empty_v<T>;

/** @brief Two layouts on two different mesh axes, applied together (e.g. a SUMMA-sharded weight). */
template <class A, class B>
  requires(is_layout_v<A>&& is_layout_v<B>)
struct Layout2D final : layout_tag {
  static_assert(!(A::is_sharded && B::is_sharded) || A::sharded_dim != B::sharded_dim || A::axis != B::axis,
                "mpar::Layout2D<A, B>: both parts shard the same dimension on the same axis; use two different axes");
  static constexpr bool is_replicated = A::is_replicated && B::is_replicated;
  static constexpr bool is_partial = A::is_partial || B::is_partial;
  static constexpr bool is_sharded = A::is_sharded || B::is_sharded;
  static constexpr int sharded_dim = A::is_sharded ? A::sharded_dim : B::sharded_dim;
  using first = A;
  using second = B;
  static std::string name() { return "Layout2D<" + A::name() + ", " + B::name() + ">"; }
  template <std::size_t R, detail::device_mesh M>
  static constexpr Box<R> local_box(const std::array<std::size_t, R>& global, const M& mesh, const MeshCoord& c) {
    Box<R> a = A::template local_box<R>(global, mesh, c);
    // B splits what A left on this rank; for different dimensions the order does not matter.
    std::array<std::size_t, R> after_a{};
    for (std::size_t d = 0; d < R; ++d) after_a[d] = a[d].extent;
    Box<R> b = B::template local_box<R>(after_a, mesh, c);
    for (std::size_t d = 0; d < R; ++d) b[d].offset += a[d].offset;
    return b;
  }
};

/** @brief Satisfied by any layout type. */
template <class L>
concept layout = is_layout_v<L>;

/** @brief The local extents of `global` on the rank at `coord`. */
template <layout L, std::size_t R, detail::device_mesh M>
[[nodiscard]] constexpr std::array<std::size_t, R> local_extents(const std::array<std::size_t, R>& global,
                                                                 const M& mesh, const MeshCoord& coord) {
  auto box = L::template local_box<R>(global, mesh, coord);
  std::array<std::size_t, R> e{};
  for (std::size_t d = 0; d < R; ++d) e[d] = box[d].extent;
  return e;
}

namespace detail {
template <class L, std::size_t R, class M>
constexpr void check_one_divisible(const std::array<std::size_t, R>& global, const M& mesh, const char* what) {
  if constexpr (L::is_sharded && requires { L::axis; }) {
    const std::size_t n = global[std::size_t(L::sharded_dim)], p = mesh.size(L::axis);
    require(n % p == 0, what, ": dimension ", L::sharded_dim, " of size ", n, " is not divisible by the ",
            axis_name(L::axis), " axis size ", p, " (layout ", L::name(), ")");
  }
}
}  // namespace detail

/**
 * @brief Run-time check that `L` splits `global` evenly on `mesh`; throws naming the dimension, the
 * size and the axis. Layers whose math needs equal shards call this at construction.
 */
template <layout L, std::size_t R, detail::device_mesh M>
void require_even_split(const std::array<std::size_t, R>& global, const M& mesh, const char* what = "layout") {
  if constexpr (requires { typename L::first; }) {
    detail::check_one_divisible<typename L::first, R>(global, mesh, what);
    detail::check_one_divisible<typename L::second, R>(global, mesh, what);
  } else {
    detail::check_one_divisible<L, R>(global, mesh, what);
  }
}

/**
 * @brief Compile-time divisibility: true unless a static extent `N` is sharded over a static
 * axis size that does not divide it.
 */
template <std::size_t N, std::size_t AxisSize>
inline constexpr bool statically_divisible_v = N == dyn || AxisSize == dyn || N % AxisSize == 0;

/**
 * @brief Checks at compile time that static extent `N` splits evenly over the static size of `Axis` in
 * mesh type `M`. Use in layer types whose sizes are template arguments.
 */
template <std::size_t N, MeshAxis Axis, detail::device_mesh M>
constexpr void static_require_divisible() {
  static_assert(statically_divisible_v<N, static_axis_size<M>(Axis)>,
                "mpar: a static extent is not divisible by the static size of the mesh axis it is sharded over; "
                "choose a size that is a multiple of the axis size, or shard another dimension");
}

}  // namespace mpar
