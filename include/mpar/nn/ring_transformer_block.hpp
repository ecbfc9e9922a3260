#pragma once
/**
 * @file `RingTransformerBlock`: the pre-LN GPT block of `TransformerBlock` over a sequence split across a
 * context group, `h = x + Dropout(Attn(LN1(x)))`, `y = h + Dropout(MLP(LN2(h)))`, with ring self-attention
 * (nn/ring_self_attention.hpp) as its attention.
 *
 * Its input and output are the rank's tokens in zig-zag chunks over the context axis, whole rows on the
 * tensor axis (`Act<ContextShard>`). The layer norms, the MLP and the residuals are token-wise: they run
 * on the rank's tokens as the unsplit block runs on all of them (their activations are whole rows on the
 * tensor axis, `Replicate` to them); only the attention core talks to the other context ranks.
 *
 * Parameter ids, names and initial values are those of `TransformerBlock` with the same `BlockConfig`,
 * so a context-parallel model starts from the single-rank model's weights. Its parameter gradients are
 * this context rank's tokens' share: the context ranks hold replicas, and the trainer reduces the
 * gradients over them as over data-parallel ranks.
 *
 * Dropout (`BlockConfig::dropout` > 0) needs `BlockConfig::tokens` with this context group's size and rank:
 * a rank's rows are not consecutive tokens of a sequence, so its masks are drawn per zig-zag chunk at the
 * chunk's global positions (nn/token_coordinates.hpp) — the elements the unsplit block drops.
 */
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/dropout.hpp"
#include "mpar/nn/layer_norm.hpp"
#include "mpar/nn/mlp.hpp"
#include "mpar/nn/pre_ln_sublayers.hpp"
#include "mpar/nn/recompute.hpp"
#include "mpar/nn/residual.hpp"
#include "mpar/nn/ring_self_attention.hpp"
#include "mpar/nn/transformer_block.hpp"

namespace mpar::nn {

/**
 * @brief One transformer block over tensor group `tp` (heads and MLP columns) and context group `context`
 * (the ring over the sequence). Input and output `Act<ContextShard>`. With `set_recompute(true)` forward
 * keeps only the block input and backward reruns the forward (ring exchange included) first.
 */
template <communicator C, backend B = HostBackend>
class RingTransformerBlock {
  using Mlp = MlpStage<C, dyn, dyn, dyn, false, B>;
  using Ln = LayerNorm<Replicate, NoComm, B>;
  using Attention = RingSelfAttention<C, B>;

 public:
  static constexpr std::string_view layer_kind = "RingTransformerBlock";

  RingTransformerBlock(C& tp, C& context, const BlockConfig& c)
      : hidden_(c.hidden), layers_{Ln(c.hidden, c.seed, c.id_base, c.name + ".ln1"),
                                   Attention(tp, context,
                                             AttentionConfig{c.hidden, c.heads, c.seq, c.seed, c.id_base + 2,
                                                             c.name + ".attn"}),
                                   Ln(c.hidden, c.seed, c.id_base + 6, c.name + ".ln2"),
                                   make_mlp<C, dyn, dyn, dyn, false, B>(
                                       tp, MlpConfig{c.hidden, c.ffn, c.seed, c.id_base + 8, c.name + ".mlp"})},
        drop1_(c.dropout, c.seed, c.id_base + 12, 1, 0, c.tokens),
        drop2_(c.dropout, c.seed, c.id_base + 13, 1, 0, c.tokens) {
    // Whole rows on the tensor axis (so Dropout<Replicate>); the context placement comes from the coordinates.
    require(c.dropout == 0.0 || (c.tokens != nullptr && c.tokens->cp == std::size_t(context.size()) &&
                                 c.tokens->cp_rank == std::size_t(context.rank())),
            "RingTransformerBlock '", c.name, "': dropout ", c.dropout, " needs BlockConfig::tokens with cp ",
            context.size(), " and cp_rank ", context.rank(),
            " (the masks are drawn at each zig-zag chunk's global positions); give them, or use dropout 0");
  }

  Act<ContextShard> forward(const Act<ContextShard>& x, int mb = 0) {
    require(x.extent(1) == hidden_, "RingTransformerBlock: input has ", x.extent(1), " features, expected ", hidden_);
    Act<ContextShard> y = run_forward(x, mb);
    layers_.keep_for_recompute(x.tensor(), mb);
    return y;
  }

  /** B: the input gradient (with recomputation, the forward is rerun first); the layer norms' own gradients too. */
  Act<ContextShard> backward_input(const Act<ContextShard>& dy, int mb = 0) {
    if (layers_.recompute)
      (void)run_forward(Act<ContextShard>(layers_.take_input(mb, "RingTransformerBlock (recompute)")), mb);
    const Act<Replicate> dyr = token_wise(dy);
    // y = h + dropout(mlp(ln2(h))): the residual passes dy straight through.
    const bool dropout = drop2_.active();
    const Act<Replicate> dffn = dropout ? drop2_.backward(dyr, mb) : Act<Replicate>{};
    Act<Replicate> dh =
        add<B>(detail::backward_input_of(layers_.ln2, layers_.ffn.backward_input(dropout ? dffn : dyr, mb), mb), dyr);
    // h = x + dropout(attn(ln1(x))): dh reaches the attention output and, through the residual, x.
    const Act<ContextShard> dattn = layers_.attn.backward_input(
        dropout ? context_shard(drop1_.backward(dh, mb)) : Act<ContextShard>(backend_copy<B>(dh.tensor())), mb);
    return context_shard(add<B>(detail::backward_input_of(layers_.ln1, token_wise(dattn), mb), dh));
  }
  /** W: the projections' weight gradients of micro-batch `mb`; no communication. */
  void backward_weight(int mb = 0) { layers_.backward_weight(mb); }

  std::vector<Parameter*> parameters() { return layers_.parameters(); }
  void drop(int mb) { layers_.drop(mb); }
  void set_recompute(bool on) { layers_.recompute = on; }
  /**
   * Full recomputation as `set_recompute(true)`. Selective recomputation keeps everything: ring attention keeps
   * no probabilities (the rows' log-sum-exp and its output instead, from which its backward rebuilds them
   * block by block), so there is nothing of the attention core left to drop.
   */
  void set_recompute(Recompute r) { layers_.set_recompute(r); }
  [[nodiscard]] std::size_t in_features() const { return hidden_; }
  [[nodiscard]] std::size_t out_features() const { return hidden_; }

 private:
  /** The rank's tokens seen by a token-wise layer: whole rows on the tensor axis, nothing more to know. */
  static Act<Replicate> token_wise(const Act<ContextShard>& x) { return Act<Replicate>(backend_copy<B>(x.tensor())); }
  static Act<ContextShard> context_shard(Act<Replicate> x) { return Act<ContextShard>(std::move(x).tensor()); }

  Act<ContextShard> run_forward(const Act<ContextShard>& x, int mb) {
    const Act<Replicate> xr = token_wise(x);
    Act<Replicate> a =
        drop1_.forward(token_wise(layers_.attn.forward(context_shard(layers_.ln1.forward(xr, mb)), mb)), mb);
    Act<Replicate> h = add<B>(std::move(a), xr);
    return context_shard(add<B>(drop2_.forward(layers_.ffn.forward(layers_.ln2.forward(h, mb), mb), mb), h));
  }

  std::size_t hidden_;
  detail::PreLnSublayers<B, Ln, Attention, Mlp> layers_;
  Dropout<Replicate, B> drop1_, drop2_;
};

}  // namespace mpar::nn
