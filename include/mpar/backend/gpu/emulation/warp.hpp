#pragma once
/**
 * @file The warp collectives under the emulation: shuffles (`__shfl_sync`, `__shfl_up_sync`, `__shfl_down_sync`,
 * `__shfl_xor_sync`), votes (`__ballot_sync`, `__any_sync`, `__all_sync`) and `__syncwarp`, with the
 * warp-synchronous meaning of the `_sync` forms: every lane the mask names arrives before any lane reads.
 *
 * A lane outside the mask, a mask naming a lane that does not exist or has exited, lanes of one warp at
 * different collectives, or a read of a lane outside the mask throw emulation_error (emulation/simt.hpp).
 * `width` splits the warp into segments as in CUDA: a source outside the caller's segment reads its own value.
 */
#include <cstdint>
#include <cstring>
#include <source_location>
#include <type_traits>

#include "mpar/backend/gpu/emulation/qualifiers.hpp"  // warpSize
#include "mpar/backend/gpu/emulation/simt.hpp"

namespace mpar::gpu::emulation::detail {

template <class T>
std::uint64_t to_bits(T v) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "a warp shuffle moves at most 8 bytes");
  std::uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  return b;
}
template <class T>
T from_bits(std::uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof(T));
  return v;
}
inline unsigned lane_of_caller(const char* op) { return Executor::here().fiber(op).linear % warp_lanes; }

template <class T>
T shuffle(unsigned mask, T v, unsigned source, const char* op, const std::source_location& at) {
  return from_bits<T>(Executor::here().warp_collective(mask, to_bits(v), source, op, at));
}

}  // namespace mpar::gpu::emulation::detail

template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize,
              const std::source_location& at = std::source_location::current()) {
  namespace d = ::mpar::gpu::emulation::detail;
  const unsigned lane = d::lane_of_caller("__shfl_sync"), w = unsigned(width);
  return d::shuffle(mask, var, (lane & ~(w - 1)) + (unsigned(src_lane) & (w - 1)), "__shfl_sync", at);
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                 const std::source_location& at = std::source_location::current()) {
  namespace d = ::mpar::gpu::emulation::detail;
  const unsigned lane = d::lane_of_caller("__shfl_up_sync"), w = unsigned(width);
  return d::shuffle(mask, var, (lane & (w - 1)) >= delta ? lane - delta : lane, "__shfl_up_sync", at);
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                   const std::source_location& at = std::source_location::current()) {
  namespace d = ::mpar::gpu::emulation::detail;
  const unsigned lane = d::lane_of_caller("__shfl_down_sync"), w = unsigned(width);
  return d::shuffle(mask, var, (lane & (w - 1)) + delta < w ? lane + delta : lane, "__shfl_down_sync", at);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize,
                  const std::source_location& at = std::source_location::current()) {
  namespace d = ::mpar::gpu::emulation::detail;
  const unsigned lane = d::lane_of_caller("__shfl_xor_sync"), w = unsigned(width);
  const unsigned src = lane ^ unsigned(lane_mask);
  return d::shuffle(mask, var, (src & ~(w - 1)) == (lane & ~(w - 1)) ? src : lane, "__shfl_xor_sync", at);
}

inline unsigned __ballot_sync(unsigned mask, int predicate,
                              const std::source_location& at = std::source_location::current()) {
  namespace d = ::mpar::gpu::emulation::detail;
  unsigned ballot = 0;
  ::mpar::gpu::emulation::Executor::here().warp_collective(mask, predicate != 0, d::lane_of_caller("__ballot_sync"),
                                                           "__ballot_sync", at, &ballot);
  return ballot;
}
inline int __any_sync(unsigned mask, int predicate, const std::source_location& at = std::source_location::current()) {
  namespace d = ::mpar::gpu::emulation::detail;
  unsigned ballot = 0;
  ::mpar::gpu::emulation::Executor::here().warp_collective(mask, predicate != 0, d::lane_of_caller("__any_sync"),
                                                           "__any_sync", at, &ballot);
  return ballot != 0;
}
inline int __all_sync(unsigned mask, int predicate, const std::source_location& at = std::source_location::current()) {
  namespace d = ::mpar::gpu::emulation::detail;
  unsigned ballot = 0;
  ::mpar::gpu::emulation::Executor::here().warp_collective(mask, predicate != 0, d::lane_of_caller("__all_sync"),
                                                           "__all_sync", at, &ballot);
  return ballot == mask;
}
inline void __syncwarp(unsigned mask = 0xffffffffu, const std::source_location& at = std::source_location::current()) {
  namespace d = ::mpar::gpu::emulation::detail;
  ::mpar::gpu::emulation::Executor::here().warp_collective(mask, 0, d::lane_of_caller("__syncwarp"), "__syncwarp", at);
}
