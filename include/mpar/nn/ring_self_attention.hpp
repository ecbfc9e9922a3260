#pragma once
/**
 * @file Context- and tensor-parallel causal self-attention: the QKV projection (ColumnParallel,
 * heads over the tensor group), ring attention over the context group (nn/ring_attention.hpp), the
 * output projection (RowParallel, all-reduced over the tensor group).
 *
 * Its input and output are the rank's tokens in zig-zag chunks over the context axis, whole rows on
 * the tensor axis (`Act<ContextShard>`). The projections are token-wise, so they run on the rank's
 * tokens unchanged; only the core talks to the other context ranks.
 *
 * Parameter gradients are this context rank's contribution (its tokens' terms): like data-parallel
 * replicas, the context ranks hold copies of the weights whose gradients must be summed over the
 * context group before the optimizer step (the trainer does not do that yet: docs/context-parallel.md).
 */
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "mpar/nn/attention.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/column_parallel.hpp"
#include "mpar/nn/ring_attention.hpp"
#include "mpar/nn/row_parallel.hpp"

namespace mpar::nn {

/**
 * @brief Self-attention over a sequence split across `context` (zig-zag) with heads split across `tp`.
 * Built from the same `AttentionConfig` as `Attention`/`SelfAttention`, so the weights start equal.
 */
template <communicator C, backend B = HostBackend>
class RingSelfAttention : public detail::TypedLayer<RingSelfAttention<C, B>> {
  using Typed = detail::TypedLayer<RingSelfAttention<C, B>>;
  using Qkv = ColumnParallel<C, dyn, dyn, dyn, ColumnOptions{false, false, 3}, B>;
  using Proj = RowParallel<C, dyn, dyn, dyn, RowReduce::all_reduce, B>;

 public:
  static constexpr std::string_view layer_kind = "RingSelfAttention";
  using default_input = ContextShard;
  static constexpr bool preserves_features = false;
  static constexpr std::size_t static_in_features = dyn, static_out_features = dyn;
  template <class L>
  static constexpr bool check_input() {
    constexpr bool ok = std::is_same_v<L, ContextShard>;
    static_assert(ok || detail::always_false_v<L>,
                  "mpar::nn::RingSelfAttention takes the rank's tokens as zig-zag chunks over the context axis, whole "
                  "rows on the tensor axis (Act<ContextShard>). Fix: state the layout where the sequence is split "
                  "(Act<ContextShard>(local_tokens)), or use Attention/SelfAttention for an unsplit sequence");
    return ok;
  }
  template <class L>
  using output_layout = ContextShard;
  using Typed::backward;
  using Typed::backward_input;
  using Typed::forward;

  /** `tp`: the tensor group (heads); `context`: the ring (sequence). `c.seq` is the global sequence length. */
  RingSelfAttention(C& tp, C& context, const AttentionConfig& c, int tag_base = RingAttentionConfig{}.tag_base)
      : core_(context, ring_config(tp, c, tag_base)),
        qkv_(tp, c.hidden, c.hidden, {c.seed, c.id_base, c.name + ".qkv", true}),
        proj_(tp, c.hidden, c.hidden, {c.seed, c.id_base + 2, c.name + ".proj", true}) {}

  void backward_weight(int mb = 0) {
    proj_.backward_weight(mb);
    qkv_.backward_weight(mb);
  }
  std::vector<Parameter*> parameters() {
    auto ps = qkv_.parameters();
    detail::append(ps, proj_.parameters());
    return ps;
  }
  void drop(int mb) {
    qkv_.drop(mb);
    core_.drop(mb);
    proj_.drop(mb);
  }
  [[nodiscard]] std::size_t in_features() const { return qkv_.in_features(); }
  [[nodiscard]] std::size_t out_features() const { return proj_.out_features(); }

 private:
  friend Typed;  // its typed entries are the only public way in; these do the work on the storage
  // On the tensor axis a rank's context tokens are whole rows, so the projections take them as Replicate and
  // return the heads' columns as Shard<1, tensor>; the core sees those columns with the tokens' context placement
  // (ContextHeads). Each restatement below names that step; only the input (a const reference) is copied, by the
  // backend (`backend_copy`: a host copy would read rank memory the host must not touch).
  Activation do_forward(const Activation& x, int mb) {
    Act<FeatureShard> qkv = qkv_.forward(Act<Replicate>(backend_copy<B>(x)), mb);
    Act<ContextHeads> o = core_.forward(Act<ContextHeads>(std::move(qkv).tensor()), mb);
    return proj_.forward(Act<FeatureShard>(std::move(o).tensor()), mb).tensor();
  }
  Activation do_backward_input(const Activation& dy, int mb) {
    Act<FeatureShard> dout = proj_.backward_input(Act<Replicate>(backend_copy<B>(dy)), mb);
    Act<ContextHeads> dqkv = core_.backward(Act<ContextHeads>(std::move(dout).tensor()), mb);
    return qkv_.backward_input(Act<FeatureShard>(std::move(dqkv).tensor()), mb).tensor();
  }
  static RingAttentionConfig ring_config(C& tp, const AttentionConfig& c, int tag_base) {
    const AttentionCore sizes = detail::make_core("RingSelfAttention '" + c.name + "'", c.hidden, c.heads, c.seq,
                                                  std::size_t(tp.size()), std::size_t(tp.rank()));
    return {sizes.heads, sizes.head_dim, c.seq, tag_base, c.name};
  }
  RingAttention<C, B> core_;
  Qkv qkv_;
  Proj proj_;
};

}  // namespace mpar::nn
