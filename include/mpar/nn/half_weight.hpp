#pragma once
/**
 * @file `HalfWeight`: the 16-bit copy of an fp32 weight that a GEMM multiplies inside an `Autocast` scope (the
 * linear layers, the tied LM head, `Linear2D`, the MoE experts): the mixed-precision optimizer's compute copy
 * where it has one, else converted once per scope.
 */
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "mpar/backend/backend.hpp"
#include "mpar/core/dtype.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/nn/autocast.hpp"
#include "mpar/nn/parameter.hpp"

namespace mpar::nn {

/**
 * @brief The 16-bit copy of one fp32 weight: `get<B, T>(p)` is the optimizer's compute copy of `p` where one is
 * current (`Parameter::compute_copy`, between its `begin_compute` and `end_compute`); otherwise it converts
 * `p.value` with `B::convert` the first time it is asked for in an `Autocast` generation (or for another type)
 * and returns the same copy until the next scope. The weight must not change inside a scope (the trainer
 * updates weights between scopes).
 */
class HalfWeight {
 public:
  template <backend B, mpar::detail::half_precision T>
  const T* get(const Parameter& p) {
    const std::span<const float> w = p.value;
    const std::span<const T> rounded = p.template compute_copy<T>();
    if (!rounded.empty() && rounded.size() == w.size()) return rounded.data();  // made this step from the master
    Buffer<T>& h = storage<T>();
    const std::uint64_t gen = autocast_generation();
    const ComputeType t = std::is_same_v<T, bf16> ? ComputeType::bf16 : ComputeType::f16;
    if (gen == 0 || gen != gen_ || type_ != t || h.size() != w.size()) {
      if (h.size() != w.size()) h = B::template allocate<T>(w.size());
      if (!w.empty()) B::run(ops::convert<float, T>{.n = w.size(), .src = w.data(), .dst = h.data()});
      type_ = t;
      gen_ = gen;
    }
    return h.data();
  }

 private:
  template <class T>
  Buffer<T>& storage() {
    if constexpr (std::is_same_v<T, bf16>)
      return b16_;
    else
      return h16_;
  }
  Buffer<bf16> b16_;
  Buffer<f16> h16_;
  ComputeType type_ = ComputeType::fp32;
  std::uint64_t gen_ = 0;
};

/** @brief `x` converted to 16-bit `T` into fresh rank memory (one `B::convert`): a GEMM operand under Autocast. */
template <backend B, mpar::detail::half_precision T>
[[nodiscard]] Buffer<T> to_half(std::span<const float> x) {
  Buffer<T> h = B::template allocate<T>(x.size());
  if (!x.empty()) B::run(ops::convert<float, T>{.n = x.size(), .src = x.data(), .dst = h.data()});
  return h;
}

}  // namespace mpar::nn
