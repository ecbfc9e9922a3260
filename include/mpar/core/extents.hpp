#pragma once
/** @file Extents that mix compile-time and run-time sizes; fully static extents occupy no storage. */
#include <array>
#include <cstddef>
#include <limits>
#include <ostream>
#include <type_traits>

#include "mpar/core/detail/extents_type.hpp"
#include "mpar/core/error.hpp"

namespace mpar {

/** @brief Marks a dimension whose size is known only at run time. */
inline constexpr std::size_t dyn = std::numeric_limits<std::size_t>::max();

namespace detail {
template <std::size_t... E>
inline constexpr std::size_t dynamic_count = ((E == dyn ? 1u : 0u) + ... + 0u);

/** Position of dimension `I` among the dynamic dimensions (only meaningful when it is dynamic). */
template <std::size_t I, std::size_t... E>
constexpr std::size_t dynamic_index() {
  constexpr std::array<std::size_t, sizeof...(E)> all{E...};
  std::size_t n = 0;
  for (std::size_t k = 0; k < I; ++k) n += all[k] == dyn ? 1 : 0;
  return n;
}

/** Storage for the dynamic sizes only; an empty type when there are none. */
template <std::size_t N>
struct DynamicSizes {
  std::array<std::size_t, N> v{};
};
template <>
struct DynamicSizes<0> {};
}  // namespace detail

/**
 * @brief A shape whose dimensions are either static (`Extents<4, 8>`) or dynamic (`Extents<dyn, 8>`).
 *
 * Static dimensions are template arguments and cost nothing at run time; `sizeof(Extents<4, 8>) == 1`
 * and `[[no_unique_address]]` members of this type occupy no bytes.
 */
template <std::size_t... E>
class Extents {
 public:
  static constexpr std::size_t rank_v = sizeof...(E);
  static constexpr std::size_t rank_dynamic_v = detail::dynamic_count<E...>;
  static constexpr std::array<std::size_t, rank_v> static_sizes{E...};

  constexpr Extents() requires(rank_dynamic_v == 0) = default;

  /** One argument per dynamic dimension, in order. */
  template <class... I>
    requires(sizeof...(I) == rank_dynamic_v && rank_dynamic_v > 0 && (std::is_convertible_v<I, std::size_t> && ...))
  constexpr explicit Extents(I... dynamic_sizes) : dyn_{{static_cast<std::size_t>(dynamic_sizes)...}} {}

  [[nodiscard]] static constexpr std::size_t rank() { return rank_v; }
  [[nodiscard]] static constexpr std::size_t rank_dynamic() { return rank_dynamic_v; }
  [[nodiscard]] static constexpr bool is_static(std::size_t d) { return static_sizes[d] != dyn; }
  [[nodiscard]] static constexpr std::size_t static_extent(std::size_t d) { return static_sizes[d]; }

  [[nodiscard]] constexpr std::size_t extent(std::size_t d) const {
    if (static_sizes[d] != dyn) return static_sizes[d];
    if constexpr (rank_dynamic_v > 0) {
      std::size_t k = 0;
      for (std::size_t j = 0; j < d; ++j) k += static_sizes[j] == dyn ? 1 : 0;
      return dyn_.v[k];
    }
    return 0;  // unreachable: a dynamic dimension implies rank_dynamic_v > 0
  }

  template <std::size_t D>
  [[nodiscard]] constexpr std::size_t extent() const {
    static_assert(D < rank_v, "mpar::Extents::extent<D>: D is not a dimension of these extents");
    if constexpr (static_sizes[D] != dyn)
      return static_sizes[D];
    else
      return dyn_.v[detail::dynamic_index<D, E...>()];
  }

  [[nodiscard]] constexpr std::size_t size() const {
    std::size_t n = 1;
    for (std::size_t d = 0; d < rank_v; ++d) n *= extent(d);
    return n;
  }

  [[nodiscard]] constexpr std::array<std::size_t, rank_v> to_array() const {
    std::array<std::size_t, rank_v> a{};
    for (std::size_t d = 0; d < rank_v; ++d) a[d] = extent(d);
    return a;
  }

  friend constexpr bool operator==(const Extents& a, const Extents& b) { return a.to_array() == b.to_array(); }

  /** Prints like CuTe: static sizes with a leading underscore, e.g. `(_4,7)`. */
  friend std::ostream& operator<<(std::ostream& os, const Extents& e) {
    os << '(';
    for (std::size_t d = 0; d < rank_v; ++d) {
      if (d) os << ',';
      if (is_static(d)) os << '_';
      os << e.extent(d);
    }
    return os << ')';
  }

 private:
  [[no_unique_address]] detail::DynamicSizes<rank_dynamic_v> dyn_{};
};

/** @brief Extents with every dimension dynamic, e.g. `DynExtents<2>` is `Extents<dyn, dyn>`. */
template <std::size_t Rank>
using DynExtents = decltype([]<std::size_t... I>(std::index_sequence<I...>) {
  return Extents<((void)I, dyn)...>{std::size_t(I)...};
}(std::make_index_sequence<Rank>{}));

}  // namespace mpar
