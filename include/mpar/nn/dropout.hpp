#pragma once
/**
 * @file `Dropout<L>`: dropout whose mask is a pure function of indices, so a shard drops exactly the elements
 * the unsharded run drops, and a recomputed forward drops the same ones again.
 *
 * With `TokenCoordinates` (what the GPT trainer gives its blocks) the mask depends on (seed, stream, step,
 * sequence, position, feature): every layout and micro-batching of a step drops what the single-rank run
 * drops, and each step draws a new mask. Without them it depends on (seed, stream, micro-batch id, local row,
 * feature): the same mask for the same micro-batch id on every call, which is what a caller that runs one
 * micro-batch layout gets and checks shards against.
 */
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/layer.hpp"
#include "mpar/nn/token_coordinates.hpp"

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

  /**
   * `p` drop probability; `tp_size`/`tp_rank` locate this rank's block (1/0 for a replicated tensor); `tokens`,
   * when given and filled in, key the mask by step and global token (see the file comment). They are read at
   * every forward and backward, so they must outlive the layer's passes.
   */
  Dropout(double p, std::uint64_t seed, std::uint64_t stream, std::size_t tp_size = 1, std::size_t tp_rank = 0,
          const TokenCoordinates* tokens = nullptr)
      : p_(p), seed_(seed), stream_(stream), tp_(tp_size), rank_(tp_rank), tokens_(tokens) {
    require(p >= 0.0 && p < 1.0, "Dropout: probability ", p, " must be in [0, 1)");
  }

  void drop(int) {}
  [[nodiscard]] double probability() const { return p_; }
  /** Whether the passes draw a mask: p > 0, and the coordinates (if any) say the passes are training ones. */
  [[nodiscard]] bool active() const { return p_ > 0.0 && (tokens_ == nullptr || tokens_->training); }

 private:
  friend Typed;  // its typed entries are the only public way in; these do the work on the storage
  Activation do_forward(const Activation& x, int mb) {
    if (!active()) return backend_copy<B>(x);  // evaluation, or training without dropout: no mask to draw
    Activation y(x.shape(), uninitialized);
    apply(x, y, mb);
    return y;
  }
  /** An input the caller gives up: without a mask to draw it is the output itself (moved, not copied). */
  Activation do_forward(Activation&& x, int mb) {
    if (!active()) return std::move(x);
    return do_forward(std::as_const(x), mb);
  }
  Activation do_backward(const Activation& dy, int mb) {
    // The mask is a pure function of indices: nothing is cached, backward re-derives it.
    if (!active()) return backend_copy<B>(dy);
    Activation dx(dy.shape(), uninitialized);
    apply(dy, dx, mb);
    return dx;
  }
  /** `out = mask ⊙ in / (1 - p)` for micro-batch `mb`: one backend operation per run of rows the mask keys alike. */
  void apply(const Activation& in, Activation& out, int mb) const {
    const std::size_t rows = in.extent(0), cols = in.extent(1);
    host::DropoutMask m;
    m.seed = seed_;
    m.p = p_;
    m.global_cols = std::is_same_v<L, FeatureShard> ? cols * tp_ : cols;
    m.col_offset = std::is_same_v<L, FeatureShard> ? cols * rank_ : 0;
    // Under sequence parallelism this rank holds the rank_-th block of the micro-batch's rows.
    const std::size_t token_shard_offset = std::is_same_v<L, TokenShard> ? rows * rank_ : 0;
    if (tokens_ == nullptr || !tokens_->known()) {
      require(tokens_ == nullptr || tokens_->cp <= 1, "Dropout: micro-batch ", mb, " under context parallelism (cp ",
              tokens_ ? tokens_->cp : 1, ") has no token coordinates for its step; a rank's rows are zig-zag chunks, ",
              "so set them before the passes (GptPipelinePart::set_token_coordinates)");
      // Each micro-batch draws its own mask; the stream mixes in the micro-batch id.
      m.stream = CounterRng::mix(stream_ ^ (std::uint64_t(std::uint32_t(mb)) << 32));
      m.row_offset = token_shard_offset;
      B::run(ops::dropout_apply{.mask = m, .rows = rows, .cols = cols, .x = in.data(), .y = out.data()});
      return;
    }
    // Each step draws its own mask over the step's batch; rows are named by their global token.
    m.stream = CounterRng::mix(CounterRng::mix(stream_) ^ tokens_->step_of(mb));
    if (tokens_->cp <= 1) {  // one run: the micro-batch's rows, under sequence parallelism this rank's block of them
      m.row_offset = tokens_->first_row(mb) + token_shard_offset;
      B::run(ops::dropout_apply{.mask = m, .rows = rows, .cols = cols, .x = in.data(), .y = out.data()});
      return;
    }
    require(token_shard_offset == 0, "Dropout: a token-sharded (sequence-parallel) activation under context ",
            "parallelism (cp ", tokens_->cp, ") has no global row mapping; use one or the other");
    tokens_->for_each_run(mb, rows, [&](std::size_t local, std::size_t global, std::size_t n) {
      m.row_offset = global;
      B::run(ops::dropout_apply{
          .mask = m, .rows = n, .cols = cols, .x = in.data() + local * cols, .y = out.data() + local * cols});
    });
  }
  double p_;
  std::uint64_t seed_, stream_;
  std::size_t tp_, rank_;
  const TokenCoordinates* tokens_;
};

}  // namespace mpar::nn
