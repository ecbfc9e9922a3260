#pragma once
/**
 * @file `RingTransformerBlock`: the pre-LN GPT block of `TransformerBlock` over a sequence split across a
 * context group, `h = x + Attn(LN1(x))`, `y = h + MLP(LN2(h))`, with ring self-attention
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
 * Dropout is not part of this block: its mask streams are indexed by local token position, which under
 * the zig-zag placement is not the global one (`BlockConfig::dropout` must be 0; the trainer refuses cp
 * with dropout).
 */
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/layer_norm.hpp"
#include "mpar/nn/mlp.hpp"
#include "mpar/nn/pre_ln_sublayers.hpp"
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
                                       tp, MlpConfig{c.hidden, c.ffn, c.seed, c.id_base + 8, c.name + ".mlp"})} {
    require(c.dropout == 0.0, "RingTransformerBlock '", c.name, "': dropout ", c.dropout,
            " under context parallelism is not supported (the mask streams are indexed by local token position); "
            "use dropout 0 with cp > 1");
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
    // y = h + mlp(ln2(h)): the residual passes dy straight through.
    Act<Replicate> dh = add<B>(detail::backward_input_of(layers_.ln2, layers_.ffn.backward_input(dyr, mb), mb), dyr);
    // h = x + attn(ln1(x)): dh reaches the attention output and, through the residual, x.
    const Act<ContextShard> dattn = layers_.attn.backward_input(Act<ContextShard>(backend_copy<B>(dh.tensor())), mb);
    return context_shard(add<B>(detail::backward_input_of(layers_.ln1, token_wise(dattn), mb), dh));
  }
  /** W: the projections' weight gradients of micro-batch `mb`; no communication. */
  void backward_weight(int mb = 0) { layers_.backward_weight(mb); }

  std::vector<Parameter*> parameters() { return layers_.parameters(); }
  void drop(int mb) { layers_.drop(mb); }
  void set_recompute(bool on) { layers_.recompute = on; }
  [[nodiscard]] std::size_t in_features() const { return hidden_; }
  [[nodiscard]] std::size_t out_features() const { return hidden_; }

 private:
  /** The rank's tokens seen by a token-wise layer: whole rows on the tensor axis, nothing more to know. */
  static Act<Replicate> token_wise(const Act<ContextShard>& x) { return Act<Replicate>(backend_copy<B>(x.tensor())); }
  static Act<ContextShard> context_shard(Act<Replicate> x) { return Act<ContextShard>(std::move(x).tensor()); }

  Act<ContextShard> run_forward(const Act<ContextShard>& x, int mb) {
    const Act<Replicate> xr = token_wise(x);
    Act<Replicate> a = token_wise(layers_.attn.forward(context_shard(layers_.ln1.forward(xr, mb)), mb));
    Act<Replicate> h = add<B>(std::move(a), xr);
    return context_shard(add<B>(layers_.ffn.forward(layers_.ln2.forward(h, mb), mb), h));
  }

  std::size_t hidden_;
  detail::PreLnSublayers<B, Ln, Attention, Mlp> layers_;
};

}  // namespace mpar::nn
