#pragma once
/**
 * @file `Stage<L1, L2, ...>`: layers composed into one callable stage, with the layout contract of
 * every link checked at compile time.
 *
 * The layout entering the stage is the first layer's `default_input`. For each link the layout
 * leaving one layer (its `output_layout<In>`) must be accepted by the next layer's `check_input`;
 * the check runs whenever the Stage type is instantiated (constructing one is enough). A refused link
 * stops compilation with exactly one static_assert, written by the refusing layer, saying what is
 * wrong and how to fix it; its instantiation context `check_link<Prev, Next, Layout, Features>`
 * names both layer types and the layout. Static feature sizes of consecutive layers must agree
 * (dynamic ones are checked once at construction, with an exception naming both layers and sizes).
 */
#include <cstddef>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/nn/layer.hpp"

namespace mpar::nn {

namespace detail {

/** Stands for "whatever feeds the stage" in diagnostics of the first layer. */
struct StageInput {
  static constexpr std::string_view layer_kind = "Stage input";
};

/** A static feature count as it appears in diagnostics: `features<4096>`, or `dyn_features`. */
template <std::size_t N>
struct features {};
struct dyn_features {};
template <std::size_t N>
using features_t = std::conditional_t<N == dyn, dyn_features, features<N>>;

/**
 * One link: `Prev` returned a tensor of layout `Layout` with `Features` static features; `Next` judges
 * the layout with its own `check_input` (and its own message); the feature sizes are compared here.
 * Returns true when the two layers compose.
 */
template <class Prev, class Next, class Layout, class Features, std::size_t F>
constexpr bool check_link() {
  if constexpr (!Next::template check_input<Layout>()) {
    return false;
  } else {
    constexpr bool features_clash =
        !Next::preserves_features && F != dyn && Next::static_in_features != dyn && F != Next::static_in_features;
    static_assert(!features_clash,
                  "mpar::nn::Stage: consecutive layers disagree on the feature size: the previous layer returns "
                  "'Features' features (see above) but the next layer's static In differs. Fix: make the next layer's "
                  "In equal the previous layer's Out");
    return !features_clash;
  }
}

/** Folds the links left to right; stops at the first bad link so only one diagnostic appears. */
template <class Prev, class Layout, std::size_t F, class Next, class... Rest>
constexpr bool check_chain() {
  if constexpr (!check_link<Prev, Next, Layout, features_t<F>, F>()) {
    return false;
  } else if constexpr (sizeof...(Rest) == 0) {
    return true;
  } else {
    constexpr std::size_t next_f = Next::preserves_features ? F : Next::static_out_features;
    return check_chain<Next, typename Next::template output_layout<Layout>, next_f, Rest...>();
  }
}

template <class Layout, std::size_t F, class... Ls>
struct stage_fold {
  using layout = Layout;
  static constexpr std::size_t features = F;
};
template <class Layout, std::size_t F, class L, class... Rest>
struct stage_fold<Layout, F, L, Rest...> : stage_fold<typename L::template output_layout<Layout>,
                                                      (L::preserves_features ? F : L::static_out_features), Rest...> {};

/** Read by Stage's class-body check: a refused link has already produced its one message. */
inline constexpr bool diagnosed_by_the_refusing_layer = true;

template <class L>
inline constexpr std::size_t static_input_features_v = L::preserves_features ? dyn : L::static_in_features;

}  // namespace detail

/**
 * @brief Layers composed into one stage: `forward` runs them in order, `backward` in reverse; the
 * stage itself satisfies `layer`, so stages nest. Construct it from the layer objects.
 *
 * Typed only: `forward(Act<In>) -> Act<Out>` and `backward(Act<grad of Out>) -> Act<grad of In>` for
 * the checked chain (a pipeline boundary re-establishes the layout from the stage's declaration:
 * pipeline/pipeline_part.hpp).
 *
 * The backward also splits (`split_backward_layer`): `backward_input` runs every layer's B in reverse
 * order (a layer without a split runs its whole backward there), `backward_weight` every layer's W.
 */
template <layer First, layer... Rest>
class Stage : public detail::TypedLayer<Stage<First, Rest...>> {
  using Typed = detail::TypedLayer<Stage<First, Rest...>>;

 public:
  using input_layout = typename First::default_input;

 private:
  using fold = detail::stage_fold<input_layout, detail::static_input_features_v<First>, First, Rest...>;

 public:
  /** Whether every link composes (a refused link has stopped compilation with its own message). */
  static constexpr bool composes =
      detail::check_chain<detail::StageInput, input_layout, detail::static_input_features_v<First>, First, Rest...>();
  // Unconditional: instantiating the Stage (constructing one) runs every link's check. A refused
  // link has already stopped compilation with its own message, so this assertion adds none.
  static_assert(composes || detail::diagnosed_by_the_refusing_layer);

  static constexpr std::string_view layer_kind = "Stage";
  using default_input = input_layout;
  static constexpr bool preserves_features = false;
  static constexpr std::size_t static_in_features = detail::static_input_features_v<First>;
  static constexpr std::size_t static_out_features = fold::features;
  /** A stage takes what its first layer takes, and only in the layout the chain was checked for. */
  template <class L>
  static constexpr bool check_input() {
    if constexpr (std::is_same_v<L, input_layout>) {
      return true;
    } else if constexpr (!First::template check_input<L>()) {
      return false;
    } else {
      static_assert(detail::always_false_v<L>,
                    "mpar::nn::Stage: fed a layout its first layer takes, but not the first layer's default_input that "
                    "the stage's chain was checked for (see L above). Fix: declare the first layer for that layout "
                    "(e.g. Dropout<L>), or redistribute the input first (nn/redistributions.hpp)");
      return false;
    }
  }
  template <class L>
  using output_layout = typename fold::layout;

  /** Typed forward: each layer's typed forward in turn (the chain was checked when the type was built). */
  template <class In>
  auto forward(const Act<In>& x, int mb = 0) {
    if constexpr (check_input<In>() && composes)
      return std::apply([&](auto&... l) { return typed_forward_each(x, mb, l...); }, layers_);
    else
      return Act<typename fold::layout>{};  // refused with its own message
  }
  /** Typed B: each layer's typed backward_input (or whole backward) in reverse order; each layer keeps what its
   *  weight gradient needs for micro-batch `mb`. */
  template <class G>
  auto backward_input(const Act<G>& dy, int mb = 0) {
    if constexpr (composes)
      return typed_backward_from<sizeof...(Rest)>(dy, mb);
    else
      return Act<grad_layout_t<input_layout>>{};
  }
  /** Typed backward: B then W. */
  template <class G>
  auto backward(const Act<G>& dy, int mb = 0) {
    auto dx = backward_input(dy, mb);
    backward_weight(mb);
    return dx;
  }

  explicit Stage(First first, Rest... rest) : layers_(std::move(first), std::move(rest)...) { check_features(); }

  /** W: every layer's weight gradients for micro-batch `mb` (last layer first, as the fused backward). */
  void backward_weight(int mb = 0) { weight_from<sizeof...(Rest)>(mb); }
  std::vector<Parameter*> parameters() {
    std::vector<Parameter*> ps;
    std::apply([&](auto&... l) { (detail::append(ps, l.parameters()), ...); }, layers_);
    return ps;
  }
  void drop(int mb) {
    std::apply([&](auto&... l) { (l.drop(mb), ...); }, layers_);
  }
  [[nodiscard]] std::size_t in_features() const {
    std::size_t f = 0;
    std::apply([&](const auto&... l) { ((f == 0 ? (void)(f = l.in_features()) : void()), ...); }, layers_);
    return f;
  }
  [[nodiscard]] std::size_t out_features() const {
    std::size_t f = 0;
    std::apply([&](const auto&... l) { ((l.out_features() != 0 ? (void)(f = l.out_features()) : void()), ...); },
               layers_);
    return f;
  }
  template <std::size_t I>
  [[nodiscard]] auto& get() {
    return std::get<I>(layers_);
  }
  static constexpr std::size_t size() { return 1 + sizeof...(Rest); }

 private:
  template <class X, class L, class... Ls>
  static auto typed_forward_each(const X& x, int mb, L& l, Ls&... ls) {
    if constexpr (sizeof...(Ls) == 0)
      return l.forward(x, mb);
    else
      return typed_forward_each(l.forward(x, mb), mb, ls...);
  }
  template <std::size_t I, class G>
  auto typed_backward_from(const Act<G>& dy, int mb) {
    if constexpr (I == 0)
      return detail::backward_input_of(std::get<0>(layers_), dy, mb);
    else
      return typed_backward_from<I - 1>(detail::backward_input_of(std::get<I>(layers_), dy, mb), mb);
  }
  template <std::size_t I>
  void weight_from(int mb) {
    detail::backward_weight_of(std::get<I>(layers_), mb);
    if constexpr (I > 0) weight_from<I - 1>(mb);
  }
  void check_features() const {
    // Elementwise layers pass features through, so a size is compared with the last layer that set it.
    std::size_t cur = 0, index = 0, prev_index = 0;
    std::string_view prev_kind = detail::StageInput::layer_kind;
    auto visit = [&](const auto& l) {
      using L = std::remove_cvref_t<decltype(l)>;
      if constexpr (!L::preserves_features) {
        require(cur == 0 || l.in_features() == cur, "Stage: layer ", index, " (", L::layer_kind, ") takes ",
                l.in_features(), " features but layer ", prev_index, " (", prev_kind, ") returns ", cur,
                "; make the sizes of consecutive layers agree");
        cur = l.out_features();
        prev_kind = L::layer_kind;
        prev_index = index;
      }
      ++index;
    };
    std::apply([&](const auto&... l) { (visit(l), ...); }, layers_);
  }

  std::tuple<First, Rest...> layers_;
};

}  // namespace mpar::nn
