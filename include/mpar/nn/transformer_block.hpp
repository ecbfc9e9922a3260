#pragma once
/**
 * @file `TransformerBlock`: a pre-LN GPT block `h = x + Dropout(Attn(LN1(x)))`,
 * `y = h + Dropout(MLP(LN2(h)))`, tensor-parallel (optionally sequence-parallel), with per-micro-batch
 * activation caches and optional full recomputation.
 */
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/nn/attention.hpp"
#include "mpar/nn/detail/block_ffn.hpp"
#include "mpar/nn/dropout.hpp"
#include "mpar/nn/layer_norm.hpp"
#include "mpar/nn/mlp.hpp"
#include "mpar/nn/pre_ln_sublayers.hpp"
#include "mpar/nn/recompute.hpp"
#include "mpar/nn/residual.hpp"

namespace mpar::nn {

/** @brief Sizes and initialisation of a transformer block. */
struct BlockConfig {
  std::size_t hidden = 0, heads = 0, ffn = 0, seq = 0;
  double dropout = 0.0;
  std::uint64_t seed = 0;
  /// Parameter ids: ln1 id_base+0,1; attention +2..+5; ln2 +6,7; MLP +8..+11; dropout streams +12, +13.
  std::uint64_t id_base = 0;
  std::string name = "block";
  /// What the dropout masks are keyed by (nn/token_coordinates.hpp): the step and each micro-batch's global
  /// tokens, so that every layout drops what the single-rank run drops and each step draws anew. Null or not
  /// filled in: keyed by micro-batch id. Read at every pass, so it must outlive the block's passes.
  const TokenCoordinates* tokens = nullptr;
  /// The number of ids a block uses, so consecutive blocks can use id_base = i * ids_per_block.
  static constexpr std::uint64_t ids_per_block = 16;
};

/**
 * @brief One transformer block on a tensor group `C`. Input and output layout: `Replicate`
 * (`Shard<0, tensor>` tokens with `SP = true`). Collectives per micro-batch: forward 2 all-reduces,
 * backward 2 all-reduces (SP: 2 all-gathers + 2 reduce-scatters each way, plus the layer norms'
 * gradient all-reduces in backward).
 *
 * With `set_recompute(Recompute::full)` forward keeps only the block input; backward first recomputes the
 * forward (dropout masks are pure functions of indices, so it reproduces the same activations). With
 * `Recompute::selective` only the attention core's probabilities are dropped and recomputed.
 *
 * The backward splits for zero-bubble schedules: `backward_input` (B, with both backward
 * all-reduces) and `backward_weight` (W, the four projection weight GEMMs, no communication).
 */
template <communicator C, bool SP = false, backend B = HostBackend,
          class FeedForward = MlpStage<C, dyn, dyn, dyn, SP, B>>
  requires detail::block_ffn<FeedForward, std::conditional_t<SP, TokenShard, Replicate>>
class TransformerBlock : public detail::TypedLayer<TransformerBlock<C, SP, B, FeedForward>> {
  using L = std::conditional_t<SP, TokenShard, Replicate>;
  using Typed = detail::TypedLayer<TransformerBlock<C, SP, B, FeedForward>>;

 public:
  using Typed::backward;
  static constexpr std::string_view layer_kind = "TransformerBlock";
  using default_input = L;
  static constexpr bool preserves_features = false;
  static constexpr std::size_t static_in_features = dyn, static_out_features = dyn;
  template <class In>
  static constexpr bool check_input() {
    return detail::check_whole_rows<L, In>();
  }
  template <class In>
  using output_layout = L;

  /** The block with the tensor-parallel MLP (ids id_base+8..+11). */
  TransformerBlock(C& tp, const BlockConfig& c) requires std::same_as<FeedForward, MlpStage<C, dyn, dyn, dyn, SP, B>>
      : TransformerBlock(tp, c,
                         make_mlp<C, dyn, dyn, dyn, SP, B>(tp, MlpConfig{c.hidden, c.ffn, c.seed, c.id_base + 8,
                                                                         c.name + ".mlp"})) {}
  /** The block with another feed-forward half (which takes the ids id_base+8..+11). */
  TransformerBlock(C& tp, const BlockConfig& c, FeedForward ffn)
      : hidden_(c.hidden), layers_{make_ln(tp, c, 0, ".ln1"),
                                   Attention(tp, AttentionConfig{c.hidden, c.heads, c.seq, c.seed, c.id_base + 2,
                                                                 c.name + ".attn"}),
                                   make_ln(tp, c, 6, ".ln2"), std::move(ffn)},
        drop1_(c.dropout, c.seed, c.id_base + 12, std::size_t(tp.size()), std::size_t(tp.rank()), c.tokens),
        drop2_(c.dropout, c.seed, c.id_base + 13, std::size_t(tp.size()), std::size_t(tp.rank()), c.tokens) {}

  template <class In>
  auto forward(const Act<In>& x, int mb = 0) {
    if constexpr (check_input<In>()) {
      require(x.extent(1) == hidden_, "TransformerBlock: input has ", x.extent(1), " features, expected ", hidden_);
      Act<L> y = run_forward(x, mb);
      layers_.keep_for_recompute(x.tensor(), mb);
      return y;
    } else {
      return Act<L>{};  // refused above, with the check's message
    }
  }

  /**
   * B: the input gradient (with recomputation, the forward is rerun first). The projections keep their
   * W inputs; the layer norms' gain and bias gradients (cheap, computed by the same kernel as their
   * input gradient) are accumulated here.
   */
  template <class G>
  auto backward_input(const Act<G>& dy, int mb = 0) {
    static_assert(std::is_same_v<G, L>,
                  "mpar::nn::TransformerBlock: the output gradient's layout differs from the block's layout (see G "
                  "above). Fix: pass the gradient of the block's output (Replicate, or Shard<0, tensor> with SP)");
    if (layers_.recompute) run_forward(Act<L>(layers_.take_input(mb, "TransformerBlock (recompute)")), mb);
    // y = h + drop2(mlp(ln2(h))): the residual passes dy straight through.
    Act<L> dh = [&] {
      if constexpr (can_fuse_ln2)
        if (fuse_ln2())  // h = x + drop1(...) and ln2 were one kernel: so is their backward
          return layers_.ln2.residual_backward(layers_.ffn.backward_input(drop2_.backward(dy, mb), mb), dy, mb);
      return add<B>(detail::backward_input_of(layers_.ln2, layers_.ffn.backward_input(drop2_.backward(dy, mb), mb), mb),
                    dy);
    }();
    return add<B>(detail::backward_input_of(layers_.ln1, layers_.attn.backward_input(drop1_.backward(dh, mb), mb), mb),
                  dh);
  }
  /** W: the weight gradients of the attention and MLP projections for micro-batch `mb`; no communication. */
  void backward_weight(int mb = 0) { layers_.backward_weight(mb); }

  std::vector<Parameter*> parameters() { return layers_.parameters(); }
  /** Frees everything saved for micro-batch `mb` (after backward nothing is left anyway). */
  void drop(int mb) { layers_.drop(mb); }
  /** Full recomputation (`true`): keep only the block input per micro-batch; `false`: none. */
  void set_recompute(bool on) { set_recompute(on ? Recompute::full : Recompute::none); }
  /** none, selective (the attention core's probabilities: `SelfAttention::set_selective_recompute`) or full. */
  void set_recompute(Recompute r) { layers_.set_recompute(r); }
  [[nodiscard]] std::size_t in_features() const { return hidden_; }
  [[nodiscard]] std::size_t out_features() const { return hidden_; }
  /** The feed-forward half. */
  [[nodiscard]] FeedForward& ffn() { return layers_.ffn; }
  /**
   * Sequence parallelism: both layer norms leave their gain and bias gradients as this rank's share
   * (`LayerNorm::defer_gradient_reduction`), and the fused residual + ln2 is taken where the backend has it. Returns
   * the four parameters whose gradients the caller sums over the tensor group once per step, after the step's last
   * backward and before anything reads them (`all_reduce_gradients<B>(tp, params)`).
   */
  std::vector<Parameter*> defer_norm_gradient_reduction() requires SP {
    return layers_.defer_norm_gradient_reduction();
  }

 private:
  using Ln = std::conditional_t<SP, LayerNorm<TokenShard, C, B>, LayerNorm<Replicate, NoComm, B>>;
  using Attention = SelfAttention<C, dyn, dyn, dyn, SP, B>;
  static Ln make_ln(C& tp, const BlockConfig& c, std::uint64_t off, const char* suffix) {
    if constexpr (SP)
      return Ln(tp, c.hidden, c.seed, c.id_base + off, c.name + suffix);
    else
      return Ln(c.hidden, c.seed, c.id_base + off, c.name + suffix);
  }
  /**
   * The first residual and ln2 as one kernel where the backend has it (chosen at compile time, so HostBackend keeps
   * `add` and `LayerNorm::forward` with no test at run time) and the layout allows: under sequence parallelism only
   * when the norms' gradient reduction is deferred (the kernel adds to the gradients; a norm that all-reduces them
   * per backward has to see its share alone).
   */
  static constexpr bool can_fuse_ln2 = detail::fused_residual_layernorm_backend<B>;
  [[nodiscard]] bool fuse_ln2() const { return can_fuse_ln2 && !layers_.ln2.reduces_gradients_in_backward(); }
  /** h = x + drop1(attn(ln1(x))), y = h + drop2(mlp(ln2(h))): every link and both residuals are typed. */
  Act<L> run_forward(const Act<L>& x, int mb) {
    Act<L> a = drop1_.forward(layers_.attn.forward(layers_.ln1.forward(x, mb), mb), mb);
    if constexpr (can_fuse_ln2) {
      if (fuse_ln2()) {
        auto [h, n2] = layers_.ln2.residual_forward(a, x, mb);
        return add<B>(drop2_.forward(layers_.ffn.forward(n2, mb), mb), h);
      }
    }
    Act<L> h = add<B>(std::move(a), x);
    return add<B>(drop2_.forward(layers_.ffn.forward(layers_.ln2.forward(h, mb), mb), mb), h);
  }

  std::size_t hidden_;
  detail::PreLnSublayers<B, Ln, Attention, FeedForward> layers_;
  Dropout<L, B> drop1_, drop2_;
};

}  // namespace mpar::nn
