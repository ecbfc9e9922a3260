#pragma once
/**
 * @file `ColumnParallelGelu`: a `ColumnParallel` projection followed by GeLU as one layer, so that the bias
 * and GeLU run as the GEMM's epilogue (`ops::gemm_bias_gelu`) — the MLP's first half. Same parameters, layouts,
 * collectives and results as `Stage<ColumnParallel, Gelu>`, with fewer passes over the `[tokens, ffn]`
 * activation: no separate bias addition and no copy of GeLU's input (the pre-activation the layer writes
 * is kept for the backward as is).
 */
#include <cstddef>
#include <string_view>
#include <utility>
#include <vector>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/nn/column_parallel.hpp"
#include "mpar/nn/layer.hpp"

namespace mpar::nn {

/**
 * @brief `y = gelu(x W + b)` with `W` split by columns over the tensor group (`SP`: token-sharded input).
 * Input `Replicate` (`Shard<0, tensor>` with SP), output `Shard<1, tensor>`; the backward is GeLU's then the
 * projection's (one all-reduce, SP: one reduce-scatter). The weight and bias are the projection's (`linear()`).
 */
template <communicator C, std::size_t In = dyn, std::size_t Out = dyn, std::size_t TP = dyn, bool SP = false,
          backend B = HostBackend>
class ColumnParallelGelu : public detail::TypedLayer<ColumnParallelGelu<C, In, Out, TP, SP, B>> {
  using Typed = detail::TypedLayer<ColumnParallelGelu<C, In, Out, TP, SP, B>>;

 public:
  /** The projection. */
  using Projection = ColumnParallel<C, In, Out, TP, ColumnOptions{SP, false, 1}, B>;
  using Typed::backward;
  using Typed::backward_input;
  using Typed::forward;
  static constexpr std::string_view layer_kind = "ColumnParallelGelu";
  using default_input = typename Projection::default_input;
  static constexpr bool preserves_features = false;
  static constexpr std::size_t static_in_features = Projection::static_in_features;
  static constexpr std::size_t static_out_features = Projection::static_out_features;
  template <class L>
  static constexpr bool check_input() {
    return Projection::template check_input<L>();
  }
  template <class L>
  using output_layout = typename Projection::template output_layout<L>;

  ColumnParallelGelu(C& tp, std::size_t in, std::size_t out, const LinearInit& init) : fc_(tp, in, out, init) {
    require(
        init.bias, "ColumnParallelGelu '", init.name,
        "': the fused bias + GeLU needs a bias (LinearInit::bias = true); without one use Stage<ColumnParallel, Gelu>");
  }

  /** W: the projection's weight and bias gradients; no communication. */
  void backward_weight(int mb = 0) { fc_.backward_weight(mb); }

  std::vector<Parameter*> parameters() { return fc_.parameters(); }
  void drop(int mb) {
    cache_.drop(mb);
    fc_.drop(mb);
  }
  [[nodiscard]] Parameter& weight() { return fc_.weight(); }
  [[nodiscard]] Parameter& bias() { return fc_.bias(); }
  [[nodiscard]] Projection& linear() { return fc_; }
  [[nodiscard]] std::size_t in_features() const { return fc_.in_features(); }
  [[nodiscard]] std::size_t out_features() const { return fc_.out_features(); }
  [[nodiscard]] std::size_t local_out_features() const { return fc_.local_out_features(); }

 private:
  friend Typed;  // its typed entries are the only public way in; these do the work on the storage
  Activation do_forward(const Activation& x, int mb) {
    Activation pre;
    Activation y = fc_.forward_bias_gelu(x, pre, mb);
    cache_.put(mb).pre = std::move(pre);
    return y;
  }
  /**
   * B: GeLU's backward on the kept pre-activation, then the projection's (its only collective), through
   * `ColumnParallel::backward_input_gelu`: under Autocast on a `fused_gelu_backward_backend` GeLU's backward,
   * the bias gradient and the 16-bit gradient operand are one pass. The pre-activation is released before the
   * projection's product runs, as the unfused GeLU releases its input: held through it, it would add a
   * `[tokens, ffn]` buffer to the backward's activation peak.
   */
  Activation do_backward_input(const Activation& dy, int mb) {
    return fc_.backward_input_gelu(std::move(cache_.take(mb, layer_kind).pre), dy, mb);
  }

  struct Cache {
    Activation pre;  ///< x W + b: GeLU's input
  };
  Projection fc_;
  MicroBatchCache<Cache> cache_;
};

}  // namespace mpar::nn
