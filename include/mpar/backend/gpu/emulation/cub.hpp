#pragma once
/**
 * @file CUB under the emulation (cub/block/block_reduce.cuh and cub/device/device_{radix_sort,histogram,scan,
 * reduce}.cuh): the subset mpar's device code calls (backend/gpu/classifier.hpp, moe_routing.hpp), with CUB's
 * documented semantics.
 *
 * - `cub::BlockReduce<T, BLOCK_DIM_X>` (`TempStorage`, `Reduce`, `Sum`) runs in the SIMT emulator: every thread
 *   stores its input in the temp storage, a `__syncthreads` (at the caller's line), then thread 0 combines the
 *   values, each warp's as a shuffle-down tree and the warps' aggregates in order, as CUB's default algorithm.
 *   Only thread 0's result is defined in CUB; the other threads get back their own input, so a kernel that reads
 *   the total elsewhere computes wrong values here too. Reusing the temp storage without a barrier races as on a
 *   GPU (the scheduler of odd blocks runs the highest thread first). A block whose shape is not the template's
 *   is an error.
 * - `cub::DeviceRadixSort::SortPairs` (integer keys), `cub::DeviceHistogram::HistogramEven` (integer samples),
 *   `cub::DeviceScan::ExclusiveSum` and `cub::DeviceReduce::Sum` run at once on the calling thread, with CUB's
 *   two-phase protocol: a call with `d_temp_storage == nullptr` writes `temp_storage_bytes` and does nothing else;
 *   the real call does its work in the temporary storage (the sort's second buffer of keys and values, the
 *   histogram's counters, the scan's and reduction's per-tile partials), so storage that overlaps an operand
 *   corrupts the result as on a GPU.
 *
 * What CUB leaves undefined or would fault on throws `emulation_error` naming the call: an operand that is null,
 * host memory or shorter than the items it covers, operands that overlap where CUB forbids it, temporary storage
 * below the size its query returned (as passed or as allocated), a bit range outside the key, fewer than two
 * histogram levels or an empty level range.
 */
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <source_location>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/backend/gpu/emulation/error.hpp"
#include "mpar/backend/gpu/emulation/graphs.hpp"
#include "mpar/backend/gpu/emulation/memory.hpp"
#include "mpar/backend/gpu/emulation/simt.hpp"
#include "mpar/backend/gpu/emulation/thread_builtins.hpp"
#include "mpar/backend/gpu/emulation/types.hpp"
#include "mpar/core/error.hpp"

namespace mpar::gpu::emulation::cub_detail {

/** Throws emulation_error naming `call` unless `ok`. */
template <class... A>
void require_arg(bool ok, const char* call, const A&... what) {
  if (!ok) throw emulation_error(mpar::detail::cat(call, ": ", what...));
}

/** CUB aligns each temporary allocation to 256 bytes, and asks for the slack to align the storage it is given. */
inline constexpr std::size_t alignment = 256;
inline constexpr std::size_t aligned(std::size_t bytes) { return (bytes + alignment - 1) / alignment * alignment; }
inline constexpr std::size_t storage_bytes(std::size_t parts_bytes) { return parts_bytes + alignment - 1; }

/** Items per tile of the scan's and the reduction's partials (one block's share on a GPU). */
inline constexpr std::size_t tile_items = 1024;
inline constexpr std::size_t tiles(std::size_t n) { return n == 0 ? 1 : (n + tile_items - 1) / tile_items; }

template <class N>
std::size_t item_count(N num_items) {
  return num_items > N(0) ? std::size_t(num_items) : 0;
}

/**
 * The readable view of the temporary storage, aligned: it must be device memory of at least `required` bytes,
 * both as `temp_storage_bytes` says and as allocated.
 */
inline unsigned char* temp_storage(const char* call, void* temp, std::size_t temp_bytes, std::size_t required) {
  require_arg(temp_bytes >= required, call, "temp_storage_bytes = ", temp_bytes, " is below the ", required,
              " bytes its size query asks for (query first with d_temp_storage = nullptr and the same arguments)");
  require_arg(device_view(temp) != nullptr, call, "d_temp_storage (", temp, ") is not device memory (cudaMalloc)");
  require_arg(DeviceAllocations::instance().covers(temp, required), call, "d_temp_storage (", temp,
              ") holds fewer than the ", required, " bytes of its size query inside one device allocation");
  auto* view = static_cast<unsigned char*>(device_view(temp));
  const auto address = reinterpret_cast<std::uintptr_t>(view);
  return view + (alignment - address % alignment) % alignment;  // the mappings share their offsets in a page
}

/** The readable view of `n` items at `p` (null when `n` is 0: nothing is touched). */
template <class T>
T* operand(const char* call, const char* name, T* p, std::size_t n) {
  if (n == 0) return nullptr;
  require_arg(p != nullptr, call, name, " is null");
  require_arg(device_view(p) != nullptr, call, name, " (", static_cast<const void*>(p),
              ") is not device memory (cudaMalloc)");
  require_arg(DeviceAllocations::instance().covers(p, n * sizeof(T)), call, name, ": ", n, " items of ", sizeof(T),
              " bytes reach beyond its device allocation");
  return static_cast<T*>(device_view(p));
}

/** Throws unless the byte ranges `[a, a + a_bytes)` and `[b, b + b_bytes)` are disjoint. */
inline void require_disjoint(const char* call, const char* a_name, const void* a, std::size_t a_bytes,
                             const char* b_name, const void* b, std::size_t b_bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  require_arg(a_bytes == 0 || b_bytes == 0 || x + a_bytes <= y || y + b_bytes <= x, call, a_name, " and ", b_name,
              " overlap, which CUB does not support");
}

/** A key as the radix sort orders it: unsigned bits, the sign bit of a signed integer flipped (CUB's TwiddleIn). */
template <class K>
std::make_unsigned_t<K> radix_bits(K key) {
  using U = std::make_unsigned_t<K>;
  U bits;
  std::memcpy(&bits, &key, sizeof bits);
  if constexpr (std::is_signed_v<K>) bits ^= U(1) << (sizeof(U) * 8 - 1);
  return bits;
}

/** Bits per radix-sort pass, as CUB's onesweep sort. */
inline constexpr int radix_digit_bits = 8;

/**
 * One stable counting-sort pass on the digit of `digit_bits` bits at `shift`: items keep their order within a
 * digit, which is what makes the least-significant-digit sort stable across passes.
 */
template <class K, class V>
void radix_pass(std::size_t n, const K* keys, const V* values, K* keys_out, V* values_out, int shift, int digit_bits) {
  const std::size_t digits = std::size_t(1) << digit_bits;
  const auto digit = [&](K k) { return std::size_t(radix_bits(k) >> shift) & (digits - 1); };
  std::vector<std::size_t> start(digits + 1, 0);
  for (std::size_t i = 0; i < n; ++i) ++start[digit(keys[i]) + 1];
  for (std::size_t d = 0; d < digits; ++d) start[d + 1] += start[d];
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t to = start[digit(keys[i])]++;
    keys_out[to] = keys[i];
    values_out[to] = values[i];
  }
}

/** Sums in `Acc` without signed overflow's undefined behaviour: integers wrap, as on a GPU. */
template <class Acc>
Acc add(Acc a, Acc b) {
  if constexpr (std::is_integral_v<Acc> && std::is_signed_v<Acc>) {
    using U = std::make_unsigned_t<Acc>;
    return Acc(U(a) + U(b));
  } else {
    return Acc(a + b);
  }
}

template <class It>
using pointee_t = std::remove_cv_t<std::remove_pointer_t<It>>;

}  // namespace mpar::gpu::emulation::cub_detail

namespace cub {

// ---- cub/block/block_reduce.cuh ---------------------------------------------------------------------------

enum BlockReduceAlgorithm {
  BLOCK_REDUCE_RAKING_COMMUTATIVE_ONLY,
  BLOCK_REDUCE_RAKING,
  BLOCK_REDUCE_WARP_REDUCTIONS,
};

/**
 * A block-wide reduction of one value per thread, called by every thread of a block of exactly
 * `BLOCK_DIM_X x BLOCK_DIM_Y x BLOCK_DIM_Z` threads; thread 0 gets the total (see the file comment).
 */
template <class T, int BLOCK_DIM_X, BlockReduceAlgorithm ALGORITHM = BLOCK_REDUCE_WARP_REDUCTIONS, int BLOCK_DIM_Y = 1,
          int BLOCK_DIM_Z = 1>
class BlockReduce {
  static_assert(std::is_trivially_copyable_v<T>, "the emulated BlockReduce moves values through shared memory bytes");
  static constexpr unsigned block_threads = unsigned(BLOCK_DIM_X * BLOCK_DIM_Y * BLOCK_DIM_Z);

 public:
  /** The shared memory the threads exchange their values through: one slot per thread. */
  struct TempStorage {
    alignas(T) unsigned char slot[block_threads][sizeof(T)];
  };

  explicit BlockReduce(TempStorage& storage) : storage_(storage) {}

  /** The reduction of every thread's `input` by `op` for thread 0; the others get their input back. */
  template <class ReductionOp>
  T Reduce(T input, ReductionOp op, const std::source_location& at = std::source_location::current()) {
    const unsigned tid = thread_rank(at);
    std::memcpy(storage_.slot[tid], &input, sizeof(T));
    __syncthreads(at);
    if (tid != 0) return input;
    T total{};
    for (unsigned w = 0; w * 32 < block_threads; ++w) {
      const unsigned lanes = block_threads - w * 32 < 32 ? block_threads - w * 32 : 32;
      T v[32];
      for (unsigned l = 0; l < lanes; ++l) std::memcpy(&v[l], storage_.slot[w * 32 + l], sizeof(T));
      for (unsigned offset = 1; offset < lanes; offset *= 2)  // __shfl_down_sync's tree: lane l takes l + offset
        for (unsigned l = 0; l + offset < lanes; l += 2 * offset) v[l] = op(v[l], v[l + offset]);
      total = w == 0 ? v[0] : op(total, v[0]);
    }
    return total;
  }
  /** The sum (`+`) of every thread's `input` for thread 0; the others get their input back. */
  T Sum(T input, const std::source_location& at = std::source_location::current()) {
    return Reduce(
        input, [](const T& a, const T& b) { return T(a + b); }, at);
  }

 private:
  unsigned thread_rank(const std::source_location& at) const {
    const dim3& b = blockDim;
    if (b.x != unsigned(BLOCK_DIM_X) || b.y != unsigned(BLOCK_DIM_Y) || b.z != unsigned(BLOCK_DIM_Z))
      throw ::mpar::gpu::emulation::emulation_error(mpar::detail::cat(
          "cub::BlockReduce at ", at.file_name(), ":", at.line(), " is for blocks of ", BLOCK_DIM_X, " x ", BLOCK_DIM_Y,
          " x ", BLOCK_DIM_Z, " threads, launched with ", b.x, " x ", b.y, " x ", b.z));
    const uint3& t = threadIdx;
    return t.x + unsigned(BLOCK_DIM_X) * (t.y + unsigned(BLOCK_DIM_Y) * t.z);
  }

  TempStorage& storage_;
};

// ---- cub/device/device_radix_sort.cuh ---------------------------------------------------------------------

struct DeviceRadixSort {
  /**
   * Sorts `num_items` pairs by key, ascending and stably, comparing only bits `[begin_bit, end_bit)` of each key
   * (after flipping a signed key's sign bit); the keys are written out whole. Inputs and outputs must not overlap.
   */
  template <class KeyT, class ValueT, class NumItemsT>
  static cudaError_t SortPairs(void* d_temp_storage, std::size_t& temp_storage_bytes, const KeyT* d_keys_in,
                               KeyT* d_keys_out, const ValueT* d_values_in, ValueT* d_values_out, NumItemsT num_items,
                               int begin_bit = 0, int end_bit = int(sizeof(KeyT) * 8), cudaStream_t stream = nullptr) {
    static_assert(std::is_integral_v<KeyT> && !std::is_same_v<KeyT, bool>,
                  "the emulated DeviceRadixSort sorts integer keys (mpar sorts no others)");
    namespace d = ::mpar::gpu::emulation::cub_detail;
    const char* call = "cub::DeviceRadixSort::SortPairs";
    const std::size_t n = d::item_count(num_items);
    const std::size_t key_bytes = n * sizeof(KeyT), value_bytes = n * sizeof(ValueT);
    const std::size_t required = d::storage_bytes(d::aligned(key_bytes) + d::aligned(value_bytes));
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = required;
      return cudaSuccess;
    }
    d::require_arg(num_items >= NumItemsT(0), call, "num_items = ", num_items, " is negative");
    d::require_arg(0 <= begin_bit && begin_bit <= end_bit && end_bit <= int(sizeof(KeyT) * 8), call, "bit range [",
                   begin_bit, ", ", end_bit, ") is not inside the ", sizeof(KeyT) * 8, " bits of the key");
    unsigned char* temp = d::temp_storage(call, d_temp_storage, temp_storage_bytes, required);
    const KeyT* keys_in = d::operand(call, "d_keys_in", d_keys_in, n);
    KeyT* keys_out = d::operand(call, "d_keys_out", d_keys_out, n);
    const ValueT* values_in = d::operand(call, "d_values_in", d_values_in, n);
    ValueT* values_out = d::operand(call, "d_values_out", d_values_out, n);
    const std::pair<const char*, const void*> ranges[] = {{"d_keys_in", d_keys_in},
                                                          {"d_keys_out", d_keys_out},
                                                          {"d_values_in", d_values_in},
                                                          {"d_values_out", d_values_out},
                                                          {"d_temp_storage", d_temp_storage}};
    const std::size_t bytes[] = {key_bytes, key_bytes, value_bytes, value_bytes, required};
    for (int i = 0; i < 5; ++i)
      for (int j = i + 1; j < 5; ++j)
        d::require_disjoint(call, ranges[i].first, ranges[i].second, bytes[i], ranges[j].first, ranges[j].second,
                            bytes[j]);
    if (n == 0) return cudaSuccess;
    // Checked above; sorted now, or on replay when the stream captures (emulation/graphs.hpp).
    return ::mpar::gpu::emulation::run_or_record(stream, [=] {
      // Least significant digit first, alternating between the outputs and the temporary buffers so that the last
      // pass writes the outputs.
      auto* keys_alt = reinterpret_cast<KeyT*>(temp);
      auto* values_alt = reinterpret_cast<ValueT*>(temp + d::aligned(key_bytes));
      const int passes = (end_bit - begin_bit + d::radix_digit_bits - 1) / d::radix_digit_bits;
      if (passes == 0) {
        std::memcpy(keys_out, keys_in, key_bytes);
        std::memcpy(values_out, values_in, value_bytes);
        return;
      }
      const KeyT* from_keys = keys_in;
      const ValueT* from_values = values_in;
      for (int p = 0; p < passes; ++p) {
        const bool to_out = (passes - 1 - p) % 2 == 0;
        KeyT* to_keys = to_out ? keys_out : keys_alt;
        ValueT* to_values = to_out ? values_out : values_alt;
        const int shift = begin_bit + p * d::radix_digit_bits;
        const int digit_bits = end_bit - shift < d::radix_digit_bits ? end_bit - shift : d::radix_digit_bits;
        d::radix_pass(n, from_keys, from_values, to_keys, to_values, shift, digit_bits);
        from_keys = to_keys;
        from_values = to_values;
      }
    });
  }
};

// ---- cub/device/device_histogram.cuh ----------------------------------------------------------------------

struct DeviceHistogram {
  /**
   * Counts `num_samples` samples into `num_levels - 1` equal bins over `[lower_level, upper_level)`: sample s
   * falls in bin `(s - lower) * (num_levels - 1) / (upper - lower)` (rounded down); samples outside the range
   * are not counted. Every bin of `d_histogram` is written. As CUB, returns cudaErrorInvalidValue (having set
   * temp_storage_bytes) when `(upper - lower) * (num_levels - 1)` could overflow the bin arithmetic.
   */
  template <class SampleIteratorT, class CounterT, class LevelT, class OffsetT>
  static cudaError_t HistogramEven(void* d_temp_storage, std::size_t& temp_storage_bytes, SampleIteratorT d_samples,
                                   CounterT* d_histogram, int num_levels, LevelT lower_level, LevelT upper_level,
                                   OffsetT num_samples, cudaStream_t stream = nullptr) {
    static_assert(std::is_pointer_v<SampleIteratorT>, "the emulated DeviceHistogram reads samples through a pointer");
    namespace d = ::mpar::gpu::emulation::cub_detail;
    using SampleT = d::pointee_t<SampleIteratorT>;
    using CommonT = std::common_type_t<LevelT, SampleT>;
    static_assert(std::is_integral_v<CommonT>,
                  "the emulated DeviceHistogram bins integer samples (mpar bins no others)");
    // CUB's bin arithmetic: 32-bit where sample and common type fit in 4 bytes together, 64-bit otherwise.
    using Arith =
        std::conditional_t<sizeof(SampleT) + sizeof(CommonT) <= sizeof(std::uint32_t), std::uint32_t, std::uint64_t>;
    const char* call = "cub::DeviceHistogram::HistogramEven";
    const std::size_t n = d::item_count(num_samples);
    const std::size_t bins = num_levels > 1 ? std::size_t(num_levels - 1) : 0;
    const std::size_t required = d::storage_bytes(d::aligned(bins * sizeof(CounterT)));
    const CommonT lower = CommonT(lower_level), upper = CommonT(upper_level);
    const bool overflows =
        bins > 0 && upper > lower && Arith(upper - lower) > std::numeric_limits<Arith>::max() / Arith(bins);
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = required;
      return overflows ? cudaErrorInvalidValue : cudaSuccess;
    }
    d::require_arg(num_samples >= OffsetT(0), call, "num_samples = ", num_samples, " is negative");
    d::require_arg(num_levels >= 2, call, "num_levels = ", num_levels, " gives no bin (num_levels - 1 bins)");
    d::require_arg(lower < upper, call, "lower_level = ", lower_level, " is not below upper_level = ", upper_level);
    if (overflows) return cudaErrorInvalidValue;
    auto* counters = reinterpret_cast<CounterT*>(d::temp_storage(call, d_temp_storage, temp_storage_bytes, required));
    const SampleT* samples = d::operand(call, "d_samples", static_cast<const SampleT*>(d_samples), n);
    CounterT* histogram = d::operand(call, "d_histogram", d_histogram, bins);
    d::require_disjoint(call, "d_samples", d_samples, n * sizeof(SampleT), "d_histogram", d_histogram,
                        bins * sizeof(CounterT));
    d::require_disjoint(call, "d_temp_storage", d_temp_storage, required, "d_histogram", d_histogram,
                        bins * sizeof(CounterT));
    return ::mpar::gpu::emulation::run_or_record(stream, [=] {
      for (std::size_t b = 0; b < bins; ++b) counters[b] = CounterT(0);
      for (std::size_t i = 0; i < n; ++i) {
        const CommonT s = CommonT(samples[i]);
        if (!(s >= lower && s < upper)) continue;
        const auto bin = std::size_t(Arith(s - lower) * Arith(bins) / Arith(upper - lower));
        counters[bin] = CounterT(counters[bin] + CounterT(1));
      }
      std::memcpy(histogram, counters, bins * sizeof(CounterT));
    });
  }
};

// ---- cub/device/device_scan.cuh ---------------------------------------------------------------------------

struct DeviceScan {
  /**
   * `d_out[i] = d_in[0] + ... + d_in[i - 1]` (`d_out[0] = 0`), summed per tile and then across tiles' totals;
   * `d_in` may be `d_out` (in place), and must not overlap it otherwise.
   */
  template <class InputIteratorT, class OutputIteratorT, class NumItemsT>
  static cudaError_t ExclusiveSum(void* d_temp_storage, std::size_t& temp_storage_bytes, InputIteratorT d_in,
                                  OutputIteratorT d_out, NumItemsT num_items, cudaStream_t stream = nullptr) {
    static_assert(std::is_pointer_v<InputIteratorT> && std::is_pointer_v<OutputIteratorT>,
                  "the emulated DeviceScan reads and writes through pointers");
    namespace d = ::mpar::gpu::emulation::cub_detail;
    using InputT = d::pointee_t<InputIteratorT>;
    using OutputT = d::pointee_t<OutputIteratorT>;
    using Acc = std::decay_t<decltype(InputT{} + InputT{})>;
    const char* call = "cub::DeviceScan::ExclusiveSum";
    const std::size_t n = d::item_count(num_items), tiles = d::tiles(n);
    const std::size_t required = d::storage_bytes(d::aligned(tiles * sizeof(Acc)));
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = required;
      return cudaSuccess;
    }
    d::require_arg(num_items >= NumItemsT(0), call, "num_items = ", num_items, " is negative");
    auto* partial = reinterpret_cast<Acc*>(d::temp_storage(call, d_temp_storage, temp_storage_bytes, required));
    const InputT* in = d::operand(call, "d_in", static_cast<const InputT*>(d_in), n);
    OutputT* out = d::operand(call, "d_out", d_out, n);
    if (static_cast<const void*>(d_in) != static_cast<const void*>(d_out))
      d::require_disjoint(call, "d_in", d_in, n * sizeof(InputT), "d_out", d_out, n * sizeof(OutputT));
    d::require_disjoint(call, "d_temp_storage", d_temp_storage, required, "d_out", d_out, n * sizeof(OutputT));
    if (n == 0) return cudaSuccess;
    return ::mpar::gpu::emulation::run_or_record(stream, [=] {
      for (std::size_t t = 0; t < tiles; ++t) {  // each tile's total
        Acc s = Acc(0);
        for (std::size_t i = t * d::tile_items; i < n && i < (t + 1) * d::tile_items; ++i) s = d::add(s, Acc(in[i]));
        partial[t] = s;
      }
      Acc prefix = Acc(0);
      for (std::size_t t = 0; t < tiles; ++t) {  // then each tile from the sum of the tiles before it
        Acc run = prefix;
        prefix = d::add(prefix, partial[t]);
        for (std::size_t i = t * d::tile_items; i < n && i < (t + 1) * d::tile_items; ++i) {
          const Acc x = Acc(in[i]);  // read before the write: in place, in[i] is out[i]
          out[i] = OutputT(run);
          run = d::add(run, x);
        }
      }
    });
  }
};

// ---- cub/device/device_reduce.cuh -------------------------------------------------------------------------

struct DeviceReduce {
  /** `*d_out = 0 + d_in[0] + ... + d_in[num_items - 1]`, summed per tile and then across tiles (0 when empty). */
  template <class InputIteratorT, class OutputIteratorT, class NumItemsT>
  static cudaError_t Sum(void* d_temp_storage, std::size_t& temp_storage_bytes, InputIteratorT d_in,
                         OutputIteratorT d_out, NumItemsT num_items, cudaStream_t stream = nullptr) {
    static_assert(std::is_pointer_v<InputIteratorT> && std::is_pointer_v<OutputIteratorT>,
                  "the emulated DeviceReduce reads and writes through pointers");
    namespace d = ::mpar::gpu::emulation::cub_detail;
    using InputT = d::pointee_t<InputIteratorT>;
    using OutputT = d::pointee_t<OutputIteratorT>;
    using Acc = std::decay_t<decltype(OutputT{} + InputT{})>;
    const char* call = "cub::DeviceReduce::Sum";
    const std::size_t n = d::item_count(num_items), tiles = d::tiles(n);
    const std::size_t required = d::storage_bytes(d::aligned(tiles * sizeof(Acc)));
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = required;
      return cudaSuccess;
    }
    d::require_arg(num_items >= NumItemsT(0), call, "num_items = ", num_items, " is negative");
    auto* partial = reinterpret_cast<Acc*>(d::temp_storage(call, d_temp_storage, temp_storage_bytes, required));
    const InputT* in = d::operand(call, "d_in", static_cast<const InputT*>(d_in), n);
    OutputT* out = d::operand(call, "d_out", d_out, 1);
    d::require_disjoint(call, "d_in", d_in, n * sizeof(InputT), "d_out", d_out, sizeof(OutputT));
    d::require_disjoint(call, "d_temp_storage", d_temp_storage, required, "d_out", d_out, sizeof(OutputT));
    return ::mpar::gpu::emulation::run_or_record(stream, [=] {
      for (std::size_t t = 0; t < tiles; ++t) {
        Acc s = Acc(0);
        for (std::size_t i = t * d::tile_items; i < n && i < (t + 1) * d::tile_items; ++i) s = d::add(s, Acc(in[i]));
        partial[t] = s;
      }
      Acc total = Acc(0);
      for (std::size_t t = 0; t < tiles; ++t) total = d::add(total, partial[t]);
      *out = OutputT(total);
    });
  }
};

}  // namespace cub
