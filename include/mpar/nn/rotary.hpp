#pragma once
/**
 * @file `Rotary<B>`: the rotary position embedding of Llama (rotate-half convention, as Hugging Face's
 * `apply_rotary_pos_emb`), applied per head to an activation of `[tokens, heads * head_dim]` given each token's
 * global position; and `sequence_positions`, the positions of consecutive rows of whole sequences.
 */
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/backend/ops/operation.hpp"
#include "mpar/backend/ops/rope.hpp"
#include "mpar/core/host_access.hpp"
#include "mpar/nn/activation.hpp"
#include "mpar/nn/parameter.hpp"
#include "mpar/nn/rank_tokens.hpp"
#include "mpar/nn/upload.hpp"

namespace mpar::nn {

/**
 * @brief Rotates each head's `head_dim` values by its token's position: with `a_i = position * theta^(-2i /
 * head_dim)` for `i < head_dim / 2`, the first half `x_i` and the second half `x_{i + head_dim/2}` of a head are
 * rotated as the pair `(x_i cos a_i - x_{i+d/2} sin a_i, x_{i+d/2} cos a_i + x_i sin a_i)`. The backward is the
 * transpose rotation (by `-a_i`). No parameters; runs on a backend that supports `ops::rope_forward` and `ops::rope_backward`.
 *
 * Positions are an input, one per row, so that whoever holds the rows says where they are in their sequence: on
 * one rank `sequence_positions(rows, seq)`; a sequence-parallel rank holding rows `[first, first + rows)` of the
 * micro-batch passes `sequence_positions(rows, seq, first)`. Any layout is accepted and kept (a rotation of whole
 * heads is linear and per row): a feature shard must hold whole heads, which is checked at run time.
 */
template <backend B = HostBackend>
class Rotary {
  static_assert(supports<B, ops::rope_forward> && supports<B, ops::rope_backward>,
                "mpar::nn::Rotary<B>: backend B does not run ops::rope_forward and ops::rope_backward "
                "(backend/ops/rope.hpp). Fix: use HostBackend, StreamHostBackend, DiscreteHostBackend or "
                "CudaBackend, or give B a run(op) for them");

 public:
  static constexpr std::string_view layer_kind = "Rotary";

  /** Heads of `head_dim` values (even); `theta` is the frequency base (Llama 2: 10000, Llama 3: 500000). */
  explicit Rotary(std::size_t head_dim, double theta = 10000.0) : head_dim_(head_dim), theta_(theta) {
    require(head_dim_ > 0 && head_dim_ % 2 == 0,
            "Rotary: head_dim must be positive and even (its two halves are "
            "rotated as pairs), got ",
            head_dim_);
    require(theta_ > 0, "Rotary: theta must be positive, got ", theta_);
  }

  /** The rotated `x`; `positions` (host values, one per row) are uploaded and kept for the backward of `mb`. */
  template <class L>
  Act<L> forward(const Act<L>& x, std::span<const std::int32_t> positions, int mb = 0) {
    check(x.tensor(), positions.size());
    auto& c = cache_.put(mb);
    c.uploaded = uninitialized_buffer<std::int32_t>(positions.size());
    upload<B>(c.uploaded, positions);  // into rank memory, where the kernels read them
    note_host_access(positions.size() * sizeof(std::int32_t));
    c.positions = {c.uploaded.data(), c.uploaded.size()};
    return rotate(x, c.positions);
  }
  /**
   * As above with the positions already in rank memory (`RankTokens`: the caller keeps them until the backward
   * of `mb`), so a captured step replays with whatever positions the memory holds then.
   */
  template <class L>
  Act<L> forward(const Act<L>& x, RankTokens positions, int mb = 0) {
    check(x.tensor(), positions.size);
    cache_.put(mb).positions = positions;
    return rotate(x, positions);
  }
  /** The gradient of the input: `dy` rotated back by the positions of the forward of `mb`. */
  template <class G>
  Act<G> backward(const Act<G>& dy, int mb = 0) {
    const Cache c = cache_.take(mb, layer_kind);
    check(dy.tensor(), c.positions.size);
    Act<G> dx(Activation(dy.shape(), uninitialized));  // the kernel writes it whole
    B::run(ops::rope_backward{.rows = dy.extent(0),
                              .heads = dy.extent(1) / head_dim_,
                              .head_dim = head_dim_,
                              .ld = dy.extent(1),
                              .positions = c.positions.data,
                              .theta = theta_,
                              .dy = dy.data(),
                              .dx = dx.data()});
    return dx;
  }

  std::vector<Parameter*> parameters() { return {}; }
  void drop(int mb) { cache_.drop(mb); }
  [[nodiscard]] std::size_t head_dim() const { return head_dim_; }
  [[nodiscard]] double theta() const { return theta_; }

 private:
  void check(const Activation& x, std::size_t positions) const {
    require(x.extent(1) % head_dim_ == 0, "Rotary: ", x.extent(1), " features are not whole heads of head_dim ",
            head_dim_, " (a feature shard must split the heads, not a head)");
    require(positions == x.extent(0), "Rotary: ", positions, " positions for ", x.extent(0),
            " rows; give one global position per row");
  }
  template <class L>
  Act<L> rotate(const Act<L>& x, RankTokens positions) {
    Act<L> y(Activation(x.shape(), uninitialized));  // the kernel writes it whole
    B::run(ops::rope_forward{.rows = x.extent(0),
                             .heads = x.extent(1) / head_dim_,
                             .head_dim = head_dim_,
                             .ld = x.extent(1),
                             .positions = positions.data,
                             .theta = theta_,
                             .x = x.data(),
                             .y = y.data()});
    return y;
  }

  struct Cache {
    Buffer<std::int32_t> uploaded;  ///< the host positions' copy in rank memory (empty for RankTokens)
    RankTokens positions;
  };
  std::size_t head_dim_;
  double theta_;
  MicroBatchCache<Cache> cache_;
};

/**
 * @brief The positions of `rows` consecutive rows of a batch of whole `seq`-token sequences, starting at row
 * `first_row` of the batch: `(first_row + r) % seq`. A sequence-parallel rank's block of `rows` tokens starts at
 * `rank * rows`.
 */
[[nodiscard]] inline std::vector<std::int32_t> sequence_positions(std::size_t rows, std::size_t seq,
                                                                  std::size_t first_row = 0) {
  require(seq > 0, "sequence_positions: seq must be positive");
  std::vector<std::int32_t> p(rows);
  for (std::size_t r = 0; r < rows; ++r) p[r] = std::int32_t((first_row + r) % seq);
  return p;
}

/**
 * @brief The positions of a context rank's rows: of each whole `seq`-token sequence it holds chunk `cp_rank` and then
 * chunk `2 cp - 1 - cp_rank` of the sequence's `2 cp` equal chunks (the zig-zag placement of nn::ContextShard), so
 * local row `s 2c + i` (c = seq / 2 cp) is at `cp_rank c + i` for `i < c`, at `(2 cp - 1 - cp_rank) c + i - c` after.
 */
[[nodiscard]] inline std::vector<std::int32_t> zigzag_positions(std::size_t rows, std::size_t seq, std::size_t cp,
                                                                std::size_t cp_rank) {
  require(cp > 0 && cp_rank < cp && seq % (2 * cp) == 0, "zigzag_positions: sequence ", seq,
          " does not split into 2 x cp = ", 2 * cp, " chunks, or context rank ", cp_rank, " is not below cp");
  const std::size_t c = seq / (2 * cp);
  require(rows % (2 * c) == 0, "zigzag_positions: ", rows, " rows are not whole sequences of ", 2 * c,
          " local tokens (seq ", seq, ", cp ", cp, ")");
  std::vector<std::int32_t> p(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    const std::size_t i = r % (2 * c);
    p[r] = std::int32_t(i < c ? cp_rank * c + i : (2 * cp - 1 - cp_rank) * c + i - c);
  }
  return p;
}

}  // namespace mpar::nn
