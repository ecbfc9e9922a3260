// The strided 2-D copy of the memory contract (`copy_2d`, backend/memory_backend.hpp) on every host backend:
// the block against a naive element loop, the elements around it untouched, bad leading dimensions rejected
// when the call is issued, and one counted launch whatever the number of rows.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <mpar/backend/host/host_backend.hpp>
#include <mpar/backend/stream/stream_backend.hpp>
#include <mpar/core.hpp>
#include <mpar/observe/counting_backend.hpp>

#include "support/on_fresh_rank.hpp"

namespace {

/** One strided copy: `rows x cols` from `src_offset` of a matrix with rows `src_ld` long, to `dst_offset` of one with `dst_ld`. */
struct Copy2dCase {
  std::size_t rows, cols, src_ld, dst_ld, src_offset, dst_offset, src_size, dst_size;
};

/** Distinct values for every index (exact in bf16 too), so a misplaced or missing element shows. */
template <class T>
std::vector<T> copy_2d_pattern(std::size_t n, int start) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = T(float(start + int(i % 200)) * 0.5f);
  return v;
}

/** The expected destination: `dst` with the block written element by element. */
template <class T>
std::vector<T> copy_2d_reference(const Copy2dCase& c, const std::vector<T>& src, std::vector<T> dst) {
  for (std::size_t r = 0; r < c.rows; ++r)
    for (std::size_t k = 0; k < c.cols; ++k)
      dst[c.dst_offset + r * c.dst_ld + k] = src[c.src_offset + r * c.src_ld + k];
  return dst;
}

/** The destination after `B::copy_2d` on rank memory (uploaded and read back by the stream-ordered copies). */
template <class B, class T>
std::vector<T> copy_2d_through_backend(const Copy2dCase& c, const std::vector<T>& src, const std::vector<T>& dst) {
  return mpar::testing::on_fresh_rank<B>([&] {
    mpar::Buffer<T> s = B::template allocate<T>(src.size()), d = B::template allocate<T>(dst.size());
    B::template copy_from_host_async<T>(src.size(), src.data(), s.data());
    B::template copy_from_host_async<T>(dst.size(), dst.data(), d.data());
    B::run(mpar::ops::copy_2d<T>{.rows = c.rows,
                                 .cols = c.cols,
                                 .src = s.data() + c.src_offset,
                                 .src_ld = c.src_ld,
                                 .dst = d.data() + c.dst_offset,
                                 .dst_ld = c.dst_ld});
    std::vector<T> out(dst.size());
    B::template copy_to_host_async<T>(out.size(), d.data(), out.data());
    B::synchronize();
    return out;
  });
}

template <class T>
bool copy_2d_same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

const std::vector<Copy2dCase>& copy_2d_cases() {
  static const std::vector<Copy2dCase> cases{
      {0, 5, 7, 5, 0, 0, 8, 8},                  // no rows: nothing written
      {3, 0, 4, 4, 0, 0, 12, 12},                // no columns: nothing written
      {1, 1, 1, 1, 0, 0, 1, 1},                  // one element
      {7, 13, 13, 13, 0, 0, 91, 91},             // packed: both leading dimensions are the row
      {7, 13, 17, 19, 0, 0, 119, 133},           // both strided, odd sizes
      {5, 3, 11, 4, 2 * 11 + 5, 4 + 1, 88, 28},  // a sub-block of a larger matrix into a sub-block of another
      {9, 6, 18, 12, 6, 6, 162, 108},            // ring attention's shape: the K/V columns of [t, 3 hl] into [t, 2 hl]
      {2, 6, 6, 18, 0, 6, 12, 36},               // and back: [t, 2 hl] into the columns [hl, 3 hl) of [t, 3 hl]
  };
  return cases;
}

template <class B, class T>
void check_copy_2d_cases() {
  for (const Copy2dCase& c : copy_2d_cases()) {
    INFO(B::name << ": " << c.rows << " x " << c.cols << ", src_ld " << c.src_ld << " at " << c.src_offset
                 << ", dst_ld " << c.dst_ld << " at " << c.dst_offset);
    const auto src = copy_2d_pattern<T>(c.src_size, 1), dst = copy_2d_pattern<T>(c.dst_size, -300);
    CHECK(copy_2d_same_bits(copy_2d_through_backend<B, T>(c, src, dst), copy_2d_reference(c, src, dst)));
  }
}

}  // namespace

TEMPLATE_TEST_CASE("backend copy_2d: the block equals a naive element loop, every other element untouched",
                   "[backend][buffer_ops][copy_2d]", mpar::HostBackend, mpar::StreamHostBackend,
                   mpar::DiscreteHostBackend, mpar::observe::CountingBackend<mpar::HostBackend>) {
  check_copy_2d_cases<TestType, float>();
  check_copy_2d_cases<TestType, double>();
  check_copy_2d_cases<TestType, mpar::bf16>();
}

TEMPLATE_TEST_CASE("backend copy_2d: no rows or no columns copies nothing, even with null pointers",
                   "[backend][buffer_ops][copy_2d]", mpar::HostBackend, mpar::StreamHostBackend,
                   mpar::DiscreteHostBackend) {
  CHECK(mpar::testing::on_fresh_rank<TestType>([] {
    TestType::run(mpar::ops::copy_2d<float>{.rows = std::size_t(0),
                                            .cols = std::size_t(4),
                                            .src = static_cast<const float*>(nullptr),
                                            .src_ld = std::size_t(4),
                                            .dst = static_cast<float*>(nullptr),
                                            .dst_ld = std::size_t(4)});
    TestType::run(mpar::ops::copy_2d<float>{.rows = std::size_t(3),
                                            .cols = std::size_t(0),
                                            .src = static_cast<const float*>(nullptr),
                                            .src_ld = std::size_t(0),
                                            .dst = static_cast<float*>(nullptr),
                                            .dst_ld = std::size_t(0)});
    return true;
  }));
}

TEMPLATE_TEST_CASE(
    "backend copy_2d: a leading dimension shorter than a row is a config_error at the call, naming the sizes",
    "[backend][buffer_ops][copy_2d]", mpar::HostBackend, mpar::StreamHostBackend, mpar::DiscreteHostBackend) {
  using B = TestType;
  // Thrown when issued (not at the next wait), and the rank's stream stays usable afterwards.
  const bool stream_usable = mpar::testing::on_fresh_rank<B>([] {
    mpar::Buffer<float> s = B::template allocate<float>(32), d = B::template allocate<float>(32);
    CHECK_THROWS_AS(B::run(mpar::ops::copy_2d<float>{.rows = std::size_t(4),
                                                     .cols = std::size_t(5),
                                                     .src = s.data(),
                                                     .src_ld = std::size_t(3),
                                                     .dst = d.data(),
                                                     .dst_ld = std::size_t(5)}),
                    mpar::config_error);
    CHECK_THROWS_WITH(
        B::run(mpar::ops::copy_2d<float>{.rows = std::size_t(4),
                                         .cols = std::size_t(5),
                                         .src = s.data(),
                                         .src_ld = std::size_t(3),
                                         .dst = d.data(),
                                         .dst_ld = std::size_t(5)}),
        Catch::Contains("copy_2d of 4 x 5") && Catch::Contains("src_ld = 3") && Catch::Contains("at least cols = 5"));
    CHECK_THROWS_WITH(B::run(mpar::ops::copy_2d<float>{.rows = std::size_t(2),
                                                       .cols = std::size_t(6),
                                                       .src = s.data(),
                                                       .src_ld = std::size_t(6),
                                                       .dst = d.data(),
                                                       .dst_ld = std::size_t(4)}),
                      Catch::Contains("dst_ld = 4") && Catch::Contains("at least cols = 6"));
    // No rows does not excuse a wrong leading dimension: the first call that makes it fails.
    CHECK_THROWS_AS(B::run(mpar::ops::copy_2d<float>{.rows = std::size_t(0),
                                                     .cols = std::size_t(5),
                                                     .src = s.data(),
                                                     .src_ld = std::size_t(2),
                                                     .dst = d.data(),
                                                     .dst_ld = std::size_t(5)}),
                    mpar::config_error);
    B::synchronize();
    return true;
  });
  CHECK(stream_usable);
}

TEMPLATE_TEST_CASE("CountingBackend: a copy_2d is one launch, whatever its number of rows",
                   "[backend][buffer_ops][copy_2d][counts]", mpar::HostBackend, mpar::StreamHostBackend) {
  using Counting = mpar::observe::CountingBackend<TestType>;
  const mpar::observe::BackendCounts d = mpar::testing::on_fresh_rank<Counting>([] {
    mpar::Buffer<float> s = Counting::template allocate<float>(64 * 6), t = Counting::template allocate<float>(64 * 4);
    const auto before = Counting::counts();
    Counting::run(mpar::ops::copy_2d<float>{.rows = std::size_t(64),
                                            .cols = std::size_t(4),
                                            .src = s.data() + 2,
                                            .src_ld = std::size_t(6),
                                            .dst = t.data(),
                                            .dst_ld = std::size_t(4)});
    Counting::synchronize();
    return Counting::counts() - before;
  });
  CHECK(d[mpar::observe::Op::copy_2d] == 1);
  CHECK(d.total_launches() == 1);
  CHECK(d.by_kind() == "copy_2d=1");
}

// ---- copy_2d_batched: a two-level batch of such blocks in one operation ----------------------------------

namespace {

/** The heads of a [tokens, parts * heads * d] matrix into dense [batch, heads, seq, d] blocks, per part. */
struct HeadsCase {
  std::size_t batch, heads, seq, d, parts;
};

template <class T>
std::vector<T> heads_reference(const HeadsCase& c, const std::vector<T>& src, std::vector<T> dst) {
  const std::size_t hl = c.heads * c.d, ld = c.parts * hl, tokens = c.batch * c.seq;
  for (std::size_t p = 0; p < c.parts; ++p)
    for (std::size_t b = 0; b < c.batch; ++b)
      for (std::size_t h = 0; h < c.heads; ++h)
        for (std::size_t s = 0; s < c.seq; ++s)
          for (std::size_t k = 0; k < c.d; ++k)
            dst[p * tokens * hl + ((b * c.heads + h) * c.seq + s) * c.d + k] =
                src[(b * c.seq + s) * ld + p * hl + h * c.d + k];
  return dst;
}

/** The same through `B::copy_2d_batched`, one call per part (as attention's rearrangement issues it). */
template <class B, class T>
std::vector<T> heads_through_backend(const HeadsCase& c, const std::vector<T>& src, const std::vector<T>& dst) {
  return mpar::testing::on_fresh_rank<B>([&] {
    const std::size_t hl = c.heads * c.d, ld = c.parts * hl, tokens = c.batch * c.seq;
    mpar::Buffer<T> s = B::template allocate<T>(src.size()), d = B::template allocate<T>(dst.size());
    B::template copy_from_host_async<T>(src.size(), src.data(), s.data());
    B::template copy_from_host_async<T>(dst.size(), dst.data(), d.data());
    for (std::size_t p = 0; p < c.parts; ++p)
      B::run(mpar::ops::copy_2d_batched<T>{.rows = c.seq,
                                           .cols = c.d,
                                           .src = s.data() + p * hl,
                                           .src_ld = ld,
                                           .src_stride = mpar::BatchStrides{c.seq * ld, c.d},
                                           .dst = d.data() + p * tokens * hl,
                                           .dst_ld = c.d,
                                           .dst_stride = mpar::BatchStrides{c.heads * c.seq * c.d, c.seq * c.d},
                                           .batch = mpar::BatchExtents{c.batch, c.heads}});
    std::vector<T> out(dst.size());
    B::template copy_to_host_async<T>(out.size(), d.data(), out.data());
    B::synchronize();
    return out;
  });
}

}  // namespace

TEMPLATE_TEST_CASE("backend copy_2d_batched: heads rearranged equal a naive element loop",
                   "[backend][buffer_ops][copy_2d]", mpar::HostBackend, mpar::StreamHostBackend,
                   mpar::DiscreteHostBackend, mpar::observe::CountingBackend<mpar::HostBackend>) {
  using B = TestType;
  for (const HeadsCase c : {HeadsCase{1, 1, 1, 1, 1}, HeadsCase{2, 3, 5, 4, 3}, HeadsCase{3, 2, 7, 6, 1},
                            HeadsCase{1, 4, 3, 8, 3}, HeadsCase{4, 1, 2, 3, 2}}) {
    INFO(B::name << ": batch " << c.batch << ", heads " << c.heads << ", seq " << c.seq << ", d " << c.d << ", parts "
                 << c.parts);
    const std::size_t n = c.batch * c.seq * c.parts * c.heads * c.d;
    // One destination element more than the blocks fill: it must keep its value.
    const auto src = copy_2d_pattern<mpar::bf16>(n, 1), dst = copy_2d_pattern<mpar::bf16>(n + 1, -300);
    CHECK(copy_2d_same_bits(heads_through_backend<B>(c, src, dst), heads_reference(c, src, dst)));
    const auto src32 = copy_2d_pattern<float>(n, 7), dst32 = copy_2d_pattern<float>(n + 1, -100);
    CHECK(copy_2d_same_bits(heads_through_backend<B>(c, src32, dst32), heads_reference(c, src32, dst32)));
  }
}

TEMPLATE_TEST_CASE("backend copy_2d_batched: a short leading dimension is a config_error at the call; one launch",
                   "[backend][buffer_ops][copy_2d][counts]", mpar::HostBackend, mpar::StreamHostBackend) {
  using Counting = mpar::observe::CountingBackend<TestType>;
  const mpar::observe::BackendCounts d = mpar::testing::on_fresh_rank<Counting>([] {
    mpar::Buffer<float> s = Counting::template allocate<float>(256), t = Counting::template allocate<float>(256);
    CHECK_THROWS_WITH(Counting::run(mpar::ops::copy_2d_batched<float>{.rows = std::size_t(4),
                                                                      .cols = std::size_t(5),
                                                                      .src = s.data(),
                                                                      .src_ld = std::size_t(3),
                                                                      .src_stride = mpar::BatchStrides{20, 5},
                                                                      .dst = t.data(),
                                                                      .dst_ld = std::size_t(5),
                                                                      .dst_stride = mpar::BatchStrides{40, 20},
                                                                      .batch = mpar::BatchExtents{2, 2}}),
                      Catch::Contains("copy_2d of 4 x 5") && Catch::Contains("src_ld = 3"));
    const auto before = Counting::counts();
    Counting::run(mpar::ops::copy_2d_batched<float>{.rows = std::size_t(4),
                                                    .cols = std::size_t(2),
                                                    .src = s.data(),
                                                    .src_ld = std::size_t(8),
                                                    .src_stride = mpar::BatchStrides{32, 2},
                                                    .dst = t.data(),
                                                    .dst_ld = std::size_t(2),
                                                    .dst_stride = mpar::BatchStrides{32, 8},
                                                    .batch = mpar::BatchExtents{2, 4}});
    Counting::synchronize();
    return Counting::counts() - before;
  });
  CHECK(d[mpar::observe::Op::copy_2d_batched] == 1);
  CHECK(d.by_kind() == "copy_2d_batched=1");
}
