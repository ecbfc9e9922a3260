#pragma once
/**
 * @file Backend operations as objects: what an operation object is, and `supports<B, Op>`, whether backend `B`
 * runs it.
 *
 * An operation object (`mpar::ops::rmsnorm_forward`, ...) is an aggregate of named arguments, built at the call
 * with designated initialisers (`B::run(ops::rmsnorm_forward{.rows = r, .cols = n, ...})`), so a call names what it
 * passes instead of listing ten pointers in order. Its header (one per operation family, backend/ops/) holds:
 * - `static constexpr const char* name`: the operation's name in errors, traces and counts;
 * - its arguments as public members, pointers into rank memory among them;
 * - `each_operand(f)`: calls `f` on (a reference to) each pointer member that points into rank memory, in a fixed
 *   order, so that a decorator which moves rank memory (DiscreteHostBackend's second mapping, an emulated device)
 *   translates them without knowing the operation; a template, not a tuple, so that an operation costs nothing to
 *   compile until a decorator visits it;
 * - its contract (what it reads, writes or accumulates, and which arguments may alias), in the comment;
 * - `host_reference(const Op&)`: the plain-loop reference found by argument-dependent lookup, which HostBackend
 *   runs and every other backend is tested against.
 *
 * A backend runs an operation through one entry, `B::run(op)`. HostBackend runs every operation that has a host
 * reference; the stream, discrete-memory and counting decorators wrap `run` once for every operation; CudaBackend
 * runs those with a `gpu::launch(op)` overload. A new operation is therefore its header plus, for CUDA, its kernels.
 */
#include <concepts>

namespace mpar {

/**
 * @brief Whether backend `B` runs operation `Op` (`B::run(op)` is well formed). A capability trait, not a concept:
 * layers state what they call with it, e.g. `static_assert(supports<B, ops::rope_forward>, ...)` or
 * `requires supports<B, ops::rmsnorm_forward>`.
 */
template <class B, class Op>
inline constexpr bool supports = requires(const Op& op) {
  B::run(op);
};

namespace ops {

/** @brief Whether `Op` has a plain-loop host reference (`host_reference(op)`, found by argument-dependent lookup). */
template <class Op>
inline constexpr bool has_host_reference = requires(const Op& op) {
  host_reference(op);
};

}  // namespace ops
}  // namespace mpar
