#pragma once
/**
 * @file `MoeTransformerBlock`: the pre-LN GPT block with its MLP replaced by a top-k gated mixture of
 * experts, `h = x + Dropout(Attn(LN1(x)))`, `y = h + Dropout(MoE(LN2(h)))` (GShard, Switch Transformer).
 *
 * Attention is tensor-parallel as in `nn::TransformerBlock`; the MoE MLP (`parallel::MoeMlp`) runs on the
 * attention's replicated output, its experts spread over the expert group. Every tensor rank of an expert group
 * routes the same tokens: without expert tensor parallelism each computes the same whole experts (expert and gate
 * weights replicated over the tensor axis, counted once in gradient norms); with it each computes its slice of
 * every expert's width (the expert weights sharded over the tensor axis, the gate still replicated). The load-balancing statistics are taken over the token
 * group: all ranks holding a part of the same micro-batch.
 *
 * The load-balancing loss enters the training objective of every micro-batch; `set_aux_gradient(g)` sets
 * d(objective)/d(aux) as seen by this rank's backward (the trainer passes ranks-in-token-group x loss scale,
 * since the data-parallel average later divides each rank's share by that many ranks).
 */
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/nn/transformer_block.hpp"
#include "mpar/parallel/moe.hpp"

namespace mpar::models {

/**
 * @brief The MoE MLP as a block's feed-forward half (`mpar::nn::detail::block_ffn<MoeFfn, Replicate>`): replicated
 * activations in and out over the tensor group (every tensor rank routes the same tokens). Its whole
 * backward runs in B (the experts' weight gradients come back through the same all-to-all as
 * the input gradient), so W has nothing left to do.
 */
template <communicator C, backend B = HostBackend>
class MoeFfn {
 public:
  explicit MoeFfn(parallel::MoeMlp<C, B> moe) : moe_(std::move(moe)) {}

  /** Typed: whole rows in, whole rows out (the gate needs every feature of a token); MoeMlp refuses any other layout. */
  template <class L>
  nn::Act<Replicate> forward(const nn::Act<L>& x, int mb) {
    return moe_.forward(x, mb);  // the statistics are collected by the backward: once per micro-batch
  }
  /** The whole backward is B (W is empty), so backward and backward_input are the same. */
  nn::Act<Replicate> backward_input(const nn::Act<Replicate>& dy, int mb) { return moe_.backward(dy, aux_grad_, mb); }
  nn::Act<Replicate> backward(const nn::Act<Replicate>& dy, int mb) { return backward_input(dy, mb); }
  void backward_weight(int /*mb*/) {}
  std::vector<nn::Parameter*> parameters() { return moe_.parameters(); }
  void drop(int mb) { moe_.drop(mb); }

  /** d(objective)/d(aux loss) for this rank's backward (see the file comment). */
  void set_aux_gradient(float g) { aux_grad_ = g; }
  /** Where each backward adds its micro-batch's load-balancing loss and dropped count (rank memory). */
  void set_statistics(const parallel::MoeStatistics& s) { moe_.set_statistics(s); }
  [[nodiscard]] parallel::MoeMlp<C, B>& moe() { return moe_; }

 private:
  parallel::MoeMlp<C, B> moe_;
  float aux_grad_ = 1.0f;
};

/**
 * @brief A transformer block whose MLP is a mixture of experts: `nn::TransformerBlock` (attention on
 * tensor group `C`, residuals, dropout, recomputation, the B/W split) with `MoeFfn` as its
 * feed-forward half, experts over the expert group, load-balancing statistics over the token group.
 */
template <communicator C, backend B = HostBackend>
class MoeTransformerBlock : public nn::TransformerBlock<C, false, B, MoeFfn<C, B>> {
  using Base = nn::TransformerBlock<C, false, B, MoeFfn<C, B>>;

 public:
  /**
   * `moe.d_model`, `moe.first_id` and `moe.seed` are taken from `c` (the MoE uses the block's MLP ids +8..+10).
   * `expert_tensor`: `&tp` splits each expert's width over the tensor group (expert tensor parallelism); null keeps
   * whole experts, computed alike by every tensor rank.
   */
  MoeTransformerBlock(C& tp, C& expert, C& tokens, const nn::BlockConfig& c, parallel::MoeConfig moe,
                      C* expert_tensor = nullptr)
      : Base(tp, c,
             MoeFfn<C, B>(parallel::MoeMlp<C, B>(with_ids(moe, c), expert, c.name + ".moe", &tokens, expert_tensor))) {}

  void set_aux_gradient(float g) { this->ffn().set_aux_gradient(g); }
  void set_statistics(const parallel::MoeStatistics& s) { this->ffn().set_statistics(s); }
  [[nodiscard]] parallel::MoeMlp<C, B>& moe() { return this->ffn().moe(); }

 private:
  static parallel::MoeConfig with_ids(parallel::MoeConfig m, const nn::BlockConfig& c) {
    m.d_model = c.hidden;
    m.seed = c.seed;
    m.first_id = c.id_base + 8;
    return m;
  }
};

}  // namespace mpar::models
