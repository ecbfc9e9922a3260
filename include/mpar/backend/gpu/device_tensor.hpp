#pragma once
/** @file An owning, contiguous, row-major tensor in device memory. */
#include <array>
#include <cstddef>
#include <span>
#include <vector>

#include "mpar/backend/gpu/context.hpp"
#include "mpar/backend/gpu/memory.hpp"
#include "mpar/core/tensor.hpp"

namespace mpar::gpu {

/**
 * @brief A rank-`R` tensor of `T` in device memory (allocated on the thread's compute stream).
 *
 * `view()` gives a TensorView over device memory: pass its pointers to device code only. Element
 * access from the host goes through `to_host()` / `from_host()`, never through the view.
 */
template <class T, std::size_t R>
  requires(R >= 1 && R <= 4 && mpar::detail::element_type<T>)
class DeviceTensor {
 public:
  using value_type = T;
  DeviceTensor() = default;
  explicit DeviceTensor(const Shape<R>& shape, cudaStream_t s = nullptr)
      : shape_(shape), buf_(mpar::detail::product(shape), s ? s : current_stream()) {}

  [[nodiscard]] static constexpr std::size_t rank() { return R; }
  [[nodiscard]] std::size_t extent(std::size_t d) const { return shape_[d]; }
  [[nodiscard]] std::ptrdiff_t stride(std::size_t d) const { return mpar::detail::row_major_strides(shape_)[d]; }
  [[nodiscard]] const Shape<R>& shape() const { return shape_; }
  [[nodiscard]] std::size_t size() const { return buf_.size(); }
  [[nodiscard]] T* data() const { return buf_.data(); }
  [[nodiscard]] std::span<T> span() const { return buf_.span(); }
  [[nodiscard]] TensorView<T, R> view() const { return {buf_.data(), shape_}; }

  /** Uploads `host` (same number of elements) on the tensor's stream. */
  void from_host(std::span<const T> host) {
    require(host.size() == size(), "DeviceTensor::from_host: ", host.size(), " elements for a tensor of ", size());
    copy_to_device(host.data(), buf_.data(), host.size(), buf_.stream());
  }
  /** Downloads the contents; synchronises the tensor's stream. */
  [[nodiscard]] std::vector<T> to_host() const { return gpu::to_host(buf_.data(), buf_.size(), buf_.stream()); }
  void zero() const { buf_.zero(); }

 private:
  Shape<R> shape_{};
  DeviceBuffer<T> buf_;
};

}  // namespace mpar::gpu
