#pragma once
/** @file `Gelu`: the tanh-approximated GeLU, applied elementwise to any non-Partial layout. */
#include <cstddef>
#include <string_view>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/layer.hpp"

namespace mpar::nn {

/**
 * @brief Elementwise GeLU on backend `B`. Keeps its input's layout (a shard stays a shard); a Partial
 * input is refused because gelu(a + b) != gelu(a) + gelu(b). `Gelu` is the host form.
 */
template <backend B>
class BasicGelu : public detail::NoParameters, public detail::TypedLayer<BasicGelu<B>> {
  using Typed = detail::TypedLayer<BasicGelu<B>>;

 public:
  using Typed::backward;
  using Typed::forward;
  static constexpr std::string_view layer_kind = "Gelu";
  using default_input = Replicate;
  static constexpr bool preserves_features = true;
  static constexpr std::size_t static_in_features = dyn, static_out_features = dyn;
  template <class L>
  static constexpr bool check_input() {
    static_assert(!L::is_partial,
                  "mpar::nn::Gelu (a nonlinear layer) is fed a Partial<sum, tensor> tensor; gelu(a + b) != gelu(a) + "
                  "gelu(b). Fix: reduce first: give the RowParallel RowReduce::all_reduce, or insert AllReduce between "
                  "the two layers");
    return !L::is_partial;
  }
  template <class L>
  using output_layout = L;
  template <class G>
  using input_for_grad = G;

  void drop(int mb) { cache_.drop(mb); }

 private:
  friend Typed;  // its typed entries are the only public way in; these do the work on the storage
  Activation do_forward(const Activation& x, int mb) {
    Activation y(x.shape(), uninitialized);
    B::run(ops::gelu_forward{.n = x.size(), .x = x.data(), .y = y.data()});
    cache_.put(mb).x = backend_copy<B>(x);
    return y;
  }
  Activation do_backward(const Activation& dy, int mb) {
    auto c = cache_.take(mb, layer_kind);
    require(dy.shape() == c.x.shape(), "Gelu: gradient shape differs from the input's");
    Activation dx(dy.shape(), uninitialized);
    B::run(ops::gelu_backward{.n = dy.size(), .x = c.x.data(), .dy = dy.data(), .dx = dx.data()});
    return dx;
  }

  struct Cache {
    Activation x;
  };
  MicroBatchCache<Cache> cache_;
};

/** @brief GeLU on the host backend. */
using Gelu = BasicGelu<HostBackend>;

}  // namespace mpar::nn
