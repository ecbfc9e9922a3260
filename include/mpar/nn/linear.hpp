#pragma once
/** @file `Linear`: the single-rank affine layer `y = x W + b`, and the GEMM steps shared by its parallel forms. */
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/core/dtype.hpp"
#include "mpar/nn/autocast.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/half_weight.hpp"
#include "mpar/nn/layer.hpp"

namespace mpar::nn {

namespace detail {
/** y[T, n] = x[T, k] * w[k, n] (+ y when accumulate). */
template <backend B>
void linear_forward(const Activation& x, const float* w, std::size_t n, Activation& y, bool accumulate = false) {
  const std::size_t t = x.extent(0), k = x.extent(1);
  B::run(ops::gemm<float>{.ta = Trans::no,
                          .tb = Trans::no,
                          .m = t,
                          .n = n,
                          .k = k,
                          .alpha = 1.0f,
                          .a = x.data(),
                          .lda = k,
                          .b = w,
                          .ldb = n,
                          .beta = accumulate ? 1.0f : 0.0f,
                          .c = y.data(),
                          .ldc = n});
}
/** dx[T, k] = dy[T, n] * w[k, n]^T */
template <backend B>
void linear_backward_input(const Activation& dy, const float* w, std::size_t k, Activation& dx) {
  const std::size_t t = dy.extent(0), n = dy.extent(1);
  B::run(ops::gemm<float>{.ta = Trans::no,
                          .tb = Trans::yes,
                          .m = t,
                          .n = k,
                          .k = n,
                          .alpha = 1.0f,
                          .a = dy.data(),
                          .lda = n,
                          .b = w,
                          .ldb = n,
                          .beta = 0.0f,
                          .c = dx.data(),
                          .ldc = k});
}
/** dw[k, n] = x[T, k]^T * dy[T, n] + beta dw (beta 1: accumulate; 0: overwrite a zeroed gradient) */
template <backend B>
void linear_backward_weight(const Activation& x, const Activation& dy, float* dw, float beta = 1.0f) {
  const std::size_t t = x.extent(0), k = x.extent(1), n = dy.extent(1);
  B::run(ops::gemm<float>{.ta = Trans::yes,
                          .tb = Trans::no,
                          .m = k,
                          .n = n,
                          .k = t,
                          .alpha = 1.0f,
                          .a = x.data(),
                          .lda = k,
                          .b = dy.data(),
                          .ldb = n,
                          .beta = beta,
                          .c = dw,
                          .ldc = n});
}
/**
 * What a linear layer's weight gradient needs from one micro-batch: the (gathered) input and the local
 * output gradient. Kept from backward_input (B) until backward_weight (W) consumes it.
 */
struct WeightGradInputs {
  Activation x, dy;
};

/** Calls `f(T{})` with the 16-bit element type of `t` (bf16 or f16; `t` is not fp32). */
template <class F>
decltype(auto) with_half(ComputeType t, F&& f) {
  if (t == ComputeType::bf16) return f(bf16{});
  return f(f16{});
}

/**
 * A `[rows, cols]` GEMM operand a layer keeps between passes: the fp32 activation, or under `Autocast` its
 * 16-bit conversion (half the bytes; the fp32 original is not kept).
 */
struct GemmOperand {
  ComputeType type = ComputeType::fp32;
  std::size_t rows = 0, cols = 0;
  Activation f32;    ///< fp32 operands
  Buffer<bf16> b16;  ///< bf16 operands
  Buffer<f16> h16;   ///< f16 operands

  template <class T>
  [[nodiscard]] const T* half() const {
    if constexpr (std::is_same_v<T, bf16>)
      return b16.data();
    else
      return h16.data();
  }
  template <class T>
  [[nodiscard]] Buffer<T>& half_storage() {
    if constexpr (std::is_same_v<T, bf16>)
      return b16;
    else
      return h16;
  }
};
/**
 * `x` as a GEMM operand of type `t`: one `B::convert` into rank memory for a 16-bit type; for fp32 the
 * activation itself (moved when `x` is an rvalue, else one `B::copy`).
 */
template <backend B, class X>
GemmOperand make_operand(X&& x, ComputeType t) {
  GemmOperand op{t, x.extent(0), x.extent(1), {}, {}, {}};
  if (t == ComputeType::fp32) {
    if constexpr (std::is_rvalue_reference_v<X&&>)
      op.f32 = std::move(x);
    else
      op.f32 = backend_copy<B>(x);
  } else {
    with_half(t, [&]<class T>(T) {
      auto& h = op.half_storage<T>();
      h = B::template allocate<T>(x.size());
      B::run(ops::convert<float, T>{.n = x.size(), .src = x.data(), .dst = h.data()});
    });
  }
  return op;
}
/** Rows `[begin, begin + count)` of a kept operand, copied by `B` (rows are contiguous) in the operand's type. */
template <backend B>
GemmOperand operand_rows(const GemmOperand& op, std::size_t begin, std::size_t count) {
  GemmOperand out{op.type, count, op.cols, {}, {}, {}};
  const std::size_t n = count * op.cols, offset = begin * op.cols;
  if (op.type == ComputeType::fp32) {
    out.f32 = Activation({count, op.cols}, uninitialized);
    if (n != 0) B::run(ops::copy<float>{.n = n, .src = op.f32.data() + offset, .dst = out.f32.data()});
  } else {
    with_half(op.type, [&]<class T>(T) {
      auto& h = out.half_storage<T>();
      h = B::template allocate<T>(n);
      if (n != 0) B::run(ops::copy<T>{.n = n, .src = op.half<T>() + offset, .dst = h.data()});
    });
  }
  return out;
}
/** The operand whose consecutive row blocks the ranks of `comm` hold (this rank's is `shard`), all-gathered. */
template <backend B, communicator C>
GemmOperand gather_operand_rows(C& comm, const GemmOperand& shard) {
  const std::size_t rows = shard.rows * std::size_t(comm.size()), n = rows * shard.cols;
  GemmOperand out{shard.type, rows, shard.cols, {}, {}, {}};
  if (shard.type == ComputeType::fp32) {
    out.f32 = Activation({rows, shard.cols}, uninitialized);  // the all-gather writes every row
    comm.all_gather(std::span<const float>(shard.f32.span()), out.f32.span());
  } else {
    with_half(shard.type, [&]<class T>(T) {
      auto& h = out.half_storage<T>();
      h = B::template allocate<T>(n);
      comm.all_gather(std::span<const T>(shard.half<T>(), shard.rows * shard.cols), std::span<T>(h.data(), n));
    });
  }
  return out;
}
/** What W needs from one micro-batch: the input and output-gradient operands. */
struct WeightGradOperands {
  GemmOperand x, dy;
};
inline constexpr std::string_view no_backward_input_msg =
    " backward_weight (no backward_input ran for this micro-batch since its forward)";
inline InitSpec default_weight_init(std::size_t fan_in) { return InitSpec::normal(1.0 / std::sqrt(double(fan_in))); }
/** Checks that a tensor-parallel layer's static size `TP` (or `dyn`) matches its communicator `tp`'s size. */
template <std::size_t TP, class C>
std::size_t checked_tp_size(const C& tp, std::string_view kind, const std::string& name) {
  const std::size_t p = std::size_t(tp.size());
  require(TP == dyn || p == TP, kind, " '", name, "': the type fixes the tensor-parallel size to ", TP,
          " but the communicator '", tp.name(), "' has ", p, " ranks");
  return p;
}

/**
 * What every linear layer holds besides its sizes: the weight, the optional bias (empty when
 * disabled), the input kept from forward to B, and the `{x, dy}` kept from B to W, per micro-batch.
 * The layers derive from it, so `parameters()`, `drop()`, `weight()` and `bias()` are written once.
 */
class LinearState {
 public:
  std::vector<Parameter*> parameters() { return param_list(&weight_, &bias_); }
  /** Frees everything kept for micro-batch `mb` (its forward input and its pending weight-gradient inputs). */
  void drop(int mb) {
    inputs_.drop(mb);
    pending_.drop(mb);
    operands_.drop(mb);
    pending_operands_.drop(mb);
  }
  [[nodiscard]] Parameter& weight() { return weight_; }
  [[nodiscard]] Parameter& bias() { return bias_; }

 protected:
  /// By its shape, not its values: under ZeRO-3 the values are released outside the forward and B (W adds the
  /// bias gradient without them).
  [[nodiscard]] bool has_bias() const { return !bias_.value.empty() || !bias_.global_shape.empty(); }
  /** Forward: keeps the (gathered) input of micro-batch `mb` for its backward. */
  void keep_input(int mb, Activation x) { inputs_.put(mb) = std::move(x); }
  /** B: the input kept by forward for micro-batch `mb` (an error naming `kind` if there is none). */
  [[nodiscard]] Activation take_input(int mb, std::string_view kind) { return inputs_.take(mb, kind); }
  /** B: keeps the input and the local output gradient of micro-batch `mb` until W consumes them. */
  void keep_for_weight(int mb, Activation x, Activation dy) { pending_.put(mb) = {std::move(x), std::move(dy)}; }
  /** W: what B kept for micro-batch `mb` (an error naming `kind` if B has not run for it). */
  [[nodiscard]] WeightGradInputs take_for_weight(int mb, std::string_view kind) {
    return pending_.take(mb, std::string(kind).append(no_backward_input_msg));
  }
  /**
   * Forward GEMM `y[T, n] = x[T, k] W[k, n]` in the compute type of the current `Autocast` scope (fp32 outside
   * one), keeping `x` of micro-batch `mb` for the backward (16-bit under autocast: converted once, used by the
   * product and by the weight gradient). An rvalue `x` is moved in fp32 mode.
   */
  template <backend B, class X>
  void gemm_forward(int mb, X&& x, std::size_t n, Activation& y) {
    const ComputeType t = autocast_type();
    GemmOperand op = make_operand<B>(std::forward<X>(x), t);
    const std::size_t rows = op.rows, k = op.cols;
    if (t == ComputeType::fp32) {
      linear_forward<B>(op.f32, weight_f32<B>(), n, y);
    } else {
      with_half(t, [&]<class T>(T) {
        B::run(ops::gemm<T, float>{.ta = Trans::no,
                                   .tb = Trans::no,
                                   .m = rows,
                                   .n = n,
                                   .k = k,
                                   .alpha = 1.0f,
                                   .a = op.half<T>(),
                                   .lda = k,
                                   .b = weight_half<B, T>(),
                                   .ldb = n,
                                   .beta = 0.0f,
                                   .c = y.data(),
                                   .ldc = n});
      });
    }
    operands_.put(mb) = std::move(op);
  }
  /**
   * Forward of a projection whose output feeds GeLU, fused: `pre[T, n] = x W + b` and `y = gelu(pre)` in one
   * `ops::gemm_bias_gelu` (the bias inside the GEMM), in the compute type of the current `Autocast` scope, keeping
   * `x` exactly as `gemm_forward` does. The caller keeps `pre` for GeLU's backward. Needs the bias.
   */
  template <backend B, class X>
  void gemm_forward_bias_gelu(int mb, X&& x, std::size_t n, Activation& pre, Activation& y) {
    const ComputeType t = autocast_type();
    GemmOperand op = make_operand<B>(std::forward<X>(x), t);
    const std::size_t rows = op.rows, k = op.cols;
    if (t == ComputeType::fp32) {
      B::run(ops::gemm_bias_gelu<float>{.m = rows,
                                        .n = n,
                                        .k = k,
                                        .a = static_cast<const float*>(op.f32.data()),
                                        .lda = k,
                                        .w = weight_f32<B>(),
                                        .ldw = n,
                                        .bias = static_cast<const float*>(bias_.value.data()),
                                        .pre = pre.data(),
                                        .y = y.data()});
    } else {
      with_half(t, [&]<class T>(T) {
        B::run(ops::gemm_bias_gelu<T>{.m = rows,
                                      .n = n,
                                      .k = k,
                                      .a = op.half<T>(),
                                      .lda = k,
                                      .w = weight_half<B, T>(),
                                      .ldw = n,
                                      .bias = static_cast<const float*>(bias_.value.data()),
                                      .pre = pre.data(),
                                      .y = y.data()});
      });
    }
    operands_.put(mb) = std::move(op);
  }
  /** B: the input operand kept by `gemm_forward` for micro-batch `mb` (an error naming `kind` if there is none). */
  [[nodiscard]] GemmOperand take_operand(int mb, std::string_view kind) { return operands_.take(mb, kind); }
  /** Replaces what the forward kept for micro-batch `mb` (e.g. by the part of it a sequence-parallel layer keeps). */
  void keep_operand(int mb, GemmOperand op) { operands_.put(mb) = std::move(op); }
  /**
   * B: `dx[T, k] = dy[T, n] Wᵀ` in the type the forward used (`x.type`: dy converted once), and keeps `x` and
   * dy for W. In 16-bit mode the bias gradient `db += Σ dy` is accumulated here, from the fp32 dy, so that only
   * the 16-bit dy is kept (the bias gradient is final no later than in fp32, where W adds it). An rvalue `dy`
   * is moved into what fp32 mode keeps; an lvalue is copied there (fp32) or only converted (16-bit), so a layer
   * passes the gradient it received by reference as it is, with no copy of its own.
   */
  template <backend B, class Dy>
  void gemm_backward_input(int mb, GemmOperand x, Dy&& dy, std::size_t k, Activation& dx) {
    if (x.type == ComputeType::fp32) {
      linear_backward_input<B>(dy, weight_f32<B>(), k, dx);
      GemmOperand kept_dy = make_operand<B>(std::forward<Dy>(dy), ComputeType::fp32);
      pending_operands_.put(mb) = WeightGradOperands{std::move(x), std::move(kept_dy)};
    } else {
      if (has_bias()) add_column_sums<B>(dy, bias_.grad);  // from the fp32 dy, which is not kept
      const ComputeType t = x.type;
      gemm_backward_input_converted<B>(mb, std::move(x), make_operand<B>(dy, t), k, dx);
    }
  }
  /**
   * B in 16-bit mode on an output gradient that is already the 16-bit operand, its bias gradient already
   * accumulated from the fp32 values (by the fused operation that produced it, `gelu_backward_bias`):
   * `dx[T, k] = dy[T, n] Wᵀ`, keeping `x` and `dy` for W as `gemm_backward_input` does.
   */
  template <backend B>
  void gemm_backward_input_converted(int mb, GemmOperand x, GemmOperand dy, std::size_t k, Activation& dx) {
    require(
        x.type != ComputeType::fp32 && dy.type == x.type,
        "gemm_backward_input_converted: the forward's operand type and the gradient's must be the same 16-bit type");
    const std::size_t rows = dy.rows, n = dy.cols;
    with_half(x.type, [&]<class T>(T) {
      B::run(ops::gemm<T, float>{.ta = Trans::no,
                                 .tb = Trans::yes,
                                 .m = rows,
                                 .n = k,
                                 .k = n,
                                 .alpha = 1.0f,
                                 .a = dy.template half<T>(),
                                 .lda = n,
                                 .b = weight_half<B, T>(),
                                 .ldb = n,
                                 .beta = 0.0f,
                                 .c = dx.data(),
                                 .ldc = k});
    });
    pending_operands_.put(mb) = WeightGradOperands{std::move(x), std::move(dy)};
  }
  /** The type of the operand the forward kept for micro-batch `mb` (the type its backward computes in). */
  [[nodiscard]] ComputeType operand_type(int mb, std::string_view kind) const { return operands_.peek(mb, kind).type; }
  /** W of a layer whose weight and bias gradients need no communication: `dW += xᵀ dy`, `db += Σ dy`. */
  template <backend B>
  void local_backward_weight(int mb, std::string_view kind) {
    auto w = pending_operands_.take(mb, std::string(kind).append(no_backward_input_msg));
    const std::size_t rows = w.x.rows, k = w.x.cols, n = w.dy.cols;
    // The first micro-batch after a zeroing overwrites the gradient: the GEMM then never reads C (as large as
    // the weight, in fp32), a few percent of a training step on the host.
    const float beta = weight_.accumulation_beta();
    if (w.x.type == ComputeType::fp32) {
      linear_backward_weight<B>(w.x.f32, w.dy.f32, weight_.grad.data(), beta);
      if (has_bias()) add_column_sums<B>(w.dy.f32, bias_.grad);
    } else {
      with_half(w.x.type, [&]<class T>(T) {
        B::run(ops::gemm<T, float>{.ta = Trans::yes,
                                   .tb = Trans::no,
                                   .m = k,
                                   .n = n,
                                   .k = rows,
                                   .alpha = 1.0f,
                                   .a = w.x.template half<T>(),
                                   .lda = k,
                                   .b = w.dy.template half<T>(),
                                   .ldb = n,
                                   .beta = beta,
                                   .c = weight_.grad.data(),
                                   .ldc = n});
      });
    }
  }

  Parameter weight_, bias_;

 private:
  /**
   * The weight as 16-bit `T`: the optimizer's compute copy in a mixed-precision step, else one `B::convert` of
   * the fp32 weight per `Autocast` generation, reused by every micro-batch's forward and backward (`HalfWeight`).
   */
  template <backend B, class T>
  const T* weight_half() {
    return weight16_.get<B, T>(weight_);
  }

  /**
   * The weight as an fp32 GEMM operand: `value`, except between a mixed-precision optimizer's `begin_compute`
   * and `end_compute`, where this weight's `value` is its unrounded master (`gemm_operand_only`, which the
   * layers set): then the compute copy widened, so that a pass outside `Autocast` multiplies the rounded
   * weight as every other pass of the step does.
   */
  template <backend B>
  const float* weight_f32() {
    const std::span<const bf16> b = weight_.bf16_copy;
    const std::span<const f16> h = weight_.f16_copy;
    if (!weight_.gemm_operand_only || (b.empty() && h.empty())) return weight_.value.data();
    if (widened_.size() != weight_.value.size()) widened_ = B::template allocate<float>(weight_.value.size());
    if (!b.empty())
      B::run(ops::convert<bf16, float>{.n = b.size(), .src = b.data(), .dst = widened_.data()});
    else
      B::run(ops::convert<f16, float>{.n = h.size(), .src = h.data(), .dst = widened_.data()});
    return widened_.data();
  }

  MicroBatchCache<Activation> inputs_;
  MicroBatchCache<WeightGradInputs> pending_;
  MicroBatchCache<GemmOperand> operands_;
  MicroBatchCache<WeightGradOperands> pending_operands_;
  HalfWeight weight16_;    // the 16-bit weight inside an Autocast scope
  Buffer<float> widened_;  // the compute copy widened, for an fp32 pass during a mixed-precision step
};
}  // namespace detail

/** @brief Options shared by the linear layers. */
struct LinearInit {
  std::uint64_t seed = 0;       ///< initialisation seed (the same on every rank)
  std::uint64_t id_base = 0;    ///< weight gets id `id_base`, bias `id_base + 1`
  std::string name = "linear";  ///< parameter names are `<name>.weight`, `<name>.bias`
  bool bias = true;
};

/**
 * @brief Single-rank `y = x W + b` with W of shape `[in, out]` (ids `id_base`, `id_base + 1`).
 * Accepts a replicated or token-sharded input (rows are independent) and returns the same layout.
 */
template <std::size_t In = dyn, std::size_t Out = dyn, backend B = HostBackend>
class Linear : public detail::LinearState, public detail::TypedLayer<Linear<In, Out, B>> {
  using Typed = detail::TypedLayer<Linear<In, Out, B>>;

 public:
  using Typed::backward;
  using Typed::backward_input;
  using Typed::forward;
  static constexpr std::string_view layer_kind = "Linear";
  using default_input = Replicate;
  static constexpr bool preserves_features = false;
  static constexpr std::size_t static_in_features = In, static_out_features = Out;
  template <class L>
  static constexpr bool check_input() {
    if constexpr (std::is_same_v<L, Replicate> || std::is_same_v<L, TokenShard>) {
      return true;
    } else if constexpr (L::is_partial) {
      static_assert(
          detail::always_false_v<L>,
          "mpar::nn::Linear is fed a Partial<sum, tensor> tensor, which would add its bias once per rank. Fix: "
          "insert AllReduce before it (or give the RowParallel RowReduce::all_reduce)");
      return false;
    } else {
      static_assert(detail::always_false_v<L>,
                    "mpar::nn::Linear needs whole rows (Replicate or Shard<0, tensor>) but is fed a feature-sharded "
                    "tensor. Fix: use RowParallel here (it consumes Shard<1, tensor>), or insert GatherFeatures");
      return false;
    }
  }
  template <class L>
  using output_layout = L;
  /** Rows are independent: the input gradient has the layout of the output gradient. */
  template <class G>
  using input_for_grad = G;

  Linear(std::size_t in, std::size_t out, const LinearInit& init)
      : in_(detail::reconcile(In, in, layer_kind, "in_features")),
        out_(detail::reconcile(Out, out, layer_kind, "out_features")) {
    require(in_ > 0 && out_ > 0, "Linear '", init.name, "': sizes must be positive, got in=", in_, " out=", out_);
    const std::array<std::size_t, 2> ws{in_, out_};
    weight_ = make_parameter<B, 2>(init.name + ".weight", init.id_base, ws, detail::tensor_box<Replicate>(ws, 1, 0),
                                   Replicate::name(), false, init.seed, detail::default_weight_init(in_));
    weight_.gemm_operand_only = true;  // read by GEMMs alone (LinearState::weight_f32)
    if (init.bias) {
      const std::array<std::size_t, 1> bs{out_};
      bias_ = make_parameter<B, 1>(init.name + ".bias", init.id_base + 1, bs, detail::tensor_box<Replicate>(bs, 1, 0),
                                   Replicate::name(), false, init.seed, InitSpec::normal(0.02));
    }
  }

 private:
  friend Typed;  // its typed entries are the only public way in; these do the work on the storage
  Activation do_forward(const Activation& x, int mb) {
    require(x.extent(1) == in_, "Linear '", weight_.name, "': input has ", x.extent(1), " features, expected ", in_);
    Activation y({x.extent(0), out_}, uninitialized);  // the GEMM (beta = 0) writes all of it
    gemm_forward<B>(mb, x, out_, y);                   // fp32, or 16-bit operands under Autocast
    if (has_bias()) detail::add_row_vector<B>(y, bias_.value);
    return y;
  }
  /** B: `dx = dy Wᵀ`; keeps `x` and `dy` of micro-batch `mb` for backward_weight. */
  Activation do_backward_input(const Activation& dy, int mb) {
    detail::GemmOperand x = take_operand(mb, layer_kind);
    require(dy.extent(1) == out_ && dy.extent(0) == x.rows, "Linear '", weight_.name, "': gradient is ", dy.extent(0),
            "x", dy.extent(1), ", expected ", x.rows, "x", out_);
    Activation dx({dy.extent(0), in_}, uninitialized);
    gemm_backward_input<B>(mb, std::move(x), dy, in_, dx);  // kept for W: copied (fp32) or converted
    return dx;
  }

 public:
  /** W: `dW += xᵀ dy`, `db += Σ dy` for micro-batch `mb`; frees what backward_input kept. */
  void backward_weight(int mb = 0) { local_backward_weight<B>(mb, layer_kind); }
  [[nodiscard]] std::size_t in_features() const { return in_; }
  [[nodiscard]] std::size_t out_features() const { return out_; }

 private:
  std::size_t in_, out_;
};

}  // namespace mpar::nn
