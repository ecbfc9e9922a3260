#pragma once
/** @file TopKCompressor: top-k gradient compression with error feedback over any communicator. */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <span>
#include <vector>

#include "mpar/comm/communicator.hpp"
#include "mpar/core/error.hpp"

namespace mpar {

/** @brief What one compressed all-reduce sent. */
struct TopKStats {
  std::size_t n = 0;             ///< dense elements per rank
  std::size_t k = 0;             ///< entries each rank sent
  double density = 0;            ///< k / n
  double compression_ratio = 0;  ///< dense bytes / sent bytes, per rank
  double residual_l2 = 0;        ///< this rank's carried-over error after the step
};

/**
 * @brief Sums gradients across ranks sending only each rank's k largest-magnitude entries.
 *
 * Error feedback: each step compresses `grad + residual` and carries everything it did not send
 * into the next step's residual, so nothing is lost, only delayed: after any number of steps, the
 * sum of the applied updates plus every rank's residual equals the dense sum of all gradients.
 * Entries travel as (index, value) pairs of doubles through one `all_gather` (exact for indices
 * below 2^53 and for float values); each rank sends exactly k pairs. One compressor per gradient
 * buffer (it owns that buffer's residual); it uses `comm` by reference.
 */
template <communicator Comm>
class TopKCompressor {
 public:
  /** Keeps `density` (0 < density <= 1) of `n` elements per step: k = ceil(density * n). */
  TopKCompressor(Comm& comm, std::size_t n, double density)
      : comm_(&comm), n_(n), k_(std::min(n, std::size_t(std::ceil(density * double(n))))), residual_(n, 0.0) {
    require(density > 0 && density <= 1, "TopKCompressor: density ", density, " is not in (0, 1]");
  }

  [[nodiscard]] std::size_t k() const { return k_; }
  [[nodiscard]] std::span<const double> residual() const { return residual_; }
  [[nodiscard]] const TopKStats& last_stats() const { return stats_; }

  /**
   * Replaces `grad` (this rank's gradient, n elements) by the sum (or average) over ranks of every
   * rank's top-k of grad + residual; collective over the communicator.
   */
  template <detail::element_type T>
  TopKStats all_reduce(std::span<T> grad, ReduceOp op = ReduceOp::sum) {
    require(grad.size() == n_, "TopKCompressor::all_reduce: the gradient has ", grad.size(),
            " elements, the compressor ", n_);
    require(op == ReduceOp::sum || op == ReduceOp::avg, "TopKCompressor::all_reduce: only sum and avg compress, not ",
            reduce_op_name(op));
    for (std::size_t i = 0; i < n_; ++i) residual_[i] += double(compute_type_t<T>(grad[i]));
    // Select the k largest magnitudes; ties broken by index so every run picks the same entries.
    order_.resize(n_);
    std::iota(order_.begin(), order_.end(), std::size_t(0));
    auto larger = [&](std::size_t a, std::size_t b) {
      const double x = std::abs(residual_[a]), y = std::abs(residual_[b]);
      return x > y || (x == y && a < b);
    };
    if (k_ < n_) std::nth_element(order_.begin(), order_.begin() + std::ptrdiff_t(k_), order_.end(), larger);
    send_.resize(2 * k_);
    for (std::size_t j = 0; j < k_; ++j) {
      const std::size_t i = order_[j];
      send_[2 * j] = double(i);
      send_[2 * j + 1] = residual_[i];
      residual_[i] = 0.0;  // sent exactly: nothing of it is carried over
    }
    const auto p = std::size_t(comm_->size());
    recv_.resize(2 * k_ * p);
    comm_->all_gather(std::span<const double>(send_), std::span<double>(recv_));
    sum_.assign(n_, 0.0);
    for (std::size_t j = 0; j < k_ * p; ++j) sum_[std::size_t(recv_[2 * j])] += recv_[2 * j + 1];
    const double scale = op == ReduceOp::avg ? 1.0 / double(p) : 1.0;
    for (std::size_t i = 0; i < n_; ++i) grad[i] = T(compute_type_t<T>(sum_[i] * scale));
    double r2 = 0;
    for (double r : residual_) r2 += r * r;
    stats_ = {n_, k_, n_ ? double(k_) / double(n_) : 0.0,
              k_ ? double(n_ * sizeof(T)) / double(k_ * 2 * sizeof(double)) : 0.0, std::sqrt(r2)};
    return stats_;
  }

 private:
  Comm* comm_;
  std::size_t n_, k_;
  std::vector<double> residual_;
  std::vector<std::size_t> order_;
  std::vector<double> send_, recv_, sum_;
  TopKStats stats_;
};

}  // namespace mpar
