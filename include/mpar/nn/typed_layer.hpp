#pragma once
/**
 * @file `TypedLayer`: the base every nn layer derives from (its typed forward and backward over `Act<L>`,
 * the input-layout checks), and the helpers the layers share (`detail::`).
 */
#include <array>
#include <concepts>
#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/core/extents.hpp"
#include "mpar/core/mesh.hpp"
#include "mpar/nn/activation.hpp"
#include "mpar/nn/detail/droppable_module.hpp"
#include "mpar/nn/detail/split_backward_module.hpp"
#include "mpar/nn/module.hpp"
#include "mpar/nn/parameter.hpp"

namespace mpar::nn {

namespace detail {
/** B of any layer on a typed gradient: its `backward_input` when it splits its backward, else its whole backward. */
template <class L, class G>
auto backward_input_of(L& l, const Act<G>& dy, int mb) {
  if constexpr (requires { l.backward_input(dy, mb); })
    return l.backward_input(dy, mb);
  else
    return l.backward(dy, mb);
}
/** W of any layer: its `backward_weight` when it splits its backward; nothing otherwise (B did all the work). */
template <class L>
void backward_weight_of(L& l, int mb) {
  if constexpr (requires { l.backward_weight(mb); }) l.backward_weight(mb);
}

template <class>
inline constexpr bool always_false_v = false;

/** True for a typed activation `Act<L>`. */
template <class X>
inline constexpr bool is_act_v = false;
template <class L>
inline constexpr bool is_act_v<Act<L>> = true;

/** The layout of the input whose gradient is `G`: the layer's own `input_for_grad<G>` if it has one, else `default_input`. */
template <class D, class G>
struct input_for_grad {
  using type = typename D::default_input;
};
template <class D, class G>
  requires requires { typename D::template input_for_grad<G>; }
struct input_for_grad<D, G> {
  using type = typename D::template input_for_grad<G>;
};

/**
 * The typed face of a layer (CRTP base): `forward(Act<In>) -> Act<output_layout<In>>` after the
 * layer's own `check_input<In>()`, and `backward(Act<G>) -> Act<grad_layout_t<In>>` /
 * `backward_input` where `G` must be the gradient layout of the output. These are the only public
 * entries: the layer does its work in private `do_forward(const Activation&, mb)` and
 * `do_backward(dy, mb)` or `do_backward_input(dy, mb)` on the same storage (it befriends this base),
 * so the typed call costs nothing and no caller can skip the layout check. A call with a bare tensor
 * stops compilation with a message saying how to state its layout.
 *
 * It also supplies the fused backward of a layer that splits its backward: `backward_input` then
 * `backward_weight`, so every split layer states "B then W" once.
 */
template <class D>
class TypedLayer {
 public:
  template <class In>
  auto forward(const Act<In>& x, int mb = 0) {
    // A refused layout stops compilation inside check_input with the layer's message; the result is
    // then what a correctly fed layer returns, so the caller's code adds no second error.
    if constexpr (D::template check_input<In>())
      return Act<typename D::template output_layout<In>>(self().do_forward(x.tensor(), mb));
    else
      return refused_output();
  }
  /**
   * An input the caller gives up (an rvalue) reaches the layer as an rvalue: a layer with
   * `do_forward(Activation&&, mb)` may keep or return its storage instead of copying it (a layer
   * without one reads it through its `const Activation&` entry, as before).
   */
  template <class In>
  auto forward(Act<In>&& x, int mb = 0) {
    if constexpr (!requires(D & d, Activation && a) { d.do_forward(std::move(a), 0); })
      return self().forward(std::as_const(x), mb);  // a layer with its own typed forward: it reads x as before
    else if constexpr (D::template check_input<In>())
      return Act<typename D::template output_layout<In>>(self().do_forward(std::move(x).tensor(), mb));
    else
      return refused_output();
  }
  template <class G>
  auto backward(const Act<G>& dy, int mb = 0) {
    using In = typename input_for_grad<D, G>::type;
    if constexpr (!sound()) {
      return Act<grad_layout_t<In>>{};  // its own diagnostic was already given
    } else if constexpr (requires(D & d) { d.backward_weight(mb); }) {
      // A layer that splits its backward: its typed B (which checks G), then W.
      auto dx = self().backward_input(dy, mb);
      self().backward_weight(mb);
      return dx;
    } else if constexpr (check_grad<In, G>()) {
      return Act<grad_layout_t<In>>(self().do_backward(dy.tensor(), mb));
    } else {
      return Act<grad_layout_t<In>>{};
    }
  }
  template <class G>
    requires requires(D& d, const Activation& a) { d.do_backward_input(a, 0); }
  auto backward_input(const Act<G>& dy, int mb = 0) {
    using In = typename input_for_grad<D, G>::type;
    if constexpr (!sound())
      return Act<grad_layout_t<In>>{};
    else if constexpr (check_grad<In, G>())
      return Act<grad_layout_t<In>>(self().do_backward_input(dy.tensor(), mb));
    else
      return Act<grad_layout_t<In>>{};
  }
  // A bare tensor (no layout in its type) is refused here, with the fix, rather than by "no matching function";
  // the declared result is what the layer returns for its declared input, so the caller's code adds no second error.
  template <class T, class Self = D>
    requires(!is_act_v<T>)
  auto forward(const T&, int = 0) -> Act<typename Self::template output_layout<typename Self::default_input>> {
    static_assert(
        always_false_v<T>,
        "mpar::nn: a layer's forward takes a typed activation Act<Layout>, not a bare Tensor<float, 2>: the "
        "layout in the type is what the layer checks its input against (see D, the layer, above). Fix: state "
        "the layout once where the tensor enters, e.g. layer.forward(Act<Replicate>(x)) (the layer's declared "
        "input is D::default_input); every layer's output is then already typed");
    return {};
  }
  template <class T, class Self = D>
    requires(!is_act_v<T>)
  auto backward(const T&, int = 0) -> Act<grad_layout_t<typename Self::default_input>> {
    static_assert(always_false_v<T>,
                  "mpar::nn: a layer's backward takes the typed gradient Act<Layout> of its output, not a bare "
                  "Tensor<float, 2> (see D, the layer, above). Fix: pass the gradient the next layer's backward "
                  "returned, or state its layout once, e.g. layer.backward(Act<Replicate>(dy)) (the gradient layout of "
                  "the layer's output: grad_layout_t<output_layout<In>>)");
    return {};
  }
  template <class T, class Self = D>
    requires(!is_act_v<T>)
  auto backward_input(const T&, int = 0) -> Act<grad_layout_t<typename Self::default_input>> {
    static_assert(always_false_v<T>,
                  "mpar::nn: a layer's backward_input takes the typed gradient Act<Layout> of its output, not a bare "
                  "Tensor<float, 2> (see D, the layer, above). Fix: pass the gradient the next layer's backward "
                  "returned, or state its layout once, e.g. layer.backward_input(Act<Replicate>(dy))");
    return {};
  }

 private:
  D& self() { return static_cast<D&>(*this); }
  /** What the layer returns for its declared input: the stand-in result of a refused call (never run). */
  static auto refused_output() { return Act<typename D::template output_layout<typename D::default_input>>{}; }
  /** False only for a composite (a Stage) whose own chain was refused, so its backward adds no second error. */
  static constexpr bool sound() {
    if constexpr (requires { D::composes; })
      return D::composes;
    else
      return true;
  }
  template <class In, class G>
  static constexpr bool check_grad() {
    constexpr bool ok = std::is_same_v<G, grad_layout_t<typename D::template output_layout<In>>>;
    static_assert(ok,
                  "mpar::nn: backward is given a gradient whose layout is not the gradient layout of this layer's "
                  "output (see D and G above). Fix: pass the gradient the next layer's backward returned, or "
                  "redistribute it first (nn/redistributions.hpp)");
    return ok;
  }
};

/**
 * The input rule shared by layers that need whole rows (`LayerNorm`, attention, a transformer block):
 * they take `Expected` (`Replicate`, or `Shard<0, tensor>` under sequence parallelism) and nothing else.
 */
template <class Expected, class In>
constexpr bool check_whole_rows() {
  if constexpr (std::is_same_v<In, Expected>) {
    return true;
  } else if constexpr (In::is_partial) {
    static_assert(
        always_false_v<In>,
        "mpar::nn: a layer that needs whole rows (LayerNorm, attention, a transformer block) is fed a "
        "Partial<sum, tensor> tensor; its statistics of a + b are not those of a plus those of b. Fix: reduce "
        "first: give the RowParallel RowReduce::all_reduce, or insert AllReduce between the two layers");
    return false;
  } else if constexpr (In::is_sharded && In::sharded_dim == 1) {
    static_assert(always_false_v<In>,
                  "mpar::nn: a layer that needs whole rows (LayerNorm, attention, a transformer block) is fed a "
                  "feature-sharded tensor (Shard<1, tensor>). Fix: use RowParallel before it (it consumes "
                  "Shard<1, tensor>), or insert GatherFeatures (or set ColumnOptions{.gather_output = true} on the "
                  "previous ColumnParallel)");
    return false;
  } else if constexpr (std::is_same_v<Expected, TokenShard>) {
    static_assert(
        always_false_v<In>,
        "mpar::nn: a sequence-parallel layer (LayerNorm<Shard<0, axis::tensor>, C>, SP attention or block) "
        "expects a token-sharded input (Shard<0, tensor>) but is fed another layout (see In above). Fix: give "
        "the previous RowParallel RowReduce::reduce_scatter, or use the non-sequence-parallel form");
    return false;
  } else {
    static_assert(always_false_v<In>,
                  "mpar::nn: this layer expects a Replicate input but is fed another layout (a token-sharded "
                  "Shard<0, tensor> under sequence parallelism?). Fix: use the sequence-parallel form of this layer "
                  "(LayerNorm<Shard<0, axis::tensor>, C>, SelfAttention<..., SP = true>)");
    return false;
  }
}

/** The parameter-free, feature-preserving half of a layer: no parameters, `in_features() == out_features() == 0`. */
class NoParameters {
 public:
  std::vector<Parameter*> parameters() { return {}; }
  [[nodiscard]] std::size_t in_features() const { return 0; }
  [[nodiscard]] std::size_t out_features() const { return 0; }
};

/**
 * Builds the `std::vector<Parameter*>` of a layer from its members, leaving out the absent ones (a layer
 * without bias keeps a default `Parameter`: no values, no shape). A parameter whose values are released
 * between uses (ZeRO-3) has its shape and is listed.
 */
template <class... P>
std::vector<Parameter*> param_list(P*... p) {
  std::vector<Parameter*> v;
  ((p != nullptr && (!p->value.empty() || !p->global_shape.empty()) ? v.push_back(p) : void()), ...);
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
inline std::size_t reconcile(std::size_t static_value, std::size_t runtime, std::string_view layer,
                             std::string_view what) {
  if (static_value == dyn) return runtime;
  require(runtime == 0 || runtime == static_value, layer, ": ", what, " is ", runtime,
          " at construction but the type fixes it to ", static_value);
  return static_value;
}
}  // namespace detail

}  // namespace mpar::nn
