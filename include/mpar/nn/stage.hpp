#pragma once
/**
 * @file `Stage<L1, L2, ...>`: layers composed into one callable stage, with the layout contract of
 * every link checked at compile time.
 *
 * The layout entering the stage is the first layer's `default_input`. For each link the layout
 * leaving one layer (its `output_layout<In>`) must be accepted by the next; otherwise compilation
 * stops with exactly one static_assert whose message says what is wrong and how to fix it, and
 * whose instantiation context `layers_do_not_compose<Prev, Next, Layout>` names both layer types and
 * the layout. Static feature sizes of consecutive layers must agree (dynamic ones are checked once at
 * construction, with an exception naming both layers and the sizes).
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

template <class...>
inline constexpr bool always_false_v = false;

/**
 * The diagnostic ladder of one link: one static_assert per cause, so a wrong stage produces one
 * readable message. `Prev` returned a tensor of layout `Layout` with `Features` static features.
 */
template <class Prev, class Next, class Layout, std::size_t Features>
constexpr bool layers_do_not_compose() {
  constexpr Verdict v = Next::template accepts<Layout>();
  constexpr bool features_clash = !Next::preserves_features && Features != dyn && Next::static_in_features != dyn &&
                                  Features != Next::static_in_features;
  if constexpr (v == Verdict::needs_feature_shard && std::is_same_v<Layout, Replicate>) {
    static_assert(always_false_v<Prev, Next, Layout>,
                  "mpar::nn::Stage: a RowParallel layer needs its input split by features (Shard<1, tensor>), but the "
                  "previous layer returns a Replicate tensor. Fix: insert ColumnParallel before RowParallel (or use "
                  "ColumnParallel here instead of RowParallel)");
  } else if constexpr (v == Verdict::needs_feature_shard && std::is_same_v<Layout, TokenShard>) {
    static_assert(always_false_v<Prev, Next, Layout>,
                  "mpar::nn::Stage: a RowParallel layer needs its input split by features (Shard<1, tensor>), but the "
                  "previous layer returns a token-sharded tensor (Shard<0, tensor>). Fix: insert a sequence-parallel "
                  "ColumnParallel (ColumnOptions{.sequence_parallel = true}) before RowParallel");
  } else if constexpr (v == Verdict::needs_feature_shard) {
    static_assert(always_false_v<Prev, Next, Layout>,
                  "mpar::nn::Stage: this layer needs its input split by features (Shard<1, tensor>), but the previous "
                  "layer returns a Partial (unreduced) tensor. Fix: reduce first (RowParallel with RowReduce::all_reduce, "
                  "or insert AllReduce), then a ColumnParallel");
  } else if constexpr (v == Verdict::nonlinear_fed_partial) {
    static_assert(always_false_v<Prev, Next, Layout>,
                  "mpar::nn::Stage: a nonlinear layer (Gelu, Dropout, LayerNorm, attention) is fed a Partial<sum, tensor> "
                  "tensor by the previous layer; f(a + b) != f(a) + f(b). Fix: reduce first: give the RowParallel "
                  "RowReduce::all_reduce, or insert AllReduce between the two layers");
  } else if constexpr (v == Verdict::linear_fed_partial) {
    static_assert(always_false_v<Prev, Next, Layout>,
                  "mpar::nn::Stage: a ColumnParallel/Linear layer is fed a Partial<sum, tensor> tensor by the previous "
                  "layer, which would add its bias once per rank. Fix: insert AllReduce between the two layers (or give "
                  "the RowParallel RowReduce::all_reduce)");
  } else if constexpr (v == Verdict::needs_full_features) {
    static_assert(always_false_v<Prev, Next, Layout>,
                  "mpar::nn::Stage: this layer (ColumnParallel, Linear or LayerNorm) needs whole rows, but the previous "
                  "layer returns a feature-sharded tensor (Shard<1, tensor>). Fix: use RowParallel here (it consumes "
                  "Shard<1, tensor>), or insert GatherFeatures (or set ColumnOptions{.gather_output = true} on the "
                  "previous ColumnParallel)");
  } else if constexpr (v == Verdict::needs_token_shard) {
    static_assert(always_false_v<Prev, Next, Layout>,
                  "mpar::nn::Stage: a sequence-parallel layer expects a token-sharded input (Shard<0, tensor>), but the "
                  "previous layer returns another layout (Replicate?). Fix: give the previous RowParallel "
                  "RowReduce::reduce_scatter, or use the non-sequence-parallel form of this layer");
  } else if constexpr (v == Verdict::needs_replicated) {
    static_assert(always_false_v<Prev, Next, Layout>,
                  "mpar::nn::Stage: this layer expects a Replicate input, but the previous layer returns a token-sharded "
                  "tensor (Shard<0, tensor>, sequence parallelism). Fix: use the sequence-parallel form of this layer "
                  "(ColumnOptions{.sequence_parallel = true}, LayerNorm<Shard<0, axis::tensor>, C>)");
  } else if constexpr (v == Verdict::layout_parameter_mismatch) {
    static_assert(always_false_v<Prev, Next, Layout>,
                  "mpar::nn::Stage: this layer was declared for another layout than the previous layer returns "
                  "(e.g. Dropout<Replicate> after a ColumnParallel). Fix: declare it with the layout shown as "
                  "'Layout' above (Dropout<Shard<1, axis::tensor>>), or AllReduce only after a Partial");
  } else if constexpr (v == Verdict::needs_2d_shard) {
    static_assert(always_false_v<Prev, Next, Layout>,
                  "mpar::nn::Stage: a 2D-parallel layer (Linear2D) needs a tensor sharded on both grid axes "
                  "(Layout2D<Shard<0, tensor_row>, Shard<1, tensor_col>>). Fix: feed it another Linear2D or shard the "
                  "input with the same Layout2D");
  } else if constexpr (features_clash) {
    static_assert(always_false_v<Prev, Next, Layout>,
                  "mpar::nn::Stage: consecutive layers disagree on the feature size: the previous layer returns "
                  "'Features' features (see above) but the next layer's static In differs. Fix: make the next layer's "
                  "In equal the previous layer's Out");
  }
  return v == Verdict::ok && !features_clash;
}

/** Folds the links left to right; stops at the first bad link so only one diagnostic appears. */
template <class Prev, class Layout, std::size_t F, class Next, class... Rest>
constexpr bool check_chain() {
  if constexpr (!layers_do_not_compose<Prev, Next, Layout, F>()) {
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
struct stage_fold<Layout, F, L, Rest...>
    : stage_fold<typename L::template output_layout<Layout>, (L::preserves_features ? F : L::static_out_features), Rest...> {};

template <class L>
inline constexpr std::size_t static_input_features_v = L::preserves_features ? dyn : L::static_in_features;

}  // namespace detail

/**
 * @brief Layers composed into one stage: `forward` runs them in order, `backward` in reverse; the
 * stage itself satisfies `layer`, so stages nest. Construct it from the layer objects.
 *
 * The backward also splits (`split_backward_layer`): `backward_input` runs every layer's B in reverse
 * order (a layer without a split runs its whole backward there), `backward_weight` every layer's W.
 */
template <layer First, layer... Rest>
class Stage : public detail::BackwardFromSplit<Stage<First, Rest...>> {
 public:
  using input_layout = typename First::default_input;
  static constexpr bool valid =
      detail::check_chain<detail::StageInput, input_layout, detail::static_input_features_v<First>, First, Rest...>();
  using fold = detail::stage_fold<input_layout, detail::static_input_features_v<First>, First, Rest...>;

  static constexpr std::string_view layer_kind = "Stage";
  using default_input = input_layout;
  static constexpr bool preserves_features = false;
  static constexpr std::size_t static_in_features = detail::static_input_features_v<First>;
  static constexpr std::size_t static_out_features = fold::features;
  template <class L>
  static constexpr Verdict accepts() {
    if constexpr (std::is_same_v<L, input_layout>) return Verdict::ok;
    else if constexpr (First::template accepts<L>() != Verdict::ok) return First::template accepts<L>();
    else return Verdict::layout_parameter_mismatch;
  }
  template <class L>
  using output_layout = typename fold::layout;

  explicit Stage(First first, Rest... rest) : layers_(std::move(first), std::move(rest)...) { check_features(); }

  Activation forward(const Activation& x, int mb = 0) {
    return std::apply([&](auto&... l) { return forward_each(x, mb, l...); }, layers_);
  }
  /** B: the input gradient; each layer keeps what its weight gradient needs for micro-batch `mb`. */
  Activation backward_input(const Activation& dy, int mb = 0) {
    return backward_from<sizeof...(Rest)>(dy, mb);
  }
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
    std::apply([&](const auto&... l) { ((l.out_features() != 0 ? (void)(f = l.out_features()) : void()), ...); }, layers_);
    return f;
  }
  template <std::size_t I>
  [[nodiscard]] auto& get() {
    return std::get<I>(layers_);
  }
  static constexpr std::size_t size() { return 1 + sizeof...(Rest); }

 private:
  template <class L, class... Ls>
  static Activation forward_each(const Activation& x, int mb, L& l, Ls&... ls) {
    if constexpr (sizeof...(Ls) == 0) return l.forward(x, mb);
    else return forward_each(l.forward(x, mb), mb, ls...);
  }
  template <std::size_t I>
  Activation backward_from(const Activation& dy, int mb) {
    if constexpr (I == 0) return detail::backward_input_of(std::get<0>(layers_), dy, mb);
    else return backward_from<I - 1>(detail::backward_input_of(std::get<I>(layers_), dy, mb), mb);
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
