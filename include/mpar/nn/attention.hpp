#pragma once
/**
 * @file Multi-head causal self-attention: the per-head core, the single-rank `Attention`, and the
 * tensor-parallel `SelfAttention` split by heads (QKV column-parallel, output projection row-parallel).
 *
 * Representation: the input is `[tokens, hidden]` with token `t = b * seq + s`; the QKV projection
 * returns `[tokens, 3 * h_local]` whose columns are `(q | k | v)`, each `[heads_local, head_dim]`
 * head-major. In fp32 the core reads head `h` of batch `b` as a `[seq, head_dim]` strided block of that
 * matrix, with no copy into `[batch, heads, seq, head_dim]`; 16-bit operands are rearranged into that
 * dense layout first (`AttentionCore::head_major_qkv` says why).
 */
#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/backend/host/host_backend.hpp"
#include "mpar/nn/column_parallel.hpp"
#include "mpar/nn/detail/fused_attention_backend.hpp"
#include "mpar/nn/linear.hpp"
#include "mpar/nn/row_parallel.hpp"

namespace mpar::nn {

/** @brief Sizes of the causal attention core on one rank: its heads, head size and sequence length. */
struct AttentionCore {
  std::size_t heads = 1, head_dim = 1, seq = 1;

  [[nodiscard]] std::size_t batch(const Activation& qkv, std::string_view who) const {
    require(qkv.extent(1) == 3 * heads * head_dim, who, ": QKV has ", qkv.extent(1), " columns, expected 3 x ", heads,
            " heads x ", head_dim);
    require(qkv.extent(0) % seq == 0, who, ": ", qkv.extent(0),
            " tokens are not a whole number of sequences of length ", seq);
    return qkv.extent(0) / seq;
  }

  /**
   * One product of every (sequence, head) pair: `C(b, h) = alpha op(A(b, h)) op(B(b, h)) + beta C(b, h)`, where
   * operand X(b, h) starts `b * X.seq + h * X.head` elements into X: one two-level strided-batched GEMM
   * (sequences outer, heads inner), so the backend sees the whole product in one call.
   */
  template <class T>
  struct OperandOf {
    const T* p;
    std::size_t ld, seq, head;
  };
  using Operand = OperandOf<float>;
  /** fp32 operands, or 16-bit ones (bf16 / f16 under `Autocast`) with fp32 accumulation; C is fp32 either way. */
  template <backend B, class T>
  void per_head_gemm(std::size_t nb, Trans ta, Trans tb, std::size_t m, std::size_t n, std::size_t k, float alpha,
                     OperandOf<T> a, OperandOf<T> b, float* c, std::size_t ldc, std::size_t c_seq,
                     std::size_t c_head) const {
    B::run(ops::gemm_strided_batched<T, float>{.ta = ta,
                                               .tb = tb,
                                               .m = m,
                                               .n = n,
                                               .k = k,
                                               .alpha = alpha,
                                               .a = a.p,
                                               .lda = a.ld,
                                               .stride_a = BatchStrides{a.seq, a.head},
                                               .b = b.p,
                                               .ldb = b.ld,
                                               .stride_b = BatchStrides{b.seq, b.head},
                                               .beta = 0.0f,
                                               .c = c,
                                               .ldc = ldc,
                                               .stride_c = BatchStrides{c_seq, c_head},
                                               .batch = BatchExtents{nb, heads}});
  }

  /**
   * q, k and v (16-bit, under `Autocast`) as three dense `[batch, heads, seq, head_dim]` blocks, rearranged from
   * the `[tokens, 3 * heads * head_dim]` layout of `qkv_t` by one `B::copy_2d_batched` each.
   *
   * Why: oneDNN's AMX bf16 matmul (`brg:avx512_core_amx_bf16`) takes a batched product only when its operands
   * are dense in the batch's order; q, k, v read in place from the QKV matrix (leading dimension 3 x hidden)
   * send oneDNN 2.6 to its `gemm:jit` kernels, ten to twenty times slower on these 64 x 64 products (the
   * destination may stay strided). The rearranged copy replaces the token-major one the layer would keep.
   */
  template <backend B, class T>
  [[nodiscard]] Buffer<T> head_major_qkv(std::size_t tokens, const T* qkv_t) const {
    return rearrange_heads<B>(tokens, 3, qkv_t);
  }
  /** Where `head_major_qkv`'s result (or any q, k, v in that layout) is passed: the products read it as dense. */
  template <class T>
  struct HeadMajor {
    const T* p;
  };

  /**
   * o = softmax(mask(q k^T / sqrt(d))) v per (batch, head); saves the probabilities `[b, h, s, s]` (fp32, for the
   * softmax backward). `qkv_t` is `qkv` itself (T = float) or its 16-bit conversion (under `Autocast`): the
   * products read it, and a 16-bit copy of the probabilities, and accumulate in fp32; the softmax is fp32.
   * 16-bit q, k, v are first rearranged by `head_major_qkv` (a layer keeping them calls that once and passes
   * `HeadMajor`, below).
   */
  template <backend B, class T = float>
  Activation forward(const Activation& qkv, const T* qkv_t, Buffer<float>& probs, std::string_view who) const {
    const std::size_t nb = batch(qkv, who);
    if constexpr (std::is_same_v<T, float>) {
      return forward_with<B, T>(qkv, token_major(qkv_t), probs);
    } else {
      const Buffer<T> heads_t = head_major_qkv<B>(qkv.extent(0), qkv_t);
      return forward_with<B, T>(qkv, head_major(heads_t.data(), nb), probs);
    }
  }
  /** The forward over q, k, v already rearranged by `head_major_qkv`. */
  template <backend B, class T>
  Activation forward(const Activation& qkv, HeadMajor<T> qkv_h, Buffer<float>& probs, std::string_view who) const {
    return forward_with<B, T>(qkv, head_major(qkv_h.p, batch(qkv, who)), probs);
  }

  /**
   * dqkv from do, the saved qkv (`qkv_t`: as in `forward`) and probabilities; with 16-bit `T` every product takes
   * 16-bit operands (dO and dS converted once each, P converted again from the fp32 probabilities; q, k, v and
   * dO rearranged as in `head_major_qkv`).
   */
  template <backend B, class T = float>
  Activation backward(std::size_t tokens, const T* qkv_t, const Buffer<float>& probs, const Activation& dout,
                      std::string_view who) const {
    if constexpr (std::is_same_v<T, float>) {
      return backward_with<B, T>(tokens, token_major(qkv_t), probs, dout, who);
    } else {
      const Buffer<T> heads_t = head_major_qkv<B>(tokens, qkv_t);
      return backward_with<B, T>(tokens, head_major(heads_t.data(), tokens / seq), probs, dout, who);
    }
  }
  /** The backward over q, k, v already rearranged by `head_major_qkv`. */
  template <backend B, class T>
  Activation backward(std::size_t tokens, HeadMajor<T> qkv_h, const Buffer<float>& probs, const Activation& dout,
                      std::string_view who) const {
    return backward_with<B, T>(tokens, head_major(qkv_h.p, tokens / seq), probs, dout, who);
  }
  /**
   * The probabilities `forward` saves, `[b, h, s, s]`, computed again from q and k (`qkv_t` as in `forward`):
   * selective recomputation. The same products and softmax as `forward`'s, so the result is bit-identical.
   */
  template <backend B, class T = float>
  [[nodiscard]] Buffer<float> probabilities(std::size_t tokens, const T* qkv_t) const {
    Buffer<float> probs;
    if constexpr (std::is_same_v<T, float>) {
      probabilities_with<B, T>(tokens / seq, token_major(qkv_t), probs);
    } else {
      const Buffer<T> heads_t = head_major_qkv<B>(tokens, qkv_t);
      probabilities_with<B, T>(tokens / seq, head_major(heads_t.data(), tokens / seq), probs);
    }
    return probs;
  }
  /** The probabilities from q, k, v already rearranged by `head_major_qkv`. */
  template <backend B, class T>
  [[nodiscard]] Buffer<float> probabilities(std::size_t tokens, HeadMajor<T> qkv_h) const {
    Buffer<float> probs;
    probabilities_with<B, T>(tokens / seq, head_major(qkv_h.p, tokens / seq), probs);
    return probs;
  }
  /**
   * The same attention through a backend's fused kernel (`fused_attention_backend`): `o` fp32 as `forward`
   * returns it; `o_heads` (the per-head output, storage type T) and `lse` (`[b, h, s]`) are what `fused_backward`
   * needs instead of the probabilities. Results equal `forward`'s to float rounding (fp32), or to 16-bit
   * rounding of the probabilities (which the fused kernels keep in fp32) under `Autocast`.
   */
  template <detail::fused_attention_backend B, class T>
  Activation fused_forward(const Activation& qkv, const T* qkv_t, Buffer<T>& o_heads, Buffer<float>& lse,
                           std::string_view who) const {
    const std::size_t nb = batch(qkv, who), hl = heads * head_dim;
    Activation o({qkv.extent(0), hl}, uninitialized);  // every element written by the kernel
    o_heads = B::template allocate<T>(qkv.extent(0) * hl);
    lse = B::template allocate<float>(nb * heads * seq);
    B::run(ops::attention_forward<T>{.nb = nb,
                                     .heads = heads,
                                     .seq = seq,
                                     .head_dim = head_dim,
                                     .scale = 1.0f / std::sqrt(float(head_dim)),
                                     .causal = true,
                                     .qkv = qkv_t,
                                     .o = o.data(),
                                     .o_heads = o_heads.data(),
                                     .lse = lse.data()});
    return o;
  }
  template <detail::fused_attention_backend B, class T>
  Activation fused_backward(std::size_t tokens, const T* qkv_t, const Buffer<T>& o_heads, const Buffer<float>& lse,
                            const Activation& dout, std::string_view who) const {
    const std::size_t hl = heads * head_dim;
    require(dout.extent(0) == tokens && dout.extent(1) == hl, who, ": output gradient is ", dout.extent(0), "x",
            dout.extent(1), ", expected ", tokens, "x", hl);
    Activation dqkv({tokens, 3 * hl}, uninitialized);
    B::run(ops::attention_backward<T>{.nb = tokens / seq,
                                      .heads = heads,
                                      .seq = seq,
                                      .head_dim = head_dim,
                                      .scale = 1.0f / std::sqrt(float(head_dim)),
                                      .causal = true,
                                      .qkv = qkv_t,
                                      .o_heads = o_heads.data(),
                                      .lse = lse.data(),
                                      .dout = dout.data(),
                                      .dqkv = dqkv.data()});
    return dqkv;
  }
  /** Whether `fused_forward` takes `tokens` tokens on backend B (false on a backend without fused attention). */
  template <backend B>
  [[nodiscard]] bool fused_applies(std::size_t tokens) const {
    if constexpr (detail::fused_attention_backend<B>)
      return B::attention_supports(tokens / seq * heads, head_dim);
    else
      return false;
  }

  /** The fp32 forms (the signatures other attention variants call). */
  template <backend B>
  Activation forward(const Activation& qkv, Buffer<float>& probs, std::string_view who) const {
    return forward<B, float>(qkv, qkv.data(), probs, who);
  }
  template <backend B>
  Activation backward(const Activation& qkv, const Buffer<float>& probs, const Activation& dout,
                      std::string_view who) const {
    (void)batch(qkv, who);
    return backward<B, float>(qkv.extent(0), qkv.data(), probs, dout, who);
  }

 private:
  /** q, k, v as the products read them: where (sequence b, head h) starts in each, and the leading dimension. */
  template <class T>
  struct QkvOperands {
    OperandOf<T> q, k, v;
  };
  /** In place in the `[tokens, 3 * heads * head_dim]` matrix: head h of sequence b at b*s*ld + h*d. */
  template <class T>
  [[nodiscard]] QkvOperands<T> token_major(const T* p) const {
    const std::size_t hl = heads * head_dim, ld = 3 * hl, s = seq, d = head_dim;
    return {{p, ld, s * ld, d}, {p + hl, ld, s * ld, d}, {p + 2 * hl, ld, s * ld, d}};
  }
  /** Three dense `[nb, heads, seq, head_dim]` blocks (`head_major_qkv`). */
  template <class T>
  [[nodiscard]] QkvOperands<T> head_major(const T* p, std::size_t nb) const {
    const std::size_t d = head_dim, matrix = seq * d, block = nb * heads * matrix;
    return {{p, d, heads * matrix, matrix},
            {p + block, d, heads * matrix, matrix},
            {p + 2 * block, d, heads * matrix, matrix}};
  }
  /**
   * `parts` column groups of `heads * head_dim` of a `[tokens, parts * heads * head_dim]` matrix as `parts` dense
   * `[nb, heads, seq, head_dim]` blocks, one `B::copy_2d_batched` per group (every element written).
   */
  template <backend B, class T>
  [[nodiscard]] Buffer<T> rearrange_heads(std::size_t tokens, std::size_t parts, const T* x) const {
    const std::size_t nb = tokens / seq, hl = heads * head_dim, ld = parts * hl, d = head_dim, matrix = seq * d;
    Buffer<T> out = B::template allocate<T>(parts * tokens * hl);
    for (std::size_t part = 0; part < parts; ++part)
      B::run(ops::copy_2d_batched<T>{.rows = seq,
                                     .cols = d,
                                     .src = x + part * hl,
                                     .src_ld = ld,
                                     .src_stride = BatchStrides{seq * ld, d},
                                     .dst = out.data() + part * tokens * hl,
                                     .dst_ld = d,
                                     .dst_stride = BatchStrides{heads * matrix, matrix},
                                     .batch = BatchExtents{nb, heads}});
    return out;
  }

  /** softmax(mask(q k^T / sqrt(d))) of `nb` sequences into `probs`: head h of sequence b at (b*heads + h)*s*s. */
  template <backend B, class T>
  void probabilities_with(std::size_t nb, QkvOperands<T> in, Buffer<float>& probs) const {
    const std::size_t s = seq;
    // Every element is written by the product and the softmax: no initialisation.
    probs = uninitialized_buffer<float>(nb * heads * s * s);
    per_head_gemm<B>(nb, Trans::no, Trans::yes, s, s, head_dim, 1.0f / std::sqrt(float(head_dim)), in.q, in.k,
                     probs.data(), s, heads * s * s, s * s);
    B::run(ops::softmax_forward{.rows = nb * heads * s,
                                .cols = s,
                                .x = probs.data(),
                                .y = probs.data(),
                                .causal = true});  // one causal softmax over all rows
  }

  template <backend B, class T>
  Activation forward_with(const Activation& qkv, QkvOperands<T> in, Buffer<float>& probs) const {
    const std::size_t nb = qkv.extent(0) / seq, hl = heads * head_dim, s = seq, d = head_dim;
    probabilities_with<B, T>(nb, in, probs);
    // Every element is written by the product below: no initialisation. Head h of sequence b at b*s*hl + h*d.
    Activation o({qkv.extent(0), hl}, uninitialized);
    const Buffer<T> p_t = as_operand<B, T>(probs);
    const OperandOf<T> p{operand_ptr(p_t, probs.data()), s, heads * s * s, s * s};
    per_head_gemm<B>(nb, Trans::no, Trans::no, s, d, s, 1.0f, p, in.v, o.data(), hl, s * hl, d);
    return o;
  }

  template <backend B, class T>
  Activation backward_with(std::size_t tokens, QkvOperands<T> in, const Buffer<float>& probs, const Activation& dout,
                           std::string_view who) const {
    const std::size_t hl = heads * head_dim, ld = 3 * hl, s = seq, d = head_dim, nb = tokens / s;
    require(dout.extent(0) == tokens && dout.extent(1) == hl, who, ": output gradient is ", dout.extent(0), "x",
            dout.extent(1), ", expected ", tokens, "x", hl);
    const float scale = 1.0f / std::sqrt(float(d));
    // dQ, dK, dV cover every column of dqkv and dP every element of dp: no initialisation.
    Activation dqkv({tokens, ld}, uninitialized);
    Buffer<float> dp = uninitialized_buffer<float>(probs.size());
    const Buffer<T> p_t = as_operand<B, T>(probs);
    const OperandOf<T> p{operand_ptr(p_t, probs.data()), s, heads * s * s, s * s};
    Buffer<T> do_t;  // 16-bit dO: converted, then rearranged dense like q, k, v
    const OperandOf<T> go = [&]() -> OperandOf<T> {
      if constexpr (std::is_same_v<T, float>) {
        return {dout.data(), hl, s * hl, d};
      } else {
        do_t = rearrange_heads<B>(tokens, 1, as_operand<B, T>(dout).data());
        return {do_t.data(), d, heads * s * d, s * d};
      }
    }();
    // fp32: dQ, dK, dV written in place into dqkv. 16-bit: into three dense [tokens, hl] blocks first, then
    // interleaved by one copy — oneDNN's AMX kernels take a strided destination only when it is a permutation
    // of a dense tensor (leading dimension hl, not 3 hl).
    constexpr bool in_place = std::is_same_v<T, float>;
    Buffer<float> separate = in_place ? Buffer<float>{} : uninitialized_buffer<float>(3 * tokens * hl);
    float* const dq = in_place ? dqkv.data() : separate.data();
    const std::size_t g_ld = in_place ? ld : hl, g_part = in_place ? hl : tokens * hl;
    per_head_gemm<B>(nb, Trans::yes, Trans::no, s, d, s, 1.0f, p, go, dq + 2 * g_part, g_ld, s * g_ld,
                     d);  // dV = P^T dO
    per_head_gemm<B>(nb, Trans::no, Trans::yes, s, s, d, 1.0f, go, in.v, dp.data(), s, heads * s * s,
                     s * s);  // dP = dO V^T
    B::run(ops::softmax_backward{.rows = nb * heads * s,
                                 .cols = s,
                                 .y = probs.data(),
                                 .dy = dp.data(),
                                 .dx = dp.data()});  // masked entries have p = 0, so dS = 0
    const Buffer<T> ds_t = as_operand<B, T>(dp);
    const OperandOf<T> ds{operand_ptr(ds_t, dp.data()), s, heads * s * s, s * s};
    per_head_gemm<B>(nb, Trans::no, Trans::no, s, d, s, scale, ds, in.k, dq, g_ld, s * g_ld, d);  // dQ = dS K
    per_head_gemm<B>(nb, Trans::yes, Trans::no, s, d, s, scale, ds, in.q, dq + g_part, g_ld, s * g_ld,
                     d);  // dK = dS^T Q
    if constexpr (!in_place)
      B::run(ops::copy_2d_batched<float>{.rows = tokens,
                                         .cols = hl,
                                         .src = separate.data(),
                                         .src_ld = hl,
                                         .src_stride = BatchStrides{0, tokens * hl},
                                         .dst = dqkv.data(),
                                         .dst_ld = ld,
                                         .dst_stride = BatchStrides{0, hl},
                                         .batch = BatchExtents{1, 3}});
    return dqkv;
  }

  /** fp32 data as a product's operand: nothing to do for float (an empty buffer; the caller reads `x`), else one `B::convert`. */
  template <backend B, class T, class X>
  static Buffer<T> as_operand(const X& x) {
    if constexpr (std::is_same_v<T, float>) {
      return {};
    } else {
      Buffer<T> h = B::template allocate<T>(x.size());
      B::run(ops::convert<float, T>{.n = x.size(), .src = x.data(), .dst = h.data()});
      return h;
    }
  }
  /** The operand `as_operand` made, or the fp32 original. */
  template <class T>
  static const T* operand_ptr(const Buffer<T>& converted, const float* x) {
    if constexpr (std::is_same_v<T, float>)
      return x;
    else
      return converted.data();
  }
};

namespace detail {
inline AttentionCore make_core(std::string_view who, std::size_t hidden, std::size_t heads, std::size_t seq,
                               std::size_t tp, std::size_t rank) {
  require(hidden > 0 && heads > 0 && seq > 0, who, ": hidden, heads and seq must be positive");
  require(hidden % heads == 0, who, ": hidden size ", hidden, " is not divisible by the number of heads ", heads);
  require(heads % tp == 0, who, " (tensor rank ", rank, "): ", heads,
          " heads are not divisible by the tensor-parallel size ", tp, "; attention is split by whole heads");
  return AttentionCore{heads / tp, hidden / heads, seq};
}

/**
 * What single-rank and tensor-parallel self-attention share: a QKV projection, the core (causal
 * attention over the heads this rank owns) and an output projection, with the per-micro-batch qkv and
 * attention probabilities kept from forward to backward. `Derived` supplies `layer_kind` for messages.
 */
template <class Derived, class Qkv, class Proj, backend B>
class AttentionLayer : public TypedLayer<Derived> {
  using Typed = TypedLayer<Derived>;

 public:
  using Typed::backward;
  using Typed::backward_input;  // the refusal of a bare tensor (this class's own typed B is below)
  using Typed::forward;         // the refusal of a bare tensor (this class's own typed forward is below)
  /**
   * Typed forward: QKV (column-parallel: the heads this rank owns, `Shard<1, tensor>`), the core on
   * those heads (still `Shard<1, tensor>`), the output projection (row-parallel: back to the input's
   * layout). Single-rank attention is the same chain with every shard the whole tensor.
   */
  template <class In>
  auto forward(const Act<In>& x, int mb = 0) {
    if constexpr (Derived::template check_input<In>()) {
      auto projected = qkv_.forward(x, mb);
      decltype(projected) qkv(self().qkv_for_core(std::move(projected).tensor()));
      auto& c = cache_.put(mb);
      const ComputeType t = autocast_type();  // read once: the backward follows what the forward did
      c.tokens = qkv.extent(0);
      if constexpr (detail::fused_attention_backend<B>) c.fused = core_.fused_applies<B>(c.tokens);
      if (t == ComputeType::fp32) {
        decltype(qkv) o(core_forward(qkv.tensor(), qkv.tensor().data(), c));
        c.qkv = make_operand<B>(std::move(qkv).tensor(), t);
        return proj_.forward(o, mb);
      }
      // Under Autocast the core's products take 16-bit q, k, v (converted once, kept for the backward instead
      // of the fp32 qkv) and 16-bit probabilities.
      c.qkv = make_operand<B>(qkv.tensor(), t);
      decltype(qkv) o(
          with_half(t, [&]<class T>(T) { return core_forward(qkv.tensor(), c.qkv.template half<T>(), c); }));
      return proj_.forward(o, mb);
    } else {
      return Act<typename Derived::default_input>{};  // refused above, with the layer's message
    }
  }
  /** B: through the output projection, the core and the QKV projection; both projections keep their W inputs. */
  template <class G>
  auto backward_input(const Act<G>& dy, int mb = 0) {
    auto dout = proj_.backward_input(dy, mb);
    auto c = cache_.take(mb, Derived::layer_kind);
    require(c.tokens % core_.seq == 0, Derived::layer_kind, ": ", c.tokens, " tokens are not whole sequences");
    decltype(dout) dqkv = c.qkv.type == ComputeType::fp32
                              ? decltype(dout)(core_backward(c.qkv.f32.data(), c, dout.tensor()))
                              : decltype(dout)(with_half(c.qkv.type, [&]<class T>(T) {
                                  return core_backward(c.qkv.template half<T>(), c, dout.tensor());
                                }));
    return qkv_.backward_input(decltype(dout)(self().projection_gradient(std::move(dqkv).tensor())), mb);
  }
  /** W: the weight gradients of both projections for micro-batch `mb` (the core has no weights). */
  void backward_weight(int mb = 0) {
    proj_.backward_weight(mb);
    qkv_.backward_weight(mb);
  }
  std::vector<Parameter*> parameters() {
    auto ps = qkv_.parameters();
    append(ps, proj_.parameters());
    return ps;
  }
  void drop(int mb) {
    qkv_.drop(mb);
    proj_.drop(mb);
    cache_.drop(mb);
  }
  [[nodiscard]] std::size_t in_features() const { return qkv_.in_features(); }
  [[nodiscard]] std::size_t out_features() const { return proj_.out_features(); }
  /**
   * Selective recomputation (Korthikanti et al. 2022; `Recompute::selective`): forward keeps q, k, v and the
   * projections' inputs but not the core's probabilities `[b, heads, s, s]`, and backward computes them again
   * from q and k with the same kernels, so every output and gradient is bit-identical to the layer without it.
   * It changes nothing where the backend's fused attention runs: that keeps no probabilities (only the rows'
   * log-sum-exp, from which its backward rebuilds them anyway). Read at each forward.
   */
  void set_selective_recompute(bool on) { selective_ = on; }
  [[nodiscard]] bool selective_recompute() const { return selective_; }

 protected:
  /** The projections are built by `make_qkv()` and `make_proj()` after the core's sizes were checked. */
  template <class MakeQkv, class MakeProj>
  AttentionLayer(AttentionCore core, MakeQkv make_qkv, MakeProj make_proj)
      : core_(core), qkv_(make_qkv()), proj_(make_proj()) {}

  AttentionCore core_;

  /**
   * The QKV projection's output as the core reads it, `[tokens, 3 * heads * head_dim]`: the projection's own output
   * here. A layer whose projection has another column order (grouped-query attention) or that transforms q and k
   * (rotary positions) hides these two with its own.
   */
  Activation qkv_for_core(Activation projected) { return projected; }
  /** The inverse map on the gradient: the core's dqkv as the projection's output gradient. */
  Activation projection_gradient(Activation dqkv) { return dqkv; }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
  struct Cache {
    std::size_t tokens = 0;
    GemmOperand qkv;      ///< fp32, or 16-bit under Autocast (head-major unless the fused kernel ran: core_forward)
    Buffer<float> probs;  ///< the probabilities `[b, h, s, s]`; on the fused path the log-sum-exp `[b, h, s]`
    bool fused = false;   ///< the backend's fused attention ran (`fused_attention_backend`)
    bool recompute_probs = false;  ///< selective recomputation dropped `probs`: the backward computes them again
    /** On the fused path: the per-head output its backward reads, in the type of the core's qkv. */
    struct {
      Buffer<float> f32;
      Buffer<bf16> b16;
      Buffer<f16> h16;
    } o_heads;
    template <class T>
    Buffer<T>& heads_output() {
      if constexpr (std::is_same_v<T, float>)
        return o_heads.f32;
      else if constexpr (std::is_same_v<T, bf16>)
        return o_heads.b16;
      else
        return o_heads.h16;
    }
  };
  /**
   * The core on this backend: its fused attention where it has one and takes the shape (chosen at compile
   * time; HostBackend compiles only the batched products), the batched GEMMs and the softmax otherwise.
   */
  template <class T>
  Activation core_forward(const Activation& qkv, const T* qkv_t, Cache& c) {
    if constexpr (detail::fused_attention_backend<B>) {
      if (c.fused) {
        return core_.fused_forward<B, T>(qkv, qkv_t, c.template heads_output<T>(), c.probs, Derived::layer_kind);
      }
    }
    Activation o = [&] {
      if constexpr (std::is_same_v<T, float>) {
        return core_.forward<B, T>(qkv, qkv_t, c.probs, Derived::layer_kind);
      } else {
        // The batched products' 16-bit q, k, v, rearranged once and kept for the backward in place of the
        // token-major conversion (AttentionCore::head_major_qkv says why).
        c.qkv.template half_storage<T>() = core_.head_major_qkv<B>(c.tokens, qkv_t);
        return core_.forward<B, T>(qkv, Head<T>{c.qkv.template half<T>()}, c.probs, Derived::layer_kind);
      }
    }();
    if (selective_) {  // freed now: the backward computes them again from q and k
      c.probs = Buffer<float>{};
      c.recompute_probs = true;
    }
    return o;
  }
  template <class T>
  Activation core_backward(const T* qkv_t, Cache& c, const Activation& dout) {
    if constexpr (detail::fused_attention_backend<B>) {
      if (c.fused) {
        return core_.fused_backward<B, T>(c.tokens, qkv_t, c.template heads_output<T>(), c.probs, dout,
                                          Derived::layer_kind);
      }
    }
    if constexpr (std::is_same_v<T, float>) {
      if (c.recompute_probs) c.probs = core_.probabilities<B, T>(c.tokens, qkv_t);
      return core_.backward<B, T>(c.tokens, qkv_t, c.probs, dout, Derived::layer_kind);
    } else {
      if (c.recompute_probs) c.probs = core_.probabilities<B, T>(c.tokens, Head<T>{qkv_t});
      return core_.backward<B, T>(c.tokens, Head<T>{qkv_t}, c.probs, dout, Derived::layer_kind);
    }
  }
  template <class T>
  using Head = AttentionCore::HeadMajor<T>;
  Qkv qkv_;
  Proj proj_;
  MicroBatchCache<Cache> cache_;
  bool selective_ = false;
};
}  // namespace detail

/** @brief Sizes and initialisation of an attention layer. */
struct AttentionConfig {
  std::size_t hidden = 0, heads = 0, seq = 0;
  std::uint64_t seed = 0, id_base = 0;  ///< QKV weight/bias get ids id_base, +1; the output projection +2, +3
  std::string name = "attn";
};

/**
 * @brief Single-rank causal self-attention: `Linear(h, 3h)` (`qkv`), the core, `Linear(h, h)` (`proj`).
 * Its QKV weight `[h, 3h]` has the same elements as SelfAttention's `[h, 3, h]`, so both start equal.
 */
template <backend B = HostBackend>
class Attention : public detail::AttentionLayer<Attention<B>, Linear<dyn, dyn, B>, Linear<dyn, dyn, B>, B> {
  using Base = detail::AttentionLayer<Attention<B>, Linear<dyn, dyn, B>, Linear<dyn, dyn, B>, B>;

 public:
  static constexpr std::string_view layer_kind = "Attention";
  using default_input = Replicate;
  static constexpr bool preserves_features = false;
  static constexpr std::size_t static_in_features = dyn, static_out_features = dyn;
  template <class L>
  static constexpr bool check_input() {
    return detail::check_whole_rows<Replicate, L>();
  }
  template <class L>
  using output_layout = Replicate;

  explicit Attention(const AttentionConfig& c)
      : Base(
            detail::make_core("Attention", c.hidden, c.heads, c.seq, 1, 0),
            [&] {
              return Linear<dyn, dyn, B>(c.hidden, 3 * c.hidden, {c.seed, c.id_base, c.name + ".qkv", true});
            },
            [&] {
              return Linear<dyn, dyn, B>(c.hidden, c.hidden, {c.seed, c.id_base + 2, c.name + ".proj", true});
            }) {}
};

/**
 * @brief Tensor-parallel causal self-attention split by heads: each tensor rank owns `heads / TP`
 * heads. QKV is one fused ColumnParallel (`[h, 3, h]`, groups = 3), the output projection a
 * RowParallel. Forward: one all-reduce (SP: all-gather + reduce-scatter); backward: one all-reduce
 * (SP: all-gather + reduce-scatter). `Heads % TP` is checked at compile time when both are static.
 */
template <communicator C, std::size_t Hidden = dyn, std::size_t Heads = dyn, std::size_t TP = dyn, bool SP = false,
          backend B = HostBackend>
class SelfAttention
    : public detail::AttentionLayer<
          SelfAttention<C, Hidden, Heads, TP, SP, B>,
          ColumnParallel<C, Hidden, Hidden, TP, ColumnOptions{SP, false, 3}, B>,
          RowParallel<C, Hidden, Hidden, TP, SP ? RowReduce::reduce_scatter : RowReduce::all_reduce, B>, B> {
  static_assert(statically_divisible_v<Heads, TP>,
                "mpar::nn::SelfAttention<C, Hidden, Heads, TP>: the static number of heads is not divisible by the "
                "static tensor-parallel size TP; attention is split by whole heads, so choose Heads a multiple of TP");
  static_assert(
      statically_divisible_v<Hidden, Heads>,
      "mpar::nn::SelfAttention<C, Hidden, Heads, TP>: Hidden is not divisible by Heads; head_dim = Hidden / Heads");
  using In = std::conditional_t<SP, TokenShard, Replicate>;
  using Qkv = ColumnParallel<C, Hidden, Hidden, TP, ColumnOptions{SP, false, 3}, B>;
  using Proj = RowParallel<C, Hidden, Hidden, TP, SP ? RowReduce::reduce_scatter : RowReduce::all_reduce, B>;
  using Base = detail::AttentionLayer<SelfAttention, Qkv, Proj, B>;

 public:
  static constexpr std::string_view layer_kind = "SelfAttention";
  using default_input = In;
  static constexpr bool preserves_features = false;
  static constexpr std::size_t static_in_features = Hidden, static_out_features = Hidden;
  template <class L>
  static constexpr bool check_input() {
    return detail::check_whole_rows<In, L>();
  }
  template <class L>
  using output_layout = In;

  SelfAttention(C& tp, const AttentionConfig& c)
      : Base(
            detail::make_core("SelfAttention '" + c.name + "'",
                              detail::reconcile(Hidden, c.hidden, layer_kind, "hidden"),
                              detail::reconcile(Heads, c.heads, layer_kind, "heads"), c.seq, std::size_t(tp.size()),
                              std::size_t(tp.rank())),
            [&] {
              return Qkv(tp, c.hidden, c.hidden, {c.seed, c.id_base, c.name + ".qkv", true});
            },
            [&] {
              return Proj(tp, c.hidden, c.hidden, {c.seed, c.id_base + 2, c.name + ".proj", true});
            }) {}

  [[nodiscard]] std::size_t local_heads() const { return this->core_.heads; }
};

}  // namespace mpar::nn
