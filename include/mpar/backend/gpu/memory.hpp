#pragma once
/**
 * @file Device memory, streams and events as RAII types, and host <-> device copies.
 *
 * Allocation is stream-ordered (cudaMallocAsync / cudaFreeAsync): a buffer is allocated and freed
 * in the order of its stream, so freeing a temporary right after the kernel that uses it is safe
 * and returns memory to the pool without a device-wide synchronisation.
 */
#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/backend/gpu/cuda_error.hpp"
#include "mpar/backend/gpu/runtime.hpp"  // the CUDA runtime, or its emulation
#include "mpar/core/dtype.hpp"

namespace mpar::gpu {

/** @brief An owned CUDA stream (non-blocking with respect to the legacy default stream). */
class Stream {
 public:
  Stream() { check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
  /** A stream with a priority (lower number = higher priority), e.g. for communication. */
  explicit Stream(int priority) {
    check(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, priority), "cudaStreamCreateWithPriority");
  }
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { reset(); }

  [[nodiscard]] cudaStream_t get() const { return s_; }
  operator cudaStream_t() const { return s_; }
  void synchronize() const { check(cudaStreamSynchronize(s_), "cudaStreamSynchronize"); }

 private:
  void reset() noexcept {
    if (s_) (void)cudaStreamDestroy(s_);
    s_ = nullptr;
  }
  cudaStream_t s_ = nullptr;
};

/** @brief An owned CUDA event; timing is off unless asked for, which makes record/wait cheaper. */
class Event {
 public:
  explicit Event(bool timing = false) {
    check(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming), "cudaEventCreate");
  }
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    if (this != &o) {
      if (e_) (void)cudaEventDestroy(e_);
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (e_) (void)cudaEventDestroy(e_);
  }

  [[nodiscard]] cudaEvent_t get() const { return e_; }
  void record(cudaStream_t s) const { check(cudaEventRecord(e_, s), "cudaEventRecord"); }
  /** Makes `s` wait (on the device, not the host) until the work recorded in this event is done. */
  void wait_on(cudaStream_t s) const { check(cudaStreamWaitEvent(s, e_, 0), "cudaStreamWaitEvent"); }
  /** Whether the recorded work is done; throws on an execution error. */
  [[nodiscard]] bool ready() const {
    const cudaError_t st = cudaEventQuery(e_);
    if (st == cudaErrorNotReady) return false;
    check(st, "cudaEventQuery");
    return true;
  }
  void synchronize() const { check(cudaEventSynchronize(e_), "cudaEventSynchronize"); }
  /** Milliseconds between two timing events. */
  [[nodiscard]] static float elapsed_ms(const Event& start, const Event& stop) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start.e_, stop.e_), "cudaEventElapsedTime");
    return ms;
  }

 private:
  cudaEvent_t e_ = nullptr;
};

/**
 * @brief An owning, contiguous device array of `T`, allocated and freed in the order of a stream.
 *
 * The buffer remembers its stream; it is freed on that stream, so it must outlive (in stream
 * order) every kernel that reads it — which stream order gives for free on the same stream.
 */
template <class T>
  requires std::is_trivially_copyable_v<T>
class DeviceBuffer {
 public:
  using value_type = T;
  DeviceBuffer() = default;
  DeviceBuffer(std::size_t n, cudaStream_t stream) : n_(n), stream_(stream) {
    if (n_ == 0) return;
    void* p = nullptr;
    const cudaError_t st = cudaMallocAsync(&p, n_ * sizeof(T), stream_);
    if (st != cudaSuccess) {
      (void)cudaGetLastError();
      throw cuda_error(mpar::detail::cat("cudaMallocAsync of ", n_, " elements (", n_ * sizeof(T),
                                         " bytes) failed: ", cudaGetErrorString(st)));
    }
    p_ = static_cast<T*>(p);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)), stream_(o.stream_) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
      stream_ = o.stream_;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { release(); }

  [[nodiscard]] T* data() const { return p_; }
  [[nodiscard]] std::size_t size() const { return n_; }
  [[nodiscard]] cudaStream_t stream() const { return stream_; }
  [[nodiscard]] std::span<T> span() const { return {p_, n_}; }

  /** Sets every byte to zero, in stream order. */
  void zero() const {
    if (n_) check(cudaMemsetAsync(p_, 0, n_ * sizeof(T), stream_), "cudaMemsetAsync");
  }

 private:
  void release() noexcept {
    if (p_) (void)cudaFreeAsync(p_, stream_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  std::size_t n_ = 0;
  cudaStream_t stream_ = nullptr;
};

/**
 * @brief An owning array of `T` in page-locked host memory (`cudaMallocHost`): the target of an
 * asynchronous device -> host copy (`CudaBackend::copy_to_host_async`), which with pageable memory
 * would stage through a driver buffer and wait. Elements are not initialised; read them after a wait
 * for an event recorded after the copy.
 */
template <class T>
  requires std::is_trivially_copyable_v<T>
class PinnedBuffer {
 public:
  using value_type = T;
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t n) : n_(n) {
    if (n_ == 0) return;
    void* p = nullptr;
    const cudaError_t st = cudaMallocHost(&p, n_ * sizeof(T));
    if (st != cudaSuccess) {
      (void)cudaGetLastError();
      throw cuda_error(
          mpar::detail::cat("cudaMallocHost of ", n_ * sizeof(T), " bytes failed: ", cudaGetErrorString(st)));
    }
    p_ = static_cast<T*>(p);
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { release(); }

  [[nodiscard]] T* data() const { return p_; }
  [[nodiscard]] std::size_t size() const { return n_; }
  [[nodiscard]] std::span<T> span() const { return {p_, n_}; }
  [[nodiscard]] T& operator[](std::size_t i) const { return p_[i]; }

 private:
  void release() noexcept {
    if (p_) (void)cudaFreeHost(p_);  // may run after the runtime shut down at exit: ignored
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/** Copies `n` elements host -> device, asynchronously on `s` (pageable memory makes it effectively synchronous). */
template <class T>
void copy_to_device(const T* host, T* dev, std::size_t n, cudaStream_t s) {
  if (n) check(cudaMemcpyAsync(dev, host, n * sizeof(T), cudaMemcpyHostToDevice, s), "cudaMemcpyAsync(H2D)");
}
/** Copies `n` elements device -> host on `s`; call `cudaStreamSynchronize(s)` before reading `host`. */
template <class T>
void copy_to_host(const T* dev, T* host, std::size_t n, cudaStream_t s) {
  if (n) check(cudaMemcpyAsync(host, dev, n * sizeof(T), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync(D2H)");
}
/** Copies `n` elements device -> device on `s`. */
template <class T>
void copy_on_device(const T* src, T* dst, std::size_t n, cudaStream_t s) {
  if (n && src != dst)
    check(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync(D2D)");
}

/**
 * Copies a `rows x cols` block device -> device on `s`: row r from `src + r * src_ld` to `dst + r * dst_ld`
 * (leading dimensions in elements, at least `cols`; the caller checks them). One `cudaMemcpy2DAsync` whatever
 * the number of rows; a packed block (both leading dimensions `cols`) is one plain `cudaMemcpyAsync`.
 */
template <class T>
void copy_2d_on_device(std::size_t rows, std::size_t cols, const T* src, std::size_t src_ld, T* dst, std::size_t dst_ld,
                       cudaStream_t s) {
  if (rows == 0 || cols == 0) return;
  if (src_ld == cols && dst_ld == cols) return copy_on_device(src, dst, rows * cols, s);
  check(cudaMemcpy2DAsync(dst, dst_ld * sizeof(T), src, src_ld * sizeof(T), cols * sizeof(T), rows,
                          cudaMemcpyDeviceToDevice, s),
        "cudaMemcpy2DAsync(D2D)");
}

/** A device buffer holding a copy of `host` (uploaded on `s`). */
template <class T>
[[nodiscard]] DeviceBuffer<T> to_device(std::span<const T> host, cudaStream_t s) {
  DeviceBuffer<T> d(host.size(), s);
  copy_to_device(host.data(), d.data(), host.size(), s);
  return d;
}
/** A host vector with the contents of `dev`; synchronises `s`. */
template <class T>
[[nodiscard]] std::vector<T> to_host(const T* dev, std::size_t n, cudaStream_t s) {
  std::vector<T> h(n);
  copy_to_host(dev, h.data(), n, s);
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  return h;
}

}  // namespace mpar::gpu
