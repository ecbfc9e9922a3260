#pragma once
// Device arrays for the emulated-runtime tests: filled and read only through cudaMemcpy, as a GPU program must.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <vector>

#include "mpar/backend/gpu/runtime.hpp"

namespace mpar::emulation_test {

template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(std::size_t n) : n_(n) { REQUIRE(cudaMalloc(&p_, n * sizeof(T)) == cudaSuccess); }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() { (void)cudaFree(p_); }
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    REQUIRE(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  void zero() { REQUIRE(cudaMemset(p_, 0, n_ * sizeof(T)) == cudaSuccess); }
  [[nodiscard]] std::vector<T> host() const {
    std::vector<T> h(n_);
    REQUIRE(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  }
  [[nodiscard]] T* get() const { return p_; }
  operator T*() const { return p_; }

 private:
  std::size_t n_;
  T* p_ = nullptr;
};

/** Every element within `rel` relative (or `abs` absolute) of the reference; NaN only where the reference is. */
template <class T>
void require_close(const std::vector<T>& got, const std::vector<T>& want, double rel = 1e-5, double abs = 1e-6) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = double(got[i]), w = double(want[i]);
    INFO("element " << i << " of " << got.size() << ": got " << g << ", want " << w);
    if (std::isnan(w)) {
      REQUIRE(std::isnan(g));
      continue;
    }
    REQUIRE(std::abs(g - w) <= abs + rel * std::abs(w));
  }
}

}  // namespace mpar::emulation_test
