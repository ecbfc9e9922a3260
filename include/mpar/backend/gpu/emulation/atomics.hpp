#pragma once
/**
 * @file The device atomics under the emulation (`atomicAdd`, `atomicSub`, `atomicMax`, `atomicMin`, `atomicExch`,
 * `atomicCAS`), each returning the old value as in CUDA. They are `std::atomic_ref` operations, so they are
 * atomic also between kernels that host threads launch at the same time.
 */
#include <atomic>
#include <type_traits>

namespace mpar::gpu::emulation::detail {
template <class T, class U>
T atomic_update(T* address, U value, T (*combine)(T, T)) {
  std::atomic_ref<T> a(*address);
  T old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, combine(old, T(value)), std::memory_order_relaxed)) {}
  return old;
}
}  // namespace mpar::gpu::emulation::detail

template <class T>
  requires(std::is_arithmetic_v<T>)
T atomicAdd(T* address, std::type_identity_t<T> value) {
  return std::atomic_ref<T>(*address).fetch_add(value, std::memory_order_relaxed);
}
template <class T>
  requires(std::is_integral_v<T>)
T atomicSub(T* address, std::type_identity_t<T> value) {
  return std::atomic_ref<T>(*address).fetch_sub(value, std::memory_order_relaxed);
}
template <class T>
  requires(std::is_arithmetic_v<T>)
T atomicMax(T* address, std::type_identity_t<T> value) {
  return ::mpar::gpu::emulation::detail::atomic_update(
      address, value, +[](T a, T b) { return a > b ? a : b; });
}
template <class T>
  requires(std::is_arithmetic_v<T>)
T atomicMin(T* address, std::type_identity_t<T> value) {
  return ::mpar::gpu::emulation::detail::atomic_update(
      address, value, +[](T a, T b) { return a < b ? a : b; });
}
template <class T>
  requires(std::is_arithmetic_v<T>)
T atomicExch(T* address, std::type_identity_t<T> value) {
  return std::atomic_ref<T>(*address).exchange(value, std::memory_order_relaxed);
}
template <class T>
  requires(std::is_integral_v<T>)
T atomicCAS(T* address, std::type_identity_t<T> compare, std::type_identity_t<T> value) {
  std::atomic_ref<T>(*address).compare_exchange_strong(compare, value, std::memory_order_relaxed);
  return compare;  // the old value: `compare` itself when the swap happened
}
