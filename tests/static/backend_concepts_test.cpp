// Static tests of the backend concept families: every backend models each family and their
// conjunction; a type that provides one family models that family only, so code that requires
// `gemm_backend` (say) accepts it where `backend` would not; the optional families (operation objects) can be left
// out of a backend.
#include <cstddef>
#include <mpar/backend/backend.hpp>
#include <mpar/backend/detail/graph_backend.hpp>
#include <mpar/backend/detail/llama_kernel_backend.hpp>
#include <mpar/backend/detail/routing_backend.hpp>
#include <mpar/backend/host/host_backend.hpp>
#include <mpar/backend/stream/stream_backend.hpp>
#include <mpar/observe/counting_backend.hpp>
#include <type_traits>

namespace {
using namespace mpar;

template <class B>
constexpr bool every_family =
    mpar::detail::memory_backend<B>&& mpar::detail::gemm_backend<B>&& mpar::detail::layer_kernel_backend<B>&&
        mpar::detail::optimizer_backend<B>&& mpar::detail::routing_backend<B>&& mpar::detail::llama_kernel_backend<B>;

static_assert(backend<HostBackend> && every_family<HostBackend>);
static_assert(backend<StreamHostBackend> && every_family<StreamHostBackend>);
static_assert(backend<observe::CountingBackend<HostBackend>> && every_family<observe::CountingBackend<HostBackend>>);
static_assert(mpar::detail::stream_ordered<HostBackend> && mpar::detail::stream_ordered<StreamHostBackend>);

template <class Op>
constexpr bool is_routing_op =
    std::is_same_v<Op, ops::gather_rows> || std::is_same_v<Op, ops::scatter_rows> ||
    std::is_same_v<Op, ops::scatter_add_rows> || std::is_same_v<Op, ops::scatter_add_rows_backward> ||
    std::is_same_v<Op, ops::moe_route> || std::is_same_v<Op, ops::moe_gate_stats> ||
    std::is_same_v<Op, ops::moe_aux_loss> || std::is_same_v<Op, ops::moe_slots> ||
    std::is_same_v<Op, ops::moe_gate_backward>;

/** Only the token-routing operations: a routing backend and nothing else. */
struct RoutingOnly {
  template <class Op>
    requires is_routing_op<Op>
  static void run(const Op& op) { host_reference(op); }
};
static_assert(mpar::detail::routing_backend<RoutingOnly>);
static_assert(!mpar::detail::gemm_backend<RoutingOnly> && !mpar::detail::layer_kernel_backend<RoutingOnly> &&
              !mpar::detail::optimizer_backend<RoutingOnly> && !mpar::detail::memory_backend<RoutingOnly> &&
              !backend<RoutingOnly> && !mpar::detail::llama_kernel_backend<RoutingOnly>);
/** Routing is optional: a backend without it is still a backend (only the MoE layer refuses it). */
struct HostWithoutRouting : HostBackend {
  template <class Op>
    requires(!is_routing_op<Op>)
  static void run(const Op& op) { HostBackend::run(op); }
};
static_assert(backend<HostWithoutRouting> && !mpar::detail::routing_backend<HostWithoutRouting> &&
              mpar::detail::llama_kernel_backend<HostWithoutRouting>);
static_assert(!backend<int> && !mpar::detail::gemm_backend<int> && !mpar::detail::memory_backend<int>);

// Capture is a capability of its own: the stream backends (and a counting wrapper of one) have it, HostBackend,
// whose operations have run when they return, does not; the capture members alone make no backend.
static_assert(mpar::detail::graph_backend<StreamHostBackend> && mpar::detail::graph_backend<DiscreteHostBackend> &&
              mpar::detail::graph_backend<observe::CountingBackend<StreamHostBackend>>);
static_assert(!mpar::detail::graph_backend<HostBackend> &&
              !mpar::detail::graph_backend<observe::CountingBackend<HostBackend>>);
struct CaptureOnly {
  struct graph_type {};
  static void begin_capture() {}
  static graph_type end_capture() { return {}; }
  static void launch(const graph_type&) {}
};
static_assert(mpar::detail::graph_backend<CaptureOnly> && !backend<CaptureOnly>);
struct CaptureWithoutLaunch {
  struct graph_type {};
  static void begin_capture() {}
  static graph_type end_capture() { return {}; }
};
static_assert(!mpar::detail::graph_backend<CaptureWithoutLaunch> && !mpar::detail::graph_backend<int>);
}  // namespace
