// CUB on the emulated runtime (backend/gpu/emulation/cub.hpp) against std:: references, and the two headers that
// call it against the host: gpu::fused_classifier (backend/gpu/classifier.hpp, cub::BlockReduce) against
// host::cross_entropy_*, and gpu::moe_route (backend/gpu/moe_routing.hpp, CUB's sort, histogram, scan and sum)
// against host::moe_route.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "device_array.hpp"
#include "mpar/backend/gpu/classifier.hpp"
#include "mpar/backend/gpu/moe_routing.hpp"
#include "mpar/backend/gpu/runtime.hpp"
#include "mpar/backend/host/kernels.hpp"
#include "mpar/backend/host/moe_routing.hpp"
#include "mpar/core/init.hpp"

namespace mpar::cub_emulation_test {

using Catch::Matchers::Contains;
using emulation_test::DeviceArray;
using emulation_test::require_close;
using gpu::emulation::emulation_error;

/** Reproducible integers in [lo, hi). */
template <class T>
std::vector<T> integers(std::size_t n, std::uint64_t seed, std::int64_t lo, std::int64_t hi) {
  const CounterRng rng{seed, 17};
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = T(lo + std::int64_t(double(hi - lo) * rng.uniform(i)) % (hi - lo));
  return v;
}

/** The message of the emulation_error `f` throws (fails the test when it throws nothing). */
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const emulation_error& e) {
    return e.what();
  }
  FAIL("no emulation_error thrown");
  return {};
}

/** Device storage of `bytes` for a CUB call (one byte when none is asked for, as cudaMalloc of 0 is not useful). */
DeviceArray<std::uint8_t> temp_of(std::size_t bytes) { return DeviceArray<std::uint8_t>(bytes ? bytes : 1); }

// ---- DeviceRadixSort::SortPairs ---------------------------------------------------------------------------

/** Sorts (key, index) pairs on the device and checks keys and values against std::stable_sort by `sort_key`. */
template <class K, class SortKey>
void check_sort_pairs(const std::vector<K>& keys, int begin_bit, int end_bit, SortKey sort_key) {
  INFO("n = " << keys.size() << ", bits [" << begin_bit << ", " << end_bit << ")");
  const std::size_t n = keys.size();
  std::vector<std::int32_t> index(n);
  std::iota(index.begin(), index.end(), 0);
  DeviceArray<K> keys_in(n ? keys : std::vector<K>{K(0)}), keys_out(n ? n : 1);
  DeviceArray<std::int32_t> values_in(n ? index : std::vector<std::int32_t>{0}), values_out(n ? n : 1);
  std::size_t bytes = 0;
  REQUIRE(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys_in.get(), keys_out.get(), values_in.get(),
                                          values_out.get(), int(n), begin_bit, end_bit) == cudaSuccess);
  REQUIRE(bytes > 0);
  auto temp = temp_of(bytes);
  REQUIRE(cub::DeviceRadixSort::SortPairs(temp.get(), bytes, keys_in.get(), keys_out.get(), values_in.get(),
                                          values_out.get(), int(n), begin_bit, end_bit) == cudaSuccess);
  std::vector<std::int32_t> want = index;
  std::stable_sort(want.begin(), want.end(),
                   [&](std::int32_t a, std::int32_t b) { return sort_key(keys[a]) < sort_key(keys[b]); });
  std::vector<K> want_keys(n);
  for (std::size_t i = 0; i < n; ++i) want_keys[i] = keys[std::size_t(want[i])];
  if (n == 0) return;
  REQUIRE(values_out.host() == want);
  REQUIRE(keys_out.host() == want_keys);  // whole keys, whatever bits were compared
  REQUIRE(keys_in.host() == keys);        // the input is not altered
}

TEST_CASE(
    "cub on the emulation: DeviceRadixSort::SortPairs is a stable sort on the key bits from begin_bit to end_bit") {
  // Few distinct keys: long runs of equal keys, whose values must keep their order.
  for (std::size_t n : {0, 1, 7, 3000}) {
    check_sort_pairs(integers<std::int32_t>(n, 1, -20, 20), 0, 32, [](std::int32_t k) { return k; });
    check_sort_pairs(integers<std::uint32_t>(n, 2, 0, 1 << 20), 0, 32, [](std::uint32_t k) { return k; });
  }
  // Partial bit ranges compare only those bits (of the key with a signed key's sign bit flipped) and keep the rest
  // in input order: bits [4, 12) over one pass and a part of the next, [8, 20) of signed keys, and an empty range.
  const auto wide = integers<std::uint32_t>(2000, 3, 0, 1 << 16);
  check_sort_pairs(wide, 4, 12, [](std::uint32_t k) { return (k >> 4) & 0xffu; });
  check_sort_pairs(wide, 3, 13, [](std::uint32_t k) { return (k >> 3) & 0x3ffu; });
  const auto signed_keys = integers<std::int32_t>(2000, 4, -(1 << 20), 1 << 20);
  check_sort_pairs(signed_keys, 8, 20, [](std::int32_t k) { return (std::uint32_t(k) >> 8) & 0xfffu; });
  check_sort_pairs(signed_keys, 24, 32, [](std::int32_t k) { return (std::uint32_t(k) ^ 0x80000000u) >> 24; });
  check_sort_pairs(signed_keys, 5, 5, [](std::int32_t) { return 0; });
}

// ---- DeviceHistogram::HistogramEven ------------------------------------------------------------------------

/** The histogram CUB documents: bin (s - lower) (levels - 1) / (upper - lower) for s in [lower, upper), else none. */
std::vector<std::int32_t> histogram_of(const std::vector<std::int32_t>& samples, int levels, int lower, int upper) {
  std::vector<std::int32_t> h(std::size_t(levels - 1), 0);
  for (std::int32_t s : samples)
    if (s >= lower && s < upper) ++h[std::size_t(std::int64_t(s - lower) * (levels - 1) / (upper - lower))];
  return h;
}

TEST_CASE("cub on the emulation: DeviceHistogram::HistogramEven bins evenly and skips samples outside the levels") {
  struct Case {
    int levels, lower, upper;
  };
  // One bin per value (moe_route's use), bins two wide, and bins that do not divide the range.
  for (Case c : {Case{9, 0, 8}, Case{7, 0, 12}, Case{4, -3, 8}}) {
    for (std::size_t n : {0, 1, 2500}) {
      INFO("levels = " << c.levels << ", [" << c.lower << ", " << c.upper << "), n = " << n);
      const auto samples = integers<std::int32_t>(n, 5, -6, 16);  // some below, some at and above upper
      DeviceArray<std::int32_t> d_samples(n ? samples : std::vector<std::int32_t>{0}), hist(std::size_t(c.levels - 1));
      std::size_t bytes = 0;
      REQUIRE(cub::DeviceHistogram::HistogramEven(nullptr, bytes, d_samples.get(), hist.get(), c.levels, c.lower,
                                                  c.upper, int(n)) == cudaSuccess);
      auto temp = temp_of(bytes);
      REQUIRE(cub::DeviceHistogram::HistogramEven(temp.get(), bytes, d_samples.get(), hist.get(), c.levels, c.lower,
                                                  c.upper, int(n)) == cudaSuccess);
      REQUIRE(hist.host() == histogram_of(samples, c.levels, c.lower, c.upper));  // every bin written, empty ones 0
    }
  }
  // 16-bit samples and levels bin in 32-bit arithmetic: a range times bins past 2^32 is refused as CUB refuses it.
  DeviceArray<std::uint16_t> small(4);
  DeviceArray<std::int32_t> hist(100000);
  std::size_t bytes = 0;
  REQUIRE(cub::DeviceHistogram::HistogramEven(nullptr, bytes, small.get(), hist.get(), 100001, std::uint16_t(0),
                                              std::uint16_t(60000), 4) == cudaErrorInvalidValue);
  REQUIRE(bytes > 0);
  auto temp = temp_of(bytes);
  REQUIRE(cub::DeviceHistogram::HistogramEven(temp.get(), bytes, small.get(), hist.get(), 100001, std::uint16_t(0),
                                              std::uint16_t(60000), 4) == cudaErrorInvalidValue);
}

// ---- DeviceScan::ExclusiveSum and DeviceReduce::Sum -------------------------------------------------------

TEST_CASE(
    "cub on the emulation: DeviceScan::ExclusiveSum and DeviceReduce::Sum equal std::exclusive_scan and "
    "std::accumulate") {
  for (std::size_t n : {0, 1, 5, 1024, 3001}) {  // none, one and several tiles of partials
    INFO("n = " << n);
    const auto x = integers<std::int32_t>(n, 6, -1000, 1000);
    std::vector<std::int32_t> want(n);
    std::exclusive_scan(x.begin(), x.end(), want.begin(), 0);
    DeviceArray<std::int32_t> in(n ? x : std::vector<std::int32_t>{0}), out(n ? n : 1), sum(1);

    std::size_t bytes = 0;
    REQUIRE(cub::DeviceScan::ExclusiveSum(nullptr, bytes, in.get(), out.get(), int(n)) == cudaSuccess);
    auto temp = temp_of(bytes);
    REQUIRE(cub::DeviceScan::ExclusiveSum(temp.get(), bytes, in.get(), out.get(), int(n)) == cudaSuccess);
    if (n) REQUIRE(out.host() == want);
    REQUIRE(cub::DeviceScan::ExclusiveSum(temp.get(), bytes, in.get(), in.get(), int(n)) == cudaSuccess);  // in place
    if (n) REQUIRE(in.host() == want);

    in.upload(n ? x : std::vector<std::int32_t>{0});
    REQUIRE(cub::DeviceReduce::Sum(nullptr, bytes, in.get(), sum.get(), int(n)) == cudaSuccess);
    auto reduce_temp = temp_of(bytes);
    sum.upload({12345});
    REQUIRE(cub::DeviceReduce::Sum(reduce_temp.get(), bytes, in.get(), sum.get(), int(n)) == cudaSuccess);
    REQUIRE(sum.host()[0] == std::accumulate(x.begin(), x.end(), 0));  // 0 when empty: the sum's initial value
  }
  // Floats whose sums are exact in any order.
  const auto ints = integers<std::int32_t>(3000, 7, -64, 64);
  const std::vector<float> f(ints.begin(), ints.end());
  DeviceArray<float> in(f), sum(1);
  std::size_t bytes = 0;
  REQUIRE(cub::DeviceReduce::Sum(nullptr, bytes, in.get(), sum.get(), 3000) == cudaSuccess);
  auto temp = temp_of(bytes);
  REQUIRE(cub::DeviceReduce::Sum(temp.get(), bytes, in.get(), sum.get(), 3000) == cudaSuccess);
  REQUIRE(sum.host()[0] == std::accumulate(f.begin(), f.end(), 0.0f));
}

// ---- the temporary-storage protocol and the refusals ------------------------------------------------------

TEST_CASE("cub on the emulation: the size query only sizes, and storage below it or bad operands name the call") {
  const std::size_t n = 500;
  const auto keys = integers<std::int32_t>(n, 8, 0, 50);
  DeviceArray<std::int32_t> keys_in(keys), keys_out(n), values_in(keys), values_out(n), one(1);
  keys_out.zero();
  values_out.zero();
  one.zero();

  // The query writes the size and touches nothing: no operand is read, written or even checked.
  std::size_t sort_bytes = 0, hist_bytes = 0, scan_bytes = 0, sum_bytes = 0;
  REQUIRE(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys_in.get(), keys_out.get(), values_in.get(),
                                          values_out.get(), int(n)) == cudaSuccess);
  REQUIRE(cub::DeviceRadixSort::SortPairs<std::int32_t, std::int32_t>(nullptr, sort_bytes, nullptr, nullptr, nullptr,
                                                                      nullptr, int(n)) == cudaSuccess);
  REQUIRE(cub::DeviceHistogram::HistogramEven(nullptr, hist_bytes, keys_in.get(), keys_out.get(), 51, 0, 50, int(n)) ==
          cudaSuccess);
  REQUIRE(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, keys_in.get(), keys_out.get(), int(n)) == cudaSuccess);
  REQUIRE(cub::DeviceReduce::Sum(nullptr, sum_bytes, keys_in.get(), one.get(), int(n)) == cudaSuccess);
  for (std::size_t b : {sort_bytes, hist_bytes, scan_bytes, sum_bytes}) REQUIRE(b > 0);
  REQUIRE(keys_out.host() == std::vector<std::int32_t>(n, 0));
  REQUIRE(values_out.host() == std::vector<std::int32_t>(n, 0));
  REQUIRE(one.host()[0] == 0);
  REQUIRE(keys_in.host() == keys);

  // Storage below what the query asked for: as passed, or as allocated behind a large enough count.
  auto big = temp_of(sort_bytes);
  auto small = temp_of(sort_bytes - 1);
  std::size_t less = sort_bytes - 1;
  REQUIRE_THAT(error_of([&] {
                 (void)cub::DeviceRadixSort::SortPairs(big.get(), less, keys_in.get(), keys_out.get(), values_in.get(),
                                                       values_out.get(), int(n));
               }),
               Contains("cub::DeviceRadixSort::SortPairs") && Contains("temp_storage_bytes"));
  REQUIRE_THAT(error_of([&] {
                 (void)cub::DeviceRadixSort::SortPairs(small.get(), sort_bytes, keys_in.get(), keys_out.get(),
                                                       values_in.get(), values_out.get(), int(n));
               }),
               Contains("cub::DeviceRadixSort::SortPairs") && Contains("d_temp_storage") && Contains("fewer"));
  REQUIRE(keys_out.host() == std::vector<std::int32_t>(n, 0));  // refused before any work
  less = hist_bytes - 1;
  REQUIRE_THAT(error_of([&] {
                 (void)cub::DeviceHistogram::HistogramEven(big.get(), less, keys_in.get(), keys_out.get(), 51, 0, 50,
                                                           int(n));
               }),
               Contains("cub::DeviceHistogram::HistogramEven") && Contains("temp_storage_bytes"));
  less = scan_bytes - 1;
  REQUIRE_THAT(
      error_of([&] { (void)cub::DeviceScan::ExclusiveSum(big.get(), less, keys_in.get(), keys_out.get(), int(n)); }),
      Contains("cub::DeviceScan::ExclusiveSum") && Contains("temp_storage_bytes"));
  less = sum_bytes - 1;
  REQUIRE_THAT(error_of([&] { (void)cub::DeviceReduce::Sum(big.get(), less, keys_in.get(), one.get(), int(n)); }),
               Contains("cub::DeviceReduce::Sum") && Contains("temp_storage_bytes"));

  // Host memory, operands shorter than the items, overlapping sort buffers, a bit range outside the key.
  std::vector<std::int32_t> host(n);
  REQUIRE_THAT(error_of([&] {
                 (void)cub::DeviceRadixSort::SortPairs(big.get(), sort_bytes, host.data(), keys_out.get(),
                                                       values_in.get(), values_out.get(), int(n));
               }),
               Contains("cub::DeviceRadixSort::SortPairs") && Contains("d_keys_in") && Contains("not device memory"));
  REQUIRE_THAT(
      error_of([&] { (void)cub::DeviceReduce::Sum(big.get(), sum_bytes, keys_in.get(), one.get(), int(n) + 1); }),
      Contains("cub::DeviceReduce::Sum") && Contains("d_in") && Contains("beyond its device allocation"));
  REQUIRE_THAT(error_of([&] {
                 (void)cub::DeviceRadixSort::SortPairs(big.get(), sort_bytes, keys_in.get(), keys_in.get(),
                                                       values_in.get(), values_out.get(), int(n));
               }),
               Contains("cub::DeviceRadixSort::SortPairs") && Contains("overlap"));
  REQUIRE_THAT(error_of([&] {
                 (void)cub::DeviceRadixSort::SortPairs(big.get(), sort_bytes, keys_in.get(), keys_out.get(),
                                                       values_in.get(), values_out.get(), int(n), 4, 33);
               }),
               Contains("cub::DeviceRadixSort::SortPairs") && Contains("bit range"));
  REQUIRE_THAT(error_of([&] {
                 (void)cub::DeviceHistogram::HistogramEven(big.get(), hist_bytes, keys_in.get(), keys_out.get(), 1, 0,
                                                           50, int(n));
               }),
               Contains("cub::DeviceHistogram::HistogramEven") && Contains("num_levels"));
}

// ---- BlockReduce in the SIMT emulator ---------------------------------------------------------------------

struct MaxIndex {  // an argmax: the larger value, the lower index on ties
  float value;
  int index;
};
struct MaxIndexOp {
  __device__ MaxIndex operator()(MaxIndex a, MaxIndex b) const {
    return (b.value > a.value || (b.value == a.value && b.index < a.index)) ? b : a;
  }
};

/** Thread 0 of each block writes the block's sum of `x` and the (max, argmax) of `y`. */
template <int Threads>
__global__ void block_sum_and_max(const int* x, const float* y, int* sums, MaxIndex* maxima) {
  using SumReduce = cub::BlockReduce<int, Threads>;
  using MaxReduce = cub::BlockReduce<MaxIndex, Threads>;
  __shared__ typename SumReduce::TempStorage sum_storage;
  __shared__ typename MaxReduce::TempStorage max_storage;
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  const int total = SumReduce(sum_storage).Sum(x[i]);
  const MaxIndex best = MaxReduce(max_storage).Reduce(MaxIndex{y[i], int(threadIdx.x)}, MaxIndexOp{});
  if (threadIdx.x == 0) {
    sums[blockIdx.x] = total;
    maxima[blockIdx.x] = best;
  }
}

/** Two sums through one TempStorage; CUB needs a barrier between them, and without it the first can be wrong. */
template <bool with_barrier>
__global__ void two_sums_in_one_storage(const int* x, int* sums) {
  using Reduce = cub::BlockReduce<int, 128>;
  __shared__ typename Reduce::TempStorage storage;
  const int v = x[blockIdx.x * blockDim.x + threadIdx.x];
  const int first = Reduce(storage).Sum(v);
  if constexpr (with_barrier) __syncthreads();
  const int second = Reduce(storage).Sum(2 * v);
  if (threadIdx.x == 0) {
    sums[2 * blockIdx.x] = first;
    sums[2 * blockIdx.x + 1] = second;
  }
}

/** Every thread writes what BlockReduce returned it: only thread 0's value is the total. */
__global__ void every_thread_writes_its_sum(const int* x, int* out) {
  using Reduce = cub::BlockReduce<int, 64>;
  __shared__ typename Reduce::TempStorage storage;
  out[threadIdx.x] = Reduce(storage).Sum(x[threadIdx.x]);
}

template <int Threads>
void check_block_reduce(unsigned blocks) {
  INFO(blocks << " blocks of " << Threads << " threads");
  const std::size_t n = std::size_t(blocks) * Threads;
  const auto x = integers<int>(n, 9, -100, 100);
  const auto yi = integers<int>(n, 10, 0, 20);  // ties for the maximum
  const std::vector<float> y(yi.begin(), yi.end());
  DeviceArray<int> dx(x), sums(blocks);
  DeviceArray<float> dy(y);
  DeviceArray<MaxIndex> maxima(blocks);
  const auto kernel = block_sum_and_max<Threads>;
  MPAR_LAUNCH(kernel, blocks, Threads, 0, nullptr, dx.get(), dy.get(), sums.get(), maxima.get());
  const auto got_sums = sums.host();
  const auto got_max = maxima.host();
  for (unsigned b = 0; b < blocks; ++b) {
    INFO("block " << b);
    REQUIRE(got_sums[b] == std::accumulate(x.begin() + b * Threads, x.begin() + (b + 1) * Threads, 0));
    const auto first = y.begin() + b * Threads, last = first + Threads;
    const auto at = std::max_element(first, last);  // the first of equal maxima
    REQUIRE(got_max[b].value == *at);
    REQUIRE(got_max[b].index == int(at - first));
  }
}

TEST_CASE("cub on the emulation: BlockReduce gives thread 0 the block's reduction, and needs its barriers") {
  check_block_reduce<256>(3);
  check_block_reduce<40>(2);  // a partial last warp
  check_block_reduce<1>(1);

  const auto x = integers<int>(256, 11, 1, 50);
  DeviceArray<int> dx(x), sums(4);
  int want[2][2];
  for (int b = 0; b < 2; ++b) {
    want[b][0] = std::accumulate(x.begin() + b * 128, x.begin() + (b + 1) * 128, 0);
    want[b][1] = 2 * want[b][0];
  }
  MPAR_LAUNCH(two_sums_in_one_storage<true>, 2, 128, 0, nullptr, dx.get(), sums.get());
  REQUIRE(sums.host() == std::vector<int>{want[0][0], want[0][1], want[1][0], want[1][1]});
  // Without the barrier the second reduction's stores overtake thread 0's reading of the first in one of the
  // two scheduling orders the emulator alternates between blocks.
  MPAR_LAUNCH(two_sums_in_one_storage<false>, 2, 128, 0, nullptr, dx.get(), sums.get());
  REQUIRE(sums.host() != std::vector<int>{want[0][0], want[0][1], want[1][0], want[1][1]});

  DeviceArray<int> out(64);
  MPAR_LAUNCH(every_thread_writes_its_sum, 1, 64, 0, nullptr, dx.get(), out.get());
  const auto got = out.host();
  REQUIRE(got[0] == std::accumulate(x.begin(), x.begin() + 64, 0));
  for (std::size_t t = 1; t < 64; ++t) REQUIRE(got[t] != got[0]);  // positive inputs: no partial is the total

  // A block of another shape than the template's.
  REQUIRE_THAT(error_of([&] { MPAR_LAUNCH(every_thread_writes_its_sum, 1, 32, 0, nullptr, dx.get(), out.get()); }),
               Contains("cub::BlockReduce") && Contains("64 x 1 x 1") && Contains("32 x 1 x 1"));
}

// ---- gpu::fused_classifier against the host's cross-entropy -----------------------------------------------

template <class T>
void check_classifier(std::size_t rows, std::size_t vocab, std::size_t ld, bool with_grad, bool in_place, double rel,
                      double abs) {
  INFO("rows = " << rows << ", vocab = " << vocab << ", ld = " << ld << (with_grad ? ", gradient" : ", loss only")
                 << (in_place ? " in place" : ""));
  const CounterRng rng{12, 3};
  std::vector<T> logits(rows * ld);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = T(float(-6.0 + 12.0 * rng.uniform(i)));
  const auto targets = integers<std::int32_t>(rows, 13, 0, std::int64_t(vocab));
  const float grad_scale = 0.5f;

  // The host on the real columns, in float from the values as stored in T.
  std::vector<float> packed(rows * vocab), probs(rows * vocab), wgrad(rows * vocab), wrow(rows), wlse(rows);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < vocab; ++c) packed[r * vocab + c] = float(logits[r * ld + c]);
  const float wloss = host::cross_entropy_forward(rows, vocab, packed.data(), targets.data(), probs.data());
  host::cross_entropy_backward(rows, vocab, probs.data(), targets.data(), wgrad.data(), grad_scale);
  for (std::size_t r = 0; r < rows; ++r) {
    std::vector<float> p(vocab);
    wrow[r] = host::cross_entropy_forward(1, vocab, packed.data() + r * vocab, targets.data() + r, p.data());
    double m = -INFINITY, s = 0;  // the log-sum-exp in double
    for (std::size_t c = 0; c < vocab; ++c) m = std::max(m, double(packed[r * vocab + c]));
    for (std::size_t c = 0; c < vocab; ++c) s += std::exp(double(packed[r * vocab + c]) - m);
    wlse[r] = float(m + std::log(s));
  }

  DeviceArray<T> dlogits(logits), dgrad(rows * ld);
  DeviceArray<std::int32_t> dtargets(targets);
  DeviceArray<float> row_loss(rows), row_lse(rows), loss(1);
  T* grad = with_grad ? (in_place ? dlogits.get() : dgrad.get()) : nullptr;
  gpu::fused_classifier(rows, vocab, ld, dlogits.get(), dtargets.get(), grad, row_loss.get(), loss.get(), grad_scale,
                        row_lse.get());
  require_close(row_loss.host(), wrow, 1e-5, 1e-5);
  require_close(row_lse.host(), wlse, 1e-6, 1e-6);
  require_close(loss.host(), std::vector<float>{wloss}, 1e-5, 1e-6);
  if (!with_grad) return;
  const auto got = (in_place ? dlogits : dgrad).host();
  std::vector<float> got_f(got.begin(), got.end()), want(rows * ld, 0.0f);  // padding columns: zero gradient
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < vocab; ++c) want[r * ld + c] = wgrad[r * vocab + c];
  require_close(got_f, want, rel, abs);
}

TEST_CASE("fused classifier on the emulation: loss, log-sum-exp and gradient equal the host's cross-entropy") {
  // A single column; rows below, at and over the block (256 threads) with padding; more rows than threads, so the
  // mean's BlockReduce sums strided partials.
  check_classifier<float>(1, 1, 1, true, false, 1e-5, 1e-7);
  check_classifier<float>(3, 300, 320, true, false, 1e-4, 1e-7);
  check_classifier<float>(5, 17, 17, true, true, 1e-4, 1e-7);
  check_classifier<float>(300, 9, 16, false, false, 1e-4, 1e-7);
  check_classifier<float>(2, 1000, 1024, true, true, 1e-4, 1e-8);
  check_classifier<bf16>(4, 300, 320, true, false, 1.0 / 128, 1e-6);  // the gradient rounded once, to bf16

  // A target outside the vocabulary (here a padding column) makes its row's loss, and the mean, NaN.
  DeviceArray<float> logits(std::vector<float>(2 * 8, 0.5f)), row_loss(2), loss(1);
  DeviceArray<std::int32_t> targets(std::vector<std::int32_t>{1, 6});
  gpu::fused_classifier<float>(2, 5, 8, logits.get(), targets.get(), nullptr, row_loss.get(), loss.get());
  const auto rl = row_loss.host();
  REQUIRE(std::abs(rl[0] - std::log(5.0f)) < 1e-6f);
  REQUIRE(std::isnan(rl[1]));
  REQUIRE(std::isnan(loss.host()[0]));
}

// ---- gpu::moe_route against host::moe_route ---------------------------------------------------------------

TEST_CASE("moe routing on the emulation: top-k, capacity and the routing permutation equal host::moe_route") {
  struct Case {
    std::size_t tokens, experts, k, capacity;
  };
  // One token; over-full experts (37 x 2 over 5 with capacity 9; 300 x 2 over 8 with 40); room for all; no room at
  // all; and no tokens.
  for (Case c : {Case{1, 1, 1, 1}, Case{37, 5, 2, 9}, Case{300, 8, 2, 40}, Case{64, 4, 3, 200}, Case{6, 3, 2, 0},
                 Case{0, 3, 1, 4}}) {
    INFO("tokens = " << c.tokens << ", experts = " << c.experts << ", k = " << c.k << ", capacity = " << c.capacity);
    const std::size_t n = c.tokens * c.k;
    // Probabilities in steps of 1/8: many ties, which go to the lower expert; one NaN ranks below every number.
    auto probs = integers<float>(c.tokens * c.experts, 14, 0, 8);
    for (float& p : probs) p /= 8;
    if (probs.size() > 3) probs[3] = NAN;

    std::vector<std::int32_t> choice(n), route(n), route_token(n), used(c.experts), routed(1);
    std::vector<std::uint8_t> accepted(n);
    std::vector<float> route_weight(n);
    host::moe_route(c.tokens, c.experts, c.k, c.capacity, probs.data(), choice.data(), accepted.data(), route.data(),
                    route_token.data(), route_weight.data(), used.data(), routed.data());
    if (c.capacity < c.tokens * c.k / c.experts) REQUIRE(routed[0] < std::int32_t(n));  // the case drops some

    const std::size_t m = n ? n : 1;
    DeviceArray<float> dprobs(probs.empty() ? std::vector<float>{0} : probs), dweight(m);
    DeviceArray<std::int32_t> dchoice(m), droute(m), dtoken(m), dused(c.experts), drouted(1);
    DeviceArray<std::uint8_t> daccepted(m);
    const gpu::MoeRouting out{dchoice.get(), daccepted.get(), droute.get(), dtoken.get(),
                              dweight.get(), dused.get(),     drouted.get()};
    gpu::moe_route(c.tokens, c.experts, c.k, c.capacity, dprobs.get(), out);
    REQUIRE(dused.host() == used);
    REQUIRE(drouted.host() == routed);
    if (n == 0) continue;
    REQUIRE(dchoice.host() == choice);
    REQUIRE(daccepted.host() == accepted);
    REQUIRE(droute.host() == route);
    REQUIRE(dtoken.host() == route_token);
    require_close(dweight.host(), route_weight, 0, 0);
  }
}

}  // namespace mpar::cub_emulation_test
