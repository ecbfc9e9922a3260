#pragma once
/**
 * @file SGD with momentum (and optional Nesterov momentum and L2 weight decay) over fp32 master weights,
 * updated through the compute backend (`ops::sgd_update`), momentum buffers in the rank's memory.
 */
#include <cstddef>
#include <span>
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

/** @brief SGD hyper-parameters; the same meaning as in most frameworks (L2 decay added to the gradient). */
struct SgdConfig {
  float lr = 0.01f;
  float momentum = 0.9f;      ///< 0 disables the momentum buffer
  float dampening = 0.0f;     ///< the buffer adds (1 - dampening) * g after its first step
  float weight_decay = 0.0f;  ///< L2: g += weight_decay * w before momentum
  bool nesterov = false;      ///< use g + momentum * buf instead of buf
};

/**
 * @brief One SGD update of `w` from `g` with momentum buffer `buf` (`first` says the buffer is empty),
 * computed by backend `B` (`ops::sgd_update`; the host reference is host::sgd_update):
 * `g' = g + wd w; buf = first ? g' : mu buf + (1 - dampening) g'; w -= lr (nesterov ? g' + mu buf : buf)`.
 * `factors->grad_scale` multiplies `g` first (1 / loss scale, a clipping coefficient) and `factors->skip`
 * leaves everything unchanged (see `UpdateFactors`; rank memory). Without momentum `buf` is unused and may be
 * empty.
 */
template <backend B = HostBackend>
void sgd_update(std::span<float> w, std::span<const float> g, std::span<float> buf, bool first, const SgdConfig& c,
                float lr, const UpdateFactors* factors) {
  require(w.size() == g.size() && (c.momentum == 0.0f || buf.size() == w.size()), "sgd_update: weights (", w.size(),
          "), gradient (", g.size(), ") and momentum buffer (", buf.size(), ") differ in size");
  if (w.empty()) return;
  B::run(ops::sgd_update{.n = w.size(),
                         .w = w.data(),
                         .g = g.data(),
                         .buf = c.momentum != 0.0f ? buf.data() : nullptr,
                         .momentum = c.momentum,
                         .dampening = c.dampening,
                         .nesterov = c.nesterov,
                         .lr = lr,
                         .weight_decay = c.weight_decay,
                         .first = first,
                         .factors = factors});
}

/**
 * @brief SGD with momentum over a list of parameters (any sharding: the update is elementwise, so each
 * rank updates its local shard). The momentum buffer is fp32, one allocation for all the parameters, in the
 * memory resource current when the optimizer is constructed (the rank's, after `B::init_rank()`); each step
 * runs on `B`. When values and gradients lie back to back in the same layout (parameter and gradient arenas)
 * the buffer takes that layout and a step is ONE `ops::sgd_update` over the flat range (SGD's L2 decay applies
 * to every parameter alike); otherwise one call per parameter.
 */
template <backend B = HostBackend>
class Sgd {
 public:
  Sgd(std::vector<nn::Parameter*> params, SgdConfig config) : params_(std::move(params)), config_(config) {
    require(config_.lr >= 0.0f && config_.momentum >= 0.0f, "Sgd: learning rate ", config_.lr, " and momentum ",
            config_.momentum, " must be non-negative");
    require(!config_.nesterov || (config_.momentum > 0.0f && config_.dampening == 0.0f),
            "Sgd: Nesterov momentum needs momentum > 0 and dampening 0");
    for (std::size_t i = 0; i < params_.size(); ++i) require(params_[i] != nullptr, "Sgd: parameter ", i, " is null");
    layout_ = FlatLayout(params_);
    const std::size_t n = config_.momentum != 0.0f ? layout_.size() : 0;
    buffer_ = B::template allocate<float>(n);  // zeroed by the backend: the host never writes rank memory
    if (n > 0) B::run(ops::zero<float>{.n = n, .x = buffer_.data()});
    factors_ = B::template allocate<UpdateFactors>(1);  // written by each step before its update reads it
  }

  /** Applies one update with the configured learning rate. */
  void step() { step(config_.lr); }
  /** Applies one update with learning rate `lr` (from a schedule); gradients are multiplied by `grad_scale`. */
  void step(float lr, float grad_scale = 1.0f) { step(lr, write_host_factors<B>(grad_scale, factors_.data())); }
  /**
   * One update with the gradient scale and the skip flag read from `factors` (rank memory). A skipped update
   * still counts here; `retract_step()` takes it back once the host has learnt of the skip.
   */
  void step(float lr, const UpdateFactors* factors) {
    float* w = nullptr;
    const float* g = nullptr;
    if (layout_.holds(params_, w, g)) {  // one call over the flat range
      B::run(ops::sgd_update{.n = layout_.size(),
                             .w = w,
                             .g = g,
                             .buf = config_.momentum != 0.0f ? buffer_.data() : nullptr,
                             .momentum = config_.momentum,
                             .dampening = config_.dampening,
                             .nesterov = config_.nesterov,
                             .lr = lr,
                             .weight_decay = config_.weight_decay,
                             .first = steps_ == 0,
                             .factors = factors});
    } else {
      for (std::size_t i = 0; i < params_.size(); ++i) {
        auto& p = *params_[i];
        require(p.grad.size() == p.value.size(), "Sgd::step: parameter ", p.name, " has ", p.value.size(),
                " values but ", p.grad.size(), " gradients");
        sgd_update<B>(p.value, p.grad, momentum_buffer_mut(i), steps_ == 0, config_, lr, factors);
      }
    }
    ++steps_;
  }
  /** Takes back the count of an update that its factors skipped (the next one starts the buffer again if it was the first). */
  void retract_step() {
    require(steps_ > 0, "Sgd::retract_step: no step taken");
    --steps_;
  }
  void zero_grad() {
    for (auto* p : params_) p->zero_grad();
  }

  [[nodiscard]] std::size_t steps() const { return steps_; }
  /** Restores the step count with the momentum buffers from a checkpoint: step 0 starts a buffer, later ones add to it. */
  void set_steps(std::size_t n) { steps_ = n; }
  [[nodiscard]] const SgdConfig& config() const { return config_; }
  [[nodiscard]] std::span<const float> momentum_buffer(std::size_t i) const { return buffer(i); }
  /** Writable momentum buffer, for restoring a checkpoint (empty without momentum). */
  [[nodiscard]] std::span<float> momentum_buffer_mut(std::size_t i) { return buffer(i); }
  /** Whether the momentum buffer lies in the parameters' flat layout, so that a step is one backend call. */
  [[nodiscard]] bool flat() const { return layout_.flat(); }
  [[nodiscard]] const std::vector<nn::Parameter*>& params() const { return params_; }

 private:
  std::vector<nn::Parameter*> params_;
  SgdConfig config_;
  [[nodiscard]] std::span<float> buffer(std::size_t i) const {
    if (config_.momentum == 0.0f) return {};
    return std::span<float>(const_cast<float*>(buffer_.data()) + layout_.offset(i), layout_.size_of(i));
  }

  FlatLayout layout_;
  Buffer<float> buffer_;           // rank memory, one allocation: the backend's kernels read and write it
  Buffer<UpdateFactors> factors_;  // the factors of `step(lr, grad_scale)`, in rank memory
  std::size_t steps_ = 0;
};

}  // namespace mpar::optim
