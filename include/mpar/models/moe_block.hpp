#pragma once
/**
 * @file `MoeTransformerBlock`: the pre-LN GPT block with its MLP replaced by a top-k gated mixture of
 * experts, `h = x + Dropout(Attn(LN1(x)))`, `y = h + Dropout(MoE(LN2(h)))` (GShard, Switch Transformer).
 *
 * Attention is tensor-parallel as in `nn::TransformerBlock`; the MoE MLP (`parallel::MoeMlp`) runs on the
 * attention's replicated output, its experts spread over the expert group (every tensor rank of an expert
 * group computes the same experts on the same tokens, so expert and gate weights are replicated over the
 * tensor axis and counted once in gradient norms). The load-balancing statistics are taken over the token
 * group: all ranks holding a part of the same micro-batch.
 *
 * The load-balancing loss enters the training objective of every micro-batch; `set_aux_gradient(g)` sets
 * d(objective)/d(aux) as seen by this rank's backward (the trainer passes ranks-in-token-group x loss scale,
 * since the data-parallel average later divides each rank's share by that many ranks).
 */
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/nn/attention.hpp"
#include "mpar/nn/dropout.hpp"
#include "mpar/nn/layer_norm.hpp"
#include "mpar/nn/transformer_block.hpp"
#include "mpar/parallel/moe.hpp"

namespace mpar::models {

/** @brief A transformer block whose MLP is a mixture of experts; tensor group `C` for attention, expert and token groups for the MoE. */
template <communicator C, backend B = HostBackend>
class MoeTransformerBlock {
 public:
  /** `moe.d_model`, `moe.first_id` and `moe.seed` are taken from `c` (the MoE uses the block's MLP ids +8..+10). */
  MoeTransformerBlock(C& tp, C& expert, C& tokens, const nn::BlockConfig& c, parallel::MoeConfig moe)
      : hidden_(c.hidden),
        ln1_(c.hidden, c.seed, c.id_base + 0, c.name + ".ln1"),
        attn_(tp, nn::AttentionConfig{c.hidden, c.heads, c.seq, c.seed, c.id_base + 2, c.name + ".attn"}),
        drop1_(c.dropout, c.seed, c.id_base + 12, std::size_t(tp.size()), std::size_t(tp.rank())),
        ln2_(c.hidden, c.seed, c.id_base + 6, c.name + ".ln2"),
        moe_(with_ids(moe, c), expert, c.name + ".moe", &tokens),
        drop2_(c.dropout, c.seed, c.id_base + 13, std::size_t(tp.size()), std::size_t(tp.rank())) {}

  nn::Activation forward(const nn::Activation& x, int mb = 0) {
    require(x.extent(1) == hidden_, "MoeTransformerBlock: input has ", x.extent(1), " features, expected ", hidden_);
    nn::Activation y = run_forward(x, mb);
    // Keyed by micro-batch: a pipeline's recomputation reruns this forward, and must not count twice.
    seen_[mb] = {double(moe_.aux_loss()), moe_.dropped()};
    if (recompute_) {
      drop_sublayers(mb);
      inputs_.put(mb).x = x;
    }
    return y;
  }

  /** B: the input gradient; the MoE's own gradients (gate and experts) are complete after it. */
  nn::Activation backward_input(const nn::Activation& dy, int mb = 0) {
    if (recompute_) run_forward(inputs_.take(mb, "MoeTransformerBlock (recompute)").x, mb);
    const nn::Activation dm = drop2_.backward(dy, mb);
    nn::Activation dn({dm.extent(0), dm.extent(1)});
    moe_.backward(std::span<const float>(dm.data(), dm.size()), std::span<float>(dn.data(), dn.size()), aux_grad_, mb);
    nn::Activation dh = nn::detail::backward_input_of(ln2_, dn, mb);
    B::add(dh.size(), dh.data(), dy.data(), dh.data());
    nn::Activation dx = nn::detail::backward_input_of(ln1_, attn_.backward_input(drop1_.backward(dh, mb), mb), mb);
    B::add(dx.size(), dx.data(), dh.data(), dx.data());
    return dx;
  }
  /** W: the attention projections' weight gradients (the MoE finished its own in B); no communication. */
  void backward_weight(int mb = 0) {
    nn::detail::backward_weight_of(ln2_, mb);
    attn_.backward_weight(mb);
    nn::detail::backward_weight_of(ln1_, mb);
  }
  nn::Activation backward(const nn::Activation& dy, int mb = 0) {
    nn::Activation dx = backward_input(dy, mb);
    backward_weight(mb);
    return dx;
  }

  std::vector<nn::Parameter*> parameters() {
    std::vector<nn::Parameter*> ps = ln1_.parameters();
    nn::detail::append(ps, attn_.parameters());
    nn::detail::append(ps, ln2_.parameters());
    nn::detail::append(ps, moe_.parameters());
    return ps;
  }
  void drop(int mb) {
    drop_sublayers(mb);
    inputs_.drop(mb);
  }
  void set_recompute(bool on) { recompute_ = on; }
  /** d(objective)/d(aux loss) for this rank's backward (see the file comment). */
  void set_aux_gradient(float g) { aux_grad_ = g; }
  /** Load-balancing loss summed over the micro-batches run since the last call (each counted once), and reset. */
  double take_aux_loss() {
    double s = 0.0;
    for (auto& [mb, v] : seen_) s += std::exchange(v.aux, 0.0);
    return s;
  }
  /** Assignments this rank dropped for capacity since the last call (each micro-batch once), and reset. */
  std::size_t take_dropped() {
    std::size_t n = 0;
    for (auto& [mb, v] : seen_) n += std::exchange(v.dropped, std::size_t(0));
    return n;
  }
  [[nodiscard]] parallel::MoeMlp<C, B>& moe() { return moe_; }

 private:
  static parallel::MoeConfig with_ids(parallel::MoeConfig m, const nn::BlockConfig& c) {
    m.d_model = c.hidden;
    m.seed = c.seed;
    m.first_id = c.id_base + 8;
    return m;
  }
  nn::Activation run_forward(const nn::Activation& x, int mb) {
    nn::Activation h = drop1_.forward(attn_.forward(ln1_.forward(x, mb), mb), mb);
    B::add(h.size(), h.data(), x.data(), h.data());
    const nn::Activation n = ln2_.forward(h, mb);
    nn::Activation m({n.extent(0), n.extent(1)});
    moe_.forward(std::span<const float>(n.data(), n.size()), n.extent(0), std::span<float>(m.data(), m.size()), mb);
    nn::Activation y = drop2_.forward(m, mb);
    B::add(y.size(), y.data(), h.data(), y.data());
    return y;
  }
  void drop_sublayers(int mb) {
    ln1_.drop(mb);
    attn_.drop(mb);
    ln2_.drop(mb);
    moe_.drop(mb);
  }
  struct Input {
    nn::Activation x;
  };

  std::size_t hidden_;
  nn::LayerNorm<Replicate, nn::NoComm, B> ln1_;
  nn::SelfAttention<C, dyn, dyn, dyn, false, B> attn_;
  nn::Dropout<Replicate, B> drop1_;
  nn::LayerNorm<Replicate, nn::NoComm, B> ln2_;
  parallel::MoeMlp<C, B> moe_;
  nn::Dropout<Replicate, B> drop2_;
  nn::MicroBatchCache<Input> inputs_;
  bool recompute_ = false;
  float aux_grad_ = 1.0f;
  struct Seen {
    double aux = 0.0;
    std::size_t dropped = 0;
  };
  std::map<int, Seen> seen_;  ///< per micro-batch of the current step
};

}  // namespace mpar::models
