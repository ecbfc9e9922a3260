#pragma once
/**
 * @file `LayerNorm<L, C>`: layer normalisation over the feature dimension of a replicated or
 * token-sharded (sequence-parallel) activation.
 */
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/detail/fused_residual_layernorm_backend.hpp"
#include "mpar/nn/layer.hpp"

namespace mpar::nn {

/**
 * @brief LayerNorm with gain and bias (`[features]`, replicated). Layout `L` is `Replicate` or
 * `Shard<0, tensor>`; feature-sharded input is refused (a row's statistics need all its features).
 *
 * Under sequence parallelism (`L = Shard<0, tensor>`) each rank sees only its tokens, so the gain and
 * bias gradients are partial sums: backward all-reduces them over the tensor group `C` (one
 * all-reduce of 2·features values) so every rank holds the full gradient, as in the unsharded run.
 * With `defer_gradient_reduction(true)` the owner reduces them instead, once per step (see there).
 */
template <class L = Replicate, class C = NoComm, backend B = HostBackend>
class LayerNorm : public detail::TypedLayer<LayerNorm<L, C, B>> {
  using Typed = detail::TypedLayer<LayerNorm<L, C, B>>;
  static_assert(std::is_same_v<L, Replicate> || std::is_same_v<L, TokenShard>,
                "mpar::nn::LayerNorm<L>: L must be Replicate or Shard<0, axis::tensor>");
  static_assert(std::is_same_v<L, Replicate> || communicator<C>,
                "mpar::nn::LayerNorm<Shard<0, tensor>, C>: sequence-parallel layer norm needs the tensor communicator "
                "type C to all-reduce its gradients");
  static constexpr bool sequence_parallel = std::is_same_v<L, TokenShard>;

 public:
  using Typed::backward;
  using Typed::forward;
  static constexpr std::string_view layer_kind = "LayerNorm";
  using default_input = L;
  static constexpr bool preserves_features = true;
  static constexpr std::size_t static_in_features = dyn, static_out_features = dyn;
  template <class In>
  static constexpr bool check_input() {
    return detail::check_whole_rows<L, In>();
  }
  template <class In>
  using output_layout = In;

  /** Single-rank or replicated form. */
  LayerNorm(std::size_t features, std::uint64_t seed, std::uint64_t id_base,
            std::string name) requires(!sequence_parallel)
      : LayerNorm(nullptr, features, seed, id_base, std::move(name)) {}
  /** Sequence-parallel form: `tp` is the tensor group. */
  LayerNorm(C& tp, std::size_t features, std::uint64_t seed, std::uint64_t id_base,
            std::string name) requires(sequence_parallel)
      : LayerNorm(&tp, features, seed, id_base, std::move(name)) {}

 private:
  friend Typed;  // its typed entries are the only public way in; these do the work on the storage
  Activation do_forward(const Activation& x, int mb) {
    require(x.extent(1) == n_, "LayerNorm '", gamma_.name, "': input has ", x.extent(1), " features, expected ", n_);
    const std::size_t rows = x.extent(0);
    Activation y(x.shape(), uninitialized);  // the kernel writes y, mean and rstd whole
    auto& c = cache_.put(mb);
    c.mean = uninitialized_buffer<float>(rows);
    c.rstd = uninitialized_buffer<float>(rows);
    B::run(ops::layernorm_forward{.rows = rows,
                                  .cols = n_,
                                  .x = x.data(),
                                  .gamma = gamma_.value.data(),
                                  .beta = beta_.value.data(),
                                  .y = y.data(),
                                  .mean = c.mean.data(),
                                  .rstd = c.rstd.data()});
    c.x = backend_copy<B>(x);
    return y;
  }
  Activation do_backward(const Activation& dy, int mb) {
    auto c = cache_.take(mb, layer_kind);
    require(dy.shape() == c.x.shape(), "LayerNorm '", gamma_.name, "': gradient shape differs from the input's");
    Activation dx(dy.shape(), uninitialized);
    ops::layernorm_backward op{.rows = dy.extent(0),
                               .cols = n_,
                               .x = c.x.data(),
                               .mean = c.mean.data(),
                               .rstd = c.rstd.data(),
                               .gamma = gamma_.value.data(),
                               .dy = dy.data(),
                               .dx = dx.data(),
                               .dgamma = gamma_.grad.data(),
                               .dbeta = beta_.grad.data()};
    if constexpr (sequence_parallel) {
      if (!defer_) {  // this rank's share, summed over the tensor group here
        Buffer<float> g = uninitialized_buffer<float>(2 * n_);
        B::run(ops::zero<float>{.n = g.size(), .x = g.data()});  // the kernel accumulates dgamma, dbeta
        op.dgamma = g.data();
        op.dbeta = g.data() + n_;
        B::run(op);
        if (comm_->size() > 1) comm_->all_reduce(std::span<float>(g), ReduceOp::sum);
        B::run(ops::add{.n = n_, .x = gamma_.grad.data(), .z = g.data(), .y = gamma_.grad.data()});
        B::run(ops::add{.n = n_, .x = beta_.grad.data(), .z = g.data() + n_, .y = beta_.grad.data()});
        return dx;
      }
    }
    B::run(op);
    return dx;
  }

 public:
  /**
   * Sequence parallelism: with `on`, backward adds this rank's share of the gain and bias gradients (from its
   * tokens only) to them and leaves the sum over the tensor group to the owner, who does it once per step after the
   * step's last backward, for every such norm in one collective (`all_reduce_gradients`), as Megatron-LM reduces
   * its sequence-parallel parameters' gradients when it finalises them. One collective per step instead of one per
   * norm and micro-batch, and the fused residual + norm becomes possible (its kernel adds to the gradients
   * directly). The gradients must start the step at zero, as the optimizer's zeroing leaves them. Off by default:
   * each backward then gives the full gradients.
   */
  void defer_gradient_reduction(bool on) requires(sequence_parallel) { defer_ = on; }
  /** Whether backward sums the gain and bias gradients over the tensor group itself (SP, not deferred). */
  [[nodiscard]] bool reduces_gradients_in_backward() const { return sequence_parallel && !defer_; }

  /**
   * The residual add before this norm and the norm in one kernel (a `fused_residual_layernorm_backend`; under
   * sequence parallelism only with the gradient reduction deferred, since the kernel adds to the gradients):
   * returns `h = branch + x` (the residual stream) and `LN(h)`, keeping what `residual_backward` needs (h, mean,
   * rstd), as `forward(add(branch, x))` would.
   */
  template <class Lx>
    requires(detail::fused_residual_layernorm_backend<B>)
  std::pair<Act<Lx>, Act<Lx>> residual_forward(const Act<Lx>& branch, const Act<Lx>& x, int mb) {
    require(!reduces_gradients_in_backward(), "LayerNorm '", gamma_.name,
            "': the fused residual + norm under sequence parallelism needs the gradient reduction deferred "
            "(defer_gradient_reduction(true)); call forward on the sum instead");
    require(x.extent(1) == n_ && branch.shape() == x.shape(), "LayerNorm '", gamma_.name, "': residual operands are ",
            branch.extent(0), "x", branch.extent(1), " and ", x.extent(0), "x", x.extent(1), ", expected ", n_,
            " features each");
    const std::size_t rows = x.extent(0);
    Activation h(x.shape(), uninitialized), y(x.shape(), uninitialized);  // the kernel writes both whole
    auto& c = cache_.put(mb);
    c.mean = uninitialized_buffer<float>(rows);
    c.rstd = uninitialized_buffer<float>(rows);
    B::run(ops::residual_layernorm_forward{.rows = rows,
                                           .cols = n_,
                                           .x = x.data(),
                                           .branch = branch.data(),
                                           .gamma = gamma_.value.data(),
                                           .beta = beta_.value.data(),
                                           .h = h.data(),
                                           .y = y.data(),
                                           .mean = c.mean.data(),
                                           .rstd = c.rstd.data()});
    c.x = backend_copy<B>(h);
    return {Act<Lx>(std::move(h)), Act<Lx>(std::move(y))};
  }
  /**
   * The backward of `residual_forward`: the gradient of both addends, `dres + LN'(dy)` (`dres` reaches h through
   * the residual path), with the gain and bias gradients accumulated, as `add(backward(dy), dres)` would.
   */
  template <class Lx>
    requires(detail::fused_residual_layernorm_backend<B>)
  Act<Lx> residual_backward(const Act<Lx>& dy, const Act<Lx>& dres, int mb) {
    auto c = cache_.take(mb, layer_kind);
    require(dy.shape() == c.x.shape() && dres.shape() == c.x.shape(), "LayerNorm '", gamma_.name,
            "': gradient shapes differ from the input's");
    Activation dh(dy.shape(), uninitialized);
    B::run(ops::residual_layernorm_backward{.rows = dy.extent(0),
                                            .cols = n_,
                                            .h = c.x.data(),
                                            .mean = c.mean.data(),
                                            .rstd = c.rstd.data(),
                                            .gamma = gamma_.value.data(),
                                            .dy = dy.data(),
                                            .dres = dres.data(),
                                            .dh = dh.data(),
                                            .dgamma = gamma_.grad.data(),
                                            .dbeta = beta_.grad.data()});
    return Act<Lx>(std::move(dh));
  }

  std::vector<Parameter*> parameters() { return detail::param_list(&gamma_, &beta_); }
  void drop(int mb) { cache_.drop(mb); }
  [[nodiscard]] std::size_t in_features() const { return 0; }
  [[nodiscard]] std::size_t out_features() const { return 0; }
  [[nodiscard]] std::size_t features() const { return n_; }

 private:
  using comm_ptr = std::conditional_t<sequence_parallel, C*, std::nullptr_t>;
  LayerNorm(comm_ptr comm, std::size_t features, std::uint64_t seed, std::uint64_t id_base, std::string name)
      : comm_(comm), n_(features) {
    require(n_ > 0, "LayerNorm '", name, "': features must be positive");
    const std::array<std::size_t, 1> s{n_};
    const auto box = detail::tensor_box<Replicate>(s, 1, 0);
    gamma_ = make_parameter<B, 1>(name + ".weight", id_base, s, box, Replicate::name(), false, seed,
                                  InitSpec::constant(1.0));
    beta_ = make_parameter<B, 1>(name + ".bias", id_base + 1, s, box, Replicate::name(), false, seed,
                                 InitSpec::constant(0.0));
  }
  struct Cache {
    Activation x;
    Buffer<float> mean, rstd;
  };
  [[no_unique_address]] comm_ptr comm_;
  bool defer_ = false;  ///< see defer_gradient_reduction
  std::size_t n_;
  Parameter gamma_, beta_;
  MicroBatchCache<Cache> cache_;
};

}  // namespace mpar::nn
