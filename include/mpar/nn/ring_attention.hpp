#pragma once
/**
 * @file Ring attention: causal attention over a sequence split across a `context` group (context
 * parallelism), K/V blocks passed around the ring while each rank computes on the block it holds.
 *
 * Placement (docs/context-parallel.md): every sequence of length `seq` is cut into `2 cp` equal chunks
 * of `c = seq / (2 cp)` tokens; context rank `r` holds chunks `r` and `2 cp - 1 - r` (`ZigZagShard`), so
 * under the causal mask every rank has the same work (`zigzag_visible_blocks`). Locally a rank's
 * tokens are `[batch, 2c]` in that order: row `b * 2c + i` is global position `r c + i` for `i < c`,
 * `(2 cp - 1 - r) c + i - c` otherwise.
 *
 * The layer is the attention core (no weights): it takes the QKV of the heads this rank owns (under
 * head-parallel tensor parallelism, the `(q | k | v)` columns a fused ColumnParallel returns, each
 * `[heads_local, head_dim]` head-major, as in nn/attention.hpp) and returns the attention output of
 * those heads, `[tokens_local, heads_local * head_dim]`. Heads are independent, so tensor
 * parallelism composes without communication: the tensor ranks run independent rings.
 * Grouped-query attention (`RingAttentionConfig::kv_heads` < heads) takes `(q | k | v)` with fewer K and V
 * columns (`[tokens, (heads + 2 kv_heads) head_dim]`, query heads `j g .. j g + g - 1` reading KV head `j`):
 * only the key/value heads travel the ring, a g-th of what repeating them first would send.
 *
 * Forward: step `j = 0 .. cp-1` computes on the K/V of context rank `r - j` while that block's
 * successor is already on its way (`isend` to `r + 1`, `irecv` from `r - 1`, waited after the
 * compute). Scores are accumulated flash-style in fp32: a running row maximum `m`, row sum `l` and
 * unnormalised output, rescaled by `exp(m_old - m_new)` as blocks arrive; the saved statistic is the
 * row log-sum-exp `L = m + log l`, not the `[seq, seq]` probabilities, so memory stays linear in the
 * local tokens.
 *
 * Backward: recomputes each block's probabilities `P = exp(S - L)` from Q, K and the saved `L`
 * (no score matrix is kept between forward and backward), and passes the accumulating dK/dV of a
 * block around the ring together with it: the gradient of block `s` is summed by every rank it visits
 * and comes home after `cp` hops. Recomputing the other way (each rank recomputing the whole ring
 * for its own dK/dV) would cost `cp` times the compute; passing the gradients costs one extra message
 * of the K/V's size per step. The K/V transfer is overlapped with the compute; the dK/dV of a step
 * depends on that step, so its transfer is not.
 *
 * Backend: every step is a backend operation on the rank's stream, so the layer runs on any
 * `online_softmax_backend` (HostBackend, the stream-emulating backends, CudaBackend) with no host wait:
 * per (query chunk, key chunk) block one strided-batched GEMM for the scores over the local heads, one
 * `online_softmax_update` (running max, running sum, rescaled output, the block's probabilities), one GEMM
 * adding `P V`; `online_softmax_finish` normalises at the end. The backward has one `online_softmax_backward`
 * per block between its GEMMs. The running statistics live in rank memory, head-major `[heads, tokens]`.
 */
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/backend/detail/online_softmax_backend.hpp"
#include "mpar/backend/host/host_backend.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/core/layout.hpp"
#include "mpar/nn/activation.hpp"
#include "mpar/nn/backend_copy.hpp"
#include "mpar/nn/layer.hpp"

namespace mpar::nn {

/** @brief Tokens in zig-zag chunks over the context axis. */
using ContextShard = ZigZagShard<0, axis::context>;
/**
 * @brief The layout of ring attention's input and output: tokens zig-zag over `context`, heads
 * (columns) split over `tensor` (with tp = 1 the tensor part is the whole tensor).
 */
using ContextHeads = Layout2D<ContextShard, FeatureShard>;

/**
 * @brief Whether query chunk `qc` sees any key of chunk `kc` under the causal mask (`kc <= qc`); the
 * diagonal (`kc == qc`) is half-masked. The layer skips the others.
 */
[[nodiscard]] constexpr bool chunk_visible(std::size_t qc, std::size_t kc) { return kc <= qc; }

/** @brief The (query chunk, key chunk) pairs context rank `r` of `cp` computes: full blocks and diagonal ones. */
struct BlockCount {
  std::size_t full = 0, diagonal = 0;
  friend constexpr bool operator==(const BlockCount&, const BlockCount&) = default;
};
[[nodiscard]] constexpr BlockCount zigzag_visible_blocks(std::size_t cp, std::size_t r) {
  BlockCount n;
  for (std::size_t qc : {r, 2 * cp - 1 - r})
    for (std::size_t kc = 0; kc < 2 * cp; ++kc)
      if (chunk_visible(qc, kc)) ++(kc == qc ? n.diagonal : n.full);
  return n;
}

/**
 * @brief Sizes of a ring-attention layer: the query heads this rank owns, head size, global sequence length, and
 * the key/value heads this rank owns (grouped-query attention; 0: as many as query heads).
 */
struct RingAttentionConfig {
  std::size_t heads = 0, head_dim = 0, seq = 0;
  int tag_base = 21000;  ///< point-to-point tags `tag_base`, `+ 2` (K/V, dK/dV); below MPI's least tag bound 32767
  std::string name = "ring_attn";
  /// Key/value heads, dividing `heads`: query heads `j g .. j g + g - 1` (g = heads / kv_heads) read KV head `j`.
  std::size_t kv_heads = 0;
};

/**
 * @brief Causal self-attention core over a sequence split across context group `C` (see the file
 * comment). Input and output `Act<ContextHeads>`; no parameters.
 */
template <communicator C, backend B = HostBackend>
class RingAttention : public detail::NoParameters, public detail::TypedLayer<RingAttention<C, B>> {
  static_assert(mpar::detail::online_softmax_backend<B>,
                "mpar::nn::RingAttention: the backend does not run the online-softmax operations "
                "(ops::online_softmax_update, _finish, _delta, _backward). Fix: use HostBackend, StreamHostBackend, "
                "DiscreteHostBackend or CudaBackend, or give this backend a run(op) for them "
                "(backend/ops/online_softmax.hpp, which holds their host reference)");
  using Typed = detail::TypedLayer<RingAttention<C, B>>;

 public:
  static constexpr std::string_view layer_kind = "RingAttention";
  using default_input = ContextHeads;
  static constexpr bool preserves_features = false;
  static constexpr std::size_t static_in_features = dyn, static_out_features = dyn;
  template <class L>
  static constexpr bool check_input() {
    constexpr bool ok = std::is_same_v<L, ContextHeads>;
    static_assert(ok || detail::always_false_v<L>,
                  "mpar::nn::RingAttention takes QKV whose tokens are zig-zag chunks over the context axis and whose "
                  "heads are split over the tensor axis (Act<ContextHeads>). Fix: state the layout where the "
                  "sequence is split (Act<ContextHeads>(local_qkv)), or use nn::Attention/SelfAttention for an "
                  "unsplit sequence");
    return ok;
  }
  template <class L>
  using output_layout = ContextHeads;
  using Typed::backward;
  using Typed::forward;

  /** `context` is the ring (its rank order is the chunk order). Refuses a sequence not divisible by 2 cp. */
  RingAttention(C& context, const RingAttentionConfig& c)
      : comm_(&context), cp_(std::size_t(context.size())), r_(std::size_t(context.rank())), h_(c.heads),
        kv_(c.kv_heads == 0 ? c.heads : c.kv_heads), d_(c.head_dim), seq_(c.seq), tag_(c.tag_base), name_(c.name) {
    require(h_ > 0 && d_ > 0 && seq_ > 0, who(), ": heads, head_dim and seq must be positive");
    require(h_ % kv_ == 0, who(), ": ", h_, " query heads are not divisible by ", kv_,
            " key/value heads; each KV head serves a whole group of query heads");
    g_ = h_ / kv_;
    require(seq_ % (2 * cp_) == 0, who(), ": sequence length ", seq_, " is not divisible by 2 x cp = 2 x ", cp_, " = ",
            2 * cp_,
            " (zig-zag placement cuts each sequence into 2 cp equal chunks). Fix: choose a sequence length "
            "that is a multiple of ",
            2 * cp_, " (pad the sequence), or a context-parallel size cp that divides ", seq_, " / 2");
    c_ = seq_ / (2 * cp_);
  }

  void drop(int mb) { cache_.drop(mb); }
  /** The score blocks the last forward computed on this rank (the load-balance measure). */
  [[nodiscard]] BlockCount last_blocks() const { return blocks_; }
  [[nodiscard]] std::size_t context_size() const { return cp_; }

 private:
  friend Typed;  // its typed entries are the only public way in; these do the work on the storage
  /** o = softmax(mask(q k^T / sqrt(d))) v over the whole sequence, for this rank's tokens and heads. */
  Activation do_forward(const Activation& qkv, int mb) {
    const std::size_t nb = batches(qkv), hl = h_ * d_, t = qkv.extent(0);
    auto& s = cache_.put(mb);
    s.qkv = backend_copy<B>(qkv);
    // Running maximum (the log-sum-exp at the end), running sum and unnormalised output, in rank memory.
    s.lse = Activation({h_, t}, uninitialized);
    B::run(ops::fill<float>{.n = s.lse.size(), .value = -std::numeric_limits<float>::infinity(), .x = s.lse.data()});
    Activation l({h_, t}, uninitialized), scores({h_ * c_, c_}, uninitialized), acc({t, hl}, uninitialized);
    B::run(ops::zero<float>{.n = l.size(), .x = l.data()});
    B::run(ops::zero<float>{.n = acc.size(), .x = acc.data()});
    blocks_ = {};
    Ring ring(*this, pack_kv(qkv), tag_);
    for (std::size_t j = 0; j < cp_; ++j) {
      const std::size_t src = (r_ + cp_ - j) % cp_;
      if (j + 1 < cp_) ring.start();  // the next block travels while this one is computed
      const float* kv = ring.current().data();
      for (std::size_t b = 0; b < nb; ++b)
        for (std::size_t a = 0; a < 2; ++a)
          for (std::size_t e = 0; e < 2; ++e) {
            const std::size_t qc = chunk(r_, a), kc = chunk(src, e);
            if (!chunk_visible(qc, kc)) continue;
            ++(qc == kc ? blocks_.diagonal : blocks_.full);
            block_forward(qkv, kv, b, a, e, qc, kc, t, scores, s.lse, l, acc);
          }
      if (j + 1 < cp_) ring.finish();
    }
    // o = acc / l; L = m + log l (every row saw its own diagonal at step 0, so l > 0).
    B::run(ops::online_softmax_finish{.heads = h_,
                                      .rows = t,
                                      .head_dim = d_,
                                      .stat_stride = t,
                                      .out_ld = hl,
                                      .row_max = s.lse.data(),
                                      .row_sum = l.data(),
                                      .out = acc.data()});
    s.out = backend_copy<B>(acc);
    return acc;
  }

  /** dqkv from do: recomputes each block's probabilities and passes dK/dV around the ring with K/V. */
  Activation do_backward(const Activation& dout, int mb) {
    auto s = cache_.take(mb, layer_kind);
    const Activation& qkv = s.qkv;
    const std::size_t nb = batches(qkv), hl = h_ * d_, t = qkv.extent(0);
    require(dout.extent(0) == t && dout.extent(1) == hl, who(), ": output gradient is ", dout.extent(0), "x",
            dout.extent(1), ", expected ", t, "x", hl);
    // delta = rowsum(dO * O) per (row, head): the softmax backward's correction term.
    Activation delta({h_, t}, uninitialized);
    B::run(ops::online_softmax_delta{.heads = h_,
                                     .rows = t,
                                     .head_dim = d_,
                                     .stat_stride = t,
                                     .out_ld = hl,
                                     .dout = dout.data(),
                                     .out = s.out.data(),
                                     .delta = delta.data()});
    Activation dqkv({t, hl + 2 * kv_cols()}, uninitialized);  // dQ accumulates in its first hl columns; dK/dV copied in
    B::run(ops::zero<float>{.n = dqkv.size(), .x = dqkv.data()});
    Activation dkv0({t, 2 * kv_cols()}, uninitialized);  // the rank's own block's dK/dV, zero at its home rank
    B::run(ops::zero<float>{.n = dkv0.size(), .x = dkv0.data()});
    Ring ring(*this, pack_kv(qkv), tag_);         // K/V of the block being worked on
    Ring grad(*this, std::move(dkv0), tag_ + 2);  // its dK/dV
    Activation p({h_ * c_, c_}, uninitialized), dp({h_ * c_, c_}, uninitialized);
    for (std::size_t j = 0; j < cp_; ++j) {
      const std::size_t src = (r_ + cp_ - j) % cp_;
      if (j + 1 < cp_) ring.start();
      const float* kv = ring.current().data();
      float* dkv = grad.current().data();
      for (std::size_t b = 0; b < nb; ++b)
        for (std::size_t a = 0; a < 2; ++a)
          for (std::size_t e = 0; e < 2; ++e) {
            const std::size_t qc = chunk(r_, a), kc = chunk(src, e);
            if (chunk_visible(qc, kc))
              block_backward(qkv, kv, dout, b, a, e, qc, kc, t, s.lse, delta, p, dp, dqkv, dkv);
          }
      // This block's dK/dV moves on with it; after cp hops every block's gradient is home.
      grad.start();
      if (j + 1 < cp_) ring.finish();
      grad.finish();
    }
    // The dK/dV rows into the K and V columns of dQKV: one strided copy, not one per token row.
    B::run(ops::copy_2d<float>{.rows = t,
                               .cols = 2 * kv_cols(),
                               .src = grad.current().data(),
                               .src_ld = 2 * kv_cols(),
                               .dst = dqkv.data() + hl,
                               .dst_ld = hl + 2 * kv_cols()});
    return dqkv;
  }

  struct Saved {
    Activation qkv, out;
    Activation lse;  // [heads, tokens]: the row log-sum-exp of the scaled, masked scores
  };
  /**
   * A block travelling the ring: `start()` posts the send of the current block to the next rank and
   * the receive of the previous rank's into a second buffer; `finish()` waits and swaps them.
   */
  class Ring {
   public:
    Ring(RingAttention& l, Activation first, int tag)
        : l_(&l), cur_(std::move(first)), next_(cur_.shape(), uninitialized), tag_(tag) {}
    void start() {
      if (l_->cp_ == 1) return;
      const int p = int(l_->cp_), r = int(l_->r_);
      recv_.emplace_back(l_->comm_->irecv(std::span<float>(next_.data(), next_.size()), (r + p - 1) % p, tag_));
      send_.emplace_back(l_->comm_->isend(std::span<const float>(cur_.data(), cur_.size()), (r + 1) % p, tag_));
    }
    void finish() {
      if (l_->cp_ == 1) return;
      for (auto& q : recv_) q.wait();
      for (auto& q : send_) q.wait();
      recv_.clear(), send_.clear();
      std::swap(cur_, next_);
    }
    Activation& current() { return cur_; }

   private:
    using Request = decltype(std::declval<C&>().isend(std::span<const float>{}, 0, 0));
    RingAttention* l_;
    Activation cur_, next_;
    int tag_;
    std::vector<Request> recv_, send_;
  };

  [[nodiscard]] std::string who() const {
    return std::string(layer_kind) + " '" + name_ + "' (context rank " + std::to_string(r_) + " of " +
           std::to_string(cp_) + ")";
  }
  [[nodiscard]] std::size_t batches(const Activation& qkv) const {
    require(qkv.extent(1) == h_ * d_ + 2 * kv_cols(), who(), ": QKV has ", qkv.extent(1), " columns, expected (", h_,
            " query + 2 x ", kv_, " key/value heads) x ", d_);
    require(qkv.extent(0) % (2 * c_) == 0, who(), ": ", qkv.extent(0), " local tokens are not a whole number of ",
            "local sequences of 2 chunks x ", c_, " tokens (sequence ", seq_, " over cp = ", cp_, ")");
    return qkv.extent(0) / (2 * c_);
  }
  /** Global chunk of local half `a` (0 or 1) on context rank `rank`. */
  [[nodiscard]] std::size_t chunk(std::size_t rank, std::size_t a) const { return a == 0 ? rank : 2 * cp_ - 1 - rank; }
  /**
   * The K and V columns of this rank's tokens, contiguous `[tokens, 2 hl]`: the block that travels. One
   * strided copy (the columns `[hl, 3 hl)` of every row), not one per token row: on a device each is a launch.
   */
  Activation pack_kv(const Activation& qkv) const {
    const std::size_t hl = h_ * d_, kw = kv_cols(), t = qkv.extent(0);
    Activation kv({t, 2 * kw}, uninitialized);
    B::run(ops::copy_2d<float>{
        .rows = t, .cols = 2 * kw, .src = qkv.data() + hl, .src_ld = hl + 2 * kw, .dst = kv.data(), .dst_ld = 2 * kw});
    return kv;
  }

  /**
   * The shape of the (query chunk qc, key chunk kc) block for the online-softmax operations: scores
   * `[heads, c, c]`, statistics `[heads, t]` (the block's rows start at its first query row), output rows
   * `hl` apart; the causal mask by global position (a chunk before the queries' masks nothing).
   */
  [[nodiscard]] SoftmaxBlock softmax_block(std::size_t qc, std::size_t kc, std::size_t t) const {
    return {h_, c_, c_, d_, t, h_ * d_, (std::ptrdiff_t(qc) - std::ptrdiff_t(kc)) * std::ptrdiff_t(c_)};
  }

  /**
   * One (query half a, key half e) block of sequence b, every local head: S = scale Q K^T, then the
   * online-softmax update of the running max (in `m` until the end), the row sums `l` and `acc`, then acc += P V.
   * Under grouped-query attention each product runs once per place `i` in a group: query heads `j g + i` against
   * KV heads `j` (strides g apart on the query side), so K and V travel the ring unrepeated.
   */
  void block_forward(const Activation& qkv, const float* kv, std::size_t b, std::size_t a, std::size_t e,
                     std::size_t qc, std::size_t kc, std::size_t t, Activation& sc, Activation& m, Activation& l,
                     Activation& acc) const {
    const std::size_t hl = h_ * d_, kw = kv_cols(), ld = hl + 2 * kw, c = c_, qrow = b * 2 * c + a * c,
                      krow = b * 2 * c + e * c, gd = g_ * d_, gcc = g_ * c * c;
    const float scale = 1.0f / std::sqrt(float(d_));
    const float *q = qkv.data() + qrow * ld, *k = kv + krow * 2 * kw, *v = k + kw;
    for (std::size_t i = 0; i < g_; ++i)
      B::run(ops::gemm_strided_batched<float>{.ta = Trans::no,
                                              .tb = Trans::yes,
                                              .m = c,
                                              .n = c,
                                              .k = d_,
                                              .alpha = scale,
                                              .a = q + i * d_,
                                              .lda = ld,
                                              .stride_a = BatchStrides{0, gd},
                                              .b = k,
                                              .ldb = 2 * kw,
                                              .stride_b = BatchStrides{0, d_},
                                              .beta = 0.0f,
                                              .c = sc.data() + i * c * c,
                                              .ldc = c,
                                              .stride_c = BatchStrides{0, gcc},
                                              .batch = BatchExtents{1, kv_}});
    B::run(ops::online_softmax_update{.block = softmax_block(qc, kc, t),
                                      .scores = sc.data(),
                                      .row_max = m.data() + qrow,
                                      .row_sum = l.data() + qrow,
                                      .out = acc.data() + qrow * hl});
    for (std::size_t i = 0; i < g_; ++i)  // acc += P V
      B::run(ops::gemm_strided_batched<float>{.ta = Trans::no,
                                              .tb = Trans::no,
                                              .m = c,
                                              .n = d_,
                                              .k = c,
                                              .alpha = 1.0f,
                                              .a = sc.data() + i * c * c,
                                              .lda = c,
                                              .stride_a = BatchStrides{0, gcc},
                                              .b = v,
                                              .ldb = 2 * kw,
                                              .stride_b = BatchStrides{0, d_},
                                              .beta = 1.0f,
                                              .c = acc.data() + qrow * hl + i * d_,
                                              .ldc = hl,
                                              .stride_c = BatchStrides{0, gd},
                                              .batch = BatchExtents{1, kv_}});
  }

  /**
   * The backward of one block: P = exp(S - L), dV += P^T dO, dS = P (dO V^T - delta), dQ += scale dS K, dK += scale
   * dS^T Q; per place in a group as in `block_forward` (a KV head's dK and dV sum its query heads in group order).
   */
  void block_backward(const Activation& qkv, const float* kv, const Activation& dout, std::size_t b, std::size_t a,
                      std::size_t e, std::size_t qc, std::size_t kc, std::size_t t, const Activation& lse,
                      const Activation& delta, Activation& p, Activation& dp, Activation& dqkv, float* dkv) const {
    const std::size_t hl = h_ * d_, kw = kv_cols(), ld = hl + 2 * kw, c = c_, qrow = b * 2 * c + a * c,
                      krow = b * 2 * c + e * c, gd = g_ * d_, cc = c * c, gcc = g_ * cc;
    const float scale = 1.0f / std::sqrt(float(d_));
    const float *q = qkv.data() + qrow * ld, *k = kv + krow * 2 * kw, *v = k + kw, *go = dout.data() + qrow * hl;
    for (std::size_t i = 0; i < g_; ++i) {
      B::run(ops::gemm_strided_batched<float>{.ta = Trans::no,
                                              .tb = Trans::yes,
                                              .m = c,
                                              .n = c,
                                              .k = d_,
                                              .alpha = scale,
                                              .a = q + i * d_,
                                              .lda = ld,
                                              .stride_a = BatchStrides{0, gd},
                                              .b = k,
                                              .ldb = 2 * kw,
                                              .stride_b = BatchStrides{0, d_},
                                              .beta = 0.0f,
                                              .c = p.data() + i * cc,
                                              .ldc = c,
                                              .stride_c = BatchStrides{0, gcc},
                                              .batch = BatchExtents{1, kv_}});
      B::run(ops::gemm_strided_batched<float>{.ta = Trans::no,
                                              .tb = Trans::yes,
                                              .m = c,
                                              .n = c,
                                              .k = d_,
                                              .alpha = 1.0f,
                                              .a = go + i * d_,
                                              .lda = hl,
                                              .stride_a = BatchStrides{0, gd},
                                              .b = v,
                                              .ldb = 2 * kw,
                                              .stride_b = BatchStrides{0, d_},
                                              .beta = 0.0f,
                                              .c = dp.data() + i * cc,
                                              .ldc = c,
                                              .stride_c = BatchStrides{0, gcc},
                                              .batch = BatchExtents{1, kv_}});
    }
    B::run(ops::online_softmax_backward{.block = softmax_block(qc, kc, t),
                                        .lse = lse.data() + qrow,
                                        .delta = delta.data() + qrow,
                                        .p = p.data(),
                                        .dp = dp.data()});
    float *dq = dqkv.data() + qrow * ld, *dk = dkv + krow * 2 * kw, *dv = dk + kw;
    const float *pp = p.data(), *ds = dp.data();
    for (std::size_t i = 0; i < g_; ++i)
      B::run(ops::gemm_strided_batched<float>{.ta = Trans::yes,
                                              .tb = Trans::no,
                                              .m = c,
                                              .n = d_,
                                              .k = c,
                                              .alpha = 1.0f,
                                              .a = pp + i * cc,
                                              .lda = c,
                                              .stride_a = BatchStrides{0, gcc},
                                              .b = go + i * d_,
                                              .ldb = hl,
                                              .stride_b = BatchStrides{0, gd},
                                              .beta = 1.0f,
                                              .c = dv,
                                              .ldc = 2 * kw,
                                              .stride_c = BatchStrides{0, d_},
                                              .batch = BatchExtents{1, kv_}});
    for (std::size_t i = 0; i < g_; ++i)
      B::run(ops::gemm_strided_batched<float>{.ta = Trans::no,
                                              .tb = Trans::no,
                                              .m = c,
                                              .n = d_,
                                              .k = c,
                                              .alpha = scale,
                                              .a = ds + i * cc,
                                              .lda = c,
                                              .stride_a = BatchStrides{0, gcc},
                                              .b = k,
                                              .ldb = 2 * kw,
                                              .stride_b = BatchStrides{0, d_},
                                              .beta = 1.0f,
                                              .c = dq + i * d_,
                                              .ldc = ld,
                                              .stride_c = BatchStrides{0, gd},
                                              .batch = BatchExtents{1, kv_}});
    for (std::size_t i = 0; i < g_; ++i)
      B::run(ops::gemm_strided_batched<float>{.ta = Trans::yes,
                                              .tb = Trans::no,
                                              .m = c,
                                              .n = d_,
                                              .k = c,
                                              .alpha = scale,
                                              .a = ds + i * cc,
                                              .lda = c,
                                              .stride_a = BatchStrides{0, gcc},
                                              .b = q + i * d_,
                                              .ldb = ld,
                                              .stride_b = BatchStrides{0, gd},
                                              .beta = 1.0f,
                                              .c = dk,
                                              .ldc = 2 * kw,
                                              .stride_c = BatchStrides{0, d_},
                                              .batch = BatchExtents{1, kv_}});
  }
  /** The columns of K (and of V) in this rank's QKV: its key/value heads times the head size. */
  [[nodiscard]] std::size_t kv_cols() const { return kv_ * d_; }

  C* comm_;
  std::size_t cp_, r_, h_, kv_, d_, seq_, c_ = 1, g_ = 1;
  int tag_;
  std::string name_;
  BlockCount blocks_;
  MicroBatchCache<Saved> cache_;
};

}  // namespace mpar::nn
