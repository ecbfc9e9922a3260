#pragma once
/**
 * @file `Linear2D`: 2D tensor parallelism (SUMMA). The tensor axis is arranged as a q x q grid
 * (`DeviceMesh::with_tensor_grid`, axes `tensor_row` x `tensor_col`); the activation `X [T, in]` and the
 * weight `W [in, out]` are both split into q x q blocks, block (i, j) on grid rank (i, j):
 * `Layout2D<Shard<0, tensor_row>, Shard<1, tensor_col>>`.
 *
 * Forward, for k = 0..q-1: rank (i, k) broadcasts X_ik along its grid row, rank (k, j) broadcasts W_kj
 * along its grid column, and every rank accumulates Y_ij += X_ik W_kj. Backward mirrors it:
 * dX_ik = sum_j dY_ij W_kj^T (reduce along the grid row to (i, k)) and dW_kj = sum_i X_ik^T dY_ij
 * (reduce along the grid column to (k, j)). Each rank stores 1/q² of W and of the activations.
 */
#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/half_weight.hpp"
#include "mpar/nn/linear.hpp"

namespace mpar::nn {

/** @brief The activation and weight layout of 2D tensor parallelism. */
using GridShard = Layout2D<Shard<0, axis::tensor_row>, Shard<1, axis::tensor_col>>;

/**
 * @brief A rank's two grid communicators: `row` holds the ranks of its grid row (ordered by column,
 * so `row.rank()` is its column j) and `col` those of its grid column (`col.rank()` is its row i).
 */
template <communicator C>
struct TensorGrid {
  C row, col;
  [[nodiscard]] std::size_t i() const { return std::size_t(col.rank()); }
  [[nodiscard]] std::size_t j() const { return std::size_t(row.rank()); }
  [[nodiscard]] std::size_t q() const { return std::size_t(row.size()); }
};

/** @brief Splits the tensor group `tp` into the grid of `mesh.with_tensor_grid(rows, cols)` (collective over `tp`). */
template <communicator C>
[[nodiscard]] TensorGrid<C> make_tensor_grid(C& tp, std::size_t rows, std::size_t cols) {
  require(rows * cols == std::size_t(tp.size()), "make_tensor_grid: ", rows, " x ", cols,
          " does not equal the tensor group size ", tp.size());
  const DynamicMesh mesh =
      DynamicMesh(std::size_t(tp.size()), std::size_t(1), std::size_t(1), std::size_t(1)).with_tensor_grid(rows, cols);
  const MeshCoord c = mesh.coord(std::size_t(tp.rank()));
  C row = tp.split(int(c.tensor_row), int(c.tensor_col));
  C col = tp.split(int(c.tensor_col), int(c.tensor_row));
  return TensorGrid<C>{std::move(row), std::move(col)};
}

/** @brief SUMMA linear layer `y = x W + b` on a square q x q tensor grid (bias split by columns). */
template <communicator C, backend B = HostBackend>
class Linear2D : public detail::LinearState, public detail::TypedLayer<Linear2D<C, B>> {
  using Typed = detail::TypedLayer<Linear2D<C, B>>;

 public:
  using Typed::backward;
  using Typed::backward_input;
  using Typed::forward;
  static constexpr std::string_view layer_kind = "Linear2D";
  using default_input = GridShard;
  static constexpr bool preserves_features = false;
  static constexpr std::size_t static_in_features = dyn, static_out_features = dyn;
  template <class L>
  static constexpr bool check_input() {
    static_assert(
        std::is_same_v<L, GridShard>,
        "mpar::nn::Linear2D (2D tensor parallelism, SUMMA) needs a tensor sharded on both grid axes "
        "(Layout2D<Shard<0, tensor_row>, Shard<1, tensor_col>>) but is fed another layout (see L above: a 1D "
        "shard, a replicated or a Partial tensor). Fix: feed it another Linear2D, or shard the input with the "
        "same Layout2D");
    return std::is_same_v<L, GridShard>;
  }
  template <class L>
  using output_layout = GridShard;

  Linear2D(TensorGrid<C>& grid, std::size_t in, std::size_t out, const LinearInit& init)
      : grid_(&grid), in_(in), out_(out), q_(grid.q()), name_(init.name) {
    require(grid.row.size() == grid.col.size(), "Linear2D '", name_, "': SUMMA needs a square grid, got ",
            grid.col.size(), " x ", grid.row.size());
    require(in_ % q_ == 0 && out_ % q_ == 0, "Linear2D '", name_, "' (grid rank ", grid.i(), ",", grid.j(), "): sizes ",
            in_, " x ", out_, " are not divisible by the grid size ", q_);
    const std::size_t n = q_ * q_;
    const DynamicMesh mesh = DynamicMesh(n, std::size_t(1), std::size_t(1), std::size_t(1)).with_tensor_grid(q_, q_);
    const MeshCoord coord = mesh.coord(grid.i() * q_ + grid.j());
    const std::array<std::size_t, 2> ws{in_, out_};
    weight_ = make_parameter<B, 2>(name_ + ".weight", init.id_base, ws, GridShard::local_box<2>(ws, mesh, coord),
                                   GridShard::name(), q_ > 1, init.seed, detail::default_weight_init(in_));
    if (init.bias) {
      using BL = Shard<0, axis::tensor_col>;
      const std::array<std::size_t, 1> bs{out_};
      bias_ = make_parameter<B, 1>(name_ + ".bias", init.id_base + 1, bs, BL::local_box<1>(bs, mesh, coord), BL::name(),
                                   q_ > 1, init.seed, InitSpec::normal(0.02));
    }
  }

 private:
  friend Typed;  // its typed entries are the only public way in; these do the work on the storage
  /** `x` is this rank's block X_ij `[T/q, in/q]`; returns Y_ij `[T/q, out/q]`. */
  Activation do_forward(const Activation& x, int mb) {
    const std::size_t tl = x.extent(0), il = in_ / q_, ol = out_ / q_;
    require(x.extent(1) == il, "Linear2D '", name_, "': input block has ", x.extent(1), " features, expected ", il);
    const ComputeType t = autocast_type();  // read once: the backward uses what the forward used
    // Every buffer is written whole by a copy, a broadcast or the first step's product (beta = 0), so none is
    // zero-filled by the host: on a stream-ordered backend the passes are backend operations only.
    Activation y({tl, ol}, uninitialized);
    Activation a({tl, il}, uninitialized);
    Buffer<float> w = B::template allocate<float>(il * ol);
    for (std::size_t k = 0; k < q_; ++k) {
      broadcast_blocks(k, x, a, w);
      gemm_in(t, Trans::no, Trans::no, tl, ol, il, a.span(), il, w, ol, k == 0 ? 0.0f : 1.0f, y.data(), ol);
    }
    if (has_bias()) detail::add_row_vector<B>(y, bias_.value);
    keep_input(mb, backend_copy<B>(x));
    types_.put(mb) = t;
    return y;
  }

  /**
   * B: the input gradient block dX_ik = Σ_j dY_ij W_kjᵀ (weight blocks broadcast along grid columns,
   * shares reduced along grid rows). Keeps X_ij and dY_ij for backward_weight.
   */
  Activation do_backward_input(const Activation& dy, int mb) {
    Activation x = take_input(mb, layer_kind);
    const std::size_t tl = x.extent(0), il = in_ / q_, ol = out_ / q_;
    require(dy.extent(0) == tl && dy.extent(1) == ol, "Linear2D '", name_, "': gradient block is ", dy.extent(0), "x",
            dy.extent(1), ", expected ", tl, "x", ol);
    const ComputeType t = types_.peek(mb, layer_kind);
    // dx is written whole by the reduce rooted at this rank (k = j); part_x by each product (beta = 0).
    Activation dx({tl, il}, uninitialized), part_x({tl, il}, uninitialized);
    Buffer<float> w = B::template allocate<float>(il * ol);
    for (std::size_t k = 0; k < q_; ++k) {
      broadcast_weight(k, w);
      // dX_ik: this rank's share dY_ij W_kj^T, summed along the grid row onto column k.
      gemm_in(t, Trans::no, Trans::yes, tl, il, ol, dy.span(), ol, w, ol, 0.0f, part_x.data(), il);
      grid_->row.reduce(std::span<const float>(part_x.span()), dx.span(), ReduceOp::sum, int(k));
    }
    keep_for_weight(mb, std::move(x), backend_copy<B>(dy));
    return dx;
  }

 public:
  /**
   * W: the weight block dW_kj = Σ_i X_ikᵀ dY_ij and the bias. SUMMA's weight gradient needs the
   * input blocks of other grid columns, so W broadcasts them along grid rows and reduces along grid
   * columns (the communication the math demands; none of it is on B's critical path).
   */
  void backward_weight(int mb = 0) {
    auto p = take_for_weight(mb, layer_kind);
    const ComputeType t = types_.take(mb, layer_kind);
    const std::size_t tl = p.x.extent(0), il = in_ / q_, ol = out_ / q_;
    Activation a({tl, il}, uninitialized);
    Buffer<float> part_w = B::template allocate<float>(il * ol);
    for (std::size_t k = 0; k < q_; ++k) {
      broadcast_input(k, p.x, a);
      // dW_kj: this rank's share X_ik^T dY_ij, summed along the grid column onto row k.
      gemm_in(t, Trans::yes, Trans::no, il, ol, tl, a.span(), il, p.dy.span(), ol, 0.0f, part_w.data(), ol);
      if (grid_->i() == k) {
        Buffer<float> sum = B::template allocate<float>(il * ol);  // written whole by the reduce
        grid_->col.reduce(std::span<const float>(part_w), std::span<float>(sum), ReduceOp::sum, int(k));
        B::run(ops::add{.n = sum.size(), .x = weight_.grad.data(), .z = sum.data(), .y = weight_.grad.data()});
      } else {
        grid_->col.reduce(std::span<const float>(part_w), std::span<float>(), ReduceOp::sum, int(k));
      }
    }
    if (has_bias()) {
      Buffer<float> db = B::template allocate<float>(ol);
      B::run(ops::zero<float>{.n = ol, .x = db.data()});
      detail::add_column_sums<B>(p.dy, db);
      grid_->col.all_reduce(std::span<float>(db), ReduceOp::sum);
      B::run(ops::add{.n = ol, .x = bias_.grad.data(), .z = db.data(), .y = bias_.grad.data()});
    }
  }

  [[nodiscard]] std::size_t in_features() const { return in_; }
  [[nodiscard]] std::size_t out_features() const { return out_; }
  /** Frees what micro-batch `mb` kept (its input, its pending weight-gradient inputs, its operand type). */
  void drop(int mb) {
    types_.drop(mb);
    LinearState::drop(mb);
  }

 private:
  /**
   * `C = op(A) op(B) + beta C` in operand type `t` (the forward's `Autocast` type): fp32 as is, or both blocks
   * converted to 16 bits right before the product, accumulated in fp32. The broadcasts stay fp32 (they move
   * the same blocks either way; a 16-bit broadcast would halve their bytes, left for later).
   */
  void gemm_in(ComputeType t, Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, std::span<const float> a,
               std::size_t lda, std::span<const float> b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
    if (t == ComputeType::fp32) {
      B::run(ops::gemm<float>{.ta = ta,
                              .tb = tb,
                              .m = m,
                              .n = n,
                              .k = k,
                              .alpha = 1.0f,
                              .a = a.data(),
                              .lda = lda,
                              .b = b.data(),
                              .ldb = ldb,
                              .beta = beta,
                              .c = c,
                              .ldc = ldc});
      return;
    }
    detail::with_half(t, [&]<class T>(T) {
      const Buffer<T> a16 = to_half<B, T>(a), b16 = to_half<B, T>(b);
      B::run(ops::gemm<T, float>{.ta = ta,
                                 .tb = tb,
                                 .m = m,
                                 .n = n,
                                 .k = k,
                                 .alpha = 1.0f,
                                 .a = a16.data(),
                                 .lda = lda,
                                 .b = b16.data(),
                                 .ldb = ldb,
                                 .beta = beta,
                                 .c = c,
                                 .ldc = ldc});
    });
  }

  /** Step k of SUMMA: `a` <- X_ik (broadcast along the grid row), `w` <- W_kj (along the grid column). */
  void broadcast_blocks(std::size_t k, const Activation& x, Activation& a, Buffer<float>& w) {
    broadcast_input(k, x, a);
    broadcast_weight(k, w);
  }
  void broadcast_input(std::size_t k, const Activation& x, Activation& a) {
    if (grid_->j() == k) B::run(ops::copy<float>{.n = x.size(), .src = x.data(), .dst = a.data()});
    grid_->row.broadcast(a.span(), int(k));
  }
  void broadcast_weight(std::size_t k, Buffer<float>& w) {
    if (grid_->i() == k) B::run(ops::copy<float>{.n = w.size(), .src = weight_.value.data(), .dst = w.data()});
    grid_->col.broadcast(std::span<float>(w), int(k));
  }
  TensorGrid<C>* grid_;
  MicroBatchCache<ComputeType> types_;  // the operand type each micro-batch's forward used
  std::size_t in_, out_, q_;
  std::string name_;
};

}  // namespace mpar::nn
