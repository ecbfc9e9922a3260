#pragma once
/**
 * @file `detail::PreLnSublayers`: the four sublayers of a pre-LN transformer block (ln1, attention, ln2,
 * feed-forward) and what every such block does with them whatever its layouts: its parameters in model order,
 * the W pass, freeing a micro-batch, and keeping only the block input under full recomputation.
 *
 * The wiring (residuals, dropout, layout changes around the attention) differs between `TransformerBlock`
 * and `RingTransformerBlock` and stays in each block; this is the bookkeeping that must not differ, so that
 * both blocks list and free their sublayers alike.
 */
#include <string_view>
#include <vector>

#include "mpar/backend/backend.hpp"
#include "mpar/nn/activation.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/parameter.hpp"
#include "mpar/nn/recompute.hpp"
#include "mpar/nn/typed_layer.hpp"

namespace mpar::nn::detail {

/**
 * @brief The sublayers of a pre-LN block on backend `B`, initialised in place (an aggregate, so each sublayer is
 * built where it lives: `{ln1, attention, ln2, ffn}`).
 */
template <backend B, class Ln, class Attention, class FeedForward>
struct PreLnSublayers {
  Ln ln1;
  Attention attn;
  Ln ln2;
  FeedForward ffn;
  /** Full recomputation: forward keeps only the block input per micro-batch, backward reruns the forward. */
  bool recompute = false;

  /**
   * none; selective (the attention core's probabilities, where the attention keeps any: `set_selective_recompute`);
   * full (keep only the block input, rerun the forward before the backward).
   */
  void set_recompute(Recompute r) {
    recompute = r == Recompute::full;
    if constexpr (requires { attn.set_selective_recompute(true); })
      attn.set_selective_recompute(r == Recompute::selective);
  }
  /**
   * Sequence parallelism: both norms leave their gain (and bias) gradients as this rank's share; returns their
   * parameters, whose gradients the block's owner sums over the tensor group once per step.
   */
  std::vector<Parameter*> defer_norm_gradient_reduction() {
    ln1.defer_gradient_reduction(true);
    ln2.defer_gradient_reduction(true);
    std::vector<Parameter*> ps = ln1.parameters();
    append(ps, ln2.parameters());
    return ps;
  }
  /** ln1, attention, ln2, feed-forward: the block's parameters in model order. */
  std::vector<Parameter*> parameters() {
    std::vector<Parameter*> ps = ln1.parameters();
    append(ps, attn.parameters());
    append(ps, ln2.parameters());
    append(ps, ffn.parameters());
    return ps;
  }
  /** W: the sublayers' weight gradients of micro-batch `mb`, last sublayer first; no communication. */
  void backward_weight(int mb) {
    ffn.backward_weight(mb);
    backward_weight_of(ln2, mb);
    attn.backward_weight(mb);
    backward_weight_of(ln1, mb);
  }
  /** After the forward of micro-batch `mb` from block input `x`: under recomputation, keeps only `x`. */
  void keep_for_recompute(const Activation& x, int mb) {
    if (!recompute) return;
    drop_sublayers(mb);
    kept_inputs.put(mb).x = backend_copy<B>(x);
  }
  /** The block input `keep_for_recompute` kept for micro-batch `mb`; `block` names the block in the error. */
  [[nodiscard]] Activation take_input(int mb, std::string_view block) { return kept_inputs.take(mb, block).x; }
  /** Frees everything saved for micro-batch `mb` (after backward nothing is left anyway). */
  void drop(int mb) {
    drop_sublayers(mb);
    kept_inputs.drop(mb);
  }

  struct Input {
    Activation x;
  };
  MicroBatchCache<Input> kept_inputs{};  // public only to keep this an aggregate: use keep_for_recompute, take_input

 private:
  void drop_sublayers(int mb) {
    ln1.drop(mb);
    attn.drop(mb);
    ln2.drop(mb);
    ffn.drop(mb);
  }
};

}  // namespace mpar::nn::detail
