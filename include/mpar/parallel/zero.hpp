#pragma once
/**
 * @file ZeRO stages 1, 2 and 3 (Rajbhandari et al., arXiv 1910.02054): AdamW whose fp32 states (stage 1),
 * averaged gradients (stage 2) and weights (stage 3) are sharded over the data axis. Each bucket of gradients is reduce-scattered
 * (rank r receives block_of(n, p, r) of the bucket's flat buffer), r updates that block of the weights with
 * its block of the moments, and the weights are all-gathered back, so every replica ends the step with
 * identical full parameters while holding only 1/p of the optimizer states. The two stages differ only in
 * how long full-size gradient memory lives (`parallel::BucketMemory`):
 * - stage 1 keeps every parameter's gradient, every bucket's flat buffer and the all-gather's receive buffers
 *   for the whole run;
 * - stage 2 releases a parameter's gradient once it is copied into its bucket, frees a bucket's flat buffer as
 *   soon as its reduce-scatter completes (at most `in_flight` + 1 in the backward), and allocates the
 *   all-gather's receive buffers for the step only. Between steps a rank holds the weights, its gradient
 *   shards (about N / p) and its moment shards (2 N / p); `prepare_gradients()` allocates the zeroed
 *   gradients the next backward accumulates into (the layers accumulate into `Parameter::grad`).
 * - stage 3 is stage 2 with the weights sharded at rest: this rank's block of each bucket's weights is the
 *   fp32 master the update writes, every `Parameter::value` is released between uses, and the step ends
 *   without the all-gather; the passes gather the buckets of a unit (a block, the embeddings, the head) just
 *   before they use it and release them after (`gather_begin` / `gather_end` / `gather_release`, driven by
 *   `parallel::GatheredUnits`).
 * The averaging, the gradient norm's sums of squares and the update run on the compute backend `B` (the
 * moments and the flat buffers are rank memory).
 *
 * This rank's blocks of all buckets lie back to back (`GradBuckets::shards()`, bucket order), and so do its
 * weight blocks and both moments, at the same offsets: the averaging is one `ops::scale`, the norm one
 * `ops::sum_squares` per run of counted parameters (one in all where every parameter counts), and the update one
 * `ops::adamw_update` over the whole shard, its weight decay taken per `DecayRun` (as `optim::AdamW` does over a
 * parameter arena). The parameter pieces still matter where weights move between the parameters and the shard
 * (stages 1 and 2 copy each piece in before the update; stage 3 copies each gathered slot out).
 */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "mpar/backend/backend.hpp"
#include "mpar/backend/host/host_backend.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/core/dtype.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/optim/adamw.hpp"
#include "mpar/optim/clip.hpp"
#include "mpar/optim/host_factors.hpp"
#include "mpar/parallel/buckets.hpp"
#include "mpar/parallel/zero_stage.hpp"

namespace mpar::parallel {

/** @brief ZeRO settings; `bucket_bytes` and `divisor` mean what they mean in `DataParallelOptions`. */
struct ZeroOptions {
  std::size_t bucket_bytes = std::size_t(25) << 20;
  double divisor = 0.0;                           ///< 0: the data group size
  ZeroStage stage = ZeroStage::optimizer_states;  ///< ZeRO-1, 2 or 3 (see the file comment); `none` is refused
  std::size_t in_flight = 2;  ///< stages 2 and 3: reduce-scatters in flight before the oldest is waited for
  /// Stage 3: indices (into the parameter list) where a unit the passes gather at once begins; no bucket
  /// crosses one, so a unit is gathered as whole buckets (`plan_buckets`).
  std::vector<std::size_t> unit_starts;
};

/**
 * @brief AdamW with ZeRO-1, ZeRO-2 or ZeRO-3 sharding over the data group `Comm` (`ZeroOptions::stage`). Replaces both `DataParallel` and
 * `optim::AdamW` (it averages the gradients itself). Per step:
 * ```
 * backward, calling zero.mark_ready(p) as gradients become final;   // reduce-scatters overlap the backward
 * zero.reduce_gradients();                                          // optional: wait explicitly
 * double norm = zero.grad_norm(tensor_group, pipeline_group);        // optional, for clipping
 * zero.step(lr, optim::clip_coefficient(norm, 1.0));
 * ```
 * or, without a host read (what `parallel::DistributedOptimizer` does):
 * ```
 * zero.global_grad_squares(squares, tensor_group, pipeline_group);   // rank memory
 * B::run(ops::update_factors{.squares = squares, .max_norm = 1.0, .norm = norm, .factors = factors});  // rank memory
 * zero.step(lr, factors);
 * ```
 * Stage 1: `p.grad` keeps this rank's un-averaged gradient (zero it for the next step as usual); the averaged
 * gradient exists only as this rank's blocks. Stage 2: `p.grad` is released when its bucket takes it;
 * `zero_grad()` leaves it released and `prepare_gradients()` allocates it zeroed before the next backward.
 */
template <communicator Comm, backend B = HostBackend>
class ZeroAdamW {
 public:
  ZeroAdamW(std::vector<nn::Parameter*> params, Comm& data_group, optim::AdamWConfig config, ZeroOptions options = {})
      : buckets_(std::move(params), data_group, options.bucket_bytes, stage_memory(options.stage, data_group),
                 options.in_flight, options.unit_starts),
        config_(std::move(config)), divisor_(options.divisor > 0.0 ? options.divisor : double(data_group.size())),
        stage_(options.stage) {
    const auto p = std::size_t(data_group.size()), r = std::size_t(data_group.rank());
    pieces_.resize(buckets_.bucket_count());
    block_offset_.resize(buckets_.bucket_count());
    std::vector<DecayRun> runs;
    for (std::size_t b = 0; b < buckets_.bucket_count(); ++b) {
      const Bucket& bk = buckets_.bucket(b);
      const Block mine = block_of(bk.size, p, r);
      block_offset_[b] = mine.offset;
      // The parts of parameters that fall into this rank's block of the bucket: they tile the block in order.
      for (const auto& s : bk.slots) {
        const std::size_t lo = std::max(s.offset, mine.offset),
                          hi = std::min(s.offset + s.size, mine.offset + mine.extent);
        if (lo >= hi) continue;
        const Piece pc{s.param, buckets_.shard_offset(b) + lo - mine.offset, lo - s.offset, hi - lo};
        pieces_[b].push_back(pc);
        const auto decays = std::uint32_t(config_.decays_param(*buckets_.params()[s.param]) ? 1 : 0);
        if (!runs.empty() && runs.back().decays == decays)
          runs.back().end = pc.shard_offset + pc.size;
        else
          runs.push_back({pc.shard_offset + pc.size, decays});
      }
    }
    // Rank memory the host never writes: moments zeroed by the backend, the weight shard copied in each step
    // (stage 3: at construction, then kept). All at the offsets of the gradient shards.
    const std::size_t n = buckets_.shard_elements();
    m_ = B::template allocate<float>(n);
    v_ = B::template allocate<float>(n);
    w_ = B::template allocate<float>(n);
    if (n != 0) {
      B::run(ops::zero<float>{.n = n, .x = m_.data()});
      B::run(ops::zero<float>{.n = n, .x = v_.data()});
    }
    decay_runs_ = B::template allocate<DecayRun>(runs.size());
    if (!runs.empty()) mpar::copy_to_rank<B>(runs.data(), decay_runs_.data(), runs.size());
    full_.resize(buckets_.bucket_count());
    if (stage_ == ZeroStage::parameters) shard_parameters();
    if (stage_ == ZeroStage::optimizer_states)  // written whole by each step's all-gather
      for (std::size_t b = 0; b < buckets_.bucket_count(); ++b)
        full_[b] = B::template allocate<float>(buckets_.bucket(b).size);
    factors_ = B::template allocate<UpdateFactors>(1);
  }

  [[nodiscard]] ZeroStage stage() const { return stage_; }

  void mark_ready(const nn::Parameter& p) { buckets_.mark_ready(p); }
  /** Marks parameter `index` (of the list given to the constructor) ready. */
  void mark_ready(std::size_t index) { buckets_.mark_ready(index); }
  void mark_ready(std::span<nn::Parameter* const> layer) {
    for (auto* p : layer) buckets_.mark_ready(*p);
  }

  /** Finishes the reduce-scatters (launching what the backward did not mark) and averages this rank's blocks. */
  void reduce_gradients() {
    if (reduced_) return;
    buckets_.wait();
    const auto g = buckets_.shards();  // every bucket's block: one operation
    if (!g.empty()) B::run(ops::scale{.n = g.size(), .factor = float(1.0 / divisor_), .x = g.data()});
    reduced_ = true;
  }

  /**
   * @brief The global squared norm of the averaged gradient into `*acc` (rank memory; overwritten), without a
   * host read. The blocks are disjoint over the data group, so here — unlike plain data parallelism — the sums
   * of squares ARE added over the data group; then over `groups...` = none, the tensor group, the tensor and
   * pipeline groups, or tensor, pipeline and expert groups, as in `optim::global_grad_squares`. One
   * `ops::sum_squares` per run of consecutive counted pieces of the shard: one in all where every parameter counts
   * (tensor rank 0); a double accumulated in shard order either way, so the sum is that of one call per piece.
   */
  template <communicator... Groups>
    requires(sizeof...(Groups) <= 3)
  void global_grad_squares(double* acc, Groups&... groups) {
    mpar::zero_in_rank<B>(acc, 1);
    accumulate_shard_squares(acc, optim::squares_share(groups...));
    optim::sum_over(acc, buckets_.comm(), groups...);
  }
  /**
   * @brief Adds the squares of this rank's averaged gradient blocks that `share` counts into `*acc` (rank
   * memory), communicating nothing: for a caller that sums the shards of two `ZeroAdamW` over one group (the
   * replicated parameters sharded over data x expert ranks and the experts over the data ranks both tile the
   * data x expert group, so one all-reduce over it counts every element once).
   */
  void accumulate_shard_squares(double* acc, optim::SquaresShare share) {
    reduce_gradients();
    const float* g = buckets_.shards().data();
    std::size_t begin = 0, end = 0;  // the run of counted pieces not yet summed
    for (const auto& bucket_pieces : pieces_)
      for (const auto& pc : bucket_pieces) {
        if (!share.counts(*buckets_.params()[pc.param])) continue;
        if (pc.shard_offset != end) {
          if (end > begin) B::run(ops::sum_squares{.n = end - begin, .x = g + begin, .acc = acc});
          begin = pc.shard_offset;
        }
        end = pc.shard_offset + pc.size;
      }
    if (end > begin) B::run(ops::sum_squares{.n = end - begin, .x = g + begin, .acc = acc});
  }
  /** @brief The global norm of the averaged gradient (see `global_grad_squares`), read back to the host. */
  template <communicator... Groups>
    requires(sizeof...(Groups) <= 3)
  [[nodiscard]] double grad_norm(Groups&... groups) {
    // Rank memory, uninitialised (a zero fill would be a host write): zeroed, accumulated and communicated by `B`.
    Buffer<double> acc = B::template allocate<double>(1);
    global_grad_squares(acc.data(), groups...);
    double squares = 0;
    mpar::copy_to_host<B>(acc.data(), &squares, 1);
    return std::sqrt(squares);
  }

  /** One AdamW step on this rank's blocks (one `ops::adamw_update`), then the all-gather of the weights. */
  void step() { step(config_.lr); }
  /** As below, with a gradient scale known on the host. */
  void step(float lr, float grad_scale = 1.0f) { step(lr, optim::write_host_factors<B>(grad_scale, factors_.data())); }
  /**
   * One AdamW step on this rank's blocks with the gradient scale and skip flag read from `factors` (rank
   * memory), then the all-gather of the weights (unchanged ones when skipped). A skipped step still counts;
   * `retract_step()` takes it back.
   */
  void step(float lr, const UpdateFactors* factors) {
    reduce_gradients();
    ++steps_;
    optim::AdamWStep st = optim::AdamWStep::at(config_, steps_, lr);
    auto& comm = buckets_.comm();
    if (stage_ !=
        ZeroStage::parameters)  // stage 3: w_ is the master itself (the full weights exist only while gathered)
      for (std::size_t b = 0; b < buckets_.bucket_count(); ++b) {
        if (const float* values = contiguous_values(b)) {  // a parameter arena: the block is one range of it
          const auto block = weight_block(b);
          copy_weights(block.size(), values + block_offset_[b], block.data());
          continue;
        }
        for (const auto& pc : pieces_[b])
          copy_weights(pc.size, buckets_.params()[pc.param]->value.data() + pc.param_offset,
                       w_.data() + pc.shard_offset);
      }
    // One update over the whole shard; each piece's weight decay comes from the run table (element for element
    // the update of one call per piece).
    if (!w_.empty())
      B::run(ops::adamw_update{.n = w_.size(),
                               .w = w_.data(),
                               .g = buckets_.shards().data(),
                               .m = m_.data(),
                               .v = v_.data(),
                               .beta1 = config_.beta1,
                               .beta2 = config_.beta2,
                               .eps = config_.eps,
                               .weight_decay = config_.weight_decay,
                               .lr = st.lr,
                               .bias_correction1 = st.bias_correction1,
                               .bias_correction2 = st.bias_correction2,
                               .factors = factors,
                               .decay_runs = decay_runs_.data(),
                               .runs = decay_runs_.size()});
    if (stage_ == ZeroStage::parameters) {  // the weights stay sharded: the passes gather each unit when they need it
      buckets_.reset();
      reduced_ = false;
      return;
    }
    // Launch every all-gather before waiting for any, so they pipeline behind one another.
    std::vector<gather_request> gathers;
    gathers.reserve(buckets_.bucket_count());
    for (std::size_t b = 0; b < buckets_.bucket_count(); ++b) {
      if (full_[b].size() != buckets_.bucket(b).size) full_[b] = uninitialized_buffer<float>(buckets_.bucket(b).size);
      gathers.push_back(comm.iall_gather(std::span<const float>(weight_block(b)), std::span<float>(full_[b])));
    }
    for (std::size_t b = 0; b < buckets_.bucket_count(); ++b) {
      gathers[b].wait();
      if (float* values = contiguous_values(b))
        copy_weights(full_[b].size(), full_[b].data(), values);
      else
        for (const auto& s : buckets_.bucket(b).slots)
          copy_weights(s.size, full_[b].data() + s.offset, buckets_.params()[s.param]->value.data());
      if (stage_ == ZeroStage::gradients)
        full_[b] = Buffer<float>{};  // the weights are in place: drop the gathered copy
    }
    buckets_.reset();
    reduced_ = false;
  }
  /** Takes back the count of a step that its factors skipped (AdamW's bias correction counts steps taken). */
  void retract_step() {
    require(steps_ > 0, "ZeroAdamW::retract_step: no step taken");
    --steps_;
  }

  /** Stage 1: zeroes every gradient. Stage 2: releases them (a parameter not marked this step still holds one). */
  void zero_grad() {
    for (auto* p : buckets_.params())
      if (stage_ == ZeroStage::optimizer_states)
        nn::zero_grad<B>(*p);
      else
        p->grad = Buffer<float>{};
  }
  /** Stages 2 and 3: allocates every gradient zeroed, for the backward to accumulate into (stage 1: they exist). */
  void prepare_gradients() {
    for (std::size_t b = 0; b < buckets_.bucket_count(); ++b)
      for (const auto& s : buckets_.bucket(b).slots) {  // the slot's size: under stage 3 the value may be released
        auto& p = *buckets_.params()[s.param];
        if (p.grad.size() == s.size) continue;
        p.grad = uninitialized_buffer<float>(s.size);
        B::run(ops::zero<float>{.n = s.size, .x = p.grad.data()});
        p.grad_zeroed = true;
      }
  }

  [[nodiscard]] std::size_t steps() const { return steps_; }

  /**
   * @brief A contiguous part of one parameter whose moments this rank holds: elements
   * `[param_offset, param_offset + m.size())` of the parameter's local block, row-major.
   */
  struct StatePiece {
    const nn::Parameter* param;
    std::size_t param_offset;
    std::span<float> m, v;
  };
  /** This rank's moments as parameter pieces, for checkpoints (`io::flat_state_blocks` maps each to boxes). */
  [[nodiscard]] std::vector<StatePiece> state_pieces() {
    std::vector<StatePiece> out;
    for (const auto& bucket_pieces : pieces_)
      for (const auto& pc : bucket_pieces)
        out.push_back({buckets_.params()[pc.param], pc.param_offset,
                       std::span<float>(m_).subspan(pc.shard_offset, pc.size),
                       std::span<float>(v_).subspan(pc.shard_offset, pc.size)});
    return out;
  }
  /** Sets the number of steps taken (AdamW's bias correction), when resuming from a checkpoint. */
  void set_steps(std::size_t steps) { steps_ = steps; }
  [[nodiscard]] std::size_t bucket_count() const { return buckets_.bucket_count(); }
  [[nodiscard]] std::size_t launched() const { return buckets_.launched(); }
  /** Floats of gradient memory the synchroniser holds now: shards, plus (stage 1, or mid-backward) flat buckets. */
  [[nodiscard]] std::size_t gradient_buffer_elements() const {
    return buckets_.shard_elements() + buckets_.flat_elements();
  }
  /** Floats of the weights' all-gather receive buffers held now (stage 1: N, kept; stage 2: 0 between steps). */
  [[nodiscard]] std::size_t gather_buffer_elements() const {
    std::size_t n = 0;
    for (const auto& f : full_) n += f.size();
    return n;
  }
  /** Optimizer-state floats held on this rank (two moments of its blocks): about 2 N / p. */
  [[nodiscard]] std::size_t state_elements() const { return m_.size() + v_.size(); }

  // ---- Stage 3: parameters sharded at rest ------------------------------------------------------------
  // Between uses every parameter's `value` is released; this rank keeps its block of each bucket's weights
  // (w_, the fp32 master the update writes). A unit of the passes is gathered as whole buckets: `gather_begin`
  // launches a bucket's all-gather (asynchronous, so it overlaps the compute before `gather_end`),
  // `gather_end` waits, allocates the bucket's parameters and copies their values in (rounded to the compute
  // precision when one is set, by `B::convert` on the rank's stream), `gather_release` frees them. Buckets are reference-counted, so two
  // units sharing a parameter (the tied embedding and head) keep it until both are done.

  /** The buckets holding parameters `ps` (each once, in bucket order); parameters not managed here are skipped. */
  [[nodiscard]] std::vector<std::size_t> buckets_of(std::span<nn::Parameter* const> ps) const {
    std::vector<bool> in(buckets_.bucket_count(), false);
    for (auto* p : ps)
      for (std::size_t k = 0; k < buckets_.params().size(); ++k)
        if (buckets_.params()[k] == p) in[buckets_.bucket_of(k)] = true;
    std::vector<std::size_t> out;
    for (std::size_t b = 0; b < in.size(); ++b)
      if (in[b]) out.push_back(b);
    return out;
  }
  /** Stage 3: one more user of bucket `b`; the first launches its all-gather. Collective over the data group. */
  void gather_begin(std::size_t b) {
    require_stage3("gather_begin");
    if (users_[b]++ > 0) return;
    full_[b] = uninitialized_buffer<float>(buckets_.bucket(b).size);
    gathering_[b].emplace(
        buckets_.comm().iall_gather(std::span<const float>(weight_block(b)), std::span<float>(full_[b])));
  }
  /**
   * Stage 3: waits for bucket `b`'s all-gather (if still in flight) and puts its parameters' full values in
   * place; `for_compute`: rounded to the compute precision (the passes), else the fp32 masters exactly
   * (checkpoints, the tied-embedding broadcast, inspection).
   */
  void gather_end(std::size_t b, bool for_compute = false) {
    require_stage3("gather_end");
    require(users_[b] > 0, "ZeroAdamW::gather_end on rank ", buckets_.comm().rank(), ": bucket ", b,
            " was not begun (call gather_begin first)");
    if (!gathering_[b]) return;
    gathering_[b]->wait();
    gathering_[b].reset();
    // The copies out of the receive buffer are operations on the rank's stream, ordered after the all-gather
    // (whose wait() orders the stream, not the host); freeing the receive buffer is stream-ordered too.
    for (const auto& s : buckets_.bucket(b).slots)
      buckets_.params()[s.param]->value = uninitialized_buffer<float>(s.size);
    if (for_compute && round_gathered_)
      (this->*round_gathered_)(b);
    else
      for (const auto& s : buckets_.bucket(b).slots)
        B::run(ops::copy<float>{
            .n = s.size, .src = full_[b].data() + s.offset, .dst = buckets_.params()[s.param]->value.data()});
    full_[b] = Buffer<float>{};
  }
  /** Stage 3: one user fewer of bucket `b`; the last frees its parameters' values. */
  void gather_release(std::size_t b) {
    require_stage3("gather_release");
    require(users_[b] > 0, "ZeroAdamW::gather_release on rank ", buckets_.comm().rank(), ": bucket ", b,
            " is not gathered");
    if (--users_[b] > 0) return;
    if (gathering_[b]) gather_end(b);  // never leave an all-gather writing into a freed buffer
    for (const auto& s : buckets_.bucket(b).slots) buckets_.params()[s.param]->value = Buffer<float>{};
  }
  /** Stage 3: gathers every bucket (checkpoints, inspection); `release_all` undoes it. */
  void gather_all() {
    for (std::size_t b = 0; b < buckets_.bucket_count(); ++b) gather_begin(b);
    for (std::size_t b = 0; b < buckets_.bucket_count(); ++b) gather_end(b);
  }
  void release_all() {
    for (std::size_t b = 0; b < buckets_.bucket_count(); ++b) gather_release(b);
  }
  /** Stage 3, while gathered: takes this rank's blocks of the (e.g. loaded) full values as the new masters. */
  void store_gathered() {
    require_stage3("store_gathered");
    for (const auto& bucket_pieces : pieces_)
      for (const auto& pc : bucket_pieces) {
        const auto& prm = *buckets_.params()[pc.param];
        require(prm.value.size() > pc.param_offset, "ZeroAdamW::store_gathered: parameter ", prm.name,
                " is not gathered");
        B::run(ops::copy<float>{
            .n = pc.size, .src = prm.value.data() + pc.param_offset, .dst = w_.data() + pc.shard_offset});
      }
  }
  /**
   * Stage 3: the values `gather_end(b, true)` puts in place are rounded to `T` (the compute precision) and widened
   * back, by `B::convert` on the rank's stream: what `ComputeCopies::widen_into` gives the passes elsewhere.
   */
  template <mpar::detail::half_precision T>
  void round_gathered_to() {
    round_gathered_ = &ZeroAdamW::widen_rounded<T>;
  }
  /** Stage 3: gathered values are put in place as they are (fp32 compute, the default). */
  void keep_gathered_exact() { round_gathered_ = nullptr; }
  /** Floats of the fp32 weight blocks this rank keeps (stage 3: its masters, about N / p; else 0). */
  [[nodiscard]] std::size_t master_elements() const { return stage_ == ZeroStage::parameters ? w_.size() : 0; }
  /** Floats of gathered full parameter values (and all-gather receive buffers) held now. */
  [[nodiscard]] std::size_t gathered_elements() const {
    std::size_t n = 0;
    for (std::size_t b = 0; b < buckets_.bucket_count(); ++b) {
      n += full_[b].size();
      if (stage_ == ZeroStage::parameters && users_[b] > 0)
        for (const auto& s : buckets_.bucket(b).slots) n += buckets_.params()[s.param]->value.size();
    }
    return n;
  }

 private:
  /** Elements `[param_offset, + size)` of a parameter at `[shard_offset, + size)` of this rank's shard (all buckets). */
  struct Piece {
    std::size_t param, shard_offset, param_offset, size;
  };

  /**
   * The first value of bucket `b` when its parameters' values lie back to back in slot order (a
   * `ParameterArena` in the backward's order, as `DistributedOptimizer` binds under ZeRO-1/2), else null: then
   * the bucket's weights move in and out of the shard with one copy each, not one per parameter. Decided at each
   * use, from host pointers only, so a value replaced since binding falls back to the copies per parameter.
   */
  [[nodiscard]] float* contiguous_values(std::size_t b) const {
    const auto& slots = buckets_.bucket(b).slots;
    if (slots.empty()) return nullptr;
    float* base = buckets_.params()[slots.front().param]->value.data();
    if (base == nullptr) return nullptr;
    for (const auto& s : slots) {
      const auto& v = buckets_.params()[s.param]->value;
      if (v.size() != s.size || (s.size != 0 && v.data() != base + s.offset)) return nullptr;
    }
    return base;
  }
  /** Copies weights within rank memory: a host copy where the host may read it, else a stream-ordered backend copy. */
  static void copy_weights(std::size_t n, const float* from, float* to) {
    if constexpr (mpar::host_reads_rank_memory<B>)
      std::copy_n(from, n, to);
    else
      B::run(ops::copy<float>{.n = n, .src = from, .dst = to});
  }

  /** This rank's weight block of bucket `b` (stage 3: its fp32 master), a range of `w_`. */
  [[nodiscard]] std::span<float> weight_block(std::size_t b) {
    return std::span<float>(w_).subspan(buckets_.shard_offset(b),
                                        buckets_.shard_offset(b + 1) - buckets_.shard_offset(b));
  }

  /**
   * Stage 3, `gather_end` for the passes: bucket `b`'s gathered fp32 values rounded to `T` in one 16-bit buffer
   * (one `B::convert`), then widened into each parameter's value (one per slot): stream-ordered, no host pass.
   */
  template <mpar::detail::half_precision T>
  void widen_rounded(std::size_t b) {
    const Bucket& bk = buckets_.bucket(b);
    Buffer<T> rounded = B::template allocate<T>(bk.size);  // written whole by the conversion
    if (bk.size != 0) B::run(ops::convert<float, T>{.n = bk.size, .src = full_[b].data(), .dst = rounded.data()});
    for (const auto& s : bk.slots)
      if (s.size != 0)
        B::run(ops::convert<T, float>{
            .n = s.size, .src = rounded.data() + s.offset, .dst = buckets_.params()[s.param]->value.data()});
  }

  using gather_request = decltype(std::declval<Comm&>().iall_gather(std::span<const float>{}, std::span<float>{}));

  /** Stage 3 at construction: this rank's blocks of the (identical on every rank) initial weights, then released. */
  void shard_parameters() {
    for (const auto& bucket_pieces : pieces_)
      for (const auto& pc : bucket_pieces) {
        const auto& value = buckets_.params()[pc.param]->value;
        if constexpr (mpar::host_reads_rank_memory<B>)
          std::copy_n(value.begin() + std::ptrdiff_t(pc.param_offset), pc.size,
                      w_.begin() + std::ptrdiff_t(pc.shard_offset));
        else
          B::run(ops::copy<float>{
              .n = pc.size, .src = value.data() + pc.param_offset, .dst = w_.data() + pc.shard_offset});
      }
    users_.assign(buckets_.bucket_count(), 0);
    gathering_.resize(buckets_.bucket_count());
    for (auto* p : buckets_.params()) p->value = Buffer<float>{};
  }
  void require_stage3(const char* what) const {
    require(stage_ == ZeroStage::parameters, "ZeroAdamW::", what, " on rank ", buckets_.comm().rank(),
            ": parameters are gathered under ", "ZeRO-3 only, this is ", name_of(stage_));
  }

  GradBuckets<Comm, BucketCollective::reduce_scatter, B> buckets_;
  optim::AdamWConfig config_;
  double divisor_;
  std::vector<std::vector<Piece>> pieces_;  // per bucket, in shard order
  std::vector<std::size_t> block_offset_;   // where this rank's block of bucket b starts in the bucket
  Buffer<float> m_, v_, w_;                 // rank memory at the offsets of the gradient shards; w_ is communicated
  Buffer<DecayRun> decay_runs_;             // rank memory: the weight decay along the shard, for the one update
  std::vector<Buffer<float>> full_;         // rank memory: the all-gathers' receive buffers
  Buffer<UpdateFactors> factors_;           // the factors of `step(lr, grad_scale)`
  ZeroStage stage_;
  std::size_t steps_ = 0;
  bool reduced_ = false;
  std::vector<int> users_;                                    // stage 3: units using each bucket's gathered values
  std::vector<std::optional<gather_request>> gathering_;      // stage 3: all-gathers in flight
  void (ZeroAdamW::*round_gathered_)(std::size_t) = nullptr;  // stage 3: the compute precision of gathered values

  static BucketMemory stage_memory(ZeroStage stage, const Comm& group) {
    require(shards(stage, ZeroStage::optimizer_states) && stage_number(stage) <= 3, "ZeroAdamW on rank ", group.rank(),
            " of group '", group.name(), "': stage ", stage_number(stage),
            " is not 1, 2 or 3 (ZeRO-1 shards optimizer states, ZeRO-2 gradients too, ZeRO-3 parameters too)");
    return shards(stage, ZeroStage::gradients) ? BucketMemory::transient : BucketMemory::kept;
  }
};

/** ZeRO-1 by its historical name: `ZeroAdamW` with `ZeroOptions::stage` = `ZeroStage::optimizer_states` (the default). */
template <communicator Comm, backend B = HostBackend>
using Zero1AdamW = ZeroAdamW<Comm, B>;

}  // namespace mpar::parallel
