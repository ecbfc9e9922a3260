#pragma once
/**
 * @file Dynamic loss scaling for f16 training: the loss is multiplied by a scale so small gradients survive
 * f16's narrow range; overflowing steps are skipped and the scale lowered, and after a run of good steps it
 * is raised again.
 */
#include <cmath>
#include <cstddef>
#include <span>

#include "mpar/comm/communicator.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/nn/parameter.hpp"

namespace mpar::optim {

/** @brief Loss-scaler settings (the defaults of common mixed-precision trainers). */
struct LossScalerConfig {
  float initial_scale = 65536.0f;
  float growth_factor = 2.0f;          ///< multiply the scale after `growth_interval` consecutive good steps
  float backoff_factor = 0.5f;         ///< multiply the scale on an overflowing step
  std::size_t growth_interval = 2000;  ///< good steps before growing
  float min_scale = 1.0f;              ///< never below this
  float max_scale = 16777216.0f;       ///< never above this (2^24)
};

/**
 * @brief Dynamic loss scaler. One step:
 * ```
 * backward(scaler.scale_loss(loss));                  // or seed the backward with scaler.scale()
 * bool ok = scaler.unscale_and_check(params, world);  // grads /= scale; inf/NaN agreed over all ranks
 * if (ok) optimizer.step(lr);                         // a skipped step leaves weights and states alone
 * scaler.update(ok);
 * ```
 * The overflow flag must be agreed by every rank that takes part in the step (all tensor, pipeline and data
 * ranks), otherwise one replica would step while another skips and the replicas would drift: pass the
 * world communicator (or any group spanning all of them).
 */
class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(LossScalerConfig config = {}) : config_(config), scale_(config.initial_scale) {
    require(config_.growth_factor > 1.0f && config_.backoff_factor > 0.0f && config_.backoff_factor < 1.0f &&
                config_.min_scale > 0.0f && config_.initial_scale >= config_.min_scale &&
                config_.initial_scale <= config_.max_scale && config_.growth_interval > 0,
            "DynamicLossScaler: need growth_factor > 1, 0 < backoff_factor < 1, growth_interval > 0 and "
            "min_scale <= initial_scale (",
            config_.initial_scale, ") <= max_scale");
  }

  [[nodiscard]] float scale() const { return scale_; }
  [[nodiscard]] float scale_loss(float loss) const { return loss * scale_; }
  [[nodiscard]] std::size_t skipped_steps() const { return skipped_; }
  [[nodiscard]] std::size_t good_steps_in_a_row() const { return good_run_; }

  /** Divides every gradient by the scale; returns whether all of them are finite on this rank alone. */
  [[nodiscard]] bool unscale_and_check(std::span<nn::Parameter* const> params) const { return local_unscale(params); }
  /** As above, with the verdict agreed over `group` (an all_reduce of the overflow flag with max). */
  template <communicator C>
  [[nodiscard]] bool unscale_and_check(std::span<nn::Parameter* const> params, C& group) const {
    Buffer<float> overflow{local_unscale(params) ? 0.0f : 1.0f};  // rank memory: it is communicated
    group.all_reduce(std::span<float>(overflow), ReduceOp::max);
    return overflow[0] == 0.0f;
  }

  /** Restores the state saved with a checkpoint. */
  void restore(float scale, std::size_t good_steps_in_a_row, std::size_t skipped) {
    scale_ = scale;
    good_run_ = good_steps_in_a_row;
    skipped_ = skipped;
  }
  /** Records the outcome of a step: lowers the scale after an overflow, raises it after enough good steps. */
  void update(bool finite) {
    if (!finite) {
      ++skipped_;
      good_run_ = 0;
      scale_ = std::fmax(scale_ * config_.backoff_factor, config_.min_scale);
      return;
    }
    if (++good_run_ >= config_.growth_interval) {
      good_run_ = 0;
      scale_ = std::fmin(scale_ * config_.growth_factor, config_.max_scale);
    }
  }

 private:
  bool local_unscale(std::span<nn::Parameter* const> params) const {
    const float inv = 1.0f / scale_;
    bool finite = true;
    for (auto* p : params)
      for (float& g : p->grad) {
        if (!std::isfinite(g)) finite = false;
        g *= inv;
      }
    return finite;
  }

  LossScalerConfig config_;
  float scale_;
  std::size_t good_run_ = 0, skipped_ = 0;
};

}  // namespace mpar::optim
