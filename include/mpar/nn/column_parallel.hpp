#pragma once
/**
 * @file `ColumnParallel`: a linear layer whose weight `[in, out]` is split along the output dimension
 * over the tensor axis (Megatron's column-parallel layer, the "f" side of the f/g pair).
 */
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/comm/host_memory_communicator.hpp"
#include "mpar/nn/collective_layers.hpp"
#include "mpar/nn/detail/fused_gelu_backward_backend.hpp"
#include "mpar/nn/linear.hpp"

namespace mpar::nn {

/** @brief Static options of a ColumnParallel layer. */
struct ColumnOptions {
  /// Input is token-sharded (sequence parallelism): all-gather tokens forward, reduce-scatter the input gradient backward.
  bool sequence_parallel = false;
  /// All-gather the output features so the layer returns a replicated tensor.
  bool gather_output = false;
  /// `groups > 1` fuses several projections of the same input (QKV: 3). The weight is then `[in, groups, out]`,
  /// split along its last dimension, so each rank holds the same output block of every group.
  std::size_t groups = 1;
};

template <communicator C, std::size_t In, std::size_t Out, std::size_t TP, bool SP, backend B>
class ColumnParallelGelu;

/**
 * @brief `y = x W + b` with `W` of global shape `[in, out]` (or `[in, groups, out]`) split along `out`.
 *
 * Layouts: input `Replicate` (or `Shard<0, tensor>` with sequence parallelism), output
 * `Shard<1, tensor>` (or `Replicate` with `gather_output`). Forward has no collective (SP: one
 * all-gather of tokens); backward all-reduces the input gradient (SP: reduce-scatters it).
 * `TP` is the tensor-parallel size when known at compile time (then `Out % TP` is checked statically).
 */
template <communicator C, std::size_t In = dyn, std::size_t Out = dyn, std::size_t TP = dyn,
          ColumnOptions O = ColumnOptions{}, backend B = HostBackend>
class ColumnParallel : public detail::LinearState, public detail::TypedLayer<ColumnParallel<C, In, Out, TP, O, B>> {
  using Typed = detail::TypedLayer<ColumnParallel<C, In, Out, TP, O, B>>;

  static_assert(
      statically_divisible_v<Out, TP>,
      "mpar::nn::ColumnParallel<C, In, Out, TP>: the static output size Out is not divisible by the static "
      "tensor-parallel size TP, so the weight cannot be split evenly by columns; choose Out a multiple of TP");
  static_assert(O.groups >= 1, "mpar::nn::ColumnParallel: ColumnOptions::groups must be at least 1");
  static_assert(!(O.gather_output && O.groups > 1),
                "mpar::nn::ColumnParallel: gather_output with groups > 1 would interleave the groups; keep the output "
                "sharded (gather_output = false) for fused projections");

 public:
  using Typed::backward;
  using Typed::backward_input;
  using Typed::forward;
  static constexpr std::string_view layer_kind = "ColumnParallel";
  static constexpr ColumnOptions options = O;
  using default_input = std::conditional_t<O.sequence_parallel, TokenShard, Replicate>;
  static constexpr bool preserves_features = false;
  static constexpr std::size_t static_in_features = In;
  static constexpr std::size_t static_out_features = Out == dyn ? dyn : Out * O.groups;
  template <class L>
  static constexpr bool check_input() {
    if constexpr (std::is_same_v<L, default_input>) {
      return true;
    } else if constexpr (L::is_partial) {
      static_assert(detail::always_false_v<L>,
                    "mpar::nn::ColumnParallel is fed a Partial<sum, tensor> tensor, which would add its bias once per "
                    "rank. Fix: insert AllReduce before it (or give the RowParallel RowReduce::all_reduce)");
      return false;
    } else if constexpr (std::is_same_v<L, FeatureShard>) {
      static_assert(detail::always_false_v<L>,
                    "mpar::nn::ColumnParallel needs whole rows but is fed a feature-sharded tensor (Shard<1, tensor>). "
                    "Fix: use RowParallel here (it consumes Shard<1, tensor>), or insert GatherFeatures (or set "
                    "ColumnOptions{.gather_output = true} on the previous ColumnParallel)");
      return false;
    } else if constexpr (O.sequence_parallel) {
      static_assert(
          detail::always_false_v<L>,
          "mpar::nn::ColumnParallel with ColumnOptions{.sequence_parallel = true} expects a token-sharded "
          "input (Shard<0, tensor>) but is fed another layout (Replicate?). Fix: give the previous RowParallel "
          "RowReduce::reduce_scatter, or use the non-sequence-parallel ColumnParallel");
      return false;
    } else {
      static_assert(detail::always_false_v<L>,
                    "mpar::nn::ColumnParallel expects a Replicate input but is fed a token-sharded tensor (Shard<0, "
                    "tensor>, sequence parallelism). Fix: use the sequence-parallel form "
                    "ColumnParallel<..., ColumnOptions{.sequence_parallel = true}>");
      return false;
    }
  }
  template <class L>
  using output_layout = std::conditional_t<O.gather_output, Replicate, FeatureShard>;

  ColumnParallel(C& tp, std::size_t in, std::size_t out, const LinearInit& init)
      : comm_(&tp), in_(detail::reconcile(In, in, layer_kind, "in_features")),
        out_(detail::reconcile(Out, out, layer_kind, "out_features")),
        p_(detail::checked_tp_size<TP>(tp, layer_kind, init.name)), rank_(std::size_t(tp.rank())), name_(init.name) {
    require(in_ > 0 && out_ > 0 && out_ % p_ == 0, "ColumnParallel '", name_, "' (tensor rank ", rank_,
            "): output size ", out_, " is not divisible by the tensor-parallel size ", p_, " (input size ", in_, ")");
    require_reaches_rank_memory<B>(tp, "ColumnParallel '" + name_ + "'");
    local_out_ = out_ / p_;
    const auto spec = detail::default_weight_init(in_);
    if constexpr (O.groups == 1) {
      const std::array<std::size_t, 2> ws{in_, out_};
      weight_ =
          make_parameter<B, 2>(name_ + ".weight", init.id_base, ws, detail::tensor_box<FeatureShard>(ws, p_, rank_),
                               FeatureShard::name(), p_ > 1, init.seed, spec);
    } else {
      using L3 = Shard<2, axis::tensor>;
      const std::array<std::size_t, 3> ws{in_, O.groups, out_};
      weight_ = make_parameter<B, 3>(name_ + ".weight", init.id_base, ws, detail::tensor_box<L3>(ws, p_, rank_),
                                     L3::name(), p_ > 1, init.seed, spec);
    }
    weight_.gemm_operand_only = true;  // read by GEMMs alone (LinearState::weight_f32)
    if (init.bias) {
      if constexpr (O.groups == 1) {
        const std::array<std::size_t, 1> bs{out_};
        bias_ =
            make_parameter<B, 1>(name_ + ".bias", init.id_base + 1, bs, detail::tensor_box<TokenShard>(bs, p_, rank_),
                                 TokenShard::name(), p_ > 1, init.seed, InitSpec::normal(0.02));
      } else {
        const std::array<std::size_t, 2> bs{O.groups, out_};
        bias_ =
            make_parameter<B, 2>(name_ + ".bias", init.id_base + 1, bs, detail::tensor_box<FeatureShard>(bs, p_, rank_),
                                 FeatureShard::name(), p_ > 1, init.seed, InitSpec::normal(0.02));
      }
    }
  }

 private:
  friend Typed;  // its typed entries are the only public way in; these do the work on the storage
  // The fused projection + GeLU runs this layer's forward_bias_gelu on storage it has already checked.
  template <communicator C2, std::size_t In2, std::size_t Out2, std::size_t TP2, bool SP2, backend B2>
  friend class ColumnParallelGelu;
  Activation do_forward(const Activation& x_in, int mb) {
    return on_replicated_input(x_in, [&](auto&& xf) { return forward_replicated(std::forward<decltype(xf)>(xf), mb); });
  }
  /**
   * `f` on the replicated operand of this rank's columns, checked against the layer's input features: SP
   * all-gathers the tokens (an rvalue `f` may move from); otherwise f (CopyToTensorRegion, the identity forward),
   * i.e. `x_in` itself.
   */
  template <class F>
  Activation on_replicated_input(const Activation& x_in, F&& f) {
    require(x_in.extent(1) == in_, "ColumnParallel '", name_, "' (tensor rank ", rank_, "): input has ", x_in.extent(1),
            " features, expected ", in_);
    // GatherTokens' forward, reading the caller's shard in place: wrapping `x_in` in an Act would copy it on the
    // host (on a stream-ordered backend before the operation that writes it has run).
    if constexpr (O.sequence_parallel)
      return p_ == 1 ? f(x_in) : f(gather_tokens(*comm_, x_in));
    else
      return f(x_in);
  }
  /**
   * The forward on the replicated input `xf`: an rvalue (the gathered tokens) is moved into what the weight
   * gradient keeps; the caller's `x_in` is copied there by `gemm_forward` in fp32 and only converted under
   * Autocast (a copy first would be thrown away after the conversion).
   */
  template <class X>
  Activation forward_replicated(X&& xf, int mb) {
    const std::size_t n = O.groups * local_out_;
    Act<FeatureShard> y(Activation({xf.extent(0), n}, uninitialized));  // the GEMM (beta = 0) writes all of it
    gemm_forward<B>(mb, std::forward<X>(xf), n, y.tensor());            // keeps the input (16-bit under Autocast)
    keep_own_tokens(mb);
    if (has_bias()) detail::add_row_vector<B>(y.tensor(), bias_.value);
    if constexpr (O.gather_output)
      return GatherFeaturesOf::forward<B>(*comm_, y).tensor();
    else
      return std::move(y).tensor();
  }

  /**
   * This layer's forward followed by GeLU, fused (`ops::gemm_bias_gelu`: the bias inside the GEMM, GeLU in the
   * same operation): returns `gelu(x W + b)` and the pre-activation `x W + b` in `pre`, which GeLU's backward
   * needs. Keeps what `forward` keeps, so `backward_input` (on GeLU's input gradient) and `backward_weight`
   * are this layer's own. For the plain form only: one group, a sharded output, and a bias.
   */
  Activation forward_bias_gelu(const Activation& x_in, Activation& pre,
                               int mb = 0) requires(O.groups == 1 && !O.gather_output) {
    // As in forward: the gathered tokens (SP), or `x_in` itself (f is the identity), copied or converted for W.
    return on_replicated_input(
        x_in, [&](auto&& xf) { return forward_bias_gelu_replicated(std::forward<decltype(xf)>(xf), pre, mb); });
  }
  template <class X>
  Activation forward_bias_gelu_replicated(X&& xf, Activation& pre, int mb) {
    require(has_bias(), "ColumnParallel '", name_, "' (tensor rank ", rank_,
            "): the fused bias + GeLU forward needs a bias; build the layer with a bias or use forward and Gelu");
    pre = Activation({xf.extent(0), local_out_}, uninitialized);  // both written whole by the operation
    Activation y({xf.extent(0), local_out_}, uninitialized);
    gemm_forward_bias_gelu<B>(mb, std::forward<X>(xf), local_out_, pre, y);
    keep_own_tokens(mb);
    return y;
  }
  /**
   * Sequence parallelism: of the gathered input the forward kept (in the GEMM's operand type), only this rank's
   * block of tokens stays until the backward, which all-gathers it again (Megatron-LM does the same). Keeping the
   * gathered input would hold tp times the rows, the activation memory sequence parallelism exists to save; the
   * price is one all-gather per layer in the backward.
   */
  void keep_own_tokens(int mb) {
    if constexpr (O.sequence_parallel) {
      if (p_ == 1) return;
      const detail::GemmOperand full = take_operand(mb, layer_kind);
      const std::size_t rows = full.rows / p_;
      keep_operand(mb, detail::operand_rows<B>(full, rank_ * rows, rows));
    }
  }

  /**
   * B: the input gradient, with the layer's backward collective (all-reduce; SP: the input's all-gather and the
   * gradient's reduce-scatter). Keeps the gathered input and this rank's output-gradient columns for backward_weight.
   */
  Activation do_backward_input(const Activation& dy_in, int mb) {
    // This rank's output-gradient columns: GatherFeaturesOf's backward slice of `dy_in`, read in place (an Act
    // around it would be a host copy), or `dy_in` itself, which gemm_backward_input copies (fp32) or converts
    // (Autocast) for W.
    if constexpr (O.gather_output)
      return backward_input_on(local_features<B>(dy_in, p_, rank_), mb);
    else
      return backward_input_on(dy_in, mb);
  }
  template <class Dy>
  Activation backward_input_on(Dy&& dy, int mb) {
    return backward_input_with(mb, dy.extent(0), dy.extent(1), [&](detail::GemmOperand x, Activation& dx) {
      gemm_backward_input<B>(mb, std::move(x), std::forward<Dy>(dy), in_, dx);
    });
  }
  /**
   * B around the product `gemm(x, dx)` on an output gradient of `rows x cols`: the kept input (SP: gathered
   * again), the check of the gradient's shape, and the backward collective on `dx`.
   */
  template <class Gemm>
  Activation backward_input_with(int mb, std::size_t rows, std::size_t cols, Gemm&& gemm) {
    detail::GemmOperand x = take_operand(mb, layer_kind);
    if constexpr (O.sequence_parallel)
      if (p_ > 1) x = detail::gather_operand_rows<B>(*comm_, x);  // the input's tokens again (see keep_own_tokens)
    require(rows == x.rows && cols == O.groups * local_out_, "ColumnParallel '", name_, "' (tensor rank ", rank_,
            "): output gradient is ", rows, "x", cols, ", expected ", x.rows, "x", O.groups * local_out_);
    // Each rank's dx is the contribution of its output columns only: a Partial sum over the ranks.
    Act<TensorPartial> dx(Activation({rows, in_}, uninitialized));
    gemm(std::move(x), dx.tensor());
    // The backward dual of the forward entry sums it: f's all-reduce (SP: the reduce-scatter of GatherTokens).
    if constexpr (O.sequence_parallel)
      return GatherTokens::backward<B>(*comm_, std::move(dx), "ColumnParallel").tensor();
    else
      return CopyToTensorRegion::backward<B>(*comm_, std::move(dx)).tensor();
  }

 public:
  /**
   * B of `forward_bias_gelu`, on the gradient `dy` of GeLU's output and the pre-activation `pre` the forward
   * returned (released here before the product): GeLU's backward, then this layer's `backward_input`. In 16-bit
   * mode on a `fused_gelu_backward_backend`, GeLU's backward, the bias gradient and the gradient's 16-bit
   * operand are one operation (`gelu_backward_bias`), and no fp32 gradient of the pre-activation is written.
   */
  Activation backward_input_gelu(Activation pre, const Activation& dy,
                                 int mb = 0) requires(O.groups == 1 && !O.gather_output) {
    require(dy.shape() == pre.shape(), "ColumnParallel '", name_, "' (tensor rank ", rank_,
            "): GeLU's output gradient is ", dy.extent(0), "x", dy.extent(1), ", the forward's output ", pre.extent(0),
            "x", pre.extent(1));
    if constexpr (detail::fused_gelu_backward_backend<B>) {
      const ComputeType t = operand_type(mb, layer_kind);
      if (t != ComputeType::fp32 && has_bias()) {  // the fused operation accumulates into the bias gradient
        detail::GemmOperand g{t, dy.extent(0), dy.extent(1), {}, {}, {}};
        detail::with_half(t, [&]<class T>(T) {
          auto& h = g.template half_storage<T>();
          h = B::template allocate<T>(dy.size());
          B::run(ops::gelu_backward_bias<T>{.rows = dy.extent(0),
                                            .cols = dy.extent(1),
                                            .pre = pre.data(),
                                            .dy = dy.data(),
                                            .dbias = bias_.grad.data(),
                                            .dpre = h.data()});
        });
        pre = Activation();  // freed before the product, as the unfused GeLU frees its input
        return backward_input_with(mb, g.rows, g.cols, [&](detail::GemmOperand x, Activation& dx) {
          gemm_backward_input_converted<B>(mb, std::move(x), std::move(g), in_, dx);
        });
      }
    }
    Activation dpre(dy.shape(), uninitialized);
    B::run(ops::gelu_backward{.n = dy.size(),
                              .x = static_cast<const float*>(pre.data()),
                              .dy = static_cast<const float*>(dy.data()),
                              .dx = dpre.data()});
    pre = Activation();
    return backward_input_on(std::move(dpre), mb);
  }

  /** W: this rank's weight and bias columns, `dW += xᵀ dy`; no communication (every rank holds all tokens). */
  void backward_weight(int mb = 0) { local_backward_weight<B>(mb, layer_kind); }

  [[nodiscard]] std::size_t in_features() const { return in_; }
  [[nodiscard]] std::size_t out_features() const { return out_ * O.groups; }
  [[nodiscard]] std::size_t local_out_features() const { return local_out_ * O.groups; }

 private:
  C* comm_;
  std::size_t in_, out_, p_, rank_, local_out_ = 0;
  std::string name_;
};

}  // namespace mpar::nn
