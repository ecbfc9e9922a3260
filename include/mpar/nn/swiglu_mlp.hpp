#pragma once
/**
 * @file The SwiGLU MLP of Llama, tensor-parallel: `ColumnParallel` (gate and up fused, no bias) -> `SiluGate` ->
 * `RowParallel` (down, no bias); one all-reduce forward and one backward (with sequence parallelism: all-gather +
 * reduce-scatter each way instead), as the Megatron MLP.
 *
 * The fused projection is a `ColumnParallel` with two groups: its weight `[hidden, 2, ffn]` holds the gate
 * projection at `[:, 0, :]` and the up projection at `[:, 1, :]` and is split along `ffn`, so each rank's output
 * `[tokens, 2 ffn / tp]` is its gate columns then the up columns of the same ffn indices, and `SiluGate` pairs them
 * with no communication.
 */
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/backend/ops/operation.hpp"
#include "mpar/backend/ops/silu_gate.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/column_parallel.hpp"
#include "mpar/nn/layer.hpp"
#include "mpar/nn/row_parallel.hpp"
#include "mpar/nn/stage.hpp"

namespace mpar::nn {

/**
 * @brief `y = silu(gate) * up` on rows that hold `features` gate values then `features` up values (a rank's block
 * of the fused gate-and-up projection): `[tokens, 2 features]` -> `[tokens, features]`, per rank. Keeps its
 * input's layout (each rank pairs its own columns); a Partial input is refused (the product is not linear).
 * `features` is the layer's global output size (ffn), which `Stage` checks against its neighbours.
 */
template <backend B = HostBackend>
class SiluGate : public detail::TypedLayer<SiluGate<B>> {
  using Typed = detail::TypedLayer<SiluGate<B>>;
  static_assert(supports<B, ops::silu_gate_forward> && supports<B, ops::silu_gate_backward>,
                "mpar::nn::SiluGate<B>: backend B does not run ops::silu_gate_forward and ops::silu_gate_backward "
                "(backend/ops/silu_gate.hpp). Fix: use HostBackend, StreamHostBackend, DiscreteHostBackend or "
                "CudaBackend, or give B a run(op) for them");

 public:
  using Typed::backward;
  using Typed::forward;
  static constexpr std::string_view layer_kind = "SiluGate";
  using default_input = FeatureShard;
  static constexpr bool preserves_features = false;
  static constexpr std::size_t static_in_features = dyn, static_out_features = dyn;
  template <class L>
  static constexpr bool check_input() {
    static_assert(!L::is_partial,
                  "mpar::nn::SiluGate (a nonlinear layer) is fed a Partial<sum, tensor> tensor; silu(a + b) (c + d) "
                  "is not the sum of the addends' products. Fix: feed it the output of the fused gate-and-up "
                  "ColumnParallel, or reduce first");
    return !L::is_partial;
  }
  template <class L>
  using output_layout = L;
  template <class G>
  using input_for_grad = G;

  explicit SiluGate(std::size_t features) : features_(features) {
    require(features_ > 0, "SiluGate: features must be positive");
  }

  std::vector<Parameter*> parameters() { return {}; }
  void drop(int mb) { cache_.drop(mb); }
  [[nodiscard]] std::size_t in_features() const { return 2 * features_; }
  [[nodiscard]] std::size_t out_features() const { return features_; }

 private:
  friend Typed;  // its typed entries are the only public way in; these do the work on the storage
  Activation do_forward(const Activation& x, int mb) {
    require(x.extent(1) % 2 == 0, "SiluGate: input has ", x.extent(1),
            " features, expected gate and up halves of equal size");
    const std::size_t cols = x.extent(1) / 2;
    Activation y({x.extent(0), cols}, uninitialized);  // the kernel writes it whole
    B::run(ops::silu_gate_forward{.rows = x.extent(0), .cols = cols, .gate_up = x.data(), .y = y.data()});
    cache_.put(mb).x = backend_copy<B>(x);
    return y;
  }
  Activation do_backward(const Activation& dy, int mb) {
    auto c = cache_.take(mb, layer_kind);
    require(dy.extent(0) == c.x.extent(0) && 2 * dy.extent(1) == c.x.extent(1), "SiluGate: gradient is ", dy.extent(0),
            "x", dy.extent(1), ", expected ", c.x.extent(0), "x", c.x.extent(1) / 2);
    Activation dx(c.x.shape(), uninitialized);
    B::run(ops::silu_gate_backward{
        .rows = dy.extent(0), .cols = dy.extent(1), .gate_up = c.x.data(), .dy = dy.data(), .dgate_up = dx.data()});
    return dx;
  }

  struct Cache {
    Activation x;  ///< gate and up
  };
  std::size_t features_;
  MicroBatchCache<Cache> cache_;
};

/** @brief Sizes and initialisation of a SwiGLU MLP. */
struct SwiGluMlpConfig {
  std::size_t hidden = 0, ffn = 0;
  std::uint64_t seed = 0, id_base = 0;  ///< gate_up weight: id_base; down weight: id_base + 2
  std::string name = "mlp";
};

/** @brief The stage type of the tensor-parallel SwiGLU MLP (`SP`: token-sharded input and output). */
template <communicator C, bool SP = false, backend B = HostBackend>
using SwiGluMlpStage = Stage<ColumnParallel<C, dyn, dyn, dyn, ColumnOptions{SP, false, 2}, B>, SiluGate<B>,
                             RowParallel<C, dyn, dyn, dyn, SP ? RowReduce::reduce_scatter : RowReduce::all_reduce, B>>;

/**
 * @brief Builds the SwiGLU MLP on tensor group `tp` (a one-rank group for the single-rank MLP): parameters
 * `<name>.gate_up.weight` `[hidden, 2, ffn]` and `<name>.down.weight` `[ffn, hidden]`, no biases; `ffn` must be
 * divisible by the group's size.
 */
template <communicator C, bool SP = false, backend B = HostBackend>
[[nodiscard]] SwiGluMlpStage<C, SP, B> make_swiglu_mlp(C& tp, const SwiGluMlpConfig& c) {
  using GateUp = ColumnParallel<C, dyn, dyn, dyn, ColumnOptions{SP, false, 2}, B>;
  using Down = RowParallel<C, dyn, dyn, dyn, SP ? RowReduce::reduce_scatter : RowReduce::all_reduce, B>;
  return SwiGluMlpStage<C, SP, B>(GateUp(tp, c.hidden, c.ffn, {c.seed, c.id_base, c.name + ".gate_up", false}),
                                  SiluGate<B>(c.ffn),
                                  Down(tp, c.ffn, c.hidden, {c.seed, c.id_base + 2, c.name + ".down", false}));
}

}  // namespace mpar::nn
