#pragma once
/**
 * @file The optimizer side of a training step as one object, in the shape of Megatron-Core's
 * DistributedOptimizer / MixedPrecisionOptimizer: `auto stats = optimizer.step(lr)`.
 *
 * It composes three policies, chosen once from a typed configuration:
 * - precision (`Precision`): fp32, or 16-bit compute weights (`parallel::ComputeCopies`) over fp32 masters,
 *   with dynamic loss scaling for f16;
 * - gradient synchronisation (`GradSync`): bucketed data-parallel all-reduces that overlap the backward
 *   (`DataParallel`; with experts, the replicated parameters over data x expert ranks and the experts over the
 *   data group), or ZeRO-1 / ZeRO-2 / ZeRO-3 (`ZeroAdamW`: reduce-scatter, sharded AdamW, all-gather; ZeRO-2
 *   keeps only the gradient shards, ZeRO-3 the weight shards too, gathered per unit by the passes; see
 *   parallel/zero.hpp). With experts ZeRO shards along the same two groups, as DeepSpeed-MoE does: one
 *   `ZeroAdamW` for the replicated parameters over data x expert ranks, one for the experts over the data group;
 *   or top-k compression with error feedback (`GradSync::topk`, `TopKCompressor` per parameter over the data
 *   group: each replica sends only the largest entries of its gradient plus what it held back before);
 * - the update rule (`UpdateRule`): AdamW or SGD with momentum.
 *
 * One step, without a host read until its statistics come back:
 * 1. finish the gradient synchronisation;
 * 2. the global squared gradient norm into rank memory (`optim::global_grad_squares`: each element counted
 *    once, all-reduced over the tensor, expert and pipeline groups — and the data group under ZeRO, the data
 *    x expert group under ZeRO with experts);
 * 3. `ops::update_factors`: the norm, and the `UpdateFactors` of the kernels (clipping coefficient x inverse
 *    loss scale; under f16 a skip flag on a non-finite norm, all-reduced with max over the world so every
 *    replica skips together);
 * 4. the update rule's kernels, which read the factors from rank memory;
 * 5. the per-step statistics (`RankStatistics`: loss, aux loss, norm, factors; the losses averaged over the
 *    world in rank memory) copied to the host once (an asynchronous copy into pinned memory and one event
 *    wait, the step's one synchronisation); then the host learns of a skip: the loss scaler is updated and a
 *    skipped update's count is taken back.
 *
 * `step(lr)` is two halves, which a captured step (`graph_backend`) separates: `issue_step_in_rank(lr)` issues
 * 1-4 and the statistics' copy with the learning rate read from rank memory and nothing that waits on the
 * host (what a graph records), and `read_statistics()` waits and does the host's part (after the launch).
 */
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "mpar/backend/backend.hpp"
#include "mpar/backend/host/host_backend.hpp"
#include "mpar/backend/rank_transfer.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/comm/topk.hpp"
#include "mpar/core/dtype.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/nn/parameter.hpp"
#include "mpar/optim/adamw.hpp"
#include "mpar/optim/clip.hpp"
#include "mpar/optim/loss_scaler.hpp"
#include "mpar/optim/sgd.hpp"
#include "mpar/parallel/data_parallel.hpp"
#include "mpar/parallel/gradient_arena.hpp"
#include "mpar/parallel/mixed_precision.hpp"
#include "mpar/parallel/parameter_arena.hpp"
#include "mpar/parallel/zero.hpp"
#include "mpar/parallel/zero_stage.hpp"

namespace mpar::parallel {

/** @brief The arithmetic of the passes: fp32, or 16-bit compute weights over fp32 masters (f16 with loss scaling). */
enum class Precision { fp32, bf16, f16 };
/** @brief The update rule. */
enum class UpdateRule { adamw, sgd };
/** @brief How the replicated gradients travel over the data replicas when no ZeRO stage shards them. */
enum class GradSync {
  all_reduce,  ///< bucketed all-reduces (replicated parameters over data x expert ranks, experts over data ranks)
  /// Top-k with error feedback (`OptimizerConfig::topk_density`): each replica sends the largest-magnitude entries of
  /// its gradient plus its residual and keeps the rest as the next step's residual (`TopKCompressor`, one per
  /// parameter); the sum of the updates applied plus the residuals is the dense sum. No ZeRO, no experts, no f16,
  /// host memory.
  topk
};

[[nodiscard]] constexpr std::string_view name_of(Precision p) {
  return p == Precision::fp32 ? "fp32" : p == Precision::bf16 ? "bf16" : "f16";
}
[[nodiscard]] constexpr std::string_view name_of(UpdateRule r) { return r == UpdateRule::adamw ? "adamw" : "sgd"; }

/** @brief Parses a precision name (fp32, bf16, f16) once, at the edge; throws config_error naming the choices. */
[[nodiscard]] inline Precision parse_precision(std::string_view s) {
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::f16})
    if (s == name_of(p)) return p;
  throw config_error(mpar::detail::cat("train: --precision '", s, "' is not one of fp32, bf16, f16"));
}
/** @brief Parses an optimizer name (adamw, sgd) once, at the edge; throws config_error naming the choices. */
[[nodiscard]] inline UpdateRule parse_update_rule(std::string_view s) {
  for (UpdateRule r : {UpdateRule::adamw, UpdateRule::sgd})
    if (s == name_of(r)) return r;
  throw config_error(mpar::detail::cat("train: --optimizer '", s, "' is not one of adamw, sgd"));
}

/** @brief What the optimizer is composed of, typed. */
struct OptimizerConfig {
  Precision precision = Precision::fp32;
  UpdateRule rule = UpdateRule::adamw;
  /// ZeRO-1 reduce-scatters the gradients, updates this rank's blocks and all-gathers the weights; ZeRO-2 holds
  /// only its gradient shards; ZeRO-3 the weights too (`ZeroAdamW`).
  ZeroStage zero = ZeroStage::none;
  GradSync sync = GradSync::all_reduce;  ///< without ZeRO
  optim::AdamWConfig adamw;              ///< AdamW's (and ZeRO-1's) hyper-parameters
  optim::SgdConfig sgd;                  ///< SGD's
  double clip = 1.0;                     ///< global-norm clipping threshold; 0 disables clipping
  std::size_t bucket_bytes = std::size_t(1) << 20;
  optim::LossScalerConfig loss_scaler;  ///< f16 only
  /// ZeRO-3: where each unit the passes gather at once begins, as indices into the updated parameters
  /// (`ZeroOptions::unit_starts`); empty: buckets by size only.
  std::vector<std::size_t> zero_unit_starts;
  /// `GradSync::topk`: the share of each parameter's gradient every replica sends per step, in (0, 1]
  /// (k = ceil(density x elements) entries of each tensor).
  double topk_density = 0;
};

/**
 * @brief What `GradSync::topk` sent over the data group in the last step, this rank's part: bytes of the (index,
 * value) pairs (two doubles each, `TopKCompressor`) against the bytes of the fp32 gradients a dense all-reduce
 * would take, and the norm of the residuals it now holds back.
 */
struct CompressionStatistics {
  double density = 0;
  std::size_t sent_bytes = 0, dense_bytes = 0;
  double residual_l2 = 0;
};

/**
 * @brief The groups of this rank the optimizer reduces over. `replica`: the ranks with other samples (data x
 * expert); `data`: the data group; `expert`: the expert group (its size is the expert-parallel degree `ep`).
 */
template <communicator Comm, communicator TensorComm = Comm>
struct OptimizerGroups {
  Comm* world = nullptr;
  TensorComm* tensor = nullptr;
  Comm* pipeline = nullptr;
  Comm* data = nullptr;
  Comm* replica = nullptr;
  Comm* expert = nullptr;
};

/**
 * @brief The statistics of one step as they live in rank memory: the losses (written by the loss
 * computation, averaged over the world by the optimizer), the squared and plain gradient norm and the
 * factors the update kernels read. Copied to the host once per step.
 */
struct RankStatistics {
  double loss = 0, aux_loss = 0;  ///< contiguous: one all-reduce averages both
  double grad_squares = 0, grad_norm = 0;
  UpdateFactors factors;
};

/** @brief What one step measured, the same on every rank. */
struct StepStatistics {
  double loss = 0, aux_loss = 0;
  double grad_norm = 0;    ///< of the true (unscaled) gradient, before clipping; not finite on an f16 overflow
  bool found_inf = false;  ///< the gradient held inf or NaN
  bool skipped = false;    ///< the update was skipped (f16 overflow): weights and states unchanged
};

/**
 * @brief The optimizer side of one rank: gradient synchronisation, norm, clipping, loss scaling, the update
 * and the mixed-precision weights, composed from an `OptimizerConfig`. `params` are the parameters it
 * updates, in model order; `compute_params` every parameter the passes read (they may include tied copies
 * that are written otherwise), whose weights `begin_compute()` rounds to the compute precision.
 */
template <communicator Comm, backend B = HostBackend, communicator TensorComm = Comm>
class DistributedOptimizer {
 public:
  DistributedOptimizer(std::vector<nn::Parameter*> params, std::vector<nn::Parameter*> compute_params,
                       OptimizerConfig config, OptimizerGroups<Comm, TensorComm> groups)
      : params_(std::move(params)), compute_params_(std::move(compute_params)), cfg_(std::move(config)), g_(groups) {
    require(g_.world && g_.tensor && g_.pipeline && g_.data && g_.replica,
            "DistributedOptimizer: the world, tensor, pipeline, data and replica groups are required");
    ep_ = g_.expert ? std::size_t(g_.expert->size()) : 1;
    const std::size_t dp = std::size_t(g_.data->size()), replicas = std::size_t(g_.replica->size());
    const ZeroStage stage = cfg_.zero;
    require(stage == ZeroStage::none || cfg_.rule == UpdateRule::adamw, "DistributedOptimizer: ", name_of(stage),
            " shards AdamW states; use the adamw update rule with ", name_of(stage));
    require(stage == ZeroStage::none || cfg_.sync != GradSync::topk, "DistributedOptimizer: top-k compression with ",
            name_of(stage), ": ZeRO reduce-scatters the dense gradients; use one of the two");
    if (cfg_.sync == GradSync::topk) require_topk_composition(replicas);
    if (cfg_.precision == Precision::f16) scaler_.emplace(cfg_.loss_scaler);
    // ZeRO-3: the updated parameters are rounded as they are gathered (their fp32 masters are the shards), so
    // the compute copies cover only what is not sharded (the head's tied copy on another pipeline stage).
    if (stage == ZeroStage::parameters)
      std::erase_if(compute_params_, [&](const nn::Parameter* p) { return std::ranges::count(params_, p) > 0; });
    if (cfg_.precision == Precision::bf16) copies_.template emplace<ComputeCopies<bf16, B>>(compute_params_);
    if (cfg_.precision == Precision::f16) copies_.template emplace<ComputeCopies<f16, B>>(compute_params_);
    if (cfg_.precision != Precision::fp32) masters_.resize(compute_params_.size());
    stats_ = B::template allocate<RankStatistics>(1);  // every field written by operations or copies before it is read
    bind_gradient_arena(stage);
    // Replicated parameters average over every rank with other samples (data x expert); experts over the
    // data group, divided by dp x ep: each already sums the tokens of its whole expert group.
    std::vector<nn::Parameter*> replicated;
    std::vector<std::size_t> replicated_units, expert_units;  // ZeRO-3's unit starts, as indices into each list
    for (std::size_t i = 0; i < params_.size(); ++i) {
      nn::Parameter* p = params_[i];
      const bool expert = ep_ > 1 && optim::sharded_over_expert(*p);
      auto& list = expert ? experts_ : replicated;
      if (std::ranges::count(cfg_.zero_unit_starts, i) > 0) {  // a unit starts here: in both lists, where it is next
        add_unit_start(replicated_units, replicated.size());
        add_unit_start(expert_units, experts_.size());
      }
      route_.emplace(p, Route{stage != ZeroStage::none ? (expert ? Route::zero_expert : Route::zero)
                              : expert                 ? Route::expert
                                                       : Route::replicated,
                              list.size()});
      list.push_back(p);
    }
    if (stage != ZeroStage::none) {
      // Without experts one ZeroAdamW shards every parameter over the data group (which then also holds the
      // context ranks of a context-parallel run).
      zero_.emplace(std::move(replicated), ep_ > 1 ? *g_.replica : *g_.data, cfg_.adamw,
                    ZeroOptions{cfg_.bucket_bytes, 0.0, stage, 2, std::move(replicated_units)});
      if (!experts_.empty())
        zero_experts_.emplace(experts_, *g_.data, cfg_.adamw,
                              ZeroOptions{cfg_.bucket_bytes, double(replicas), stage, 2, std::move(expert_units)});
      for (auto* z : zeros()) {
        if (stage == ZeroStage::parameters && cfg_.precision == Precision::bf16) z->template round_gathered_to<bf16>();
        if (stage == ZeroStage::parameters && cfg_.precision == Precision::f16) z->template round_gathered_to<f16>();
      }
    } else {
      if (cfg_.sync == GradSync::topk) {
        topk_.reserve(params_.size());  // every parameter is replicated (no experts): all in the replica group
        for (auto* p : params_) topk_.emplace_back(*g_.replica, p->value.size(), cfg_.topk_density);
      } else if (replicas > 1) {
        dp_.emplace(replicated, *g_.replica, DataParallelOptions{cfg_.bucket_bytes, 0.0});
      }
      if (dp > 1 && !experts_.empty())
        dp_experts_.emplace(experts_, *g_.data, DataParallelOptions{cfg_.bucket_bytes, double(replicas)});
      if (cfg_.rule == UpdateRule::adamw)
        adamw_.emplace(params_, cfg_.adamw);
      else
        sgd_.emplace(params_, cfg_.sgd);
    }
  }
  /**
   * A step abandoned between `begin_compute` and `end_compute` leaves no parameter pointing at the compute
   * copies this object owns (only then: the parameters may be gone after a finished step).
   */
  ~DistributedOptimizer() {
    if (computing_)
      for (nn::Parameter* p : compute_params_) p->clear_compute_copy();
  }
  DistributedOptimizer(DistributedOptimizer&&) = default;
  DistributedOptimizer& operator=(DistributedOptimizer&&) = default;

  /**
   * The gradient of `p` is final for this step: its bucket may start reducing (overlap with the backward).
   * Parameters this optimizer does not update (a tied copy) are ignored; the lookup is one hash probe, and
   * the bucket is found by the parameter's index.
   */
  void gradient_ready(const nn::Parameter& p) {
    const auto t = std::chrono::steady_clock::now();
    if (const auto it = route_.find(&p); it != route_.end()) {
      const Route r = it->second;
      if (r.kind == Route::zero)
        zero_->mark_ready(r.index);
      else if (r.kind == Route::zero_expert)
        zero_experts_->mark_ready(r.index);
      else if (r.kind == Route::replicated && dp_)
        dp_->mark_ready(r.index);
      else if (r.kind == Route::expert && dp_experts_)
        dp_experts_->mark_ready(r.index);
    }
    sync_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  /** The factor the loss (its gradient) is multiplied by in the backward: the f16 loss scale, else 1. */
  [[nodiscard]] float loss_scale() const { return scaler_ ? scaler_->scale() : 1.0f; }

  /**
   * Where this step's loss and auxiliary loss go (rank memory, two doubles): the optimizer averages them over
   * the world and returns them with the statistics. Until the loss is computed by backend operations the
   * trainer records the host values with `record_losses`.
   */
  [[nodiscard]] double* losses() { return &stats_.data()->loss; }
  /**
   * Starts a step whose losses the passes accumulate in rank memory (`B::accumulate` into `losses()`): both
   * zeroed by an operation, no host wait; the auxiliary loss follows with `record_aux_loss`.
   */
  void zero_losses() { B::run(ops::zero<double>{.n = 2, .x = losses()}); }
  /** The auxiliary loss as a host value (the MoE blocks' load-balancing loss), after the passes; no host wait. */
  void record_aux_loss(double aux_loss) {
    loss_staging_[1] = aux_loss;  // rewritten only after this step's statistics read, as in record_losses
    B::template copy_from_host_async<double>(1, loss_staging_.data() + 1, losses() + 1);
  }
  void record_losses(double loss, double aux_loss) {
    // Without a host wait: the staging buffer is rewritten only by the next step's call, after this step's
    // statistics read (a later point of the same stream) has waited.
    loss_staging_[0] = loss;
    loss_staging_[1] = aux_loss;
    B::template copy_from_host_async<double>(2, loss_staging_.data(), losses());
  }

  /**
   * Before the passes: under ZeRO-2 allocates the zeroed gradients the backward accumulates into (released
   * again bucket by bucket as they are reduced); rounds the weights the passes read to the compute precision
   * (fp32 masters kept aside; nothing in fp32).
   */
  void begin_compute() {
    end_compute();  // a step abandoned by an exception after begin_compute: its masters back in place first
    for (auto* z : zeros()) z->prepare_gradients();
    std::visit(
        [&](auto& copies) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(copies)>, std::monostate>) {
            // Round each master into its 16-bit copy (B::convert, on the rank's stream), then exchange the
            // master's buffer with a scratch buffer of the same size (the master aside without copying it)
            // and widen the copy into the scratch, which the passes read as the value. The exchange is of
            // handles on the host: the passes always read one buffer and the update always writes the
            // other, so a captured step replays with the same addresses; no host pass over weights.
            // The layers' GEMMs take the 16-bit copy itself as their weight (`Parameter::compute_copy`) instead
            // of rounding the widened value once more. A weight only GEMMs read (`gemm_operand_only`) keeps its
            // master in place: nothing reads a widened copy of it.
            copies.refresh();
            widened_.assign(compute_params_.size(), false);
            for (std::size_t i = 0; i < compute_params_.size(); ++i) {
              nn::Parameter& p = *compute_params_[i];
              p.set_compute_copy(copies.weights(i));
              if (p.gemm_operand_only) continue;
              if (masters_[i].size() != p.value.size()) masters_[i] = B::template allocate<float>(p.value.size());
              std::swap(p.value, masters_[i]);
              copies.widen_into(i, p.value);
              widened_[i] = true;
            }
            computing_ = true;
          }
        },
        copies_);
  }
  /**
   * Puts the fp32 masters back after the passes (the optimizer updates them): the buffers exchanged by
   * `begin_compute` are exchanged again. Without a `begin_compute` before it, it changes nothing.
   */
  void end_compute() {
    if (!computing_) return;
    for (std::size_t i = 0; i < masters_.size(); ++i) {
      auto& value = compute_params_[i]->value;
      require(!widened_[i] || value.size() == masters_[i].size(), "DistributedOptimizer::end_compute: parameter ",
              compute_params_[i]->name, " holds ", value.size(), " values but its master ", masters_[i].size(),
              "; a parameter must not be resized between begin_compute and end_compute");
    }
    for (std::size_t i = 0; i < masters_.size(); ++i) {
      if (widened_[i]) std::swap(compute_params_[i]->value, masters_[i]);
      compute_params_[i]->clear_compute_copy();
    }
    computing_ = false;
  }

  /**
   * @brief One optimizer step with learning rate `lr` after the backward (and any tied-gradient sums): finishes
   * the gradient synchronisation, computes the global norm, clips, unscales and steps on the device, averages
   * the recorded losses over the world, and reads the statistics back once. Collective over the world.
   */
  StepStatistics step(double lr) {
    issue_step(float(lr), nullptr);
    return read_statistics();
  }
  /**
   * @brief The issue half of `step`, for a step that is captured once and replayed (`graph_backend`): the
   * learning rate is read from rank memory `lr` (one float the caller writes by an asynchronous copy before each
   * step), AdamW advances its count and bias corrections in rank memory (`optim::AdamW::step_in_rank`), and the
   * statistics are copied into pinned memory this optimizer holds; nothing waits on the host. Call
   * `read_statistics()` after the step has been issued (or launched). Needs the AdamW update rule without ZeRO
   * and without f16 loss scaling (whose scale the host chooses each step); the first call waits once on the host
   * (AdamW's count into rank memory), so make it eagerly, before a capture.
   */
  void issue_step_in_rank(const float* lr) {
    require(adamw_.has_value() && !scaler_ && topk_.empty(), "DistributedOptimizer::issue_step_in_rank: the ",
            "learning rate in rank memory needs AdamW without ZeRO, f16 loss scaling or top-k compression (this ",
            "optimizer: ", name_of(cfg_.rule), zero_ ? " with ZeRO" : "", scaler_ ? ", f16" : "",
            topk_.empty() ? "" : ", top-k", "); use step(lr)");
    require(lr != nullptr, "DistributedOptimizer::issue_step_in_rank: the learning rate's address is null");
    issue_step(0.0f, lr);
  }
  /**
   * @brief The read half of a step (see `issue_step_in_rank`), after the step was issued or a captured one
   * launched: waits until the rank's stream has passed the statistics' copy (the step's one host
   * synchronisation), then updates the loss scaler and takes back a skipped update's count (or, for an update
   * AdamW counted in rank memory, counts a taken one on the host too). Returns the statistics.
   */
  StepStatistics read_statistics() {
    require(step_issued_,
            "DistributedOptimizer::read_statistics: no step issued yet; call issue_step_in_rank (or "
            "step) first");
    mpar::wait_for_rank_stream<B>();  // the step's one synchronisation: the copy into stats_staging_ has run
    const RankStatistics& host = stats_staging_[0];
    StepStatistics out{host.loss, host.aux_loss, host.grad_norm, !std::isfinite(host.grad_norm),
                       host.factors.skip != 0.0f};
    if (rank_lr_) {
      if (!out.skipped) adamw_->count_update_in_rank();  // step_in_rank counted it in rank memory already
    } else if (out.skipped) {
      if (zero_)
        for (auto* z : zeros()) z->retract_step();
      else if (adamw_)
        adamw_->retract_step();
      else
        sgd_->retract_step();
    }
    if (scaler_) scaler_->update(!out.skipped);
    last_ = out;
    return out;
  }

 private:
  /** Issues a step (see `step`): the learning rate `host_lr`, or read from rank memory `rank_lr` when not null. */
  void issue_step(float host_lr, const float* rank_lr) {
    finish_gradient_sync();
    if (on_synchronised_) on_synchronised_();
    RankStatistics* st = stats_.data();
    if (zero_experts_) {
      // Both shards tile the data x expert group (the replicated blocks over all of it, each expert's blocks over
      // the data ranks of its expert rank): one sum over it, then over the tensor and pipeline groups.
      mpar::zero_in_rank<B>(&st->grad_squares, 1);
      const optim::SquaresShare share = optim::squares_share(*g_.tensor, *g_.pipeline);
      for (auto* z : zeros()) z->accumulate_shard_squares(&st->grad_squares, share);
      optim::sum_over(&st->grad_squares, *g_.replica, *g_.tensor, *g_.pipeline);
    } else if (zero_)
      zero_->global_grad_squares(&st->grad_squares, *g_.tensor, *g_.pipeline);
    else if (ep_ > 1)
      optim::global_grad_squares<B>(params_, &st->grad_squares, *g_.tensor, *g_.pipeline, *g_.expert);
    else
      optim::global_grad_squares<B>(params_, &st->grad_squares, *g_.tensor, *g_.pipeline);
    B::run(ops::update_factors{.squares = &st->grad_squares,
                               .max_norm = cfg_.clip,
                               .inv_loss_scale = 1.0f / loss_scale(),
                               .skip_nonfinite = scaler_.has_value(),
                               .norm = &st->grad_norm,
                               .factors = &st->factors});
    // The norm is already the same on every rank; agreeing the skip over the world keeps replicas together
    // even if a communicator's reduction rounded differently on some rank.
    if (scaler_) g_.world->all_reduce(std::span<float>(&st->factors.skip, 1), ReduceOp::max);
    if (rank_lr != nullptr)
      adamw_->step_in_rank(rank_lr, &st->factors);
    else if (zero_)
      for (auto* z : zeros()) z->step(host_lr, &st->factors);
    else if (adamw_)
      adamw_->step(host_lr, &st->factors);
    else
      sgd_->step(host_lr, &st->factors);
    g_.world->all_reduce(std::span<double>(losses(), 2), ReduceOp::avg);
    // The step's one read of rank memory, into pinned memory that stays: a captured step copies it at each replay.
    B::template copy_to_host_async<RankStatistics>(1, st, stats_staging_.data());
    rank_lr_ = rank_lr != nullptr;
    step_issued_ = true;
  }

 public:
  /** The statistics of the last step (for logging without another read). */
  [[nodiscard]] const StepStatistics& last_statistics() const { return last_; }

  /**
   * Zeroes the gradients of the updated parameters and of the other parameters the passes read (a tied
   * copy): with the gradient arena (no ZeRO, ZeRO-1) one `B::zero` over all of them; ZeRO-2/3 release them
   * instead (`begin_compute` allocates them again).
   */
  void zero_grad() {
    if (arena_) {
      arena_->zero();
      if (!arena_->intact())  // a gradient replaced since binding (it left the arena): zero it on its own
        for (auto* p : arena_->params())
          if (!arena_->holds(*p)) nn::zero_grad<B>(*p);
    } else if (zero_) {
      for (auto* z : zeros()) z->zero_grad();  // the same parameters, through ZeRO's own lists
    } else {
      for (auto* p : params_) nn::zero_grad<B>(*p);
    }
  }
  /** Whether `zero_grad()` zeroes `p`'s gradient although `p` is not updated here (a tied copy in the arena). */
  [[nodiscard]] bool zeroes_gradient_of(const nn::Parameter& p) const { return arena_ && arena_->holds(p); }
  /** The gradient arena (no ZeRO and ZeRO-1; null under ZeRO-2/3, which release gradients). */
  [[nodiscard]] const GradientArena<B>* gradient_arena() const { return arena_ ? &*arena_ : nullptr; }
  /** The parameter arena (without ZeRO and under ZeRO-1/2; null under ZeRO-3, which releases the values). */
  [[nodiscard]] const ParameterArena<B>* parameter_arena() const { return values_ ? &*values_ : nullptr; }

  [[nodiscard]] const OptimizerConfig& config() const { return cfg_; }
  [[nodiscard]] const std::vector<nn::Parameter*>& params() const { return params_; }
  /** Seconds spent in the gradient synchronisation (marking buckets, finishing them), accumulated. */
  [[nodiscard]] double sync_seconds() const { return sync_seconds_; }
  /** `GradSync::topk`: what the last step's compression sent (this rank); empty before the first step or without it. */
  [[nodiscard]] const std::optional<CompressionStatistics>& compression() const { return compression_; }
  /**
   * `GradSync::topk`: the residual parameter `i` (of `params()`) holds back after the last step — its gradient's
   * entries not yet sent, in double precision; empty without top-k.
   */
  [[nodiscard]] std::span<const double> compression_residual(std::size_t i) const {
    return topk_.empty() ? std::span<const double>() : topk_.at(i).residual();
  }
  /** Bytes the top-k residuals hold (a double per gradient element; 0 without top-k). */
  [[nodiscard]] std::size_t compression_bytes() const {
    std::size_t n = 0;
    for (const auto& c : topk_) n += c.residual().size() * sizeof(double);
    return n;
  }
  /**
   * @brief Calls `f` in every step once the gradient synchronisation has finished and before the norm and the
   * update: the gradients are then what the update applies (averaged over the data group, decompressed under
   * top-k). For inspection; a step captured once and replayed (`issue_step_in_rank` under a capture) runs it at the
   * capture only.
   */
  void on_synchronised(std::function<void()> f) { on_synchronised_ = std::move(f); }
  /** The composed parts, for checkpoints and inspection (null when not part of this composition). */
  [[nodiscard]] optim::AdamW<B>* adamw() { return adamw_ ? &*adamw_ : nullptr; }
  [[nodiscard]] optim::Sgd<B>* sgd() { return sgd_ ? &*sgd_ : nullptr; }
  /** ZeRO's optimizer of the replicated parameters (of all of them without experts); null without ZeRO. */
  [[nodiscard]] ZeroAdamW<Comm, B>* zero() { return zero_ ? &*zero_ : nullptr; }
  /** ZeRO's optimizer of the experts (sharded over the data group) when `ep > 1` and this rank holds experts. */
  [[nodiscard]] ZeroAdamW<Comm, B>* expert_zero() { return zero_experts_ ? &*zero_experts_ : nullptr; }
  /**
   * Every ZeRO optimizer of this rank (none, the one of all parameters, or that of the replicated parameters and
   * that of the experts): what a caller iterates to gather, store or checkpoint every shard.
   */
  [[nodiscard]] std::vector<ZeroAdamW<Comm, B>*> zeros() {
    std::vector<ZeroAdamW<Comm, B>*> out;
    if (zero_) out.push_back(&*zero_);
    if (zero_experts_) out.push_back(&*zero_experts_);
    return out;
  }
  [[nodiscard]] optim::DynamicLossScaler* scaler() { return scaler_ ? &*scaler_ : nullptr; }
  /** Updates taken (AdamW's bias-correction count, or SGD's), for checkpoints. */
  [[nodiscard]] std::size_t steps() const { return zero_ ? zero_->steps() : adamw_ ? adamw_->steps() : sgd_->steps(); }
  void set_steps(std::size_t n) {
    if (zero_)
      for (auto* z : zeros()) z->set_steps(n);
    else if (adamw_)
      adamw_->set_steps(n);
    else
      sgd_->set_steps(n);
  }
  /** Floats of the synchroniser's own gradient buffers held now (ZeRO: shards and flat buckets; else 0). */
  [[nodiscard]] std::size_t sync_gradient_elements() const {
    return sum_over_zeros([](const auto& z) { return z.gradient_buffer_elements(); });
  }
  /** Floats of the fp32 weight shards ZeRO-3 keeps at rest (0 otherwise: the weights are the parameters'). */
  [[nodiscard]] std::size_t sharded_weight_elements() const {
    return sum_over_zeros([](const auto& z) { return z.master_elements(); });
  }
  /** Optimizer-state floats held on this rank. */
  [[nodiscard]] std::size_t state_elements() const {
    if (zero_) return sum_over_zeros([](const auto& z) { return z.state_elements(); });
    std::size_t n = 0;
    for (const auto* p : params_) n += p->value.size();
    return adamw_ ? 2 * n : sgd_->config().momentum != 0.0f ? n : 0;
  }
  /** Bytes of the precision policy: the fp32 masters kept aside and the 16-bit copies. */
  [[nodiscard]] std::size_t precision_bytes() const {
    std::size_t n = 0;
    for (const auto& m : masters_) n += m.size() * sizeof(float);
    std::visit(
        [&](const auto& c) {
          if constexpr (!std::is_same_v<std::decay_t<decltype(c)>, std::monostate>) n += c.bytes();
        },
        copies_);
    return n;
  }

 private:
  struct Route {
    enum Kind { replicated, expert, zero, zero_expert } kind;
    std::size_t index;  ///< in the list of the synchroniser that owns the parameter
  };

  /** `f(z)` summed over the ZeRO optimizers (0 without ZeRO). */
  template <class F>
  [[nodiscard]] std::size_t sum_over_zeros(F f) const {
    return (zero_ ? f(*zero_) : 0) + (zero_experts_ ? f(*zero_experts_) : 0);
  }
  /** Appends `start` to ZeRO-3's unit starts of one list unless the list's last unit starts there already. */
  static void add_unit_start(std::vector<std::size_t>& starts, std::size_t start) {
    if (starts.empty() || starts.back() != start) starts.push_back(start);
  }

  /**
   * Without ZeRO and under ZeRO-1 every gradient this rank holds becomes a slice of one arena, in the order the
   * backward produces them: the replicated parameters last first, then the experts last first (each list is
   * bucketed on its own, last first, so every bucket is a contiguous range and is reduced in place), then the
   * parameters the passes read but this optimizer does not update (a tied copy), so that `zero_grad` is one
   * operation. ZeRO-2/3 keep their own path: they release each gradient once its bucket has taken it.
   * Without ZeRO the values of the updated parameters become a parameter arena in the same order, so that
   * values, gradients and the optimizer's states (which take the values' layout, see optim::FlatLayout) lie
   * at the same offsets and AdamW or SGD is one backend call per step. ZeRO updates its own contiguous shard
   * (its blocks of every bucket, back to back; one backend call too); under ZeRO-1/2 the values are bound all
   * the same, so that each bucket's weights are one range of the arena (one copy into the shard before the
   * update, one out of the all-gather after it). ZeRO-3 releases the values, and ZeRO-2 the gradients.
   */
  void bind_gradient_arena(ZeroStage stage) {
    if (stage == ZeroStage::parameters) return;
    std::vector<nn::Parameter*> order, experts;
    for (auto it = params_.rbegin(); it != params_.rend(); ++it)
      (ep_ > 1 && optim::sharded_over_expert(**it) ? experts : order).push_back(*it);
    order.insert(order.end(), experts.begin(), experts.end());
    values_.emplace(order);
    if (stage == ZeroStage::gradients) return;
    for (auto* p : compute_params_)
      if (std::ranges::count(order, p) == 0) order.push_back(p);
    arena_.emplace(std::move(order));
  }

  void finish_gradient_sync() {
    const auto t = std::chrono::steady_clock::now();
    if (zero_)
      for (auto* z : zeros()) z->reduce_gradients();
    else if (dp_)
      dp_->finish();
    else if (!topk_.empty())
      compress_gradients();
    if (dp_experts_)
      dp_experts_->finish();
    else if (ep_ > 1 && !zero_)
      optim::scale_grads<B>(experts_, 1.0f / float(ep_));
    sync_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  /**
   * What `GradSync::topk` needs of the composition, each refusal naming the fix; `replicas`: the size of the data group
   * the gradients are averaged over.
   */
  void require_topk_composition(std::size_t replicas) const {
    require(cfg_.topk_density > 0 && cfg_.topk_density <= 1, "DistributedOptimizer: top-k density ", cfg_.topk_density,
            " is not in (0, 1]; give the share of each gradient a replica sends, e.g. 0.01");
    require(replicas > 1, "DistributedOptimizer: top-k compression reduces over the data group, which has one rank ",
            "here: there is nothing to compress; use two or more data-parallel ranks, or the dense all-reduce");
    require(ep_ == 1, "DistributedOptimizer: top-k compression with expert parallelism (ep ", ep_,
            "): the experts' gradients reduce over another group than the rest; use ep 1, or the dense all-reduce");
    require(cfg_.precision != Precision::f16, "DistributedOptimizer: top-k compression with f16: the residual it ",
            "carries over would hold gradients scaled by an old loss scale (and an overflowed step's infinities); ",
            "use bf16 or fp32, or the dense all-reduce");
    require(mpar::host_reads_rank_memory<B>, "DistributedOptimizer: top-k compression selects the entries on the ",
            "host, and the ", B::name, " backend's gradients are not host memory; use the host backend, or the ",
            "dense all-reduce");
  }
  /**
   * `GradSync::topk`: each parameter's gradient replaced by the average over the data group of every replica's top k
   * of gradient + residual (the rest kept as the residual), parameter after parameter in the same order on every
   * replica; the step's bytes counted.
   */
  void compress_gradients() {
    if constexpr (mpar::host_reads_rank_memory<B>) {
      CompressionStatistics s{cfg_.topk_density, 0, 0, 0};
      double squares = 0;
      for (std::size_t i = 0; i < params_.size(); ++i) {
        const TopKStats t = topk_[i].all_reduce(std::span<float>(params_[i]->grad), ReduceOp::avg);
        s.sent_bytes += t.k * 2 * sizeof(double);
        s.dense_bytes += t.n * sizeof(float);
        squares += t.residual_l2 * t.residual_l2;
      }
      s.residual_l2 = std::sqrt(squares);
      compression_ = s;
    }
  }

  std::vector<nn::Parameter*> params_, compute_params_;
  OptimizerConfig cfg_;
  OptimizerGroups<Comm, TensorComm> g_;
  std::size_t ep_ = 1;
  std::unordered_map<const nn::Parameter*, Route> route_;
  std::vector<nn::Parameter*> experts_;
  std::optional<DataParallel<Comm, B>> dp_, dp_experts_;
  std::vector<TopKCompressor<Comm>> topk_;  // GradSync::topk: one per updated parameter, over the data group
  std::optional<CompressionStatistics> compression_;
  std::optional<GradientArena<B>> arena_;    // bound before the synchronisers are built: their buckets are ranges of it
  std::optional<ParameterArena<B>> values_;  // bound before the update rule: its states take the values' layout
  std::optional<ZeroAdamW<Comm, B>> zero_, zero_experts_;
  std::optional<optim::AdamW<B>> adamw_;
  std::optional<optim::Sgd<B>> sgd_;
  std::optional<optim::DynamicLossScaler> scaler_;
  std::variant<std::monostate, ComputeCopies<bf16, B>, ComputeCopies<f16, B>> copies_;
  // Rank memory: the fp32 weights while the passes see rounded ones (`computing_`), else the scratch buffers
  // the passes' rounded values are widened into.
  std::vector<Buffer<float>> masters_;
  std::vector<bool> widened_;  // per compute parameter: its value is the widened copy, its master in masters_
  bool computing_ = false;
  typename B::template pinned_buffer<double> loss_staging_ =
      typename B::template pinned_buffer<double>(2);  // record_losses
  Buffer<RankStatistics> stats_;                      // rank memory: written by backend operations and communicators
  typename B::template pinned_buffer<RankStatistics> stats_staging_ =
      typename B::template pinned_buffer<RankStatistics>(1);  // the statistics' copy on the host
  bool step_issued_ = false;  // a step was issued: its statistics' copy is what read_statistics waits for
  bool rank_lr_ = false;      // the last step issued read its learning rate from rank memory (step_in_rank);
                              // a replay of a captured step is that step again
  StepStatistics last_;
  double sync_seconds_ = 0;
  std::function<void()> on_synchronised_;
};

}  // namespace mpar::parallel
