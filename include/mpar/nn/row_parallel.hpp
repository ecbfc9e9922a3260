#pragma once
/**
 * @file `RowParallel`: a linear layer whose weight `[in, out]` is split along the input dimension over
 * the tensor axis (Megatron's row-parallel layer, the "g" side of the f/g pair).
 */
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/comm/host_memory_communicator.hpp"
#include "mpar/nn/collective_layers.hpp"
#include "mpar/nn/linear.hpp"

namespace mpar::nn {

/** @brief How a RowParallel layer finishes its partial sums. */
enum class RowReduce {
  all_reduce,      ///< output Replicate
  reduce_scatter,  ///< output Shard<0, tensor> (sequence parallelism)
  none             ///< output Partial<sum, tensor>: the caller reduces later (bias added on tensor rank 0 only)
};

/**
 * @brief `y = x W + b` with `W` of global shape `[in, out]` split along `in`; input `Shard<1, tensor>`.
 *
 * Each rank computes a full-size partial product; the bias is added once, after the reduction.
 * Forward: one all-reduce (or reduce-scatter); backward: none (or one all-gather of the gradient).
 */
template <communicator C, std::size_t In = dyn, std::size_t Out = dyn, std::size_t TP = dyn,
          RowReduce R = RowReduce::all_reduce, backend B = HostBackend>
class RowParallel : public detail::LinearState, public detail::TypedLayer<RowParallel<C, In, Out, TP, R, B>> {
  using Typed = detail::TypedLayer<RowParallel<C, In, Out, TP, R, B>>;

  static_assert(statically_divisible_v<In, TP>,
                "mpar::nn::RowParallel<C, In, Out, TP>: the static input size In is not divisible by the static "
                "tensor-parallel size TP, so the weight cannot be split evenly by rows; choose In a multiple of TP");

 public:
  using Typed::backward;
  using Typed::backward_input;
  using Typed::forward;
  static constexpr std::string_view layer_kind = "RowParallel";
  static constexpr RowReduce reduction = R;
  using default_input = FeatureShard;
  static constexpr bool preserves_features = false;
  static constexpr std::size_t static_in_features = In, static_out_features = Out;
  template <class L>
  static constexpr bool check_input() {
    if constexpr (std::is_same_v<L, FeatureShard>) {
      return true;
    } else if constexpr (std::is_same_v<L, Replicate>) {
      static_assert(detail::always_false_v<L>,
                    "mpar::nn::RowParallel needs its input split by features (Shard<1, tensor>) but is fed a Replicate "
                    "tensor. Fix: feed it the output of a ColumnParallel that keeps its output sharded (no "
                    "gather_output): insert ColumnParallel before RowParallel, or use ColumnParallel here instead");
      return false;
    } else if constexpr (std::is_same_v<L, TokenShard>) {
      static_assert(detail::always_false_v<L>,
                    "mpar::nn::RowParallel needs its input split by features (Shard<1, tensor>) but is fed a "
                    "token-sharded tensor (Shard<0, tensor>). Fix: insert a sequence-parallel ColumnParallel "
                    "(ColumnOptions{.sequence_parallel = true}) before RowParallel");
      return false;
    } else if constexpr (L::is_partial) {
      static_assert(detail::always_false_v<L>,
                    "mpar::nn::RowParallel needs its input split by features (Shard<1, tensor>) but is fed a Partial "
                    "(unreduced) tensor. Fix: reduce first (RowParallel with RowReduce::all_reduce, or insert "
                    "AllReduce), then a ColumnParallel");
      return false;
    } else {
      static_assert(detail::always_false_v<L>,
                    "mpar::nn::RowParallel needs its input split by features on the 1D tensor axis (Shard<1, tensor>) "
                    "but is fed another layout (see L above). Fix: feed it a ColumnParallel output");
      return false;
    }
  }
  template <class L>
  using output_layout =
      std::conditional_t<R == RowReduce::all_reduce, Replicate,
                         std::conditional_t<R == RowReduce::reduce_scatter, TokenShard, TensorPartial>>;

  RowParallel(C& tp, std::size_t in, std::size_t out, const LinearInit& init)
      : comm_(&tp), in_(detail::reconcile(In, in, layer_kind, "in_features")),
        out_(detail::reconcile(Out, out, layer_kind, "out_features")),
        p_(detail::checked_tp_size<TP>(tp, layer_kind, init.name)), rank_(std::size_t(tp.rank())), name_(init.name) {
    require(in_ > 0 && out_ > 0 && in_ % p_ == 0, "RowParallel '", name_, "' (tensor rank ", rank_, "): input size ",
            in_, " is not divisible by the tensor-parallel size ", p_, " (output size ", out_, ")");
    require_reaches_rank_memory<B>(tp, "RowParallel '" + name_ + "'");
    local_in_ = in_ / p_;
    const std::array<std::size_t, 2> ws{in_, out_};
    weight_ = make_parameter<B, 2>(name_ + ".weight", init.id_base, ws, detail::tensor_box<TokenShard>(ws, p_, rank_),
                                   TokenShard::name(), p_ > 1, init.seed, detail::default_weight_init(in_));
    weight_.gemm_operand_only = true;  // read by GEMMs alone (LinearState::weight_f32)
    if (init.bias) {
      const std::array<std::size_t, 1> bs{out_};
      bias_ = make_parameter<B, 1>(name_ + ".bias", init.id_base + 1, bs, detail::tensor_box<Replicate>(bs, p_, rank_),
                                   Replicate::name(), false, init.seed, InitSpec::normal(0.02));
    }
  }

 private:
  friend Typed;  // its typed entries are the only public way in; these do the work on the storage
  Activation do_forward(const Activation& x_in, int mb) {
    require(x_in.extent(1) == local_in_, "RowParallel '", name_, "' (tensor rank ", rank_, "): input shard has ",
            x_in.extent(1), " features, expected ", local_in_, " (= ", in_, " / ", p_, ")");
    // This rank's rows of W times its feature block: a full-size addend of the product.
    Act<TensorPartial> y(Activation({x_in.extent(0), out_}, uninitialized));  // the GEMM (beta = 0) writes all of it
    // fp32, or 16-bit operands under Autocast; the input shard is kept for W (copied in fp32, converted under
    // Autocast: a copy made here first would be thrown away after the conversion).
    gemm_forward<B>(mb, x_in, out_, y.tensor());
    const bool with_bias = has_bias();
    if constexpr (R == RowReduce::all_reduce) {
      Act<Replicate> r = ReduceToReplicate::forward<B>(*comm_, std::move(y));
      if (with_bias) detail::add_row_vector<B>(r.tensor(), bias_.value);
      return std::move(r).tensor();
    } else if constexpr (R == RowReduce::reduce_scatter) {
      Act<TokenShard> part = ReduceScatterTokens::forward<B>(*comm_, std::move(y), "RowParallel");
      if (with_bias) detail::add_row_vector<B>(part.tensor(), bias_.value);
      return std::move(part).tensor();
    } else {
      // A Partial tensor is the sum of the ranks' addends: the bias belongs to exactly one of them.
      if (with_bias && rank_ == 0) detail::add_row_vector<B>(y.tensor(), bias_.value);
      return std::move(y).tensor();
    }
  }

  /**
   * B: this rank's input-gradient columns `dx = dy W_localᵀ` (SP: after the all-gather of dy, the
   * layer's only backward collective). Keeps the input shard and the full dy for backward_weight.
   */
  Activation do_backward_input(const Activation& dy_in, int mb) {
    // The backward dual of the forward reduction: identity (all-reduce: `dy_in` itself, which gemm_backward_input
    // copies in fp32 or converts under Autocast for W) or all-gather (reduce-scatter); a Partial output's
    // gradient is already replicated.
    if constexpr (R == RowReduce::reduce_scatter)
      // ReduceScatterTokens' backward, reading the caller's gradient in place (as ColumnParallel's forward gathers).
      return comm_->size() == 1 ? backward_input_on(dy_in, mb) : backward_input_on(gather_tokens(*comm_, dy_in), mb);
    else
      return backward_input_on(dy_in, mb);
  }
  template <class Dy>
  Activation backward_input_on(Dy&& dy, int mb) {
    detail::GemmOperand x = take_operand(mb, layer_kind);
    require(dy.extent(0) == x.rows && dy.extent(1) == out_, "RowParallel '", name_, "' (tensor rank ", rank_,
            "): output gradient is ", dy.extent(0), "x", dy.extent(1), ", expected ", x.rows, "x", out_);
    Activation dx({dy.extent(0), local_in_}, uninitialized);
    gemm_backward_input<B>(mb, std::move(x), std::forward<Dy>(dy), local_in_, dx);
    return dx;
  }

 public:
  /**
   * W: this rank's weight rows `dW += x_localᵀ dy` and the bias; no communication. The replicated bias
   * sees every token's gradient; with sequence parallelism the gathered dy already holds them all, so no
   * extra all-reduce of the bias gradient is needed.
   */
  void backward_weight(int mb = 0) { local_backward_weight<B>(mb, layer_kind); }

  [[nodiscard]] std::size_t in_features() const { return in_; }
  [[nodiscard]] std::size_t out_features() const { return out_; }

 private:
  C* comm_;
  std::size_t in_, out_, p_, rank_, local_in_ = 0;
  std::string name_;
};

}  // namespace mpar::nn
