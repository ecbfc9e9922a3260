#pragma once
/**
 * @file Gradient buckets: parameters grouped into flat buffers of a bounded size whose collective is launched
 * asynchronously as soon as every gradient in the bucket is final, while the backward pass still runs.
 *
 * Shared by data parallelism (all-reduce of each bucket) and ZeRO-1 (reduce-scatter of each bucket).
 * Rules that keep every rank's collectives in the same order (a mismatch would be a comm_error):
 * - buckets are filled in *reverse* parameter order, because the backward pass produces the last layer's
 *   gradients first; so pass parameters in forward (model) order;
 * - bucket b is launched only after buckets 0..b-1, so ranks whose backward marks gradients ready in a
 *   slightly different order still issue the same sequence of collectives;
 * - every rank must hold the same parameters with the same local sizes (true for data-parallel replicas).
 */
#include <algorithm>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mpar/backend/backend.hpp"
#include "mpar/backend/host/host_backend.hpp"
#include "mpar/backend/rank_transfer.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/nn/parameter.hpp"

namespace mpar::parallel {

/** @brief Where one parameter's gradient sits in a bucket's flat buffer. */
struct BucketSlot {
  std::size_t param = 0;   ///< index into the parameter list
  std::size_t offset = 0;  ///< first element in the bucket's flat buffer
  std::size_t size = 0;    ///< the parameter's local element count
};

/** @brief A group of parameters reduced by one collective over a flat buffer of `size` floats. */
struct Bucket {
  std::vector<BucketSlot> slots;
  std::size_t size = 0;
};

/**
 * @brief Groups `params` into buckets of about `bucket_bytes` (fp32 gradients), last parameter first. A bucket
 * is closed once it reaches `bucket_bytes`, so a parameter larger than the bound gets a bucket of its own and
 * `bucket_bytes = 0` gives one bucket per parameter. A bucket is also closed at every index of `unit_starts`
 * (the first parameter of a unit), so no bucket holds parameters of two units (ZeRO-3 gathers whole buckets
 * per unit).
 */
[[nodiscard]] inline std::vector<Bucket> plan_buckets(std::span<nn::Parameter* const> params, std::size_t bucket_bytes,
                                                      std::span<const std::size_t> unit_starts = {}) {
  std::vector<Bucket> out;
  Bucket cur;
  std::vector<bool> starts(params.size(), false);
  for (std::size_t k : unit_starts)
    if (k < params.size()) starts[k] = true;
  for (std::size_t k = params.size(); k-- > 0;) {
    const std::size_t n = params[k]->local_size();
    cur.slots.push_back({k, cur.size, n});
    cur.size += n;
    if (cur.size * sizeof(float) >= bucket_bytes || starts[k]) {
      out.push_back(std::move(cur));
      cur = Bucket{};
    }
  }
  if (!cur.slots.empty()) out.push_back(std::move(cur));
  return out;
}

/** @brief Which collective a bucket runs once its gradients are final. */
enum class BucketCollective { all_reduce, reduce_scatter };

/**
 * @brief How long a bucket's full-size memory lives.
 * - `kept`: every bucket's flat buffer is allocated once and kept for the whole run, and each parameter keeps
 *   its gradient (data parallelism, ZeRO-1).
 * - `transient` (reduce_scatter only; ZeRO-2): a bucket's flat buffer is allocated when its first gradient
 *   arrives and freed as soon as its reduce-scatter has completed; each parameter's gradient is released
 *   (`grad` left empty) once copied into its bucket. Each launch frees the buckets whose reduce-scatter has
 *   completed; if more than `in_flight` are still in flight, it waits for the oldest, so during the backward
 *   at most `in_flight` + 1 full-size buckets exist, and after `wait()` only this rank's shards remain.
 */
enum class BucketMemory { kept, transient };

/**
 * @brief Buckets of gradients over a communicator `Comm` with their asynchronous collectives in flight.
 *
 * `mark_ready(p)` copies `p.grad` into its bucket; a complete bucket is launched at once (in bucket order).
 * Under `kept` memory a bucket whose gradients lie next to one another in slot order (a `GradientArena`
 * laid out in backward order, gradient_arena.hpp) is not copied at all: its collective runs in place on
 * that range of the gradients, and `flat(b)` is a view of it (`aliased(b)`). Whether a bucket is aliased is
 * decided again at its first mark of every step, so a gradient replaced in between falls back to the copy.
 * `wait()` launches what is left (parameters never marked are taken as they are) and waits for all. After
 * `wait()`, `flat(b)` holds the summed bucket (all_reduce) or `shard(b)` this rank's summed block of it,
 * `block_of(size, p, rank)` (reduce_scatter); the blocks of all buckets lie back to back in one allocation
 * (`shards()`), so an update over this rank's share of every bucket is one operation. `reset()` starts the next
 * step.
 */
template <communicator Comm, BucketCollective Kind, backend B = HostBackend>
class GradBuckets {
  using all_reduce_request = decltype(std::declval<Comm&>().iall_reduce(std::span<float>{}, ReduceOp::sum));
  using reduce_scatter_request =
      decltype(std::declval<Comm&>().ireduce_scatter(std::span<const float>{}, std::span<float>{}, ReduceOp::sum));

 public:
  using request_type =
      std::conditional_t<Kind == BucketCollective::all_reduce, all_reduce_request, reduce_scatter_request>;

  GradBuckets(std::vector<nn::Parameter*> params, Comm& comm, std::size_t bucket_bytes,
              BucketMemory memory = BucketMemory::kept, std::size_t in_flight = 2,
              std::span<const std::size_t> unit_starts = {})
      : params_(std::move(params)), comm_(&comm), memory_(memory), in_flight_(std::max<std::size_t>(in_flight, 1)) {
    require(memory_ == BucketMemory::kept || Kind == BucketCollective::reduce_scatter,
            "GradBuckets: transient buckets keep only a shard, so they need the reduce_scatter collective");
    for (std::size_t k = 0; k < params_.size(); ++k) {
      require(params_[k] != nullptr, "GradBuckets: parameter ", k, " is null");
      require(index_.emplace(params_[k], k).second, "GradBuckets: parameter ", params_[k]->name, " is listed twice");
    }
    buckets_ = plan_buckets(params_, bucket_bytes, unit_starts);
    bucket_of_.resize(params_.size());
    slot_of_.resize(params_.size());
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      for (std::size_t s = 0; s < buckets_[b].slots.size(); ++s) {
        bucket_of_[buckets_[b].slots[s].param] = b;
        slot_of_[buckets_[b].slots[s].param] = s;
      }
    flat_.resize(buckets_.size());
    view_.resize(buckets_.size());
    aliased_.assign(buckets_.size(), false);
    shard_offset_.assign(buckets_.size() + 1, 0);
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      // Uninitialised: every slot is copied in before a collective reads it, and the collective writes the shard.
      // A bucket over contiguous gradients needs no buffer of its own.
      if (memory_ == BucketMemory::kept) select_storage(b);
      const std::size_t extent =
          Kind == BucketCollective::reduce_scatter
              ? block_of(buckets_[b].size, std::size_t(comm_->size()), std::size_t(comm_->rank())).extent
              : 0;
      shard_offset_[b + 1] = shard_offset_[b] + extent;
    }
    // This rank's blocks of every bucket back to back in one allocation, in bucket order, so that an update over
    // all of them (ZeRO's AdamW) is one operation over `shards()`.
    shards_ = uninitialized_buffer<float>(shard_offset_.back());
    requests_.resize(buckets_.size());
    reset();
  }

  /** The gradient of `p` is final for this step: copy it into its bucket and launch what is complete. */
  void mark_ready(const nn::Parameter& p) {
    const auto it = index_.find(&p);
    require(it != index_.end(), "GradBuckets::mark_ready on rank ", comm_->rank(), " of group '", comm_->name(),
            "': parameter ", p.name, " is not managed here");
    mark_index(it->second);
    launch_complete();
  }
  /** As above for parameter `k` of the list given to the constructor (no lookup). */
  void mark_ready(std::size_t k) {
    require(k < params_.size(), "GradBuckets::mark_ready on rank ", comm_->rank(), " of group '", comm_->name(),
            "': parameter index ", k, " is out of range (", params_.size(), " parameters)");
    mark_index(k);
    launch_complete();
  }

  /** Launches the remaining buckets (unmarked parameters are taken as they are) and waits for all of them. */
  void wait() {
    for (std::size_t k = 0; k < params_.size(); ++k)
      if (!marked_[k]) mark_index(k);
    launch_complete();
    for (std::size_t b = 0; b < requests_.size(); ++b) finish_bucket(b);
  }

  /** Forgets this step's marks; the next step's gradients may be marked. Call after `wait()`. */
  void reset() {
    marked_.assign(params_.size(), false);
    ready_.assign(buckets_.size(), 0);
    for (auto& r : requests_) r.reset();
    next_launch_ = 0;
    next_done_ = 0;
  }

  [[nodiscard]] std::size_t bucket_count() const { return buckets_.size(); }
  [[nodiscard]] const Bucket& bucket(std::size_t b) const { return buckets_.at(b); }
  [[nodiscard]] std::size_t bucket_of(std::size_t param) const { return bucket_of_.at(param); }
  /** Buckets whose collective has been launched this step (they are in flight until `wait()`). */
  [[nodiscard]] std::size_t launched() const { return next_launch_; }
  /** Bucket `b`'s values: its own buffer, or (`aliased(b)`) the range of the gradients it covers. */
  [[nodiscard]] std::span<float> flat(std::size_t b) { return view_.at(b); }
  /** Whether bucket `b` runs in place on the gradients (no copy into a bucket buffer, none back). */
  [[nodiscard]] bool aliased(std::size_t b) const { return aliased_.at(b); }
  /** This rank's block of bucket `b` (reduce_scatter): elements `[shard_offset(b), shard_offset(b + 1))` of `shards()`. */
  [[nodiscard]] std::span<float> shard(std::size_t b) {
    return std::span<float>(shards_).subspan(shard_offset_.at(b), shard_offset_.at(b + 1) - shard_offset_[b]);
  }
  /** Every bucket's block of this rank, contiguous in bucket order (one allocation). */
  [[nodiscard]] std::span<float> shards() { return shards_; }
  /** Where bucket `b`'s block starts in `shards()`; `shard_offset(bucket_count())` is its size. */
  [[nodiscard]] std::size_t shard_offset(std::size_t b) const { return shard_offset_.at(b); }
  [[nodiscard]] const std::vector<nn::Parameter*>& params() const { return params_; }
  [[nodiscard]] Comm& comm() const { return *comm_; }
  [[nodiscard]] BucketMemory memory() const { return memory_; }
  /** Floats of full-size bucket buffers allocated now (0 between steps under `transient`). */
  [[nodiscard]] std::size_t flat_elements() const {
    std::size_t n = 0;
    for (const auto& f : flat_) n += f.size();
    return n;
  }
  /** Floats of this rank's gradient shards (reduce_scatter). */
  [[nodiscard]] std::size_t shard_elements() const { return shards_.size(); }

 private:
  void mark_index(std::size_t k) {
    const auto& p = *params_[k];
    require(!marked_[k], "GradBuckets::mark_ready on rank ", comm_->rank(), ": parameter ", p.name,
            " was marked twice in one step (call reset() after wait())");
    const std::size_t b = bucket_of_[k];
    const BucketSlot& s = buckets_[b].slots[slot_of_[k]];
    require(p.grad.size() == s.size, "GradBuckets::mark_ready on rank ", comm_->rank(), ": parameter ", p.name, " has ",
            p.grad.size(), " gradient elements, but ", s.size, " when the buckets were planned");
    if (ready_[b] == 0) select_storage(b);  // the bucket's first gradient this step
    // A backend copy where operations run in stream order (the host must not touch rank memory there).
    if (aliased_[b]) {
      // In place: the collective reads the gradients themselves once the bucket is complete.
    } else if constexpr (mpar::host_reads_rank_memory<B>)
      std::copy(p.grad.begin(), p.grad.end(), flat_[b].begin() + std::ptrdiff_t(s.offset));
    else
      B::run(ops::copy<float>{.n = s.size, .src = p.grad.data(), .dst = flat_[b].data() + s.offset});
    if (memory_ == BucketMemory::transient) params_[k]->grad = Buffer<float>{};  // the bucket holds it now
    marked_[k] = true;
    ++ready_[b];
  }

  void launch_complete() {
    while (next_launch_ < buckets_.size() && ready_[next_launch_] == buckets_[next_launch_].slots.size()) {
      const std::size_t b = next_launch_++;
      if constexpr (Kind == BucketCollective::all_reduce)
        requests_[b].emplace(comm_->iall_reduce(view_[b], ReduceOp::sum));
      else
        requests_[b].emplace(comm_->ireduce_scatter(std::span<const float>(view_[b]), shard(b), ReduceOp::sum));
      if (memory_ == BucketMemory::transient) release_finished();
    }
  }

  /**
   * Transient buckets: frees every bucket whose reduce-scatter has completed (without blocking), then, while
   * more than `in_flight_` are still in flight, waits for the oldest. Every rank launches in the same order, so
   * the oldest bucket is launched on every rank and its completion needs nothing of this rank's backward.
   */
  void release_finished() {
    std::size_t in_flight = 0;
    for (std::size_t b = next_done_; b < next_launch_; ++b)
      if (requests_[b] && requests_[b]->test())
        finish_bucket(b);
      else if (requests_[b])
        ++in_flight;
    for (std::size_t b = next_done_; b < next_launch_ && in_flight > in_flight_; ++b)
      if (requests_[b]) finish_bucket(b), --in_flight;
  }

  /**
   * Chooses where bucket `b`'s values live this step: in place when its gradients are contiguous in slot
   * order (kept memory only: a transient bucket releases the gradients it takes), else its own buffer
   * (allocated if it has none).
   */
  void select_storage(std::size_t b) {
    const auto& slots = buckets_[b].slots;
    float* base = slots.empty() ? nullptr : params_[slots.front().param]->grad.data();
    bool contiguous = memory_ == BucketMemory::kept && base != nullptr;
    for (std::size_t i = 0; contiguous && i < slots.size(); ++i) {
      const auto& g = params_[slots[i].param]->grad;
      contiguous = g.size() == slots[i].size && (g.empty() || g.data() == base + slots[i].offset);
    }
    aliased_[b] = contiguous;
    if (contiguous) {
      flat_[b] = Buffer<float>{};
      view_[b] = std::span<float>(base, buckets_[b].size);
      return;
    }
    if (flat_[b].size() != buckets_[b].size) flat_[b] = uninitialized_buffer<float>(buckets_[b].size);
    view_[b] = std::span<float>(flat_[b]);
  }

  /** Waits for bucket `b`'s collective (if launched and not waited yet); a transient bucket's buffer is freed. */
  void finish_bucket(std::size_t b) {
    if (requests_[b]) {
      requests_[b]->wait();
      requests_[b].reset();
    }
    if (memory_ == BucketMemory::transient) {
      flat_[b] = Buffer<float>{};
      view_[b] = {};
    }
    while (next_done_ < next_launch_ && !requests_[next_done_]) ++next_done_;
  }

  std::vector<nn::Parameter*> params_;
  Comm* comm_;
  std::unordered_map<const nn::Parameter*, std::size_t> index_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_, slot_of_;
  std::vector<Buffer<float>> flat_;        // rank memory, as every communicated buffer
  Buffer<float> shards_;                   // rank memory: every bucket's block of this rank (reduce_scatter)
  std::vector<std::size_t> shard_offset_;  // bucket b's block: [shard_offset_[b], shard_offset_[b + 1]) of shards_
  std::vector<std::span<float>> view_;     // what each bucket's collective reads and writes: flat_[b] or the gradients
  std::vector<bool> aliased_;              // bucket b runs in place on the gradients
  std::vector<std::optional<request_type>> requests_;
  std::vector<bool> marked_;
  std::vector<std::size_t> ready_;
  std::size_t next_launch_ = 0;
  std::size_t next_done_ = 0;  ///< every bucket below it has been waited for (transient: its flat buffer freed)
  BucketMemory memory_;
  std::size_t in_flight_;
};

}  // namespace mpar::parallel
