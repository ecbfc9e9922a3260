#pragma once
/**
 * @file Device memory under the emulation: `cudaMalloc` and friends hand out memory the host cannot touch.
 *
 * Allocations come from the stream emulation's `DiscreteMemoryResource` (backend/stream/emulated_memory.hpp): a
 * memfd mapped twice, the address the caller gets `PROT_NONE`, so any host read or write of device memory
 * faults as it would on a GPU. Copies, sets and kernels reach the bytes through the other, readable mapping
 * (`device_view`). A fresh allocation is filled with 0xFF (NaN in every float type), as device memory holds
 * garbage. Copies check their direction and their bounds against the allocation; never managed memory.
 *
 * Each allocation is followed by a red zone: 256 bytes of one byte value per allocation, 0xE0 to 0xEF (a large
 * negative float, never NaN, so that a value computed from NaN-filled memory cannot pass for the zone, and
 * two neighbours rarely share the value, so that copying one zone into another shows). After every launch the
 * red zones are checked: a kernel that writes past the end of an allocation (an index off by one) fails with its
 * name instead of corrupting a neighbour silently.
 */
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <new>

#include "mpar/backend/gpu/emulation/capture_state.hpp"
#include "mpar/backend/gpu/emulation/error.hpp"
#include "mpar/backend/gpu/emulation/types.hpp"
#include "mpar/backend/stream/emulated_memory.hpp"
#include "mpar/core/error.hpp"

namespace mpar::gpu::emulation {

/** The readable address of device memory `p` (what kernels and copies use); null if `p` is not device memory. */
[[nodiscard]] inline void* device_view(const void* p) {
  return p ? stream::discrete_memory_resource().operation_address(p) : nullptr;
}

/** @brief The live `cudaMalloc` allocations: frees, copies, sets and red zones are checked against them. */
class DeviceAllocations {
 public:
  [[nodiscard]] static DeviceAllocations& instance() {
    static auto* a = new DeviceAllocations;  // never destroyed: memory may be freed from static destructors
    return *a;
  }
  /** Bytes after each allocation that no kernel may write. */
  static constexpr std::size_t red_zone_bytes = 256;

  void* allocate(std::size_t bytes) {
    void* p = stream::discrete_memory_resource().allocate(bytes + red_zone_bytes);  // all 0xFF
    std::lock_guard lock(m_);
    const auto zone_byte = static_cast<unsigned char>(0xE0u | (next_zone_byte_++ & 0x0Fu));
    std::memset(static_cast<unsigned char*>(device_view(p)) + bytes, zone_byte, red_zone_bytes);
    live_[reinterpret_cast<std::uintptr_t>(p)] = {bytes, zone_byte};
    return p;
  }
  /** False when `p` is not the base of a live allocation. */
  bool free(void* p) {
    std::size_t bytes = 0;
    {
      std::lock_guard lock(m_);
      auto it = live_.find(reinterpret_cast<std::uintptr_t>(p));
      if (it == live_.end()) return false;
      bytes = it->second.bytes;
      live_.erase(it);
    }
    stream::discrete_memory_resource().deallocate(p, bytes + red_zone_bytes);
    return true;
  }
  /**
   * Throws emulation_error naming `kernel` if a red zone changed, and restores it (so one bad write is reported
   * once). Run after each launch; with launches on several host threads at once the blame may land on another.
   */
  void check_red_zones(const char* kernel) {
    std::lock_guard lock(m_);
    for (const auto& [base, a] : live_) {
      auto* zone = static_cast<unsigned char*>(device_view(reinterpret_cast<const void*>(base))) + a.bytes;
      for (std::size_t i = 0; i < red_zone_bytes; ++i)
        if (zone[i] != a.zone_byte) {
          std::memset(zone, a.zone_byte, red_zone_bytes);
          throw emulation_error(mpar::detail::cat("kernel ", kernel, " wrote past the end of a device allocation of ",
                                                  a.bytes, " bytes (byte ", i, " after its end changed): an index ",
                                                  "out of range"));
        }
    }
  }
  /** Whether `[p, p + bytes)` lies inside one live allocation. */
  [[nodiscard]] bool covers(const void* p, std::size_t bytes) const {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard lock(m_);
    auto it = live_.upper_bound(a);
    if (it == live_.begin()) return false;
    --it;
    return a + bytes <= it->first + it->second.bytes;
  }

 private:
  struct Allocation {
    std::size_t bytes = 0;
    unsigned char zone_byte = 0;  // the value of every byte of its red zone
  };
  mutable std::mutex m_;
  std::map<std::uintptr_t, Allocation> live_;  // by base address
  unsigned next_zone_byte_ = 0;
};

namespace detail {
/** The address a copy reads or writes for `p`, which `kind` says is device (or host) memory; null if it is not. */
inline void* copy_address(const void* p, std::size_t bytes, bool device) {
  if (!device) return device_view(p) ? nullptr : const_cast<void*>(p);
  return DeviceAllocations::instance().covers(p, bytes) ? device_view(p) : nullptr;
}
}  // namespace detail

}  // namespace mpar::gpu::emulation

namespace mpar::gpu::emulation::detail {
/**
 * Checks a copy of `bytes` (each side what `kind` says: device memory inside one allocation, or host memory) and,
 * with `perform`, makes it. A capture checks when it records and copies when it replays.
 */
inline cudaError_t copy_bytes(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, bool perform) {
  if (bytes == 0) return cudaSuccess;
  if (kind == cudaMemcpyDefault) kind = cudaMemcpyKind((device_view(src) ? 2 : 0) + (device_view(dst) ? 1 : 0));
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDeviceToDevice) return cudaErrorInvalidMemcpyDirection;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  void* to = copy_address(dst, bytes, dst_device);
  const void* from = copy_address(src, bytes, src_device);
  if (to == nullptr || from == nullptr) return cudaErrorInvalidValue;
  if (perform) std::memmove(to, from, bytes);
  return cudaSuccess;
}
/** `height` rows of `width` bytes, `spitch` and `dpitch` bytes apart, each row as `copy_bytes`. */
inline cudaError_t copy_rows(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                             std::size_t height, cudaMemcpyKind kind, bool perform) {
  if (width > dpitch || width > spitch) return cudaErrorInvalidValue;
  for (std::size_t r = 0; r < height; ++r)
    if (const cudaError_t e = copy_bytes(static_cast<char*>(dst) + r * dpitch,
                                         static_cast<const char*>(src) + r * spitch, width, kind, perform);
        e != cudaSuccess)
      return e;
  return cudaSuccess;
}
/** Checks a set of `bytes` of device memory and, with `perform`, makes it. */
inline cudaError_t set_bytes(void* p, int value, std::size_t bytes, bool perform) {
  if (bytes == 0) return cudaSuccess;
  void* to = copy_address(p, bytes, true);
  if (to == nullptr) return cudaErrorInvalidValue;
  if (perform) std::memset(to, value, bytes);
  return cudaSuccess;
}
}  // namespace mpar::gpu::emulation::detail

// The synchronous calls: CUDA refuses them on a capturing thread (they wait on the device), so does the emulation.
// Their stream-ordered forms, which a capture records, are in emulation/graphs.hpp.
inline cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  if (p == nullptr) return cudaErrorInvalidValue;
  if (::mpar::gpu::emulation::capturing())
    return ::mpar::gpu::emulation::fail_capture(cudaErrorStreamCaptureUnsupported);
  *p = ::mpar::gpu::emulation::DeviceAllocations::instance().allocate(bytes);
  return cudaSuccess;
}
template <class T>
cudaError_t cudaMalloc(T** p, std::size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
inline cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  if (::mpar::gpu::emulation::capturing())
    return ::mpar::gpu::emulation::fail_capture(cudaErrorStreamCaptureUnsupported);
  return ::mpar::gpu::emulation::DeviceAllocations::instance().free(p) ? cudaSuccess : cudaErrorInvalidDevicePointer;
}

/** Copies `bytes`; each side must be what `kind` says (device memory inside one allocation, or host memory). */
inline cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  if (::mpar::gpu::emulation::capturing())
    return ::mpar::gpu::emulation::fail_capture(cudaErrorStreamCaptureUnsupported);
  return ::mpar::gpu::emulation::detail::copy_bytes(dst, src, bytes, kind, true);
}
/** Copies `height` rows of `width` bytes, `spitch` and `dpitch` bytes apart, checked row by row as cudaMemcpy. */
inline cudaError_t cudaMemcpy2D(void* dst, std::size_t dpitch, const void* src, std::size_t spitch, std::size_t width,
                                std::size_t height, cudaMemcpyKind kind) {
  if (::mpar::gpu::emulation::capturing())
    return ::mpar::gpu::emulation::fail_capture(cudaErrorStreamCaptureUnsupported);
  return ::mpar::gpu::emulation::detail::copy_rows(dst, dpitch, src, spitch, width, height, kind, true);
}
enum cudaMemoryType : int {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3,
};
struct cudaPointerAttributes {
  cudaMemoryType type = cudaMemoryTypeUnregistered;
  int device = 0;
  void* devicePointer = nullptr;
  void* hostPointer = nullptr;
};
/** Device memory (from `cudaMalloc` and friends) or not; page-locked host memory reads as unregistered here. */
inline cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  if (a == nullptr) return cudaErrorInvalidValue;
  *a = {};
  if (::mpar::gpu::emulation::DeviceAllocations::instance().covers(p, 1)) {
    a->type = cudaMemoryTypeDevice;
    a->devicePointer = const_cast<void*>(p);
  } else {
    a->hostPointer = const_cast<void*>(p);
  }
  return cudaSuccess;
}

/** Page-locked host memory is plain host memory here: the host reads and writes it, kernels may not. */
inline cudaError_t cudaMallocHost(void** p, std::size_t bytes) {
  if (p == nullptr) return cudaErrorInvalidValue;
  *p = ::operator new(bytes == 0 ? 1 : bytes);
  return cudaSuccess;
}
template <class T>
cudaError_t cudaMallocHost(T** p, std::size_t bytes) {
  return cudaMallocHost(reinterpret_cast<void**>(p), bytes);
}
inline cudaError_t cudaFreeHost(void* p) {
  ::operator delete(p);
  return cudaSuccess;
}

inline cudaError_t cudaMemset(void* p, int value, std::size_t bytes) {
  if (::mpar::gpu::emulation::capturing())
    return ::mpar::gpu::emulation::fail_capture(cudaErrorStreamCaptureUnsupported);
  return ::mpar::gpu::emulation::detail::set_bytes(p, value, bytes, true);
}
