// The host AdamW update (backend/host/optimizer_kernels.hpp, its vector blocks in adamw_blocks.hpp) at every
// instruction-set level against the textbook float formula written out here, operation by operation, bit for
// bit: lengths with every tail, gradients over many binades, a skipped step.
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <mpar/backend/host/optimizer_kernels.hpp>
#include <vector>

namespace {

struct AdamwKernelCase {
  float beta1, beta2, eps, lr, weight_decay, bc1, bc2, grad_scale;
};

/** One update by the formula, each operation rounded to float in the documented order (this file is compiled
 * without -march, so x86-64's baseline has no FMA that could fuse a product into a sum). */
void adamw_kernel_reference(std::vector<float>& w, const std::vector<float>& g, std::vector<float>& m,
                            std::vector<float>& v, const AdamwKernelCase& c) {
  const float decay = 1.0f - c.lr * c.weight_decay;
  for (std::size_t i = 0; i < w.size(); ++i) {
    const float gi = g[i] * c.grad_scale;
    const float m1 = c.beta1 * m[i], m2 = (1.0f - c.beta1) * gi;
    m[i] = m1 + m2;
    const float v1 = c.beta2 * v[i], v2 = ((1.0f - c.beta2) * gi) * gi;
    v[i] = v1 + v2;
    const float mhat = m[i] / c.bc1, vhat = v[i] / c.bc2;
    const float kept = w[i] * decay;
    const float step = (c.lr * mhat) / (std::sqrt(vhat) + c.eps);
    w[i] = kept - step;
  }
}

/** Values spread over many binades with both signs (and exact zeros), so that roundings differ if fused. */
std::vector<float> adamw_kernel_values(std::size_t n, std::uint32_t seed, int binades) {
  std::vector<float> x(n);
  std::uint32_t s = seed * 2654435761u + 12345u;
  for (std::size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    const float mant = 1.0f + float(s >> 9) * 0x1p-23f;
    const int e = int((s >> 3) % std::uint32_t(binades)) - binades / 2;
    x[i] = (s & 1u ? -1.0f : 1.0f) * std::ldexp(mant, e);
    if (s % 29 == 0) x[i] = 0.0f;
  }
  return x;
}

bool adamw_kernel_same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return false;
  return true;
}

}  // namespace

TEST_CASE("host adamw_update: every level equals the float formula bit for bit, tails included",
          "[backend][optimizer_kernels]") {
  const AdamwKernelCase cases[] = {{0.9f, 0.999f, 1e-8f, 1e-3f, 0.01f, 0.1f, 0.001f, 1.0f},
                                   {0.85f, 0.97f, 1e-7f, 0.02f / 3.0f, 0.2f, 0.385875f, 0.087327f, 0.37f},
                                   {0.8f, 0.95f, 1e-6f, 0.5f, 0.0f, 0.99f, 0.9f, 3.5f}};
  for (const mpar::host::Isa isa : mpar::host::supported_isas()) {
    mpar::host::ScopedIsa pin(isa);
    for (const AdamwKernelCase& c : cases)
      for (std::size_t n : {0u, 1u, 15u, 16u, 17u, 33u, 47u, 64u, 1000u, 4099u}) {
        INFO("instruction set " << mpar::host::isa_name(isa) << ", n " << n << ", lr " << c.lr);
        std::vector<float> w = adamw_kernel_values(n, 1, 12), m = adamw_kernel_values(n, 2, 30);
        std::vector<float> v = adamw_kernel_values(n, 3, 30);
        for (float& x : v) x = std::fabs(x);  // a second moment is never negative
        std::vector<float> w_ref = w, m_ref = m, v_ref = v;
        for (int step = 0; step < 3; ++step) {  // the second and third steps start from updated moments
          const std::vector<float> g = adamw_kernel_values(n, 10 + std::uint32_t(step), 40);
          const mpar::UpdateFactors factors{c.grad_scale, 0.0f};
          mpar::host::adamw_update(n, w.data(), g.data(), m.data(), v.data(), c.beta1, c.beta2, c.eps, c.lr,
                                   c.weight_decay, c.bc1, c.bc2, &factors);
          adamw_kernel_reference(w_ref, g, m_ref, v_ref, c);
        }
        CHECK(adamw_kernel_same_bits(m, m_ref));
        CHECK(adamw_kernel_same_bits(v, v_ref));
        CHECK(adamw_kernel_same_bits(w, w_ref));
      }
  }
}

TEST_CASE("host adamw_update: a skipped step leaves weights and moments untouched at every level",
          "[backend][optimizer_kernels]") {
  for (const mpar::host::Isa isa : mpar::host::supported_isas()) {
    mpar::host::ScopedIsa pin(isa);
    const std::size_t n = 35;
    std::vector<float> w = adamw_kernel_values(n, 4, 8), m = adamw_kernel_values(n, 5, 8);
    std::vector<float> v = adamw_kernel_values(n, 6, 8), g = adamw_kernel_values(n, 7, 8);
    const std::vector<float> w0 = w, m0 = m, v0 = v;
    const mpar::UpdateFactors skip{1.0f, 1.0f};
    mpar::host::adamw_update(n, w.data(), g.data(), m.data(), v.data(), 0.9f, 0.999f, 1e-8f, 0.1f, 0.1f, 0.5f, 0.5f,
                             &skip);
    CHECK(adamw_kernel_same_bits(w, w0));
    CHECK(adamw_kernel_same_bits(m, m0));
    CHECK(adamw_kernel_same_bits(v, v0));
  }
}
