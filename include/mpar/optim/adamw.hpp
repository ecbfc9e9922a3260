#pragma once
/**
 * @file AdamW (Loshchilov & Hutter, arXiv 1711.05101): Adam with bias correction and decoupled weight
 * decay, fp32 first and second moments in the rank's memory, updated through the compute backend
 * (`B::adamw_update`), so a CUDA rank steps on the device.
 */
#include <cmath>
#include <cstddef>
#include <functional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "mpar/backend/backend.hpp"
#include "mpar/backend/host/host_backend.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/nn/parameter.hpp"
#include "mpar/optim/rank_scalars.hpp"

namespace mpar::optim {

/**
 * @brief The default weight-decay rule: weight matrices and embeddings (two or more dimensions) decay;
 * biases — by name, so the fused QKV bias of shape [3, hidden] too — and layer-norm gains and biases do
 * not (GPT-2 / nanoGPT / Megatron practice).
 */
[[nodiscard]] inline bool decays_weight_matrices(const nn::Parameter& p) {
  constexpr std::string_view bias = ".bias";
  const bool is_bias = p.name == "bias" || (p.name.size() >= bias.size() &&
                                            std::string_view(p.name).substr(p.name.size() - bias.size()) == bias);
  return p.global_shape.size() >= 2 && !is_bias;
}

/** @brief AdamW hyper-parameters. */
struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;  ///< decoupled: w *= 1 - lr * weight_decay, independent of the gradient
  /**
   * Which parameters decay; empty means all. `decays_weight_matrices` excludes biases and layer-norm
   * parameters (the trainer's default).
   */
  std::function<bool(const nn::Parameter&)> decays;

  [[nodiscard]] bool decays_param(const nn::Parameter& p) const { return !decays || decays(p); }
};

/** @brief The per-step constants of one AdamW update: the learning rate and both bias corrections. */
struct AdamWStep {
  float lr = 0.0f;
  float weight_decay = 0.0f;                               ///< 0 for parameters that do not decay
  float bias_correction1 = 1.0f, bias_correction2 = 1.0f;  ///< 1 - beta^t for step t (1-based)

  /** The constants of step `t` (1-based). */
  [[nodiscard]] static AdamWStep at(const AdamWConfig& c, std::size_t t, float lr) {
    return {lr, c.weight_decay, float(1.0 - std::pow(double(c.beta1), double(t))),
            float(1.0 - std::pow(double(c.beta2), double(t)))};
  }
};

/**
 * @brief One AdamW update, elementwise over equal-sized spans (so it applies unchanged to a local
 * shard, a ZeRO block or a whole tensor), computed by backend `B` (`B::adamw_update`; the host
 * reference is host::adamw_update):
 * `w *= 1 - lr wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= lr (m / c1) / (sqrt(v / c2) + eps)`.
 * The gradient is multiplied by `factors->grad_scale` first and nothing changes when `factors->skip` is
 * set (see `UpdateFactors`). All four spans and `factors` must be memory `B` computes on (the rank's memory
 * resource).
 */
template <backend B = HostBackend>
void adamw_update(std::span<float> w, std::span<const float> g, std::span<float> m, std::span<float> v,
                  const AdamWConfig& c, const AdamWStep& s, const UpdateFactors* factors) {
  require(w.size() == g.size() && m.size() == w.size() && v.size() == w.size(), "adamw_update: weights (", w.size(),
          "), gradient (", g.size(), "), first (", m.size(), ") and second moments (", v.size(), ") differ in size");
  if (w.empty()) return;
  B::adamw_update(w.size(), w.data(), g.data(), m.data(), v.data(), c.beta1, c.beta2, c.eps, s.lr, s.weight_decay,
                  s.bias_correction1, s.bias_correction2, factors);
}

/**
 * @brief AdamW over a list of parameters. Each rank updates its local shard: the update is elementwise, so
 * any tensor/pipeline sharding gives the single-rank result. States are fp32, one pair per parameter, in
 * the memory resource current when the optimizer is constructed (construct it on the rank's thread after
 * `B::init_rank()`); each step runs on backend `B`.
 */
template <backend B = HostBackend>
class AdamW {
 public:
  AdamW(std::vector<nn::Parameter*> params, AdamWConfig config)
      : params_(std::move(params)), config_(std::move(config)) {
    require(config_.lr >= 0.0f && config_.beta1 >= 0.0f && config_.beta1 < 1.0f && config_.beta2 >= 0.0f &&
                config_.beta2 < 1.0f && config_.eps > 0.0f,
            "AdamW: need lr >= 0, 0 <= beta1, beta2 < 1 and eps > 0 (got lr ", config_.lr, ", beta1 ", config_.beta1,
            ", beta2 ", config_.beta2, ", eps ", config_.eps, ")");
    m_.reserve(params_.size());
    v_.reserve(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      require(params_[i] != nullptr, "AdamW: parameter ", i, " is null");
      // Zeroed by the backend: rank memory the host never writes.
      const std::size_t n = params_[i]->local_size();
      m_.push_back(B::template allocate<float>(n));
      v_.push_back(B::template allocate<float>(n));
      B::zero(n, m_.back().data());
      B::zero(n, v_.back().data());
    }
    factors_ = B::template allocate<UpdateFactors>(1);  // written by each step before its update reads it
  }

  void step() { step(config_.lr); }
  /** One update with learning rate `lr`; gradients are multiplied by `grad_scale` (a host value) first. */
  void step(float lr, float grad_scale = 1.0f) {
    const UpdateFactors f{grad_scale, 0.0f};
    copy_to_rank<B>(&f, factors_.data(), 1);
    step(lr, factors_.data());
  }
  /**
   * One update with learning rate `lr`, the gradient scale and the skip flag read from `factors` (rank
   * memory, e.g. written by `B::update_factors`). A skipped update still counts here; `retract_step()`
   * takes it back once the host has learnt of the skip (AdamW's bias correction counts updates taken).
   */
  void step(float lr, const UpdateFactors* factors) {
    ++steps_;
    AdamWStep s = AdamWStep::at(config_, steps_, lr);
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto& p = *params_[i];
      require(p.grad.size() == p.value.size(), "AdamW::step: parameter ", p.name, " has ", p.value.size(),
              " values but ", p.grad.size(), " gradients");
      s.weight_decay = config_.decays_param(p) ? config_.weight_decay : 0.0f;
      adamw_update<B>(p.value, p.grad, m_[i], v_[i], config_, s, factors);
    }
  }
  /** Takes back the count of an update that its factors skipped. */
  void retract_step() {
    require(steps_ > 0, "AdamW::retract_step: no step taken");
    --steps_;
  }
  void zero_grad() {
    for (auto* p : params_) p->zero_grad();
  }

  [[nodiscard]] std::size_t steps() const { return steps_; }
  [[nodiscard]] const AdamWConfig& config() const { return config_; }
  [[nodiscard]] std::span<const float> first_moment(std::size_t i) const { return m_.at(i); }
  [[nodiscard]] std::span<const float> second_moment(std::size_t i) const { return v_.at(i); }
  [[nodiscard]] const std::vector<nn::Parameter*>& params() const { return params_; }
  /** Writable moments and step count, for restoring a checkpoint. */
  [[nodiscard]] std::span<float> first_moment_mut(std::size_t i) { return m_.at(i); }
  [[nodiscard]] std::span<float> second_moment_mut(std::size_t i) { return v_.at(i); }
  void set_steps(std::size_t steps) { steps_ = steps; }

 private:
  std::vector<nn::Parameter*> params_;
  AdamWConfig config_;
  std::vector<Buffer<float>> m_, v_;  // rank memory: the backend's kernels read and write them
  Buffer<UpdateFactors> factors_;     // the factors of `step(lr, grad_scale)`, in rank memory
  std::size_t steps_ = 0;
};

}  // namespace mpar::optim
