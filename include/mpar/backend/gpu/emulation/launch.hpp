#pragma once
/**
 * @file A kernel launch under the emulation (what MPAR_LAUNCH expands to, backend/gpu/runtime.hpp): the kernel's
 * pointer arguments are translated from device addresses (which the host cannot touch) to the readable view of
 * the same memory, then every thread of the grid runs the kernel with them (emulation/simt.hpp).
 *
 * A non-null pointer argument that is not device memory is a host pointer handed to a kernel, which faults on a
 * GPU: the launch throws emulation_error naming the kernel and the argument. After the grid ran, a write past the
 * end of any allocation throws too (memory.hpp, red zones). Pointers inside a struct passed by value are
 * translated when the struct says where they are (`for_each_device_pointer(f)`, as gpu::DeviceCommunicator's peer
 * pointers do); no other struct argument may hold one.
 */
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "mpar/backend/gpu/emulation/graphs.hpp"
#include "mpar/backend/gpu/emulation/memory.hpp"
#include "mpar/backend/gpu/emulation/simt.hpp"
#include "mpar/backend/gpu/emulation/types.hpp"

namespace mpar::gpu::emulation {

namespace detail {
template <class A>
A device_argument(const char* kernel, std::size_t index, A a) {
  if constexpr (std::is_pointer_v<A> && !std::is_function_v<std::remove_pointer_t<A>>) {
    if (a == nullptr) return a;
    void* view = device_view(a);
    if (view == nullptr)
      throw emulation_error(mpar::detail::cat("launch of ", kernel, ": argument ", index + 1, " (", (const void*)a,
                                              ") is host memory; a kernel can only reach device memory (cudaMalloc)"));
    return static_cast<A>(view);
  } else if constexpr (requires(A & s) { s.for_each_device_pointer([](auto*&) {}); }) {
    a.for_each_device_pointer([&](auto*& p) { p = device_argument(kernel, index, p); });
    return a;
  } else {
    return a;
  }
}
}  // namespace detail

/**
 * @brief One launch: the kernel (as a callable that forwards its arguments to it) and its configuration;
 * calling it with the kernel's arguments runs the grid at once, or, on a capturing stream, checks the arguments and
 * records the launch (emulation/graphs.hpp).
 */
template <class Kernel>
class Launch {
 public:
  Launch(const char* name, dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream, Kernel kernel)
      : name_(name), grid_(grid), block_(block), shared_bytes_(shared_bytes), stream_(stream), kernel_(kernel) {}

  template <class... Args>
  void operator()(Args... args) const {
    auto device_args = translate(std::index_sequence_for<Args...>{}, args...);
    const cudaError_t e = run_or_record(stream_, [launch = *this, device_args] { launch.run(device_args); });
    if (e != cudaSuccess)
      throw emulation_error(mpar::detail::cat("launch of ", name_, " on the legacy default stream during a capture"));
  }

 private:
  /** The arguments as the kernel reaches them: device pointers as their readable view, host pointers refused. */
  template <std::size_t... I, class... Args>
  std::tuple<Args...> translate(std::index_sequence<I...>, Args... args) const {
    return std::tuple<Args...>{detail::device_argument(name_, I, args)...};
  }
  template <class... Args>
  void run(const std::tuple<Args...>& device_args) const {
    struct Call {
      const Kernel* kernel;
      const std::tuple<Args...>* args;
    } call{&kernel_, &device_args};
    Executor::here().run(
        name_, grid_, block_, shared_bytes_,
        [](const void* c) {
          const Call& k = *static_cast<const Call*>(c);
          std::apply(*k.kernel, *k.args);  // each thread gets its own copies, as by-value parameters
        },
        &call);
    DeviceAllocations::instance().check_red_zones(name_);
  }

  const char* name_;
  dim3 grid_, block_;
  std::size_t shared_bytes_;
  cudaStream_t stream_;
  Kernel kernel_;
};

}  // namespace mpar::gpu::emulation
