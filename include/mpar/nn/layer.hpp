#pragma once
/**
 * @file The layer contract: what every layer declares about the layouts it accepts and returns,
 * and the `layer` concept the pipeline and training code program against.
 */
#include <array>
#include <concepts>
#include <cstddef>
#include <string_view>
#include <type_traits>
#include <vector>

#include "mpar/core/extents.hpp"
#include "mpar/core/mesh.hpp"
#include "mpar/nn/activation.hpp"
#include "mpar/nn/parameter.hpp"

namespace mpar::nn {

/**
 * @brief A layer's answer to "can you take a tensor of layout `In`?". Each refusal is one cause with
 * its own diagnostic in `Stage` (see stage.hpp), so the message can say how to fix it.
 */
enum class Verdict {
  ok,
  needs_feature_shard,         ///< a row-parallel layer fed a tensor whose features are not split
  nonlinear_fed_partial,       ///< a nonlinear layer fed a Partial (unreduced) tensor
  linear_fed_partial,          ///< a layer with a bias or a column split fed a Partial tensor
  needs_full_features,         ///< a layer that needs whole rows fed a feature-sharded tensor
  needs_token_shard,           ///< a sequence-parallel layer fed a tensor that is not token-sharded
  needs_replicated,            ///< a non-sequence-parallel layer fed a token-sharded tensor
  layout_parameter_mismatch,   ///< a layer declared for layout L (e.g. Dropout<L>) fed another layout
  needs_2d_shard               ///< a 2D-parallel layer fed a tensor that is not 2D-sharded
};

/**
 * @brief The static half of a layer: `layer_kind` (its name in messages), `default_input` (the
 * layout it expects when it is first in a Stage), `accepts<In>()` (a Verdict), `output_layout<In>`
 * (the layout it returns), `preserves_features` (elementwise layers) and, for the others,
 * `static_in_features` / `static_out_features` (a size or `dyn`).
 */
template <class L>
concept layer_contract = requires {
  { L::layer_kind } -> std::convertible_to<std::string_view>;
  typename L::default_input;
  { L::template accepts<typename L::default_input>() } -> std::same_as<Verdict>;
  typename L::template output_layout<typename L::default_input>;
  { L::preserves_features } -> std::convertible_to<bool>;
  { L::static_in_features } -> std::convertible_to<std::size_t>;
  { L::static_out_features } -> std::convertible_to<std::size_t>;
};

/**
 * @brief A layer: the static contract plus `forward(x, mb) -> y`, `backward(dy, mb) -> dx` (which
 * accumulates parameter gradients into Parameter::grad), `parameters()`, `drop(mb)` (free the
 * activations saved for micro-batch `mb`), and run-time `in_features()` / `out_features()` (0 for
 * layers that preserve their input's features).
 */
template <class L>
concept layer = layer_contract<L> && requires(L& l, const Activation& x, int mb) {
  { l.forward(x, mb) } -> std::same_as<Activation>;
  { l.backward(x, mb) } -> std::same_as<Activation>;
  { l.parameters() } -> std::same_as<std::vector<Parameter*>>;
  l.drop(mb);
  { l.in_features() } -> std::convertible_to<std::size_t>;
  { l.out_features() } -> std::convertible_to<std::size_t>;
};

/**
 * @brief A layer whose backward splits in two, for zero-bubble pipeline schedules:
 * `backward_input(dy, mb) -> dx` (B: the input gradient, with every tensor-parallel collective it
 * needs; it keeps what the weight gradient needs for micro-batch `mb`) and `backward_weight(mb)` (W:
 * the weight gradients `dW = xᵀ·dy`, accumulated into Parameter::grad; frees what B kept).
 * `backward(dy, mb)` equals B followed by W. Several micro-batches may sit between their B and W.
 */
template <class L>
concept split_backward_layer = layer<L> && requires(L& l, const Activation& dy, int mb) {
  { l.backward_input(dy, mb) } -> std::same_as<Activation>;
  l.backward_weight(mb);
};

namespace detail {
/** B of any layer: its `backward_input` when it splits its backward, else its whole backward (W is then empty). */
template <class L>
Activation backward_input_of(L& l, const Activation& dy, int mb) {
  if constexpr (requires { { l.backward_input(dy, mb) } -> std::same_as<Activation>; }) return l.backward_input(dy, mb);
  else return l.backward(dy, mb);
}
/** W of any layer: its `backward_weight` when it splits its backward; nothing otherwise (B did all the work). */
template <class L>
void backward_weight_of(L& l, int mb) {
  if constexpr (requires { l.backward_weight(mb); }) l.backward_weight(mb);
}

/**
 * The fused backward of a layer that splits its backward: `Derived::backward_input` then
 * `Derived::backward_weight` (CRTP base, so every split layer states "B then W" once).
 */
template <class Derived>
class BackwardFromSplit {
 public:
  /** The whole backward: backward_input then backward_weight. */
  Activation backward(const Activation& dy, int mb = 0) {
    auto& self = static_cast<Derived&>(*this);
    Activation dx = self.backward_input(dy, mb);
    self.backward_weight(mb);
    return dx;
  }
};

/**
 * The verdict of a nonlinear layer that needs whole rows in layout `Expected` (`Replicate`, or
 * `Shard<0, tensor>` under sequence parallelism) when it is fed layout `In`.
 */
template <class Expected, class In>
constexpr Verdict whole_rows_verdict() {
  if constexpr (std::is_same_v<In, Expected>) return Verdict::ok;
  else if constexpr (In::is_partial) return Verdict::nonlinear_fed_partial;
  else if constexpr (std::is_same_v<In, FeatureShard>) return Verdict::needs_full_features;
  else if constexpr (std::is_same_v<Expected, TokenShard>) return Verdict::needs_token_shard;
  else return Verdict::needs_replicated;
}

/** The parameter-free, feature-preserving half of a layer: no parameters, `in_features() == out_features() == 0`. */
class NoParameters {
 public:
  std::vector<Parameter*> parameters() { return {}; }
  [[nodiscard]] std::size_t in_features() const { return 0; }
  [[nodiscard]] std::size_t out_features() const { return 0; }
};

/** Builds the `std::vector<Parameter*>` of a layer from its members. */
template <class... P>
std::vector<Parameter*> param_list(P*... p) {
  std::vector<Parameter*> v;
  ((p != nullptr && !p->value.empty() ? v.push_back(p) : void()), ...);
  return v;
}
/** This rank's block of a tensor of shape `global` laid out as `L` on a tensor axis of `tp` ranks. */
template <class L, std::size_t R>
Box<R> tensor_box(const std::array<std::size_t, R>& global, std::size_t tp, std::size_t tp_rank) {
  const DynamicMesh mesh(tp, std::size_t(1), std::size_t(1), std::size_t(1));
  return L::template local_box<R>(global, mesh, mesh.coord(tp_rank));
}
inline void append(std::vector<Parameter*>& to, const std::vector<Parameter*>& from) {
  to.insert(to.end(), from.begin(), from.end());
}
/** A non-negative size from a static template argument and a run-time one; throws if they disagree. */
inline std::size_t reconcile(std::size_t static_value, std::size_t runtime, std::string_view layer, std::string_view what) {
  if (static_value == dyn) return runtime;
  require(runtime == 0 || runtime == static_value, layer, ": ", what, " is ", runtime,
          " at construction but the type fixes it to ", static_value);
  return static_value;
}
}  // namespace detail

}  // namespace mpar::nn
