#pragma once
/**
 * @file `RingGroupedQueryAttention`: Llama's grouped-query attention over a sequence split across a context group
 * (zig-zag chunks, nn/ring_attention.hpp), its heads split across a tensor group by whole key/value heads.
 *
 * The weights are `GroupedQueryAttention`'s with the same `GqaConfig` (ids, names, initial values, and the fused
 * projection's column order by KV head), so a context-parallel model starts from the single-rank one. Before the ring
 * each rank rearranges its block of the fused projection into `(q | k | v)` — without repeating k and v: the ring
 * core pairs each query head with its KV head, so only the KV heads travel — and rotates q and k by their global
 * positions (`zigzag_positions`). The projections are token-wise and run on the rank's tokens unchanged.
 *
 * Parameter gradients are this context rank's tokens' share: the context ranks hold replicas, and the trainer sums
 * the gradients over them as over data-parallel ranks.
 */
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/backend/detail/online_softmax_backend.hpp"
#include "mpar/backend/ops/operation.hpp"
#include "mpar/backend/ops/rope.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/column_parallel.hpp"
#include "mpar/nn/grouped_query_attention.hpp"
#include "mpar/nn/ring_attention.hpp"
#include "mpar/nn/ring_attention_layer.hpp"
#include "mpar/nn/rotary.hpp"
#include "mpar/nn/row_parallel.hpp"
#include "mpar/nn/upload.hpp"

namespace mpar::nn {

/**
 * @brief Grouped-query causal self-attention over a sequence split across `context` (zig-zag), heads split across
 * `tp` (which must divide kv_heads). Input and output `Act<ContextShard>`; `c.seq` is the global sequence length.
 */
template <communicator C, backend B = HostBackend>
class RingGroupedQueryAttention
    : public detail::RingAttentionLayer<RingGroupedQueryAttention<C, B>, C,
                                        ColumnParallel<C, dyn, dyn, dyn, ColumnOptions{false, false, 1}, B>,
                                        RowParallel<C, dyn, dyn, dyn, RowReduce::all_reduce, B>, B> {
  static_assert(supports<B, ops::rope_forward> && supports<B, ops::rope_backward>,
                "mpar::nn::RingGroupedQueryAttention<C, B>: backend B does not run ops::rope_forward and "
                "ops::rope_backward (backend/ops/rope.hpp). Fix: use HostBackend, StreamHostBackend, "
                "DiscreteHostBackend or CudaBackend, or give B a run(op) for them");
  using Qkv = ColumnParallel<C, dyn, dyn, dyn, ColumnOptions{false, false, 1}, B>;
  using Proj = RowParallel<C, dyn, dyn, dyn, RowReduce::all_reduce, B>;
  using Base = detail::RingAttentionLayer<RingGroupedQueryAttention, C, Qkv, Proj, B>;
  friend Base;                                           // calls for_core and projection_gradient
  friend detail::TypedLayer<RingGroupedQueryAttention>;  // its typed entries are the only public way in

 public:
  static constexpr std::string_view layer_kind = "RingGroupedQueryAttention";

  /** `tp`: the tensor group (KV heads); `context`: the ring (sequence), whose rank order is the chunk order. */
  RingGroupedQueryAttention(C& tp, C& context, const GqaConfig& c, int tag_base = RingAttentionConfig{}.tag_base)
      : Base(
            context, ring_config(tp, c, tag_base),
            [&] {
              return Qkv(tp, c.hidden, (c.heads + 2 * detail::gqa_kv_heads(c)) * (c.hidden / c.heads),
                         {c.seed, c.id_base, c.name + ".qkv", false});
            },
            [&] {
              return Proj(tp, c.hidden, c.hidden, {c.seed, c.id_base + 2, c.name + ".proj", false});
            }),
        sizes_(detail::checked_gqa_core(layer_kind, c, std::size_t(tp.size()), std::size_t(tp.rank()))),
        group_(c.heads / detail::gqa_kv_heads(c)), theta_(c.rope_theta), cp_(std::size_t(context.size())),
        cp_rank_(std::size_t(context.rank())) {}

  /** Query heads on this rank (heads / tp). */
  [[nodiscard]] std::size_t local_heads() const { return sizes_.heads; }
  /** Key/value heads on this rank (kv_heads / tp): what travels the ring. */
  [[nodiscard]] std::size_t local_kv_heads() const { return sizes_.heads / group_; }

 private:
  static RingAttentionConfig ring_config(C& tp, const GqaConfig& c, int tag_base) {
    const AttentionCore z = detail::checked_gqa_core(layer_kind, c, std::size_t(tp.size()), std::size_t(tp.rank()));
    return {z.heads, z.head_dim, c.seq, tag_base, c.name, z.heads / (c.heads / detail::gqa_kv_heads(c))};
  }

  struct Sizes {
    std::size_t tokens, d, kvl, w, fused_ld, hl, ld;
  };
  /** Column sizes: fused block per KV head `w = (g + 2) d`, query columns `hl`, the core's row `ld = hl + 2 kvl d`. */
  [[nodiscard]] Sizes sizes(std::size_t tokens) const {
    const std::size_t d = sizes_.head_dim, kvl = local_kv_heads(), w = (group_ + 2) * d, hl = sizes_.heads * d;
    return {tokens, d, kvl, w, kvl * w, hl, hl + 2 * kvl * d};
  }
  /**
   * The fused projection's `[tokens, kvl (g + 2) d]` (by KV head: g query heads, k, v) as the core's `[tokens, (q | k
   * | v)]` with kvl K and V heads, q and k rotated by their global positions.
   */
  Activation for_core(Activation fused) {
    const Sizes z = sizes(fused.extent(0));
    require(fused.extent(1) == z.fused_ld, layer_kind, ": QKV projection has ", fused.extent(1), " columns, expected ",
            z.fused_ld);
    Activation qkv({z.tokens, z.ld}, uninitialized);  // the three copies write every element
    rearrange(fused.data(), qkv.data(), z, false);
    const std::int32_t* pos = positions(z.tokens);
    // The query heads, then the KV heads' keys, each rotated in place.
    for (const auto& [first, heads] : {std::pair{std::size_t(0), sizes_.heads}, std::pair{z.hl, z.kvl}})
      B::run(ops::rope_forward{.rows = z.tokens,
                               .heads = heads,
                               .head_dim = z.d,
                               .ld = z.ld,
                               .positions = pos,
                               .theta = theta_,
                               .x = qkv.data() + first,
                               .y = qkv.data() + first});
    return qkv;
  }
  /** The core's dqkv as the fused projection's gradient: dq and dk rotated back, the columns returned to KV-head order. */
  Activation projection_gradient(Activation dqkv) {
    const Sizes z = sizes(dqkv.extent(0));
    const std::int32_t* pos = positions(z.tokens);
    for (const auto& [first, heads] : {std::pair{std::size_t(0), sizes_.heads}, std::pair{z.hl, z.kvl}})
      B::run(ops::rope_backward{.rows = z.tokens,
                                .heads = heads,
                                .head_dim = z.d,
                                .ld = z.ld,
                                .positions = pos,
                                .theta = theta_,
                                .dy = dqkv.data() + first,
                                .dx = dqkv.data() + first});
    Activation dfused({z.tokens, z.fused_ld}, uninitialized);
    rearrange(dqkv.data(), dfused.data(), z, true);
    return dfused;
  }
  /** Copies between the fused order (per KV head: g query heads, k, v) and `(q | k | v)`, either way. */
  void rearrange(const float* src, float* dst, const Sizes& z, bool to_fused) const {
    // (width, fused column of KV head 0, core column of KV head 0, core stride between KV heads) for q, k, v
    const std::size_t gd = group_ * z.d, kw = z.kvl * z.d;
    const std::size_t parts[3][4] = {{gd, 0, 0, gd}, {z.d, gd, z.hl, z.d}, {z.d, gd + z.d, z.hl + kw, z.d}};
    for (const auto& [width, fused_col, core_col, core_stride] : parts) {
      if (to_fused)
        B::run(ops::copy_2d_batched<float>{.rows = z.tokens,
                                           .cols = width,
                                           .src = src + core_col,
                                           .src_ld = z.ld,
                                           .src_stride = BatchStrides{0, core_stride},
                                           .dst = dst + fused_col,
                                           .dst_ld = z.fused_ld,
                                           .dst_stride = BatchStrides{0, z.w},
                                           .batch = BatchExtents{1, z.kvl}});
      else
        B::run(ops::copy_2d_batched<float>{.rows = z.tokens,
                                           .cols = width,
                                           .src = src + fused_col,
                                           .src_ld = z.fused_ld,
                                           .src_stride = BatchStrides{0, z.w},
                                           .dst = dst + core_col,
                                           .dst_ld = z.ld,
                                           .dst_stride = BatchStrides{0, core_stride},
                                           .batch = BatchExtents{1, z.kvl}});
    }
  }
  /** Each local row's global position in its sequence (zig-zag chunks), in rank memory; uploaded once per token count. */
  const std::int32_t* positions(std::size_t tokens) {
    if (positions_.size() != tokens) {
      const std::vector<std::int32_t> host = zigzag_positions(tokens, sizes_.seq, cp_, cp_rank_);
      positions_ = uninitialized_buffer<std::int32_t>(tokens);
      upload<B>(positions_, std::span<const std::int32_t>(host));
    }
    return positions_.data();
  }

  AttentionCore sizes_;
  std::size_t group_;
  double theta_;
  std::size_t cp_, cp_rank_;
  Buffer<std::int32_t> positions_;
};

}  // namespace mpar::nn
