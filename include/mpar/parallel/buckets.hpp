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
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

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
 * `bucket_bytes = 0` gives one bucket per parameter.
 */
[[nodiscard]] inline std::vector<Bucket> plan_buckets(std::span<nn::Parameter* const> params,
                                                      std::size_t bucket_bytes) {
  std::vector<Bucket> out;
  Bucket cur;
  for (std::size_t k = params.size(); k-- > 0;) {
    const std::size_t n = params[k]->local_size();
    cur.slots.push_back({k, cur.size, n});
    cur.size += n;
    if (cur.size * sizeof(float) >= bucket_bytes) {
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
 * @brief Buckets of gradients over a communicator `Comm` with their asynchronous collectives in flight.
 *
 * `mark_ready(p)` copies `p.grad` into its bucket; a complete bucket is launched at once (in bucket order).
 * `wait()` launches what is left (parameters never marked are taken as they are) and waits for all. After
 * `wait()`, `flat(b)` holds the summed bucket (all_reduce) or `shard(b)` this rank's summed block of it,
 * `block_of(size, p, rank)` (reduce_scatter). `reset()` starts the next step.
 */
template <communicator Comm, BucketCollective Kind>
class GradBuckets {
  using all_reduce_request = decltype(std::declval<Comm&>().iall_reduce(std::span<float>{}, ReduceOp::sum));
  using reduce_scatter_request = decltype(std::declval<Comm&>().ireduce_scatter(std::span<const float>{},
                                                                                std::span<float>{}, ReduceOp::sum));

 public:
  using request_type =
      std::conditional_t<Kind == BucketCollective::all_reduce, all_reduce_request, reduce_scatter_request>;

  GradBuckets(std::vector<nn::Parameter*> params, Comm& comm, std::size_t bucket_bytes)
      : params_(std::move(params)), comm_(&comm) {
    for (std::size_t k = 0; k < params_.size(); ++k) {
      require(params_[k] != nullptr, "GradBuckets: parameter ", k, " is null");
      require(index_.emplace(params_[k], k).second, "GradBuckets: parameter ", params_[k]->name, " is listed twice");
    }
    buckets_ = plan_buckets(params_, bucket_bytes);
    bucket_of_.resize(params_.size());
    slot_of_.resize(params_.size());
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      for (std::size_t s = 0; s < buckets_[b].slots.size(); ++s) {
        bucket_of_[buckets_[b].slots[s].param] = b;
        slot_of_[buckets_[b].slots[s].param] = s;
      }
    flat_.resize(buckets_.size());
    shard_.resize(buckets_.size());
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      flat_[b].assign(buckets_[b].size, 0.0f);
      if constexpr (Kind == BucketCollective::reduce_scatter)
        shard_[b].assign(block_of(buckets_[b].size, std::size_t(comm_->size()), std::size_t(comm_->rank())).extent,
                         0.0f);
    }
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
    for (auto& r : requests_)
      if (r) r->wait();
  }

  /** Forgets this step's marks; the next step's gradients may be marked. Call after `wait()`. */
  void reset() {
    marked_.assign(params_.size(), false);
    ready_.assign(buckets_.size(), 0);
    for (auto& r : requests_) r.reset();
    next_launch_ = 0;
  }

  [[nodiscard]] std::size_t bucket_count() const { return buckets_.size(); }
  [[nodiscard]] const Bucket& bucket(std::size_t b) const { return buckets_.at(b); }
  [[nodiscard]] std::size_t bucket_of(std::size_t param) const { return bucket_of_.at(param); }
  /** Buckets whose collective has been launched this step (they are in flight until `wait()`). */
  [[nodiscard]] std::size_t launched() const { return next_launch_; }
  [[nodiscard]] std::span<float> flat(std::size_t b) { return flat_.at(b); }
  [[nodiscard]] std::span<float> shard(std::size_t b) { return shard_.at(b); }
  [[nodiscard]] const std::vector<nn::Parameter*>& params() const { return params_; }
  [[nodiscard]] Comm& comm() const { return *comm_; }

 private:
  void mark_index(std::size_t k) {
    const auto& p = *params_[k];
    require(!marked_[k], "GradBuckets::mark_ready on rank ", comm_->rank(), ": parameter ", p.name,
            " was marked twice in one step (call reset() after wait())");
    const std::size_t b = bucket_of_[k];
    const BucketSlot& s = buckets_[b].slots[slot_of_[k]];
    require(p.grad.size() == s.size, "GradBuckets::mark_ready on rank ", comm_->rank(), ": parameter ", p.name,
            " has ", p.grad.size(), " gradient elements, but ", s.size, " when the buckets were planned");
    std::copy(p.grad.begin(), p.grad.end(), flat_[b].begin() + std::ptrdiff_t(s.offset));
    marked_[k] = true;
    ++ready_[b];
  }

  void launch_complete() {
    while (next_launch_ < buckets_.size() && ready_[next_launch_] == buckets_[next_launch_].slots.size()) {
      const std::size_t b = next_launch_++;
      if constexpr (Kind == BucketCollective::all_reduce)
        requests_[b].emplace(comm_->iall_reduce(std::span<float>(flat_[b]), ReduceOp::sum));
      else
        requests_[b].emplace(
            comm_->ireduce_scatter(std::span<const float>(flat_[b]), std::span<float>(shard_[b]), ReduceOp::sum));
    }
  }

  std::vector<nn::Parameter*> params_;
  Comm* comm_;
  std::unordered_map<const nn::Parameter*, std::size_t> index_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_, slot_of_;
  std::vector<Buffer<float>> flat_, shard_;  // rank memory, as every communicated buffer
  std::vector<std::optional<request_type>> requests_;
  std::vector<bool> marked_;
  std::vector<std::size_t> ready_;
  std::size_t next_launch_ = 0;
};

}  // namespace mpar::parallel
