#pragma once
/** @file `Linear`: the single-rank affine layer `y = x W + b`, and the GEMM steps shared by its parallel forms. */
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/layer.hpp"

namespace mpar::nn {

namespace detail {
/** y[T, n] = x[T, k] * w[k, n] (+ y when accumulate). */
template <backend B>
void linear_forward(const Activation& x, const float* w, std::size_t n, Activation& y, bool accumulate = false) {
  const std::size_t t = x.extent(0), k = x.extent(1);
  B::template gemm<float>(Trans::no, Trans::no, t, n, k, 1.0f, x.data(), k, w, n, accumulate ? 1.0f : 0.0f, y.data(), n);
}
/** dx[T, k] = dy[T, n] * w[k, n]^T */
template <backend B>
void linear_backward_input(const Activation& dy, const float* w, std::size_t k, Activation& dx) {
  const std::size_t t = dy.extent(0), n = dy.extent(1);
  B::template gemm<float>(Trans::no, Trans::yes, t, k, n, 1.0f, dy.data(), n, w, n, 0.0f, dx.data(), k);
}
/** dw[k, n] += x[T, k]^T * dy[T, n] */
template <backend B>
void linear_backward_weight(const Activation& x, const Activation& dy, float* dw) {
  const std::size_t t = x.extent(0), k = x.extent(1), n = dy.extent(1);
  B::template gemm<float>(Trans::yes, Trans::no, k, n, t, 1.0f, x.data(), k, dy.data(), n, 1.0f, dw, n);
}
/**
 * What a linear layer's weight gradient needs from one micro-batch: the (gathered) input and the local
 * output gradient. Kept from backward_input (B) until backward_weight (W) consumes it.
 */
struct WeightGradInputs {
  Activation x, dy;
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
  }
  [[nodiscard]] Parameter& weight() { return weight_; }
  [[nodiscard]] Parameter& bias() { return bias_; }

 protected:
  [[nodiscard]] bool has_bias() const { return !bias_.value.empty(); }
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
  /** W of a layer whose weight and bias gradients need no communication: `dW += xᵀ dy`, `db += Σ dy`. */
  template <backend B>
  void local_backward_weight(int mb, std::string_view kind) {
    auto w = take_for_weight(mb, kind);
    linear_backward_weight<B>(w.x, w.dy, weight_.grad.data());
    if (has_bias()) add_column_sums<B>(w.dy, bias_.grad);
  }

  Parameter weight_, bias_;

 private:
  MicroBatchCache<Activation> inputs_;
  MicroBatchCache<WeightGradInputs> pending_;
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
      static_assert(detail::always_false_v<L>,
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
      : in_(detail::reconcile(In, in, layer_kind, "in_features")), out_(detail::reconcile(Out, out, layer_kind, "out_features")) {
    require(in_ > 0 && out_ > 0, "Linear '", init.name, "': sizes must be positive, got in=", in_, " out=", out_);
    const std::array<std::size_t, 2> ws{in_, out_};
    weight_ = make_parameter<2>(init.name + ".weight", init.id_base, ws, detail::tensor_box<Replicate>(ws, 1, 0),
                                Replicate::name(), false, init.seed, detail::default_weight_init(in_));
    if (init.bias) {
      const std::array<std::size_t, 1> bs{out_};
      bias_ = make_parameter<1>(init.name + ".bias", init.id_base + 1, bs, detail::tensor_box<Replicate>(bs, 1, 0),
                                Replicate::name(), false, init.seed, InitSpec::normal(0.02));
    }
  }

  Activation forward(const Activation& x, int mb = 0) {
    require(x.extent(1) == in_, "Linear '", weight_.name, "': input has ", x.extent(1), " features, expected ", in_);
    Activation y({x.extent(0), out_}, uninitialized);  // the GEMM (beta = 0) writes all of it
    detail::linear_forward<B>(x, weight_.value.data(), out_, y);
    if (has_bias()) detail::add_row_vector<B>(y, bias_.value);
    keep_input(mb, backend_copy<B>(x));
    return y;
  }
  /** B: `dx = dy Wᵀ`; keeps `x` and `dy` of micro-batch `mb` for backward_weight. */
  Activation backward_input(const Activation& dy, int mb = 0) {
    Activation x = take_input(mb, layer_kind);
    require(dy.extent(1) == out_ && dy.extent(0) == x.extent(0), "Linear '", weight_.name, "': gradient is ",
            dy.extent(0), "x", dy.extent(1), ", expected ", x.extent(0), "x", out_);
    Activation dx({dy.extent(0), in_}, uninitialized);
    detail::linear_backward_input<B>(dy, weight_.value.data(), in_, dx);
    keep_for_weight(mb, std::move(x), backend_copy<B>(dy));
    return dx;
  }
  /** W: `dW += xᵀ dy`, `db += Σ dy` for micro-batch `mb`; frees what backward_input kept. */
  void backward_weight(int mb = 0) { local_backward_weight<B>(mb, layer_kind); }
  [[nodiscard]] std::size_t in_features() const { return in_; }
  [[nodiscard]] std::size_t out_features() const { return out_; }

 private:
  std::size_t in_, out_;
};

}  // namespace mpar::nn
