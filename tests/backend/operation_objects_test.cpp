// Backend operations as objects (backend/ops/operation.hpp), as a user meets them: an operation written in the test
// alone — its arguments, operands and host reference, nothing added to any backend — runs on HostBackend, both stream
// backends and a counting wrapper, and equals a loop written here; DiscreteHostBackend refuses one whose operand is
// not rank memory, naming the operation and the argument; `supports` tells which backends run what. The library's
// own operation objects (the Llama-class kernels) are counted under their own kinds.
#include <catch2/catch.hpp>

#include <cstddef>
#include <vector>

#include <mpar/backend/host/host_backend.hpp>
#include <mpar/backend/ops/operation.hpp>
#include <mpar/backend/ops/rmsnorm.hpp>
#include <mpar/backend/stream/stream_backend.hpp>
#include <mpar/core.hpp>
#include <mpar/observe/counting_backend.hpp>

#include "support/on_fresh_rank.hpp"

namespace user_ops {

/** A user's operation: each row of `x` (`rows x cols`) scaled by its own factor, `x[r][c] *= factor[r]`. */
struct scale_rows {
  static constexpr const char* name = "scale_rows";
  std::size_t rows = 0, cols = 0;
  const float* factor = nullptr;
  float* x = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(factor), f(x);
  }
};
inline void host_reference(const scale_rows& op) {
  for (std::size_t r = 0; r < op.rows; ++r)
    for (std::size_t c = 0; c < op.cols; ++c) op.x[r * op.cols + c] *= op.factor[r];
}

/** An operation with no host reference: no backend here runs it. */
struct no_reference {
  static constexpr const char* name = "no_reference";
  float* x = nullptr;
  template <class F>
  void each_operand(F&& f) {
    f(x);
  }
};

}  // namespace user_ops

namespace {

using mpar::supports;

static_assert(supports<mpar::HostBackend, user_ops::scale_rows> &&
              supports<mpar::StreamHostBackend, user_ops::scale_rows> &&
              supports<mpar::DiscreteHostBackend, user_ops::scale_rows> &&
              supports<mpar::observe::CountingBackend<mpar::DiscreteHostBackend>, user_ops::scale_rows>);
static_assert(!supports<mpar::HostBackend, user_ops::no_reference> &&
              !supports<mpar::StreamHostBackend, user_ops::no_reference> &&
              !supports<mpar::observe::CountingBackend<mpar::HostBackend>, user_ops::no_reference>);
static_assert(!supports<int, user_ops::scale_rows>);

template <class B>
std::vector<float> scaled_through(const std::vector<float>& factor, const std::vector<float>& x, std::size_t cols) {
  return mpar::testing::on_fresh_rank<B>([&] {
    const std::size_t rows = factor.size();
    mpar::Buffer<float> f = B::template allocate<float>(rows), v = B::template allocate<float>(x.size());
    B::template copy_from_host_async<float>(rows, factor.data(), f.data());
    B::template copy_from_host_async<float>(x.size(), x.data(), v.data());
    B::run(user_ops::scale_rows{.rows = rows, .cols = cols, .factor = f.data(), .x = v.data()});
    std::vector<float> out(x.size());
    B::template copy_to_host_async<float>(out.size(), v.data(), out.data());
    B::synchronize();
    return out;
  });
}

}  // namespace

TEMPLATE_TEST_CASE("A user's own operation object runs on every host backend with nothing added to them",
                   "[backend][ops]", mpar::HostBackend, mpar::StreamHostBackend, mpar::DiscreteHostBackend,
                   mpar::observe::CountingBackend<mpar::DiscreteHostBackend>) {
  const std::size_t rows = 5, cols = 3;
  std::vector<float> factor(rows), x(rows * cols), want(rows * cols);
  for (std::size_t r = 0; r < rows; ++r) factor[r] = 0.5f + float(r);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i) - 7.0f;
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c) want[r * cols + c] = x[r * cols + c] * factor[r];
  CHECK(scaled_through<TestType>(factor, x, cols) == want);
}

TEST_CASE("CountingBackend counts an operation object under its kind, a user's own under 'other'",
          "[backend][ops][counting]") {
  using CB = mpar::observe::CountingBackend<mpar::HostBackend>;
  using mpar::observe::Op;
  mpar::testing::on_fresh_rank<CB>([] {
    std::vector<float> factor{2.0f}, x{1.0f, 2.0f}, gain{1.0f, 1.0f}, y(2), rstd(1);
    const auto before = CB::counts();
    CB::run(user_ops::scale_rows{.rows = 1, .cols = 2, .factor = factor.data(), .x = x.data()});
    CB::run(user_ops::scale_rows{.rows = 1, .cols = 2, .factor = factor.data(), .x = x.data()});
    CB::run(mpar::ops::rmsnorm_forward{
        .rows = 1, .cols = 2, .eps = 1e-6f, .x = x.data(), .gain = gain.data(), .y = y.data(), .rstd = rstd.data()});
    const auto d = CB::counts() - before;
    CHECK(d[Op::other] == 2);
    CHECK(d[Op::rmsnorm_forward] == 1);
    CHECK(d.total_launches() == 3);
    CHECK(d.by_kind() == "rmsnorm_forward=1 other=2");
    CHECK(x == std::vector<float>{4.0f, 8.0f});
    return 0;
  });
}

TEST_CASE("DiscreteHostBackend refuses an operation object whose operand is not rank memory, naming it",
          "[backend][ops][errors]") {
  CHECK_THROWS_WITH(mpar::testing::on_fresh_rank<mpar::DiscreteHostBackend>([] {
                      std::vector<float> host_factor{2.0f};  // host memory: a device operation could not reach it
                      mpar::Buffer<float> x = mpar::DiscreteHostBackend::allocate<float>(2);
                      mpar::DiscreteHostBackend::run(
                          user_ops::scale_rows{.rows = 1, .cols = 2, .factor = host_factor.data(), .x = x.data()});
                      return 0;
                    }),
                    Catch::Contains("argument 1 of scale_rows does not point into rank memory"));
}
