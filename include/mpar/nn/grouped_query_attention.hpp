#pragma once
/**
 * @file `GroupedQueryAttention`: Llama's causal self-attention — grouped-query heads (`kv_heads` dividing `heads`),
 * rotary positions on q and k, no biases — split over a tensor group by key/value heads (the fused QKV projection
 * column-parallel, the output projection row-parallel), optionally sequence-parallel.
 *
 * The fused projection's columns are ordered by key/value head, as Megatron's: for KV head `j`, its `g = heads /
 * kv_heads` query heads, then `k_j`, then `v_j` (`(g + 2) * head_dim` columns). A contiguous split of the columns
 * over `tp` ranks (tp dividing kv_heads) then gives each rank whole KV heads with their own query heads, so the core
 * needs no communication. Before the core each rank rearranges its block into the `[tokens, (q | k | v)]` layout of
 * `AttentionCore`, repeating each KV head for its g query heads (Hugging Face's `repeat_kv`), and rotates q and k;
 * the backward rotates back and sums the g copies' gradients in a fixed order, the same on every layout.
 */
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "mpar/backend/ops/operation.hpp"
#include "mpar/backend/ops/rope.hpp"
#include "mpar/nn/attention.hpp"
#include "mpar/nn/rotary.hpp"
#include "mpar/nn/upload.hpp"

namespace mpar::nn {

/** @brief Sizes and initialisation of grouped-query attention. */
struct GqaConfig {
  std::size_t hidden = 0, heads = 0;
  std::size_t kv_heads = 0;  ///< key/value heads, dividing `heads`; 0 means `heads` (multi-head attention)
  std::size_t seq = 0;
  double rope_theta = 10000.0;          ///< the rotary frequency base (Llama 2: 1e4, Llama 3: 5e5)
  std::uint64_t seed = 0, id_base = 0;  ///< QKV weight id `id_base`; output projection weight `id_base + 2`
  std::string name = "attn";
};

namespace detail {
/** Key/value heads of `c`: `kv_heads`, or `heads` when 0 (multi-head attention). */
[[nodiscard]] inline std::size_t gqa_kv_heads(const GqaConfig& c) { return c.kv_heads == 0 ? c.heads : c.kv_heads; }
/**
 * The sizes of a grouped-query attention layer's core on tensor rank `rank` of `tp` (its query heads), after checking
 * `c` for every way it can fail to split; `kind` names the layer in the errors.
 */
[[nodiscard]] inline AttentionCore checked_gqa_core(std::string_view kind, const GqaConfig& c, std::size_t tp,
                                                    std::size_t rank) {
  const std::string who = std::string(kind) + " '" + c.name + "' (tensor rank " + std::to_string(rank) + ")";
  const std::size_t kv = gqa_kv_heads(c);
  require(c.hidden > 0 && c.heads > 0 && c.seq > 0, who, ": hidden, heads and seq must be positive");
  require(c.hidden % c.heads == 0, who, ": hidden size ", c.hidden, " is not divisible by ", c.heads, " heads");
  require((c.hidden / c.heads) % 2 == 0, who, ": head_dim ", c.hidden / c.heads,
          " is odd; the rotary embedding rotates its two halves as pairs");
  require(c.heads % kv == 0, who, ": ", c.heads, " query heads are not divisible by ", kv,
          " key/value heads; each KV head serves a whole group of query heads");
  require(kv % tp == 0, who, ": ", kv, " key/value heads are not divisible by the tensor-parallel size ", tp,
          "; attention is split by whole KV heads. Fix: a tensor group dividing kv_heads");
  require(c.rope_theta > 0, who, ": rope_theta must be positive, got ", c.rope_theta);
  return AttentionCore{c.heads / tp, c.hidden / c.heads, c.seq};
}
}  // namespace detail

/**
 * @brief Grouped-query causal self-attention on tensor group `C` (a one-rank group for the single rank).
 * Parameters `<name>.qkv.weight` `[hidden, (heads + 2 kv_heads) head_dim]` (columns ordered by KV head, see the
 * file comment) and `<name>.proj.weight` `[heads head_dim, hidden]`; head_dim = hidden / heads, even. Input and
 * output `Replicate` (`Shard<0, tensor>` tokens with `SP`). The group's size must divide kv_heads. Collectives as
 * `SelfAttention`'s; selective recomputation, `Autocast` and a backend's fused attention apply as they do there.
 */
template <communicator C, bool SP = false, backend B = HostBackend>
class GroupedQueryAttention
    : public detail::AttentionLayer<
          GroupedQueryAttention<C, SP, B>, ColumnParallel<C, dyn, dyn, dyn, ColumnOptions{SP, false, 1}, B>,
          RowParallel<C, dyn, dyn, dyn, SP ? RowReduce::reduce_scatter : RowReduce::all_reduce, B>, B> {
  static_assert(supports<B, ops::rope_forward> && supports<B, ops::rope_backward>,
                "mpar::nn::GroupedQueryAttention<C, SP, B>: backend B does not run ops::rope_forward and "
                "ops::rope_backward (backend/ops/rope.hpp). Fix: use HostBackend, StreamHostBackend, "
                "DiscreteHostBackend or CudaBackend, or give B a run(op) for them");
  using In = std::conditional_t<SP, TokenShard, Replicate>;
  using Qkv = ColumnParallel<C, dyn, dyn, dyn, ColumnOptions{SP, false, 1}, B>;
  using Proj = RowParallel<C, dyn, dyn, dyn, SP ? RowReduce::reduce_scatter : RowReduce::all_reduce, B>;
  using Base = detail::AttentionLayer<GroupedQueryAttention, Qkv, Proj, B>;
  friend Base;  // calls qkv_for_core and projection_gradient

 public:
  static constexpr std::string_view layer_kind = "GroupedQueryAttention";
  using default_input = In;
  static constexpr bool preserves_features = false;
  static constexpr std::size_t static_in_features = dyn, static_out_features = dyn;
  template <class L>
  static constexpr bool check_input() {
    return detail::check_whole_rows<In, L>();
  }
  template <class L>
  using output_layout = In;

  GroupedQueryAttention(C& tp, const GqaConfig& c)
      : Base(
            checked_core(c, std::size_t(tp.size()), std::size_t(tp.rank())),
            [&] {
              return Qkv(tp, c.hidden, (c.heads + 2 * kv_heads_of(c)) * (c.hidden / c.heads),
                         {c.seed, c.id_base, c.name + ".qkv", false});
            },
            [&] {
              return Proj(tp, c.hidden, c.hidden, {c.seed, c.id_base + 2, c.name + ".proj", false});
            }),
        group_(c.heads / kv_heads_of(c)), theta_(c.rope_theta) {}

  /** Query heads on this rank (heads / tp). */
  [[nodiscard]] std::size_t local_heads() const { return this->core_.heads; }
  /** Key/value heads on this rank (kv_heads / tp). */
  [[nodiscard]] std::size_t local_kv_heads() const { return this->core_.heads / group_; }
  [[nodiscard]] double rope_theta() const { return theta_; }

 private:
  static std::size_t kv_heads_of(const GqaConfig& c) { return detail::gqa_kv_heads(c); }
  static AttentionCore checked_core(const GqaConfig& c, std::size_t tp, std::size_t rank) {
    return detail::checked_gqa_core(layer_kind, c, tp, rank);
  }

  /**
   * This rank's fused projection `[tokens, kv_local (g + 2) d]` as the core's `[tokens, 3 heads_local d]`: q heads
   * copied, each k and v head repeated for its g query heads, then q and k rotated by their positions in the sequence.
   */
  Activation qkv_for_core(Activation fused) {
    const Sizes z = sizes(fused.extent(0));
    require(fused.extent(1) == z.fused_ld, layer_kind, ": QKV projection has ", fused.extent(1), " columns, expected ",
            z.fused_ld);
    Activation qkv({z.tokens, 3 * z.hl}, uninitialized);  // q, k and v copies write every element
    B::run(ops::copy_2d_batched<float>{.rows = z.tokens,
                                       .cols = group_ * z.d,
                                       .src = fused.data(),
                                       .src_ld = z.fused_ld,
                                       .src_stride = BatchStrides{0, z.w},
                                       .dst = qkv.data(),
                                       .dst_ld = 3 * z.hl,
                                       .dst_stride = BatchStrides{0, group_ * z.d},
                                       .batch = BatchExtents{1, z.kvl}});
    for (std::size_t part = 1; part <= 2; ++part)  // k, v: KV head j to query heads j g .. j g + g - 1
      B::run(ops::copy_2d_batched<float>{.rows = z.tokens,
                                         .cols = z.d,
                                         .src = fused.data() + (group_ + part - 1) * z.d,
                                         .src_ld = z.fused_ld,
                                         .src_stride = BatchStrides{z.w, 0},
                                         .dst = qkv.data() + part * z.hl,
                                         .dst_ld = 3 * z.hl,
                                         .dst_stride = BatchStrides{group_ * z.d, z.d},
                                         .batch = BatchExtents{z.kvl, group_}});
    const std::int32_t* pos = positions(z.tokens);
    for (std::size_t part = 0; part < 2; ++part)  // q, k in place
      B::run(ops::rope_forward{.rows = z.tokens,
                               .heads = this->core_.heads,
                               .head_dim = z.d,
                               .ld = 3 * z.hl,
                               .positions = pos,
                               .theta = theta_,
                               .x = qkv.data() + part * z.hl,
                               .y = qkv.data() + part * z.hl});
    return qkv;
  }
  /** The core's dqkv as the fused projection's gradient: dq and dk rotated back, the g copies of dk, dv summed. */
  Activation projection_gradient(Activation dqkv) {
    const Sizes z = sizes(dqkv.extent(0));
    const std::int32_t* pos = positions(z.tokens);
    for (std::size_t part = 0; part < 2; ++part)
      B::run(ops::rope_backward{.rows = z.tokens,
                                .heads = this->core_.heads,
                                .head_dim = z.d,
                                .ld = 3 * z.hl,
                                .positions = pos,
                                .theta = theta_,
                                .dy = dqkv.data() + part * z.hl,
                                .dx = dqkv.data() + part * z.hl});
    Activation dfused({z.tokens, z.fused_ld}, uninitialized);  // dq, dk and dv columns cover it
    B::run(ops::copy_2d_batched<float>{.rows = z.tokens,
                                       .cols = group_ * z.d,
                                       .src = dqkv.data(),
                                       .src_ld = 3 * z.hl,
                                       .src_stride = BatchStrides{0, group_ * z.d},
                                       .dst = dfused.data(),
                                       .dst_ld = z.fused_ld,
                                       .dst_stride = BatchStrides{0, z.w},
                                       .batch = BatchExtents{1, z.kvl}});
    const std::size_t kv_cols = z.kvl * z.d;
    for (std::size_t part = 1; part <= 2; ++part) {
      float* const dst = dfused.data() + (group_ + part - 1) * z.d;
      const float* const src = dqkv.data() + part * z.hl;
      if (group_ == 1) {
        B::run(ops::copy_2d_batched<float>{.rows = z.tokens,
                                           .cols = z.d,
                                           .src = src,
                                           .src_ld = 3 * z.hl,
                                           .src_stride = BatchStrides{0, z.d},
                                           .dst = dst,
                                           .dst_ld = z.fused_ld,
                                           .dst_stride = BatchStrides{0, z.w},
                                           .batch = BatchExtents{1, z.kvl}});
        continue;
      }
      // sum = copy 0 + copy 1 + ... + copy g-1 of each KV head, gathered densely: the same order on every layout.
      Activation sum({z.tokens, kv_cols}, uninitialized), term({z.tokens, kv_cols}, uninitialized);
      const auto gather = [&](std::size_t copy, Activation& out) {
        B::run(ops::copy_2d_batched<float>{.rows = z.tokens,
                                           .cols = z.d,
                                           .src = src + copy * z.d,
                                           .src_ld = 3 * z.hl,
                                           .src_stride = BatchStrides{0, group_ * z.d},
                                           .dst = out.data(),
                                           .dst_ld = kv_cols,
                                           .dst_stride = BatchStrides{0, z.d},
                                           .batch = BatchExtents{1, z.kvl}});
      };
      gather(0, sum);
      for (std::size_t copy = 1; copy < group_; ++copy) {
        gather(copy, term);
        B::run(ops::add{.n = sum.size(), .x = sum.data(), .z = term.data(), .y = sum.data()});
      }
      B::run(ops::copy_2d_batched<float>{.rows = z.tokens,
                                         .cols = z.d,
                                         .src = sum.data(),
                                         .src_ld = kv_cols,
                                         .src_stride = BatchStrides{0, z.d},
                                         .dst = dst,
                                         .dst_ld = z.fused_ld,
                                         .dst_stride = BatchStrides{0, z.w},
                                         .batch = BatchExtents{1, z.kvl}});
    }
    return dfused;
  }

  struct Sizes {
    std::size_t tokens, d, kvl, w, fused_ld, hl;
  };
  [[nodiscard]] Sizes sizes(std::size_t tokens) const {
    const std::size_t d = this->core_.head_dim, kvl = local_kv_heads(), w = (group_ + 2) * d;
    return {tokens, d, kvl, w, kvl * w, this->core_.heads * d};
  }
  /**
   * Each row's position in its sequence, in rank memory: the rows here are whole sequences (a sequence-parallel
   * projection has gathered the tokens), so row r is at r % seq. Uploaded once per token count.
   */
  const std::int32_t* positions(std::size_t tokens) {
    if (positions_.size() != tokens) {
      const std::vector<std::int32_t> host = sequence_positions(tokens, this->core_.seq);
      positions_ = uninitialized_buffer<std::int32_t>(tokens);
      upload<B>(positions_, std::span<const std::int32_t>(host));
    }
    return positions_.data();
  }

  std::size_t group_;
  double theta_;
  Buffer<std::int32_t> positions_;
};

}  // namespace mpar::nn
