#pragma once
/**
 * @file Sharding-independent deterministic initialisation.
 *
 * An element's value is a pure function of (seed, parameter id, global element index): a
 * counter-based generator (SplitMix64 finaliser over the three keys) rather than a sequential
 * stream. A rank that owns a shard evaluates the function for its own block only, so every
 * TP/PP/DP layout starts from bit-identical weights without materialising the full tensor.
 *
 * The same pure function runs wherever the block lives: `InitBlock` carries everything a local element's
 * value depends on, and a backend's `init_values(block, x)` (backend/memory_backend.hpp) writes the block
 * into rank memory — a host loop, or a CUDA kernel calling the same `MPAR_HOST_DEVICE` functions below, so
 * the host uploads no initial values and there is one definition of the arithmetic.
 */
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <span>

#include "mpar/core/dtype.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/host_device.hpp"
#include "mpar/core/layout.hpp"
#include "mpar/core/tensor.hpp"

namespace mpar {

/** @brief A counter-based random source: each (seed, stream, counter) maps to 64 independent bits. */
struct CounterRng {
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;

  [[nodiscard]] MPAR_HOST_DEVICE static constexpr std::uint64_t mix(std::uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  [[nodiscard]] MPAR_HOST_DEVICE constexpr std::uint64_t bits(std::uint64_t counter) const {
    return mix(mix(mix(seed) ^ stream) ^ counter);
  }
  /** Uniform in (0, 1), never exactly 0 or 1 (safe for logarithms). */
  [[nodiscard]] MPAR_HOST_DEVICE constexpr double uniform(std::uint64_t counter) const {
    return (double(bits(counter) >> 11) + 0.5) * 0x1.0p-53;
  }
  /**
   * Standard normal by Box-Muller on two counters derived from `counter`. The logarithm and cosine are the
   * platform's (glibc on the host, CUDA's libdevice in a kernel): the bits that feed them are identical.
   */
  [[nodiscard]] MPAR_HOST_DEVICE double normal(std::uint64_t counter) const {
    const double u1 = uniform(2 * counter), u2 = uniform(2 * counter + 1);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
};

/** @brief How a parameter's elements are drawn. */
struct InitSpec {
  enum class Kind { normal, uniform, constant } kind = Kind::normal;
  double scale = 0.02;  ///< standard deviation (normal), half-width (uniform) or the value (constant)
  static constexpr InitSpec normal(double std) { return {Kind::normal, std}; }
  static constexpr InitSpec uniform(double half_width) { return {Kind::uniform, half_width}; }
  static constexpr InitSpec constant(double v) { return {Kind::constant, v}; }
};

/** @brief The value of the element at row-major `global_index` of parameter `param_id`. */
[[nodiscard]] MPAR_HOST_DEVICE inline double init_value(std::uint64_t seed, std::uint64_t param_id,
                                                        std::uint64_t global_index, const InitSpec& spec) {
  const CounterRng rng{seed, param_id};
  switch (spec.kind) {
    case InitSpec::Kind::normal:
      return spec.scale * rng.normal(global_index);
    case InitSpec::Kind::uniform:
      return spec.scale * (2.0 * rng.uniform(global_index) - 1.0);
    case InitSpec::Kind::constant:
      return spec.scale;
  }
  return 0.0;
}

/**
 * @brief A rank's block of a parameter and how its elements are drawn: everything the initial value of a
 * local element depends on, by value (fixed-size arrays, no pointers), so that a device kernel receives it
 * as a launch argument. Element `k` of the block (row-major over `extent`) is element `global_index(k)`
 * of the whole parameter of shape `global`.
 */
struct InitBlock {
  static constexpr std::size_t max_rank = 4;  ///< the largest tensor rank (Tensor<T, R> has R <= 4)
  std::uint64_t seed = 0;
  std::uint64_t param_id = 0;  ///< the counter stream: Parameter::id
  InitSpec spec{};
  std::uint32_t rank = 0;
  std::uint64_t global[max_rank]{};  ///< the unsharded shape
  std::uint64_t offset[max_rank]{};  ///< where the block starts in each dimension
  std::uint64_t extent[max_rank]{};  ///< the block's shape

  [[nodiscard]] MPAR_HOST_DEVICE constexpr std::uint64_t size() const {
    std::uint64_t n = 1;
    for (std::uint32_t d = 0; d < rank; ++d) n *= extent[d];
    return n;
  }
  /** The row-major index, in the whole parameter, of element `k` of the block. */
  [[nodiscard]] MPAR_HOST_DEVICE constexpr std::uint64_t global_index(std::uint64_t k) const {
    std::uint64_t g = 0, stride = 1;
    for (std::uint32_t d = rank; d-- > 0;) {
      g += (offset[d] + k % extent[d]) * stride;
      k /= extent[d];
      stride *= global[d];
    }
    return g;
  }
  /** The initial value of element `k` of the block. */
  [[nodiscard]] MPAR_HOST_DEVICE double value(std::uint64_t k) const {
    return init_value(seed, param_id, global_index(k), spec);
  }
};

/**
 * @brief The `InitBlock` of the block `box` of a parameter of shape `global`: checks that the block lies
 * inside the parameter and that the rank fits, naming the parameter `what` otherwise.
 */
[[nodiscard]] inline InitBlock make_init_block(std::uint64_t seed, std::uint64_t param_id,
                                               std::span<const std::size_t> global, std::span<const Block> box,
                                               const InitSpec& spec, const char* what = "parameter") {
  require(global.size() == box.size(), "init_values: ", what, " (id ", param_id, ") has ", global.size(),
          " global dimensions but a block of ", box.size(), "; give one Block per dimension");
  require(global.size() <= InitBlock::max_rank, "init_values: ", what, " (id ", param_id, ") has ", global.size(),
          " dimensions; at most ", InitBlock::max_rank, " are supported (reshape it)");
  InitBlock b{seed, param_id, spec, std::uint32_t(global.size())};
  for (std::size_t d = 0; d < global.size(); ++d) {
    require(box[d].offset + box[d].extent <= global[d], "init_values: ", what, " (id ", param_id, "): the block [",
            box[d].offset, ", +", box[d].extent, ") of dimension ", d, " lies outside the global extent ", global[d],
            "; take the block from the layout's local_box");
    b.global[d] = global[d];
    b.offset[d] = box[d].offset;
    b.extent[d] = box[d].extent;
  }
  return b;
}

/**
 * @brief Fills `local`, the block `box` of a parameter of global shape `global`, with the values
 * that the same elements have in the unsharded parameter.
 */
template <class T, std::size_t R>
void init_shard(const TensorView<T, R>& local, const std::array<std::size_t, R>& global, const Box<R>& box,
                std::uint64_t seed, std::uint64_t param_id, const InitSpec& spec) {
  for (std::size_t d = 0; d < R; ++d)
    require(local.extent(d) == box[d].extent && box[d].offset + box[d].extent <= global[d], "init_shard: local extent ",
            local.extent(d), " in dimension ", d, " does not match the block [", box[d].offset, ", +", box[d].extent,
            ") of global extent ", global[d]);
  std::array<std::size_t, R> idx{};
  const std::size_t n = local.size();
  for (std::size_t k = 0; k < n; ++k) {
    std::size_t rem = k, gidx = 0;
    for (std::size_t d = R; d-- > 0;) {
      idx[d] = rem % local.extent(d);
      rem /= local.extent(d);
    }
    for (std::size_t d = 0; d < R; ++d) gidx = gidx * global[d] + box[d].offset + idx[d];
    std::ptrdiff_t off = 0;
    for (std::size_t d = 0; d < R; ++d) off += std::ptrdiff_t(idx[d]) * local.stride(d);
    local.data()[off] = convert<std::remove_const_t<T>>(init_value(seed, param_id, gidx, spec));
  }
}

/** @brief Fills a whole (unsharded) tensor. */
template <class T, std::size_t R>
void init_full(Tensor<T, R>& t, std::uint64_t seed, std::uint64_t param_id, const InitSpec& spec) {
  Box<R> box{};
  for (std::size_t d = 0; d < R; ++d) box[d] = {0, t.extent(d)};
  init_shard(t.view(), t.shape(), box, seed, param_id, spec);
}

}  // namespace mpar
