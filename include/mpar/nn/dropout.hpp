#pragma once
/**
 * @file `Dropout<L>`: dropout whose mask depends on (seed, stream, micro-batch, global element index),
 * so a shard drops exactly the elements the unsharded run drops, and a recomputed forward drops the
 * same ones again.
 */
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/layer.hpp"

namespace mpar::nn {

/**
 * @brief Dropout on an activation of layout `L` (Replicate, Shard<1, tensor> or Shard<0, tensor>);
 * `L` tells it where its local block sits in the global tensor. Shards must be even.
 */
template <class L = Replicate, backend B = HostBackend>
class Dropout : public detail::NoParameters, public detail::TypedLayer<Dropout<L, B>> {
  using Typed = detail::TypedLayer<Dropout<L, B>>;

  static_assert(
      std::is_same_v<L, Replicate> || std::is_same_v<L, FeatureShard> || std::is_same_v<L, TokenShard>,
      "mpar::nn::Dropout<L>: L must be Replicate, Shard<1, axis::tensor> or Shard<0, axis::tensor>; dropout of "
      "a Partial tensor would drop each addend separately (reduce it first)");

 public:
  using Typed::backward;
  using Typed::forward;
  static constexpr std::string_view layer_kind = "Dropout";
  using default_input = L;
  static constexpr bool preserves_features = true;
  static constexpr std::size_t static_in_features = dyn, static_out_features = dyn;
  template <class In>
  static constexpr bool check_input() {
    if constexpr (std::is_same_v<In, L>) {
      return true;
    } else if constexpr (In::is_partial) {
      static_assert(
          detail::always_false_v<In>,
          "mpar::nn::Dropout is fed a Partial<sum, tensor> tensor: it would drop each addend separately. Fix: "
          "reduce first: give the RowParallel RowReduce::all_reduce, or insert AllReduce");
      return false;
    } else {
      static_assert(
          detail::always_false_v<In>,
          "mpar::nn::Dropout<L> was declared for another layout than it is fed (e.g. Dropout<Replicate> after "
          "a ColumnParallel). Fix: declare it with the layout shown as 'In' above "
          "(Dropout<Shard<1, axis::tensor>>)");
      return false;
    }
  }
  template <class In>
  using output_layout = In;

  /** `p` drop probability; `tp_size`/`tp_rank` locate this rank's block (1/0 for a replicated tensor). */
  Dropout(double p, std::uint64_t seed, std::uint64_t stream, std::size_t tp_size = 1, std::size_t tp_rank = 0)
      : p_(p), seed_(seed), stream_(stream), tp_(tp_size), rank_(tp_rank) {
    require(p >= 0.0 && p < 1.0, "Dropout: probability ", p, " must be in [0, 1)");
  }

  void drop(int) {}
  [[nodiscard]] double probability() const { return p_; }

 private:
  friend Typed;  // its typed entries are the only public way in; these do the work on the storage
  Activation do_forward(const Activation& x, int mb) {
    if (p_ == 0.0) return backend_copy<B>(x);  // evaluation, or training without dropout: no mask to draw
    Activation y(x.shape(), uninitialized);
    B::dropout_apply(mask_for(x, mb), x.extent(0), x.extent(1), x.data(), y.data());
    return y;
  }
  /** An input the caller gives up: without a mask to draw it is the output itself (moved, not copied). */
  Activation do_forward(Activation&& x, int mb) {
    if (p_ == 0.0) return std::move(x);
    return do_forward(std::as_const(x), mb);
  }
  Activation do_backward(const Activation& dy, int mb) {
    // The mask is a pure function of indices: nothing is cached, backward re-derives it.
    if (p_ == 0.0) return backend_copy<B>(dy);
    Activation dx(dy.shape(), uninitialized);
    B::dropout_apply(mask_for(dy, mb), dy.extent(0), dy.extent(1), dy.data(), dx.data());
    return dx;
  }
  [[nodiscard]] host::DropoutMask mask_for(const Activation& x, int mb) const {
    host::DropoutMask m;
    m.seed = seed_;
    // Each micro-batch draws its own mask; the stream mixes in the micro-batch id.
    m.stream = CounterRng::mix(stream_ ^ (std::uint64_t(std::uint32_t(mb)) << 32));
    m.p = p_;
    const std::size_t rows = x.extent(0), cols = x.extent(1);
    m.global_cols = std::is_same_v<L, FeatureShard> ? cols * tp_ : cols;
    m.col_offset = std::is_same_v<L, FeatureShard> ? cols * rank_ : 0;
    m.row_offset = std::is_same_v<L, TokenShard> ? rows * rank_ : 0;
    return m;
  }
  double p_;
  std::uint64_t seed_, stream_;
  std::size_t tp_, rank_;
};

}  // namespace mpar::nn
