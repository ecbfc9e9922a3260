#pragma once
/**
 * @file `CountingBackend<B>`: backend `B` with a per-rank count of what a training step asks of it —
 * operations issued (by kind), host synchronisations, and bytes of tensor memory host code touched.
 *
 * Use it wherever a backend type is a template argument (`GptTrainer<Comm, CountingBackend<HostBackend>>`)
 * and take `CountingBackend<B>::counts()` on each rank before and after a step; the difference is that
 * step's work. Counters are thread-local: a rank is a thread, and a backend's operations run on the
 * thread that issues them, so nothing is shared between ranks and the numbers are exact and reproducible.
 *
 * What is counted, and how:
 * - launches: one per backend operation (the operation objects of backend/ops/ where `B` runs them), by `Op` kind — a `copy_2d` is one
 *   launch whatever its number of rows, as it is one `cudaMemcpy2DAsync` on CUDA;
 * - host synchronisations: calls of `synchronize()` and event waits, plus — for a backend whose
 *   operations return only when finished (`operations_block_host<B>`, true for the synchronous
 *   backends) — one per launch, since every such call blocks the host until the work is done;
 * - graph launches: calls of `launch(g)` where `B` models `graph_backend` (one replay of a captured step,
 *   however many operations it holds; the operations recorded during the capture were counted when issued);
 * - host bytes: `host_access_bytes()` (core/host_access.hpp): bytes of tensor memory written or read by
 *   host code on the paths that announce it — a value-initialising or filling `Tensor` constructor,
 *   `Tensor::fill`, `Tensor` copies (read + write), `Parameter::zero_grad`, the layers' host loops and
 *   value-initialised `Buffer`s (each site calls `note_host_access`). Not counted: the communicators'
 *   own copies, and host code that does not announce its accesses (see docs/performance.md for the list).
 *
 * Operation objects (backend/ops/operation.hpp) are counted by one entry, `run`, under the kind of their name, so a
 * new operation is counted with no line here.
 */
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "mpar/backend/backend.hpp"
#include "mpar/backend/ops/operation.hpp"
#include "mpar/core/host_access.hpp"

namespace mpar::observe {

/** @brief The kinds of backend operation `CountingBackend` tells apart. */
enum class Op : std::size_t {
  gemm,        ///< same-type GEMM (fp32)
  gemm_mixed,  ///< 16-bit A and B, fp32 C
  gemm_strided_batched,
  add,
  bias_add_forward,
  bias_add_backward,
  gelu_forward,
  gelu_backward,
  softmax_forward,
  softmax_backward,
  layernorm_forward,
  layernorm_backward,
  dropout_apply,
  embedding_forward,
  embedding_backward,
  vocab_parallel_max,
  vocab_parallel_sumexp,
  vocab_parallel_backward,
  adamw_update,
  sgd_update,
  sum_squares,
  scale,
  gather_rows,
  scatter_rows,
  scatter_add_rows,
  scatter_add_rows_backward,
  zero,
  fill,
  copy,
  copy_2d,          ///< a strided block of rows copied in one operation
  copy_2d_batched,  ///< a two-level batch of such blocks in one operation
  convert,
  init_values,  ///< a parameter block's initial values written in rank memory
  vocab_parallel_loss,
  update_factors,
  gemm_bias_gelu,  ///< the MLP's first projection with its bias and GeLU (a GEMM)
  accumulate,      ///< a micro-batch's loss added to the step's statistics in rank memory
  adamw_advance,   ///< AdamW's step count and learning rate advanced in rank memory
  // MoE token routing (operation objects, backend/ops/token_routing.hpp)
  moe_route,
  moe_gate_stats,
  moe_aux_loss,
  moe_slots,
  moe_gate_backward,
  // The online-softmax steps of blockwise attention (online_softmax_backend: ring attention)
  online_softmax_update,
  online_softmax_finish,
  online_softmax_delta,
  online_softmax_backward,
  // The Llama-class layers' kernels (llama_kernel_backend), counted where `B` has them
  rmsnorm_forward,
  rmsnorm_backward,
  rope_forward,
  rope_backward,
  silu_gate_forward,
  silu_gate_backward,
  // The fused operations outside the `backend` concept (nn::fused_*_backend), counted where `B` has them
  gelu_backward_bias,  ///< GeLU's backward with the bias gradient and the 16-bit operand
  fused_classifier,    ///< softmax cross-entropy and its gradient in one pass
  residual_layernorm_forward,
  residual_layernorm_backward,
  attention_forward,  ///< attention over the QKV layout without the s x s scores
  attention_backward,
  other,  ///< an operation object (backend/ops/) whose name is none of the kinds above, e.g. a user's own
  kinds_  ///< the number of kinds
};
inline constexpr std::size_t op_kinds = std::size_t(Op::kinds_);
inline constexpr std::array<std::string_view, op_kinds> op_names{"gemm",
                                                                 "gemm_mixed",
                                                                 "gemm_strided_batched",
                                                                 "add",
                                                                 "bias_add_forward",
                                                                 "bias_add_backward",
                                                                 "gelu_forward",
                                                                 "gelu_backward",
                                                                 "softmax_forward",
                                                                 "softmax_backward",
                                                                 "layernorm_forward",
                                                                 "layernorm_backward",
                                                                 "dropout_apply",
                                                                 "embedding_forward",
                                                                 "embedding_backward",
                                                                 "vocab_parallel_max",
                                                                 "vocab_parallel_sumexp",
                                                                 "vocab_parallel_backward",
                                                                 "adamw_update",
                                                                 "sgd_update",
                                                                 "sum_squares",
                                                                 "scale",
                                                                 "gather_rows",
                                                                 "scatter_rows",
                                                                 "scatter_add_rows",
                                                                 "scatter_add_rows_backward",
                                                                 "zero",
                                                                 "fill",
                                                                 "copy",
                                                                 "copy_2d",
                                                                 "copy_2d_batched",
                                                                 "convert",
                                                                 "init_values",
                                                                 "vocab_parallel_loss",
                                                                 "update_factors",
                                                                 "gemm_bias_gelu",
                                                                 "accumulate",
                                                                 "adamw_advance",
                                                                 "moe_route",
                                                                 "moe_gate_stats",
                                                                 "moe_aux_loss",
                                                                 "moe_slots",
                                                                 "moe_gate_backward",
                                                                 "online_softmax_update",
                                                                 "online_softmax_finish",
                                                                 "online_softmax_delta",
                                                                 "online_softmax_backward",
                                                                 "rmsnorm_forward",
                                                                 "rmsnorm_backward",
                                                                 "rope_forward",
                                                                 "rope_backward",
                                                                 "silu_gate_forward",
                                                                 "silu_gate_backward",
                                                                 "gelu_backward_bias",
                                                                 "fused_classifier",
                                                                 "residual_layernorm_forward",
                                                                 "residual_layernorm_backward",
                                                                 "attention_forward",
                                                                 "attention_backward",
                                                                 "other"};

/**
 * @brief Whether backend `B`'s operations return only after their work finished (each one a host
 * synchronisation). True unless `B` says otherwise with `static constexpr bool operations_block_host = false`
 * (a stream-ordered backend whose operations return at once).
 */
template <class B>
inline constexpr bool operations_block_host = [] {
  if constexpr (requires { B::operations_block_host; })
    return bool(B::operations_block_host);
  else
    return true;
}();

/** @brief What one rank asked of its backend (a snapshot, or the difference of two). */
struct BackendCounts {
  std::array<std::uint64_t, op_kinds> launches{};
  std::uint64_t synchronize_calls = 0;  ///< explicit `synchronize()`
  std::uint64_t event_waits = 0;        ///< host waits on an event (stream-ordered backends)
  std::uint64_t graph_launches = 0;     ///< replays of a captured graph (`graph_backend`'s `launch`)
  std::uint64_t host_bytes = 0;         ///< `host_access_bytes()` at the snapshot
  bool operations_block = true;         ///< whether every launch also blocked the host

  [[nodiscard]] std::uint64_t operator[](Op k) const { return launches[std::size_t(k)]; }
  [[nodiscard]] std::uint64_t total_launches() const {
    std::uint64_t n = 0;
    for (auto v : launches) n += v;
    return n;
  }
  [[nodiscard]] std::uint64_t gemms() const {
    return (*this)[Op::gemm] + (*this)[Op::gemm_mixed] + (*this)[Op::gemm_strided_batched] +
           (*this)[Op::gemm_bias_gelu];
  }
  /** Times the host waited for the backend: explicit synchronisations and event waits, plus every launch of a blocking backend. */
  [[nodiscard]] std::uint64_t host_syncs() const {
    return synchronize_calls + event_waits + (operations_block ? total_launches() : 0);
  }
  [[nodiscard]] friend BackendCounts operator-(BackendCounts a, const BackendCounts& b) {
    for (std::size_t i = 0; i < op_kinds; ++i) a.launches[i] -= b.launches[i];
    a.synchronize_calls -= b.synchronize_calls;
    a.event_waits -= b.event_waits;
    a.graph_launches -= b.graph_launches;
    a.host_bytes -= b.host_bytes;
    return a;
  }
  /** `kind=count` for every kind issued, e.g. "gemm=120 add=8". */
  [[nodiscard]] std::string by_kind() const {
    std::string s;
    for (std::size_t i = 0; i < op_kinds; ++i)
      if (launches[i]) s += (s.empty() ? "" : " ") + std::string(op_names[i]) + "=" + std::to_string(launches[i]);
    return s;
  }
};

/**
 * @brief Backend `B`, counting on the calling thread (see the file comment). Every counted operation
 * forwards its arguments to `B`'s unchanged.
 */
template <backend B>
struct CountingBackend : B {
  static constexpr const char* name = "counting";

  /** This thread's counts so far (the host bytes read from `host_access_bytes()` now). */
  [[nodiscard]] static BackendCounts counts() {
    BackendCounts c = state();
    c.host_bytes = host_access_bytes();
    c.operations_block = operations_block_host<B>;
    return c;
  }

  static void synchronize() {
    ++state().synchronize_calls;
    B::synchronize();
  }
  /** A host wait on an event is a host synchronisation too. */
  template <class E>
  static void wait_event(E& e) {
    ++state().event_waits;
    B::wait_event(e);
  }

  /** One replay of a captured graph (where `B` models `graph_backend`): one launch, whatever it holds. */
  template <class G>
    requires requires(const G& g) { B::launch(g); }
  static void launch(const G& g) {
    ++state().graph_launches;
    B::launch(g);
  }

  /**
   * An operation object (backend/ops/operation.hpp), counted under the kind of its name (`Op::other` where it has
   * none) and run by `B`. Constrained on `B` running it, so that the counting backend supports exactly what `B` does.
   */
  template <class O>
    requires supports<B, O>
  static void run(const O& op) {
    static constexpr Op kind = kind_of(O::name);  // found once per operation type, at compile time
    note(kind);
    B::run(op);
  }

 private:
  static BackendCounts& state() {
    thread_local BackendCounts c;
    return c;
  }
  static void note(Op k) { ++state().launches[std::size_t(k)]; }
  static constexpr Op kind_of(std::string_view name) {
    for (std::size_t k = 0; k < op_kinds; ++k)
      if (op_names[k] == name) return Op(k);
    return Op::other;
  }
};

}  // namespace mpar::observe
