// Static tests of the backend concept families: every backend models each family and their
// conjunction; a type that provides one family models that family only, so code that requires
// `gemm_backend` (say) accepts it where `backend` would not.
#include <cstddef>
#include <mpar/backend/backend.hpp>
#include <mpar/backend/detail/graph_backend.hpp>
#include <mpar/backend/host/host_backend.hpp>
#include <mpar/backend/stream/stream_backend.hpp>
#include <mpar/observe/counting_backend.hpp>

namespace {
using namespace mpar;

template <class B>
constexpr bool every_family = mpar::detail::memory_backend<B>&& mpar::detail::gemm_backend<B>&&
    mpar::detail::layer_kernel_backend<B>&& mpar::detail::optimizer_backend<B>&& mpar::detail::routing_backend<B>;

static_assert(backend<HostBackend> && every_family<HostBackend>);
static_assert(backend<StreamHostBackend> && every_family<StreamHostBackend>);
static_assert(backend<observe::CountingBackend<HostBackend>> && every_family<observe::CountingBackend<HostBackend>>);
static_assert(mpar::detail::stream_ordered<HostBackend> && mpar::detail::stream_ordered<StreamHostBackend>);

/** Only the routing rows: a routing backend and nothing else. */
struct RoutingOnly {
  static void gather_rows(std::size_t, std::size_t, const std::int32_t*, const float*, float*) {}
  static void scatter_rows(std::size_t, std::size_t, const std::int32_t*, const float*, float*) {}
  static void scatter_add_rows(std::size_t, std::size_t, const std::int32_t*, const float*, const float*, float*) {}
  static void scatter_add_rows_backward(std::size_t, std::size_t, const std::int32_t*, const float*, const float*,
                                        const float*, float*, float*) {}
  // the MoE routing decisions and the operations around them
  static void moe_route(std::size_t, std::size_t, std::size_t, std::size_t, const float*, std::int32_t*, std::uint8_t*,
                        std::int32_t*, std::int32_t*, float*, std::int32_t*, std::int32_t*) {}
  static void moe_gate_stats(std::size_t, std::size_t, std::size_t, const float*, const std::int32_t*,
                             const std::int32_t*, float*) {}
  static void moe_aux_loss(std::size_t, std::size_t, float, const float*, float*) {}
  static void moe_slots(std::size_t, std::size_t, const std::int32_t*, const std::int32_t*, const float*, std::int32_t*,
                        float*) {}
  static void moe_gate_backward(std::size_t, std::size_t, std::size_t, std::size_t, const std::int32_t*, const float*,
                                float, float, const float*, float*) {}
};
static_assert(mpar::detail::routing_backend<RoutingOnly>);
static_assert(!mpar::detail::gemm_backend<RoutingOnly> && !mpar::detail::layer_kernel_backend<RoutingOnly> &&
              !mpar::detail::optimizer_backend<RoutingOnly> && !mpar::detail::memory_backend<RoutingOnly> &&
              !backend<RoutingOnly>);
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
