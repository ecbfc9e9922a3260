// `gelu_backward_bias`: GeLU's backward with the bias gradient and the 16-bit gradient operand in one pass.
//
// Reference: GeLU's derivative written out here in double from the tanh form, the column sums in double.
// Tolerances: a 16-bit value is the fp32 gradient rounded once, half an ulp; the fp32 gradient itself may sit on
// the other side of a rounding boundary than the double one, so one ulp is allowed (2^-7 relative for bf16,
// 2^-10 for f16, and for f16 also its smallest subnormal, 2^-24, absolute: the left tail's gradients fall
// below f16's normal range). The bias sums are fp32 sums of `rows` terms, within 1e-5 of the sum of magnitudes. The kernel also promises the bits of the unfused composition
// (gelu_backward, bias_add_backward, convert), which the layers relied on before: checked exactly.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <mpar/backend/host/host_backend.hpp>
#include <mpar/backend/stream/stream_backend.hpp>
#include <mpar/core.hpp>
#include <mpar/nn/detail/fused_gelu_backward_backend.hpp>

#include "support/on_fresh_rank.hpp"

namespace {

struct GeluBiasCase {
  std::size_t rows, cols;
};
// Several blocks with a partial last one (4096 / 1000 = 4 rows per block), one row wider than a block, a single
// column, and nothing at all.
const std::vector<GeluBiasCase> gelu_bias_cases = {{7, 1000}, {3, 5000}, {33, 1}, {0, 16}, {5, 0}};

std::vector<float> gelu_bias_values(std::size_t n, std::uint64_t stream, double scale) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float(mpar::init_value(23, stream, i, mpar::InitSpec::uniform(scale)));
  return v;
}

double gelu_derivative(double x) {
  const double k = std::sqrt(2.0 / M_PI), c = 0.044715;
  const double t = std::tanh(k * (x + c * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x);
}

/** The same bits (memcmp is not called on the empty vectors' null data). */
template <class T>
bool gelu_bias_same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

template <class T>
struct GeluBiasResult {
  std::vector<T> dpre;
  std::vector<float> dbias;
};

template <class B, class T>
GeluBiasResult<T> gelu_bias_through(const GeluBiasCase& c, const std::vector<float>& pre, const std::vector<float>& dy,
                                    const std::vector<float>& dbias0) {
  return mpar::testing::on_fresh_rank<B>([&] {
    const std::size_t n = c.rows * c.cols;
    mpar::Buffer<float> p = B::template allocate<float>(n), g = B::template allocate<float>(n),
                        b = B::template allocate<float>(c.cols);
    mpar::Buffer<T> d = B::template allocate<T>(n);
    B::template copy_from_host_async<float>(n, pre.data(), p.data());
    B::template copy_from_host_async<float>(n, dy.data(), g.data());
    B::template copy_from_host_async<float>(c.cols, dbias0.data(), b.data());
    B::run(mpar::ops::gelu_backward_bias<T>{
        .rows = c.rows, .cols = c.cols, .pre = p.data(), .dy = g.data(), .dbias = b.data(), .dpre = d.data()});
    GeluBiasResult<T> r{std::vector<T>(n), std::vector<float>(c.cols)};
    B::template copy_to_host_async<T>(n, d.data(), r.dpre.data());
    B::template copy_to_host_async<float>(c.cols, b.data(), r.dbias.data());
    B::synchronize();
    return r;
  });
}

template <class B, class T>
void check_gelu_bias_cases() {
  static_assert(mpar::nn::detail::fused_gelu_backward_backend<B>);
  constexpr bool is_bf16 = std::is_same_v<T, mpar::bf16>;
  const double ulp = is_bf16 ? 0x1p-7 : 0x1p-10, floor = is_bf16 ? 1e-30 : 0x1p-24;
  for (const auto& c : gelu_bias_cases) {
    INFO(B::name << ", " << mpar::dtype_name_v<T> << ": " << c.rows << " x " << c.cols);
    const std::size_t n = c.rows * c.cols;
    // Pre-activations over GeLU's curved range and both tails; gradients of either sign.
    const auto pre = gelu_bias_values(n, 1, 6.0), dy = gelu_bias_values(n, 2, 1.0),
               dbias0 = gelu_bias_values(c.cols, 3, 0.5);
    const GeluBiasResult<T> got = gelu_bias_through<B, T>(c, pre, dy, dbias0);

    std::vector<double> sums(dbias0.begin(), dbias0.end()), magnitude(c.cols, 0.0);
    double worst_value = 0, worst_sum = 0;
    for (std::size_t r = 0; r < c.rows; ++r)
      for (std::size_t j = 0; j < c.cols; ++j) {
        const std::size_t i = r * c.cols + j;
        const double g = double(dy[i]) * gelu_derivative(double(pre[i]));
        sums[j] += g;
        magnitude[j] += std::abs(g);
        const double bound = ulp * std::abs(g) + floor;
        worst_value = std::max(worst_value, std::abs(double(float(got.dpre[i])) - g) / bound);
      }
    for (std::size_t j = 0; j < c.cols; ++j)
      worst_sum = std::max(worst_sum, std::abs(double(got.dbias[j]) - sums[j]) /
                                          (1e-5 * (magnitude[j] + std::abs(double(dbias0[j]))) + 1e-30));
    CHECK(worst_value <= 1.0);
    CHECK(worst_sum <= 1.0);

    // The unfused composition on the host, bit for bit.
    std::vector<float> g(n), dbias = dbias0;
    std::vector<T> dpre(n);
    mpar::host::gelu_backward<float>(n, pre.data(), dy.data(), g.data());
    mpar::host::bias_add_backward<float>(c.rows, c.cols, g.data(), dbias.data());
    mpar::host::convert(n, static_cast<const float*>(g.data()), dpre.data());
    CHECK(gelu_bias_same_bytes(dpre, got.dpre));
    CHECK(gelu_bias_same_bytes(dbias, got.dbias));
  }
}

}  // namespace

TEMPLATE_TEST_CASE(
    "gelu_backward_bias: GeLU's derivative, the bias sums and the 16-bit rounding match a double "
    "reference and the unfused operations' bits",
    "[backend][kernels][gelu]", mpar::HostBackend, mpar::StreamHostBackend, mpar::DiscreteHostBackend) {
  check_gelu_bias_cases<TestType, mpar::bf16>();
  check_gelu_bias_cases<TestType, mpar::f16>();
}
