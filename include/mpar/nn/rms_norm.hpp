#pragma once
/**
 * @file `RMSNorm<L, C, B>`: root-mean-square normalisation over the feature dimension (Llama's norm) of a
 * replicated or token-sharded (sequence-parallel) activation.
 */
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/backend/ops/operation.hpp"
#include "mpar/backend/ops/rmsnorm.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/layer.hpp"

namespace mpar::nn {

/**
 * @brief `y = x / sqrt(mean(x^2) + eps) * gain` per row, with a gain (`[features]`, replicated, initialised to 1)
 * and no bias. Layout `L` is `Replicate` or `Shard<0, tensor>`; feature-sharded input is refused (a row's mean
 * square needs all its features). Runs on a backend that supports `ops::rmsnorm_forward` and `ops::rmsnorm_backward`.
 *
 * Under sequence parallelism (`L = Shard<0, tensor>`) each rank sees only its tokens, so the gain gradient is a
 * partial sum: backward all-reduces it over the tensor group `C` so every rank holds the full gradient, as in the
 * unsharded run; with `defer_gradient_reduction(true)` the owner reduces it once per step instead, as for
 * `LayerNorm`.
 */
template <class L = Replicate, class C = NoComm, backend B = HostBackend>
class RMSNorm : public detail::TypedLayer<RMSNorm<L, C, B>> {
  using Typed = detail::TypedLayer<RMSNorm<L, C, B>>;
  static_assert(std::is_same_v<L, Replicate> || std::is_same_v<L, TokenShard>,
                "mpar::nn::RMSNorm<L>: L must be Replicate or Shard<0, axis::tensor>");
  static_assert(std::is_same_v<L, Replicate> || communicator<C>,
                "mpar::nn::RMSNorm<Shard<0, tensor>, C>: sequence-parallel RMSNorm needs the tensor communicator type "
                "C to all-reduce its gain gradient");
  static_assert(supports<B, ops::rmsnorm_forward> && supports<B, ops::rmsnorm_backward>,
                "mpar::nn::RMSNorm<L, C, B>: backend B does not run ops::rmsnorm_forward and ops::rmsnorm_backward "
                "(backend/ops/rmsnorm.hpp). Fix: use HostBackend, StreamHostBackend, DiscreteHostBackend or "
                "CudaBackend, or give B a run(op) for them");
  static constexpr bool sequence_parallel = std::is_same_v<L, TokenShard>;

 public:
  using Typed::backward;
  using Typed::forward;
  static constexpr std::string_view layer_kind = "RMSNorm";
  using default_input = L;
  static constexpr bool preserves_features = true;
  static constexpr std::size_t static_in_features = dyn, static_out_features = dyn;
  template <class In>
  static constexpr bool check_input() {
    return detail::check_whole_rows<L, In>();
  }
  template <class In>
  using output_layout = In;

  /** Single-rank or replicated form; `eps` is added to the mean square (Llama: 1e-5 or 1e-6). */
  RMSNorm(std::size_t features, std::uint64_t seed, std::uint64_t id_base, std::string name,
          float eps = 1e-6f) requires(!sequence_parallel)
      : RMSNorm(nullptr, features, seed, id_base, std::move(name), eps) {}
  /** Sequence-parallel form: `tp` is the tensor group. */
  RMSNorm(C& tp, std::size_t features, std::uint64_t seed, std::uint64_t id_base, std::string name,
          float eps = 1e-6f) requires(sequence_parallel)
      : RMSNorm(&tp, features, seed, id_base, std::move(name), eps) {}

 private:
  friend Typed;  // its typed entries are the only public way in; these do the work on the storage
  Activation do_forward(const Activation& x, int mb) {
    require(x.extent(1) == n_, "RMSNorm '", gain_.name, "': input has ", x.extent(1), " features, expected ", n_);
    const std::size_t rows = x.extent(0);
    Activation y(x.shape(), uninitialized);  // the kernel writes y and rstd whole
    auto& c = cache_.put(mb);
    c.rstd = uninitialized_buffer<float>(rows);
    B::run(ops::rmsnorm_forward{.rows = rows,
                                .cols = n_,
                                .eps = eps_,
                                .x = x.data(),
                                .gain = gain_.value.data(),
                                .y = y.data(),
                                .rstd = c.rstd.data()});
    c.x = backend_copy<B>(x);
    return y;
  }
  Activation do_backward(const Activation& dy, int mb) {
    auto c = cache_.take(mb, layer_kind);
    require(dy.shape() == c.x.shape(), "RMSNorm '", gain_.name, "': gradient shape differs from the input's");
    Activation dx(dy.shape(), uninitialized);
    if constexpr (sequence_parallel) {
      if (!defer_) {  // this rank's share, summed over the tensor group here
        Buffer<float> g = uninitialized_buffer<float>(n_);
        B::run(ops::zero<float>{.n = g.size(), .x = g.data()});  // the kernel accumulates dgain
        B::run(gradient(c, dy, dx, g.data()));
        if (comm_->size() > 1) comm_->all_reduce(std::span<float>(g), ReduceOp::sum);
        B::run(ops::add{.n = n_, .x = gain_.grad.data(), .z = g.data(), .y = gain_.grad.data()});
        return dx;
      }
    }
    B::run(gradient(c, dy, dx, gain_.grad.data()));
    return dx;
  }

 public:
  /**
   * Sequence parallelism: with `on`, backward adds this rank's share of the gain gradient (from its tokens only)
   * and leaves the sum over the tensor group to the owner, once per step (`all_reduce_gradients`), as
   * `LayerNorm::defer_gradient_reduction` does. The gradient must start the step at zero. Off by default.
   */
  void defer_gradient_reduction(bool on) requires(sequence_parallel) { defer_ = on; }
  /** Whether backward sums the gain gradient over the tensor group itself (SP, not deferred). */
  [[nodiscard]] bool reduces_gradients_in_backward() const { return sequence_parallel && !defer_; }

  std::vector<Parameter*> parameters() { return detail::param_list(&gain_); }
  void drop(int mb) { cache_.drop(mb); }
  [[nodiscard]] std::size_t in_features() const { return 0; }
  [[nodiscard]] std::size_t out_features() const { return 0; }
  [[nodiscard]] std::size_t features() const { return n_; }
  [[nodiscard]] float eps() const { return eps_; }

 private:
  using comm_ptr = std::conditional_t<sequence_parallel, C*, std::nullptr_t>;
  RMSNorm(comm_ptr comm, std::size_t features, std::uint64_t seed, std::uint64_t id_base, std::string name, float eps)
      : comm_(comm), n_(features), eps_(eps) {
    require(n_ > 0, "RMSNorm '", name, "': features must be positive");
    require(eps_ > 0.0f, "RMSNorm '", name, "': eps must be positive (it keeps an all-zero row finite), got ", eps_);
    const std::array<std::size_t, 1> s{n_};
    gain_ = make_parameter<B, 1>(name + ".weight", id_base, s, detail::tensor_box<Replicate>(s, 1, 0),
                                 Replicate::name(), false, seed, InitSpec::constant(1.0));
  }
  struct Cache {
    Activation x;
    Buffer<float> rstd;
  };
  /** The backward operation: `dx` overwritten, the gain gradient accumulated into `dgain`. */
  ops::rmsnorm_backward gradient(const Cache& c, const Activation& dy, Activation& dx, float* dgain) const {
    return {.rows = dy.extent(0),
            .cols = n_,
            .x = c.x.data(),
            .rstd = c.rstd.data(),
            .gain = gain_.value.data(),
            .dy = dy.data(),
            .dx = dx.data(),
            .dgain = dgain};
  }
  [[no_unique_address]] comm_ptr comm_;
  bool defer_ = false;  ///< see defer_gradient_reduction
  std::size_t n_;
  float eps_;
  Parameter gain_;
  MicroBatchCache<Cache> cache_;
};

}  // namespace mpar::nn
