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

 public:
  static constexpr std::string_view layer_kind = "RingTransformerBlock";

  RingTransformerBlock(C& tp, C& context, const BlockConfig& c)
      : hidden_(c.hidden), ln1_(c.hidden, c.seed, c.id_base, c.name + ".ln1"),
        attn_(tp, context, AttentionConfig{c.hidden, c.heads, c.seq, c.seed, c.id_base + 2, c.name + ".attn"}),
        ln2_(c.hidden, c.seed, c.id_base + 6, c.name + ".ln2"),
        mlp_(make_mlp<C, dyn, dyn, dyn, false, B>(tp,
                                                  MlpConfig{c.hidden, c.ffn, c.seed, c.id_base + 8, c.name + ".mlp"})) {
    require(c.dropout == 0.0, "RingTransformerBlock '", c.name, "': dropout ", c.dropout,
            " under context parallelism is not supported (the mask streams are indexed by local token position); "
            "use dropout 0 with cp > 1");
  }

  Act<ContextShard> forward(const Act<ContextShard>& x, int mb = 0) {
    require(x.extent(1) == hidden_, "RingTransformerBlock: input has ", x.extent(1), " features, expected ", hidden_);
    Act<ContextShard> y = run_forward(x, mb);
    if (recompute_) {
      drop_sublayers(mb);
      inputs_.put(mb).x = backend_copy<B>(x.tensor());
    }
    return y;
  }

  /** B: the input gradient (with recomputation, the forward is rerun first); the layer norms' own gradients too. */
  Act<ContextShard> backward_input(const Act<ContextShard>& dy, int mb = 0) {
    if (recompute_) (void)run_forward(Act<ContextShard>(inputs_.take(mb, "RingTransformerBlock (recompute)").x), mb);
    const Act<Replicate> dyr = token_wise(dy);
    // y = h + mlp(ln2(h)): the residual passes dy straight through.
    Act<Replicate> dh = add<B>(detail::backward_input_of(ln2_, mlp_.backward_input(dyr, mb), mb), dyr);
    // h = x + attn(ln1(x)): dh reaches the attention output and, through the residual, x.
    const Act<ContextShard> dattn = attn_.backward_input(Act<ContextShard>(backend_copy<B>(dh.tensor())), mb);
    return context_shard(add<B>(detail::backward_input_of(ln1_, token_wise(dattn), mb), dh));
  }
  /** W: the projections' weight gradients of micro-batch `mb`; no communication. */
  void backward_weight(int mb = 0) {
    mlp_.backward_weight(mb);
    detail::backward_weight_of(ln2_, mb);
    attn_.backward_weight(mb);
    detail::backward_weight_of(ln1_, mb);
  }

  std::vector<Parameter*> parameters() {
    std::vector<Parameter*> ps = ln1_.parameters();
    detail::append(ps, attn_.parameters());
    detail::append(ps, ln2_.parameters());
    detail::append(ps, mlp_.parameters());
    return ps;
  }
  void drop(int mb) {
    drop_sublayers(mb);
    inputs_.drop(mb);
  }
  void set_recompute(bool on) { recompute_ = on; }
  [[nodiscard]] std::size_t in_features() const { return hidden_; }
  [[nodiscard]] std::size_t out_features() const { return hidden_; }

 private:
  /** The rank's tokens seen by a token-wise layer: whole rows on the tensor axis, nothing more to know. */
  static Act<Replicate> token_wise(const Act<ContextShard>& x) { return Act<Replicate>(backend_copy<B>(x.tensor())); }
  static Act<ContextShard> context_shard(Act<Replicate> x) { return Act<ContextShard>(std::move(x).tensor()); }

  Act<ContextShard> run_forward(const Act<ContextShard>& x, int mb) {
    const Act<Replicate> xr = token_wise(x);
    Act<Replicate> a = token_wise(attn_.forward(context_shard(ln1_.forward(xr, mb)), mb));
    Act<Replicate> h = add<B>(std::move(a), xr);
    return context_shard(add<B>(mlp_.forward(ln2_.forward(h, mb), mb), h));
  }
  void drop_sublayers(int mb) {
    ln1_.drop(mb);
    attn_.drop(mb);
    ln2_.drop(mb);
    mlp_.drop(mb);
  }
  struct Input {
    Activation x;
  };

  std::size_t hidden_;
  Ln ln1_;
  RingSelfAttention<C, B> attn_;
  Ln ln2_;
  Mlp mlp_;
  MicroBatchCache<Input> inputs_;
  bool recompute_ = false;
};

}  // namespace mpar::nn
