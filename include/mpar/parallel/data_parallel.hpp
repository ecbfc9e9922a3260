#pragma once
/**
 * @file Data parallelism: replicas of the model on the data axis average their gradients with bucketed
 * asynchronous all-reduces that overlap the backward pass.
 */
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "mpar/comm/communicator.hpp"
#include "mpar/parallel/buckets.hpp"

namespace mpar::parallel {

/** @brief Data-parallel settings. */
struct DataParallelOptions {
  /** Target bucket size in bytes of fp32 gradient; smaller buckets start communicating earlier. */
  std::size_t bucket_bytes = std::size_t(25) << 20;
  /**
   * What the summed gradient is divided by; 0 means the data group size. Keep 0 when each replica's loss is
   * the *mean* over its local batch (equal local batches): the result is the gradient of the mean over the
   * global batch. When each replica's loss is a *sum* over its samples, set the global batch size to get the
   * mean, or 1 to keep the sum.
   */
  double divisor = 0.0;
};

/**
 * @brief Averages gradients over the data group `Comm` (one replica per data rank).
 *
 * Per step: run the backward and call `mark_ready(p)` (or `mark_ready(layer_params)`) as soon as a
 * parameter's gradient is final — its bucket's all-reduce starts while the backward continues; then
 * `finish()` waits and writes the averaged gradients back into `p.grad` (in place, without copies, where the
 * gradients lie in a `GradientArena` in backward order: each bucket is then a range of it). With gradient accumulation over
 * micro-batches, mark gradients ready during the last micro-batch only. Parameters never marked are
 * reduced by `finish()` as they are (so a model without hooks needs only `finish()`, without overlap).
 */
template <communicator Comm, backend B = HostBackend>
class DataParallel {
 public:
  DataParallel(std::vector<nn::Parameter*> params, Comm& data_group, DataParallelOptions options = {})
      : buckets_(std::move(params), data_group, options.bucket_bytes),
        divisor_(options.divisor > 0.0 ? options.divisor : double(data_group.size())) {}

  /** Makes every replica start from rank `root`'s values (identical initialisation needs no call). */
  void broadcast_parameters(int root = 0) {
    for (auto* p : buckets_.params()) buckets_.comm().broadcast(std::span<float>(p->value), root);
  }

  void mark_ready(const nn::Parameter& p) { buckets_.mark_ready(p); }
  /** Marks parameter `index` (of the list given to the constructor) ready. */
  void mark_ready(std::size_t index) { buckets_.mark_ready(index); }
  /** Marks a whole layer's parameters ready (a per-layer backward hook). */
  void mark_ready(std::span<nn::Parameter* const> layer) {
    for (auto* p : layer) buckets_.mark_ready(*p);
  }

  /** Waits for every bucket and writes the averaged gradients back; the next step may begin afterwards. */
  void finish() {
    buckets_.wait();
    const float inv = float(1.0 / divisor_);
    for (std::size_t b = 0; b < buckets_.bucket_count(); ++b) {
      const auto flat = buckets_.flat(b);
      if (buckets_.aliased(b)) {  // reduced in place: the bucket is the gradients, scaled where they are
        if constexpr (mpar::host_reads_rank_memory<B>) {
          for (float& x : flat) x *= inv;
        } else {
          B::run(ops::scale{.n = flat.size(), .factor = inv, .x = flat.data()});
        }
        continue;
      }
      for (const auto& s : buckets_.bucket(b).slots) {
        auto& g = buckets_.params()[s.param]->grad;
        if constexpr (mpar::host_reads_rank_memory<B>) {
          for (std::size_t i = 0; i < s.size; ++i) g[i] = flat[s.offset + i] * inv;
        } else {  // the same product, by backend operations ordered after the all-reduce
          B::run(ops::copy<float>{.n = s.size, .src = flat.data() + s.offset, .dst = g.data()});
          B::run(ops::scale{.n = s.size, .factor = inv, .x = g.data()});
        }
      }
    }
    buckets_.reset();
  }

  [[nodiscard]] std::size_t bucket_count() const { return buckets_.bucket_count(); }
  [[nodiscard]] const Bucket& bucket(std::size_t b) const { return buckets_.bucket(b); }
  /** Whether bucket `b` is reduced in place on the gradients (see `GradBuckets::aliased`). */
  [[nodiscard]] bool aliased(std::size_t b) const { return buckets_.aliased(b); }
  /** Bucket `b`'s values (a view of the gradients when `aliased(b)`). */
  [[nodiscard]] std::span<float> flat(std::size_t b) { return buckets_.flat(b); }
  /** Buckets whose all-reduce has started this step; more than 0 before the backward ends means overlap. */
  [[nodiscard]] std::size_t launched() const { return buckets_.launched(); }
  [[nodiscard]] double divisor() const { return divisor_; }

 private:
  GradBuckets<Comm, BucketCollective::all_reduce, B> buckets_;
  double divisor_;
};

}  // namespace mpar::parallel
