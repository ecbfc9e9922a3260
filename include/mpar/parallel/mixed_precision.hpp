#pragma once
/**
 * @file Mixed precision: 16-bit (bf16 or f16) compute copies of fp32 master weights, and the way back for
 * gradients. The optimizer always updates the fp32 masters in `nn::Parameter::value`; after each step the
 * compute copies are refreshed. f16 needs dynamic loss scaling (`optim::DynamicLossScaler`); bf16 has
 * float's exponent range and normally does not.
 *
 * The arithmetic in 16 bits is `nn::Autocast` (nn/autocast.hpp): inside its scope the GEMM layers convert
 * their activations with `B::convert` and multiply 16-bit operands with fp32 accumulation, their weights
 * being these copies (`nn::Parameter::compute_copy`, set by the optimizer's `begin_compute`); the copies
 * widened are what the other passes (layer norm gains, embeddings) read.
 *
 * Rounding the copies and widening them back are backend operations (`B::convert`, `B::copy` on the rank's
 * stream): the masters and copies are rank memory, so on a device backend the refresh is kernels, never a
 * host loop over device memory. `B::convert` rounds to nearest even exactly as `mpar::convert` does, so the
 * numbers are those of the host loops `round_to` / `accumulate_into` below (kept for host-side use).
 */
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "mpar/backend/backend.hpp"
#include "mpar/backend/host/host_backend.hpp"
#include "mpar/core/dtype.hpp"
#include "mpar/core/error.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/nn/parameter.hpp"

namespace mpar::parallel {

/** @brief Rounds fp32 values to `T` (nearest even), elementwise. */
template <mpar::detail::half_precision T>
void round_to(std::span<const float> from, std::span<T> to) {
  require(from.size() == to.size(), "round_to<", dtype_name_v<T>, ">: ", from.size(), " values into ", to.size());
  for (std::size_t i = 0; i < from.size(); ++i) to[i] = convert<T>(from[i]);
}

/** @brief Adds 16-bit gradients into fp32 accumulators (the accumulation itself is in fp32). */
template <mpar::detail::half_precision T>
void accumulate_into(std::span<const T> grad, std::span<float> acc) {
  require(grad.size() == acc.size(), "accumulate_into<", dtype_name_v<T>, ">: ", grad.size(), " gradients into ",
          acc.size(), " accumulators");
  for (std::size_t i = 0; i < grad.size(); ++i) acc[i] += float(grad[i]);
}

/**
 * @brief The 16-bit compute copies of a parameter list: `weights(i)` feeds the forward pass, `add_grad(i, g)`
 * accumulates a 16-bit gradient into the master's fp32 `grad`, and `refresh()` re-rounds the copies from the
 * masters after an optimizer step (one `B::convert` per parameter, on the rank's stream: no host pass).
 */
template <mpar::detail::half_precision T, backend B = HostBackend>
class ComputeCopies {
 public:
  explicit ComputeCopies(std::vector<nn::Parameter*> params) : params_(std::move(params)) {
    copies_.resize(params_.size());
    refresh();
  }

  void refresh() {
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const std::size_t n = params_[i]->local_size();
      // rank memory the conversion overwrites whole: allocated without a host fill
      if (copies_[i].size() != n) copies_[i] = B::template allocate<T>(n);
      if (n) B::run(ops::convert<float, T>{.n = n, .src = params_[i]->value.data(), .dst = copies_[i].data()});
    }
  }

  [[nodiscard]] std::span<const T> weights(std::size_t i) const { return copies_.at(i); }
  /**
   * Writes copy `i` widened back to fp32 into `out` (the rounded weights, for passes that compute in fp32 on
   * 16-bit-rounded weights).
   */
  void widen_into(std::size_t i, std::span<float> out) const {
    const auto& c = copies_.at(i);
    require(out.size() == c.size(), "ComputeCopies::widen_into: copy ", i, " has ", c.size(), " values, the target ",
            out.size());
    if (!c.empty())
      B::run(ops::convert<T, float>{
          .n = c.size(), .src = c.data(), .dst = out.data()});  // exact: every 16-bit value is a float
  }
  void add_grad(std::size_t i, std::span<const T> g) { accumulate_into<T>(g, params_.at(i)->grad); }
  [[nodiscard]] std::size_t size() const { return params_.size(); }
  /** Bytes of the compute copies (the masters are counted with the parameters). */
  [[nodiscard]] std::size_t bytes() const {
    std::size_t n = 0;
    for (const auto& c : copies_) n += c.size() * sizeof(T);
    return n;
  }

 private:
  std::vector<nn::Parameter*> params_;
  std::vector<Buffer<T>> copies_;  // rank memory: the passes read them
};

}  // namespace mpar::parallel
