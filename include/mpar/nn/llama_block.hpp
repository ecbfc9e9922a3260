#pragma once
/**
 * @file `LlamaBlock`: the pre-norm block of Llama, `h = x + Attn(RMSNorm1(x))`, `y = h + SwiGLU(RMSNorm2(h))`, with
 * grouped-query attention and rotary positions, no biases and no dropout; tensor-parallel (optionally
 * sequence-parallel), with per-micro-batch caches, full or selective recomputation and a split backward.
 */
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "mpar/nn/grouped_query_attention.hpp"
#include "mpar/nn/pre_ln_sublayers.hpp"
#include "mpar/nn/recompute.hpp"
#include "mpar/nn/residual.hpp"
#include "mpar/nn/rms_norm.hpp"
#include "mpar/nn/swiglu_mlp.hpp"

namespace mpar::nn {

/** @brief Sizes and initialisation of a Llama block. */
struct LlamaBlockConfig {
  std::size_t hidden = 0, heads = 0;
  std::size_t kv_heads = 0;  ///< key/value heads, dividing `heads`; 0 means `heads`
  std::size_t ffn = 0, seq = 0;
  double rope_theta = 10000.0;
  float norm_eps = 1e-6f;  ///< RMSNorm's epsilon (Hugging Face's `rms_norm_eps`)
  std::uint64_t seed = 0;
  /// Parameter ids: ln1 id_base+0; attention qkv +2, proj +4; ln2 +6; MLP gate_up +8, down +10.
  std::uint64_t id_base = 0;
  std::string name = "block";
  /// The number of ids a block uses, so consecutive blocks can use id_base = i * ids_per_block.
  static constexpr std::uint64_t ids_per_block = 16;
};

/**
 * @brief One Llama block on a tensor group `C` (a one-rank group for the single rank). Parameters, in model order:
 * `<name>.ln1.weight`, `<name>.attn.qkv.weight`, `<name>.attn.proj.weight`, `<name>.ln2.weight`,
 * `<name>.mlp.gate_up.weight`, `<name>.mlp.down.weight` (see `GroupedQueryAttention` and `make_swiglu_mlp` for their
 * shapes). Input and output `Replicate` (`Shard<0, tensor>` tokens with `SP`). Collectives per micro-batch: as
 * `TransformerBlock`'s (two all-reduces each way; with SP two all-gathers and two reduce-scatters each way).
 *
 * `backward_input` (B: with every backward collective) and `backward_weight` (W: the four projections' weight
 * products, no communication) split the backward for zero-bubble schedules; the norms' gain gradients are computed in
 * B, by the kernel that computes their input gradient.
 */
template <communicator C, bool SP = false, backend B = HostBackend>
class LlamaBlock : public detail::TypedLayer<LlamaBlock<C, SP, B>> {
  using L = std::conditional_t<SP, TokenShard, Replicate>;
  using Typed = detail::TypedLayer<LlamaBlock<C, SP, B>>;
  using Norm = std::conditional_t<SP, RMSNorm<TokenShard, C, B>, RMSNorm<Replicate, NoComm, B>>;
  using Attention = GroupedQueryAttention<C, SP, B>;
  using FeedForward = SwiGluMlpStage<C, SP, B>;

 public:
  using Typed::backward;
  static constexpr std::string_view layer_kind = "LlamaBlock";
  using default_input = L;
  static constexpr bool preserves_features = false;
  static constexpr std::size_t static_in_features = dyn, static_out_features = dyn;
  template <class In>
  static constexpr bool check_input() {
    return detail::check_whole_rows<L, In>();
  }
  template <class In>
  using output_layout = L;

  LlamaBlock(C& tp, const LlamaBlockConfig& c)
      : hidden_(c.hidden), layers_{make_norm(tp, c, 0, ".ln1"),
                                   Attention(tp, GqaConfig{c.hidden, c.heads, c.kv_heads, c.seq, c.rope_theta, c.seed,
                                                           c.id_base + 2, c.name + ".attn"}),
                                   make_norm(tp, c, 6, ".ln2"),
                                   make_swiglu_mlp<C, SP, B>(
                                       tp, SwiGluMlpConfig{c.hidden, c.ffn, c.seed, c.id_base + 8, c.name + ".mlp"})} {}

  template <class In>
  auto forward(const Act<In>& x, int mb = 0) {
    if constexpr (check_input<In>()) {
      require(x.extent(1) == hidden_, "LlamaBlock: input has ", x.extent(1), " features, expected ", hidden_);
      Act<L> y = run_forward(x, mb);
      layers_.keep_for_recompute(x.tensor(), mb);
      return y;
    } else {
      return Act<L>{};  // refused above, with the check's message
    }
  }
  /** B: the input gradient (under full recomputation the forward is rerun first); the projections keep their W inputs. */
  template <class G>
  auto backward_input(const Act<G>& dy, int mb = 0) {
    static_assert(std::is_same_v<G, L>,
                  "mpar::nn::LlamaBlock: the output gradient's layout differs from the block's layout (see G above). "
                  "Fix: pass the gradient of the block's output (Replicate, or Shard<0, tensor> with SP)");
    if (layers_.recompute) run_forward(Act<L>(layers_.take_input(mb, "LlamaBlock (recompute)")), mb);
    Act<L> dh = add<B>(detail::backward_input_of(layers_.ln2, layers_.ffn.backward_input(dy, mb), mb), dy);
    return add<B>(detail::backward_input_of(layers_.ln1, layers_.attn.backward_input(dh, mb), mb), dh);
  }
  /** W: the weight gradients of the attention and MLP projections for micro-batch `mb`; no communication. */
  void backward_weight(int mb = 0) { layers_.backward_weight(mb); }

  std::vector<Parameter*> parameters() { return layers_.parameters(); }
  void drop(int mb) { layers_.drop(mb); }
  /** none, selective (the attention core's probabilities) or full (keep only the block input). */
  void set_recompute(Recompute r) { layers_.set_recompute(r); }
  [[nodiscard]] std::size_t in_features() const { return hidden_; }
  [[nodiscard]] std::size_t out_features() const { return hidden_; }
  [[nodiscard]] Attention& attention() { return layers_.attn; }
  /**
   * Sequence parallelism: both norms leave their gain gradients as this rank's share; returns the two parameters
   * whose gradients the caller sums over the tensor group once per step (`all_reduce_gradients<B>(tp, params)`).
   */
  std::vector<Parameter*> defer_norm_gradient_reduction() requires SP {
    return layers_.defer_norm_gradient_reduction();
  }

 private:
  static Norm make_norm(C& tp, const LlamaBlockConfig& c, std::uint64_t off, const char* suffix) {
    if constexpr (SP)
      return Norm(tp, c.hidden, c.seed, c.id_base + off, c.name + suffix, c.norm_eps);
    else
      return Norm(c.hidden, c.seed, c.id_base + off, c.name + suffix, c.norm_eps);
  }
  Act<L> run_forward(const Act<L>& x, int mb) {
    Act<L> h = add<B>(layers_.attn.forward(layers_.ln1.forward(x, mb), mb), x);
    return add<B>(layers_.ffn.forward(layers_.ln2.forward(h, mb), mb), h);
  }

  std::size_t hidden_;
  detail::PreLnSublayers<B, Norm, Attention, FeedForward> layers_;
};

}  // namespace mpar::nn
