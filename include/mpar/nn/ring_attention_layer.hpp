#pragma once
/**
 * @file `detail::RingAttentionLayer`: what the context-parallel attention layers (`RingSelfAttention`,
 * `RingGroupedQueryAttention`) share — the QKV projection, ring attention, the output projection, their passes and
 * bookkeeping — so that each layer states only how its projection's columns become the core's.
 */
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/nn/activation.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/layer.hpp"
#include "mpar/nn/ring_attention.hpp"

namespace mpar::nn {

namespace detail {
/**
 * What the context-parallel attention layers share: the fused QKV projection (column-parallel, heads over the tensor
 * group), ring attention over the context group, the output projection (row-parallel, all-reduced). `Derived`
 * supplies `layer_kind` and may hide `for_core` and `projection_gradient` to rearrange the projection's columns for
 * the core and back (grouped-query attention, rotary positions); it befriends this class and `TypedLayer<Derived>`.
 */
template <class Derived, communicator C, class Qkv, class Proj, backend B>
class RingAttentionLayer : public TypedLayer<Derived> {
  using Typed = TypedLayer<Derived>;

 public:
  using default_input = ContextShard;
  static constexpr bool preserves_features = false;
  static constexpr std::size_t static_in_features = dyn, static_out_features = dyn;
  template <class L>
  static constexpr bool check_input() {
    constexpr bool ok = std::is_same_v<L, ContextShard>;
    static_assert(ok || always_false_v<L>,
                  "mpar::nn's ring attention layers (RingSelfAttention, RingGroupedQueryAttention) take the rank's "
                  "tokens as zig-zag chunks over the context axis, whole rows on the tensor axis (Act<ContextShard>). "
                  "Fix: state the layout where the sequence is split (Act<ContextShard>(local_tokens)), or use the "
                  "unsplit layer (SelfAttention, GroupedQueryAttention)");
    return ok;
  }
  template <class L>
  using output_layout = ContextShard;
  using Typed::backward;
  using Typed::backward_input;
  using Typed::forward;

  void backward_weight(int mb = 0) {
    proj_.backward_weight(mb);
    qkv_.backward_weight(mb);
  }
  std::vector<Parameter*> parameters() {
    auto ps = qkv_.parameters();
    append(ps, proj_.parameters());
    return ps;
  }
  void drop(int mb) {
    qkv_.drop(mb);
    core_.drop(mb);
    proj_.drop(mb);
  }
  [[nodiscard]] std::size_t in_features() const { return qkv_.in_features(); }
  [[nodiscard]] std::size_t out_features() const { return proj_.out_features(); }

 protected:
  /** The projections are built by `make_qkv()` and `make_proj()` after `ring` (whose making checks the sizes). */
  template <class MakeQkv, class MakeProj>
  RingAttentionLayer(C& context, const RingAttentionConfig& ring, MakeQkv make_qkv, MakeProj make_proj)
      : core_(context, ring), qkv_(make_qkv()), proj_(make_proj()) {}

  /** The projection's output as the core reads it, `(q | k | v)`: the projection's own output here. */
  Activation for_core(Activation projected) { return projected; }
  /** The inverse map on the gradient: the core's dqkv as the projection's output gradient. */
  Activation projection_gradient(Activation dqkv) { return dqkv; }

  // On the tensor axis a rank's context tokens are whole rows, so the projections take them as Replicate and
  // return the heads' columns as Shard<1, tensor>; the core sees those columns with the tokens' context placement
  // (ContextHeads). Each restatement below names that step; only the input (a const reference) is copied, by the
  // backend (`backend_copy`: a host copy would read rank memory the host must not touch).
  Activation do_forward(const Activation& x, int mb) {
    Act<FeatureShard> qkv = qkv_.forward(Act<Replicate>(backend_copy<B>(x)), mb);
    Act<ContextHeads> o = core_.forward(Act<ContextHeads>(self().for_core(std::move(qkv).tensor())), mb);
    return proj_.forward(Act<FeatureShard>(std::move(o).tensor()), mb).tensor();
  }
  Activation do_backward_input(const Activation& dy, int mb) {
    Act<FeatureShard> dout = proj_.backward_input(Act<Replicate>(backend_copy<B>(dy)), mb);
    Act<ContextHeads> dqkv = core_.backward(Act<ContextHeads>(std::move(dout).tensor()), mb);
    return qkv_.backward_input(Act<FeatureShard>(self().projection_gradient(std::move(dqkv).tensor())), mb).tensor();
  }

  RingAttention<C, B> core_;
  Qkv qkv_;
  Proj proj_;

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
};
}  // namespace detail

}  // namespace mpar::nn
