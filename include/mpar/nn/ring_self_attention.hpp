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
#include "mpar/nn/ring_attention_layer.hpp"
#include "mpar/nn/row_parallel.hpp"

namespace mpar::nn {

/**
 * @brief Self-attention over a sequence split across `context` (zig-zag) with heads split across `tp`.
 * Built from the same `AttentionConfig` as `Attention`/`SelfAttention`, so the weights start equal.
 */
template <communicator C, backend B = HostBackend>
class RingSelfAttention
    : public detail::RingAttentionLayer<RingSelfAttention<C, B>, C,
                                        ColumnParallel<C, dyn, dyn, dyn, ColumnOptions{false, false, 3}, B>,
                                        RowParallel<C, dyn, dyn, dyn, RowReduce::all_reduce, B>, B> {
  using Qkv = ColumnParallel<C, dyn, dyn, dyn, ColumnOptions{false, false, 3}, B>;
  using Proj = RowParallel<C, dyn, dyn, dyn, RowReduce::all_reduce, B>;
  using Base = detail::RingAttentionLayer<RingSelfAttention, C, Qkv, Proj, B>;
  friend Base;
  friend detail::TypedLayer<RingSelfAttention>;  // its typed entries are the only public way in

 public:
  static constexpr std::string_view layer_kind = "RingSelfAttention";

  /** `tp`: the tensor group (heads); `context`: the ring (sequence). `c.seq` is the global sequence length. */
  RingSelfAttention(C& tp, C& context, const AttentionConfig& c, int tag_base = RingAttentionConfig{}.tag_base)
      : Base(
            context, ring_config(tp, c, tag_base),
            [&] {
              return Qkv(tp, c.hidden, c.hidden, {c.seed, c.id_base, c.name + ".qkv", true});
            },
            [&] {
              return Proj(tp, c.hidden, c.hidden, {c.seed, c.id_base + 2, c.name + ".proj", true});
            }) {}

 private:
  static RingAttentionConfig ring_config(C& tp, const AttentionConfig& c, int tag_base) {
    const AttentionCore sizes = detail::make_core("RingSelfAttention '" + c.name + "'", c.hidden, c.heads, c.seq,
                                                  std::size_t(tp.size()), std::size_t(tp.rank()));
    return {sizes.heads, sizes.head_dim, c.seq, tag_base, c.name};
  }
};

}  // namespace mpar::nn
