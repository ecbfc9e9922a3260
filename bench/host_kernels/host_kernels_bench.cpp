// The host element-wise kernels (mpar::host, float) against the scalar std::exp / std::tanh versions
// they replaced, kept below as the baseline, on the shapes of the GPT training benchmark (hidden 256,
// FFN 1024, 4 heads, seq 64, 256 tokens per micro-batch). Single-threaded, as a rank runs them.
// The mpar kernels run on the CPU's best instruction set (isa.hpp); the same set is also timed pinned to
// each lower level, so the gain of the run-time dispatch shows next to the gain over std::.
// Last line: ours / baseline = elements per second over the whole set of kernels (total elements /
// total median time), ratio > 1: the mpar kernels are faster; loadavg says how busy the machine was.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <mpar/backend/host/kernels.hpp>
#include <string>
#include <vector>

#include "bench_util.hpp"

namespace baseline {
// The previous implementations of mpar::host (scalar, libm per element), verbatim in behaviour.
constexpr float k = 0.7978845608028654f, c = 0.044715f;
void gelu_forward(std::size_t n, const float* x, float* y) {
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + std::tanh(k * (v + c * v * v * v)));
  }
}
void gelu_backward(std::size_t n, const float* x, const float* dy, float* dx) {
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = std::tanh(k * (v + c * v * v * v));
    const float dt = k * (1.0f + 3.0f * c * v * v) * (1.0f - t * t);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * dt);
  }
}
void softmax_forward(std::size_t rows, std::size_t cols, const float* x, float* y, bool causal, float scale) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    const std::size_t valid = causal ? r % cols + 1 : cols;
    float mx = -std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < valid; ++j) mx = std::max(mx, scale * xr[j]);
    float sum = 0;
    for (std::size_t j = 0; j < valid; ++j) sum += (yr[j] = std::exp(scale * xr[j] - mx));
    const float inv = 1.0f / sum;
    for (std::size_t j = 0; j < valid; ++j) yr[j] *= inv;
    for (std::size_t j = valid; j < cols; ++j) yr[j] = 0.0f;
  }
}
void softmax_backward(std::size_t rows, std::size_t cols, const float* y, const float* dy, float* dx) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float *yr = y + r * cols, *dyr = dy + r * cols;
    float dot = 0;
    for (std::size_t j = 0; j < cols; ++j) dot += yr[j] * dyr[j];
    for (std::size_t j = 0; j < cols; ++j) dx[r * cols + j] = yr[j] * (dyr[j] - dot);
  }
}
void layernorm_forward(std::size_t rows, std::size_t cols, const float* x, const float* gamma, const float* beta,
                       float* y, float* mean, float* rstd) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float m = 0;
    for (std::size_t j = 0; j < cols; ++j) m += xr[j];
    m /= float(cols);
    float v = 0;
    for (std::size_t j = 0; j < cols; ++j) v += (xr[j] - m) * (xr[j] - m);
    v /= float(cols);
    const float rs = 1.0f / std::sqrt(v + 1e-5f);
    mean[r] = m;
    rstd[r] = rs;
    for (std::size_t j = 0; j < cols; ++j) y[r * cols + j] = (xr[j] - m) * rs * gamma[j] + beta[j];
  }
}
void layernorm_backward(std::size_t rows, std::size_t cols, const float* x, const float* mean, const float* rstd,
                        const float* gamma, const float* dy, float* dx, float* dgamma, float* dbeta) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float *xr = x + r * cols, *dyr = dy + r * cols;
    const float m = mean[r], rs = rstd[r];
    float sum_g = 0, sum_gx = 0;
    for (std::size_t j = 0; j < cols; ++j) {
      const float xhat = (xr[j] - m) * rs;
      const float g = dyr[j] * gamma[j];
      sum_g += g;
      sum_gx += g * xhat;
      dgamma[j] += dyr[j] * xhat;
      dbeta[j] += dyr[j];
    }
    const float inv_n = 1.0f / float(cols);
    for (std::size_t j = 0; j < cols; ++j) {
      const float xhat = (xr[j] - m) * rs;
      dx[r * cols + j] = rs * (dyr[j] * gamma[j] - inv_n * (sum_g + xhat * sum_gx));
    }
  }
}
}  // namespace baseline

namespace {
std::vector<float> filled(std::size_t n, std::uint64_t stream, double scale) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float(mpar::init_value(5, stream, i, mpar::InitSpec::uniform(scale)));
  return v;
}
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double w = 0, m = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    w = std::max(w, double(std::fabs(a[i] - b[i]))), m = std::max(m, double(std::fabs(b[i])));
  return m > 0 ? w / m : w;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace mpar;
  const bool smoke = bench::has_flag(argc, argv, "--smoke");
  const int reps = smoke ? 3 : 41;
  const std::size_t tokens = smoke ? 32 : 256, hidden = 256, ffn = 4 * hidden, heads = 4, seq = 64;
  const std::size_t att_rows = tokens * heads;  // [batch, heads, seq] rows of seq scores

  std::vector<float> xf = filled(tokens * ffn, 1, 4.0), gf = filled(tokens * ffn, 2, 1.0), yf(tokens * ffn),
                     yb(tokens * ffn);
  std::vector<float> xa = filled(att_rows * seq, 3, 6.0), ga = filled(att_rows * seq, 4, 1.0), ya(att_rows * seq),
                     yab(att_rows * seq), dxa(att_rows * seq);
  std::vector<float> xl = filled(tokens * hidden, 5, 2.0), gl = filled(tokens * hidden, 6, 1.0),
                     gam = filled(hidden, 7, 1.0), bet = filled(hidden, 8, 0.5), yl(tokens * hidden),
                     dxl(tokens * hidden), mean(tokens), rstd(tokens), dgam(hidden), dbet(hidden);

  struct Row {
    std::string name;
    double elements, ours, base, diff;
  };
  std::vector<Row> rows;
  auto measure = [&](const std::string& name, double elements, auto&& ours, auto&& base, auto&& diff) {
    const auto [t_ours, t_base] = bench::paired_medians(reps, ours, base);
    rows.push_back({name, elements, t_ours, t_base, diff()});
  };
  const float scale = 1.0f / std::sqrt(float(hidden / heads));  // attention score scale
  measure(
      "gelu_forward", double(xf.size()), [&] { host::gelu_forward(xf.size(), xf.data(), yf.data()); },
      [&] { baseline::gelu_forward(xf.size(), xf.data(), yb.data()); }, [&] { return max_rel_diff(yf, yb); });
  measure(
      "gelu_backward", double(xf.size()), [&] { host::gelu_backward(xf.size(), xf.data(), gf.data(), yf.data()); },
      [&] { baseline::gelu_backward(xf.size(), xf.data(), gf.data(), yb.data()); },
      [&] { return max_rel_diff(yf, yb); });
  measure(
      "softmax_forward causal", double(xa.size()),
      [&] { host::softmax_forward(att_rows, seq, xa.data(), ya.data(), true, scale); },
      [&] { baseline::softmax_forward(att_rows, seq, xa.data(), yab.data(), true, scale); },
      [&] { return max_rel_diff(ya, yab); });
  measure(
      "softmax_backward", double(xa.size()),
      [&] { host::softmax_backward(att_rows, seq, ya.data(), ga.data(), dxa.data()); },
      [&] { baseline::softmax_backward(att_rows, seq, ya.data(), ga.data(), yab.data()); },
      [&] { return max_rel_diff(dxa, yab); });
  std::vector<float> ylb(yl.size()), meanb(tokens), rstdb(tokens);
  measure(
      "layernorm_forward", double(xl.size()),
      [&] {
        host::layernorm_forward(tokens, hidden, xl.data(), gam.data(), bet.data(), yl.data(), mean.data(), rstd.data());
      },
      [&] {
        baseline::layernorm_forward(tokens, hidden, xl.data(), gam.data(), bet.data(), ylb.data(), meanb.data(),
                                    rstdb.data());
      },
      [&] { return max_rel_diff(yl, ylb); });
  std::vector<float> dxlb(dxl.size()), dgamb(hidden), dbetb(hidden);
  measure(
      "layernorm_backward", double(xl.size()),
      [&] {
        host::layernorm_backward(tokens, hidden, xl.data(), mean.data(), rstd.data(), gam.data(), gl.data(), dxl.data(),
                                 dgam.data(), dbet.data());
      },
      [&] {
        baseline::layernorm_backward(tokens, hidden, xl.data(), mean.data(), rstd.data(), gam.data(), gl.data(),
                                     dxlb.data(), dgamb.data(), dbetb.data());
      },
      [&] { return max_rel_diff(dxl, dxlb); });

  std::printf("host kernels (float, single thread), median of %d alternating runs\n", reps);
  std::printf("%-24s %12s %14s %14s %8s %12s\n", "kernel", "elements", "mpar Melem/s", "std:: Melem/s", "ratio",
              "max rel diff");
  double total = 0, t_ours = 0, t_base = 0;
  bool ok = true;
  for (const Row& r : rows) {
    std::printf("%-24s %12.0f %14.1f %14.1f %7.2fx %12.2e\n", r.name.c_str(), r.elements, r.elements / r.ours * 1e-6,
                r.elements / r.base * 1e-6, r.base / r.ours, r.diff);
    total += r.elements;
    t_ours += r.ours;
    t_base += r.base;
    ok = ok && r.diff < 1e-5;
  }
  if (!ok) {
    std::fprintf(stderr, "host_kernels bench: the kernels disagree with the baseline by more than 1e-5 (norm-wise)\n");
    return 1;
  }
  // The whole set again, pinned to each instruction-set level this CPU runs (the rows above ran on the best).
  std::printf("%-24s %14s\n", "instruction set", "mpar Melem/s");
  for (const host::Isa isa : host::supported_isas()) {
    host::ScopedIsa pin(isa);
    std::vector<double> times;
    for (int r = 0; r < reps; ++r)
      times.push_back(bench::time_once([&] {
        host::gelu_forward(xf.size(), xf.data(), yf.data());
        host::gelu_backward(xf.size(), xf.data(), gf.data(), yf.data());
        host::softmax_forward(att_rows, seq, xa.data(), ya.data(), true, scale);
        host::softmax_backward(att_rows, seq, ya.data(), ga.data(), dxa.data());
        host::layernorm_forward(tokens, hidden, xl.data(), gam.data(), bet.data(), yl.data(), mean.data(), rstd.data());
        host::layernorm_backward(tokens, hidden, xl.data(), mean.data(), rstd.data(), gam.data(), gl.data(), dxl.data(),
                                 dgam.data(), dbet.data());
      }));
    std::printf("%-24s %14.1f\n", host::isa_name(isa), total / bench::median(times) * 1e-6);
  }
  bench::print_result_json("host_kernels", total / t_ours, total / t_base, "elements/s", true,
                           "\"reps\": " + std::to_string(reps) + ", \"isa\": \"" +
                               host::isa_name(host::detected_isa()) +
                               "\", \"loadavg\": " + mpar::bench::load_average());
  return 0;
}
