#pragma once
/**
 * @file `RingLlamaBlock`: the Llama block of `LlamaBlock`, `h = x + Attn(RMSNorm1(x))`, `y = h + SwiGLU(RMSNorm2(h))`,
 * over a sequence split across a context group, with ring grouped-query attention
 * (nn/ring_grouped_query_attention.hpp).
 *
 * Its input and output are the rank's tokens in zig-zag chunks over the context axis, whole rows on the tensor axis
 * (`Act<ContextShard>`). The norms, the MLP and the residuals are token-wise and run on the rank's tokens as the
 * unsplit block runs on all of them; only the attention core talks to the other context ranks. Parameter ids, names
 * and initial values are `LlamaBlock`'s with the same `LlamaBlockConfig`; the gradients are this context rank's share.
 */
#include <cstddef>
#include <string_view>
#include <vector>

#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/llama_block.hpp"
#include "mpar/nn/pre_ln_sublayers.hpp"
#include "mpar/nn/recompute.hpp"
#include "mpar/nn/residual.hpp"
#include "mpar/nn/ring_grouped_query_attention.hpp"
#include "mpar/nn/rms_norm.hpp"
#include "mpar/nn/swiglu_mlp.hpp"

namespace mpar::nn {

/**
 * @brief One Llama block over tensor group `tp` (KV heads and MLP columns) and context group `context` (the ring
 * over the sequence). Input and output `Act<ContextShard>`. With full recomputation forward keeps only the block
 * input and backward reruns the forward (ring exchange included) first.
 */
template <communicator C, backend B = HostBackend>
class RingLlamaBlock {
  using Norm = RMSNorm<Replicate, NoComm, B>;
  using Attention = RingGroupedQueryAttention<C, B>;
  using FeedForward = SwiGluMlpStage<C, false, B>;

 public:
  static constexpr std::string_view layer_kind = "RingLlamaBlock";

  RingLlamaBlock(C& tp, C& context, const LlamaBlockConfig& c)
      : hidden_(c.hidden), layers_{Norm(c.hidden, c.seed, c.id_base, c.name + ".ln1", c.norm_eps),
                                   Attention(tp, context,
                                             GqaConfig{c.hidden, c.heads, c.kv_heads, c.seq, c.rope_theta, c.seed,
                                                       c.id_base + 2, c.name + ".attn"}),
                                   Norm(c.hidden, c.seed, c.id_base + 6, c.name + ".ln2", c.norm_eps),
                                   make_swiglu_mlp<C, false, B>(
                                       tp, SwiGluMlpConfig{c.hidden, c.ffn, c.seed, c.id_base + 8, c.name + ".mlp"})} {}

  Act<ContextShard> forward(const Act<ContextShard>& x, int mb = 0) {
    require(x.extent(1) == hidden_, "RingLlamaBlock: input has ", x.extent(1), " features, expected ", hidden_);
    Act<ContextShard> y = run_forward(x, mb);
    layers_.keep_for_recompute(x.tensor(), mb);
    return y;
  }
  /** B: the input gradient (under full recomputation the forward is rerun first); the norms' gain gradients too. */
  Act<ContextShard> backward_input(const Act<ContextShard>& dy, int mb = 0) {
    if (layers_.recompute)
      (void)run_forward(Act<ContextShard>(layers_.take_input(mb, "RingLlamaBlock (recompute)")), mb);
    const Act<Replicate> dyr = token_wise(dy);
    Act<Replicate> dh = add<B>(detail::backward_input_of(layers_.ln2, layers_.ffn.backward_input(dyr, mb), mb), dyr);
    const Act<ContextShard> dattn = layers_.attn.backward_input(Act<ContextShard>(backend_copy<B>(dh.tensor())), mb);
    return context_shard(add<B>(detail::backward_input_of(layers_.ln1, token_wise(dattn), mb), dh));
  }
  /** W: the projections' weight gradients of micro-batch `mb`; no communication. */
  void backward_weight(int mb = 0) { layers_.backward_weight(mb); }

  std::vector<Parameter*> parameters() { return layers_.parameters(); }
  void drop(int mb) { layers_.drop(mb); }
  /**
   * Full recomputation as in `LlamaBlock`. Selective recomputation keeps everything: ring attention keeps no
   * probabilities (the rows' log-sum-exp instead, from which its backward rebuilds them block by block).
   */
  void set_recompute(Recompute r) { layers_.set_recompute(r); }
  [[nodiscard]] std::size_t in_features() const { return hidden_; }
  [[nodiscard]] std::size_t out_features() const { return hidden_; }
  [[nodiscard]] Attention& attention() { return layers_.attn; }

 private:
  static Act<Replicate> token_wise(const Act<ContextShard>& x) { return Act<Replicate>(backend_copy<B>(x.tensor())); }
  static Act<ContextShard> context_shard(Act<Replicate> x) { return Act<ContextShard>(std::move(x).tensor()); }

  Act<ContextShard> run_forward(const Act<ContextShard>& x, int mb) {
    const Act<Replicate> xr = token_wise(x);
    Act<Replicate> h = add<B>(token_wise(layers_.attn.forward(context_shard(layers_.ln1.forward(xr, mb)), mb)), xr);
    return context_shard(add<B>(layers_.ffn.forward(layers_.ln2.forward(h, mb), mb), h));
  }

  std::size_t hidden_;
  detail::PreLnSublayers<B, Norm, Attention, FeedForward> layers_;
};

}  // namespace mpar::nn
