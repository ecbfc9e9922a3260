#pragma once
/**
 * @file AdamW (Loshchilov & Hutter, arXiv 1711.05101): Adam with bias correction and decoupled weight
 * decay, fp32 first and second moments in the rank's memory, updated through the compute backend
 * (`ops::adamw_update`), so a CUDA rank steps on the device.
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
#include "mpar/backend/ops/optimizer.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/nn/parameter.hpp"
#include "mpar/optim/flat_layout.hpp"
#include "mpar/optim/host_factors.hpp"

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
 * shard, a ZeRO block or a whole tensor), computed by backend `B` (`ops::adamw_update`; the host
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
  B::run(ops::adamw_update{.n = w.size(),
                           .w = w.data(),
                           .g = g.data(),
                           .m = m.data(),
                           .v = v.data(),
                           .beta1 = c.beta1,
                           .beta2 = c.beta2,
                           .eps = c.eps,
                           .weight_decay = s.weight_decay,
                           .lr = s.lr,
                           .bias_correction1 = s.bias_correction1,
                           .bias_correction2 = s.bias_correction2,
                           .factors = factors});
}

/**
 * @brief AdamW over a list of parameters. Each rank updates its local shard: the update is elementwise, so
 * any tensor/pipeline sharding gives the single-rank result. States are fp32, each moment one allocation for
 * all the parameters, in the memory resource current when the optimizer is constructed (construct it on the
 * rank's thread after `B::init_rank()`); each step runs on backend `B`.
 *
 * When the parameters' values and gradients lie back to back in the same layout (parameter and gradient arenas,
 * as `parallel::DistributedOptimizer` binds them), the moments take that layout too and a step is ONE
 * `ops::adamw_update` over the flat range. Weight decay then applies per run of a table in rank memory
 * (`DecayRun`): a per-run table rather than two contiguous ranges (decaying parameters first), because the
 * arenas keep the backward's order, which the gradient buckets need as contiguous ranges; the table has one
 * entry per change of the decay rule along that order (a few per layer) and costs no memory per element.
 * Otherwise (parameters in separate allocations, or one re-allocated since) a step is one call per parameter.
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
    for (std::size_t i = 0; i < params_.size(); ++i) require(params_[i] != nullptr, "AdamW: parameter ", i, " is null");
    layout_ = FlatLayout(params_);
    // Zeroed by the backend: rank memory the host never writes.
    m_ = B::template allocate<float>(layout_.size());
    v_ = B::template allocate<float>(layout_.size());
    if (layout_.size() != 0) {
      B::run(ops::zero<float>{.n = layout_.size(), .x = m_.data()});
      B::run(ops::zero<float>{.n = layout_.size(), .x = v_.data()});
    }
    if (layout_.flat()) {  // the decay rule along the flat range, consecutive parameters alike merged into one run
      std::vector<DecayRun> runs;
      for (std::size_t i : layout_.order()) {
        const auto decays = std::uint32_t(config_.decays_param(*params_[i]) ? 1 : 0);
        const std::size_t end = layout_.offset(i) + params_[i]->value.size();
        if (!runs.empty() && runs.back().decays == decays)
          runs.back().end = end;
        else
          runs.push_back({end, decays});
      }
      runs_ = B::template allocate<DecayRun>(runs.size());
      copy_to_rank<B>(runs.data(), runs_.data(), runs.size());
    }
    factors_ = B::template allocate<UpdateFactors>(1);  // written by each step before its update reads it
  }

  void step() { step(config_.lr); }
  /** One update with learning rate `lr`; gradients are multiplied by `grad_scale` (a host value) first. */
  void step(float lr, float grad_scale = 1.0f) { step(lr, write_host_factors<B>(grad_scale, factors_.data())); }
  /**
   * One update with learning rate `lr`, the gradient scale and the skip flag read from `factors` (rank
   * memory, e.g. written by `ops::update_factors`). A skipped update still counts here; `retract_step()`
   * takes it back once the host has learnt of the skip (AdamW's bias correction counts updates taken).
   */
  void step(float lr, const UpdateFactors* factors) {
    ++steps_;
    rank_count_stale_ = true;
    AdamWStep s = AdamWStep::at(config_, steps_, lr);
    issue_update(
        "AdamW::step",
        [&](float* w, const float* g) {
          ops::adamw_update op = flat_update(w, g, factors);
          op.lr = s.lr;
          op.bias_correction1 = s.bias_correction1;
          op.bias_correction2 = s.bias_correction2;
          B::run(op);
        },
        [&](std::size_t i, nn::Parameter& p, float weight_decay) {
          s.weight_decay = weight_decay;
          adamw_update<B>(p.value, p.grad, first_moment_mut(i), second_moment_mut(i), config_, s, factors);
        });
  }
  /**
   * One update with every per-step value read from rank memory: the learning rate from `lr` (one float, e.g.
   * written by the host with `copy_from_host_async` before the step), the gradient scale and the skip flag from
   * `factors`; the update count and the bias corrections advance in rank memory (`rank_scalars()`; a skipped
   * update is not counted, so there is nothing to retract). Nothing here waits on the host or passes a value
   * that changes from step to step as an argument, so a captured step replays it with each step's values
   * (`graph_backend`). Equals `step(*lr, factors)` bit for bit. The host's count `steps()` does not move.
   *
   * The first call after construction, `step()` or `set_steps()` copies the host's count into rank memory, which
   * waits on the host: take it eagerly, before capturing (a capture would throw naming `record_event`).
   */
  void step_in_rank(const float* lr, const UpdateFactors* factors) {
    if (rank_count_stale_) write_rank_scalars();
    B::run(ops::adamw_advance{
        .beta1 = config_.beta1, .beta2 = config_.beta2, .lr = lr, .factors = factors, .scalars = scalars_.data()});
    const auto* scalars = static_cast<const AdamWScalars*>(scalars_.data());
    issue_update(
        "AdamW::step_in_rank",
        [&](float* w, const float* g) {
          ops::adamw_update op = flat_update(w, g, factors);
          op.scalars = scalars;
          B::run(op);
        },
        [&](std::size_t i, nn::Parameter& p, float weight_decay) {
          if (p.value.empty()) return;
          B::run(ops::adamw_update{.n = p.value.size(),
                                   .w = p.value.data(),
                                   .g = p.grad.data(),
                                   .m = first_moment_mut(i).data(),
                                   .v = second_moment_mut(i).data(),
                                   .beta1 = config_.beta1,
                                   .beta2 = config_.beta2,
                                   .eps = config_.eps,
                                   .weight_decay = weight_decay,
                                   .scalars = scalars,
                                   .factors = factors});
        });
  }
  /**
   * The host learns that an update issued by `step_in_rank` (or replayed from a captured one) was taken, e.g.
   * from the step's statistics: counts it in `steps()` too, for checkpoints. The count in rank memory has it
   * already, so it stays current (no copy on the next `step_in_rank`).
   */
  void count_update_in_rank() { ++steps_; }
  /** The per-step scalars `step_in_rank` keeps in rank memory (its update count included). */
  [[nodiscard]] const AdamWScalars* rank_scalars() const { return scalars_.data(); }

  /** Takes back the count of an update that its factors skipped. */
  void retract_step() {
    require(steps_ > 0, "AdamW::retract_step: no step taken");
    --steps_;
    rank_count_stale_ = true;
  }
  void zero_grad() {
    for (auto* p : params_) p->zero_grad();
  }

  [[nodiscard]] std::size_t steps() const { return steps_; }
  [[nodiscard]] const AdamWConfig& config() const { return config_; }
  [[nodiscard]] std::span<const float> first_moment(std::size_t i) const { return moment(m_, i); }
  [[nodiscard]] std::span<const float> second_moment(std::size_t i) const { return moment(v_, i); }
  /** Whether the moments lie in the parameters' flat layout, so that a step is one backend call while they do. */
  [[nodiscard]] bool flat() const { return layout_.flat(); }
  [[nodiscard]] const std::vector<nn::Parameter*>& params() const { return params_; }
  /** Writable moments and step count, for restoring a checkpoint. */
  [[nodiscard]] std::span<float> first_moment_mut(std::size_t i) { return moment(m_, i); }
  [[nodiscard]] std::span<float> second_moment_mut(std::size_t i) { return moment(v_, i); }
  /** Sets the update count (the next step_in_rank carries it into rank memory). */
  void set_steps(std::size_t steps) {
    steps_ = steps;
    rank_count_stale_ = true;
  }

 private:
  /**
   * The update over the flat range (values `w` and gradients `g` bound in the layout, the moments, the decay runs)
   * without its step's learning rate and bias corrections, which the caller gives or points to in rank memory.
   */
  [[nodiscard]] ops::adamw_update flat_update(float* w, const float* g, const UpdateFactors* factors) {
    return {.n = layout_.size(),
            .w = w,
            .g = g,
            .m = m_.data(),
            .v = v_.data(),
            .beta1 = config_.beta1,
            .beta2 = config_.beta2,
            .eps = config_.eps,
            .weight_decay = config_.weight_decay,
            .factors = factors,
            .decay_runs = runs_.data(),
            .runs = runs_.size()};
  }
  /**
   * Issues one update: `flat(w, g)` once over the flat range when the parameters sit in it, else
   * `per_parameter(i, p, weight_decay)` for each parameter, after checking that its values, gradients and
   * moments agree in size (`who` names the caller in the error).
   */
  template <class Flat, class PerParameter>
  void issue_update(const char* who, Flat&& flat, PerParameter&& per_parameter) {
    float* w = nullptr;
    const float* g = nullptr;
    if (layout_.holds(params_, w, g)) {  // one call over the flat range
      flat(w, g);
      return;
    }
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto& p = *params_[i];
      require(p.grad.size() == p.value.size(), who, ": parameter ", p.name, " has ", p.value.size(), " values but ",
              p.grad.size(), " gradients");
      require(p.value.size() == state_size(i), who, ": parameter ", p.name, " holds ", p.value.size(),
              " values but its moments ", state_size(i), "; a parameter must keep its size");
      per_parameter(i, p, config_.decays_param(p) ? config_.weight_decay : 0.0f);
    }
  }
  /** The count in rank memory from the host's (the learning rate is written by each step_in_rank). */
  void write_rank_scalars() {
    const AdamWStep s = AdamWStep::at(config_, steps_, 0.0f);
    const AdamWScalars init{0.0f, s.bias_correction1, s.bias_correction2, std::uint32_t(steps_)};
    if (scalars_.size() == 0) scalars_ = B::template allocate<AdamWScalars>(1);
    copy_to_rank<B>(&init, scalars_.data(), 1);
    rank_count_stale_ = false;
  }
  [[nodiscard]] std::size_t state_size(std::size_t i) const { return layout_.size_of(i); }
  [[nodiscard]] std::span<float> moment(const Buffer<float>& all, std::size_t i) const {
    return std::span<float>(const_cast<float*>(all.data()) + layout_.offset(i), state_size(i));
  }

  std::vector<nn::Parameter*> params_;
  AdamWConfig config_;
  FlatLayout layout_;
  Buffer<float> m_, v_;            // rank memory, one allocation each: the backend's kernels read and write them
  Buffer<DecayRun> runs_;          // rank memory: the decay rule along the flat range (flat layouts)
  Buffer<UpdateFactors> factors_;  // the factors of `step(lr, grad_scale)`, in rank memory
  Buffer<AdamWScalars> scalars_;   // step_in_rank's learning rate, bias corrections and update count
  std::size_t steps_ = 0;
  bool rank_count_stale_ = true;  // the count in rank memory is not the host's (none yet, or step() counted since)
};

}  // namespace mpar::optim
