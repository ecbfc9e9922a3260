// mpar's host GEMM (matmul on tensor views through HostBackend) against a raw cblas_sgemm call on
// the same operands. Goal: no abstraction cost (ratio >= 0.97). Both run single-threaded, as ranks do.
#include <cmath>
#include <cstdio>
#include <mpar/mpar.hpp>
#include <string>
#include <vector>

#include "bench_util.hpp"

#if !defined(MPAR_HAVE_CBLAS)
int main() {
  std::printf("{\"bench\": \"gemm\", \"skipped\": true, \"reason\": \"no CBLAS found at configure time\"}\n");
}
#else
#include <cblas.h>

int main(int argc, char** argv) {
  using namespace mpar;
  const bool smoke = bench::has_flag(argc, argv, "--smoke");
  HostBackend::init_rank();
  struct Shape {
    const char* name;
    std::size_t m, n, k;
  };
  std::vector<Shape> shapes = {{"square-256", 256, 256, 256},
                               {"square-512", 512, 512, 512},
                               {"square-1024", 1024, 1024, 1024},
                               {"square-2048", 2048, 2048, 2048},
                               {"mlp-fc1 (tokens 2048, h 1024 -> 4096)", 2048, 4096, 1024}};
  if (smoke) shapes = {{"square-64", 64, 64, 64}};
  const int reps = smoke ? 1 : 15;

  std::printf("%-40s %12s %12s %8s\n", "shape", "mpar GFLOP/s", "cblas GFLOP/s", "ratio");
  double sum_log_ratio = 0, ours_total = 0, base_total = 0;
  for (const auto& s : shapes) {
    Tensor<float, 2> a({s.m, s.k}), b({s.k, s.n}), c({s.m, s.n}), c_ref({s.m, s.n});
    init_full(a, 1, 0, InitSpec::uniform(1));
    init_full(b, 1, 1, InitSpec::uniform(1));
    const auto [t_ours, t_base] = bench::paired_medians(
        reps, [&] { matmul<float>(a.view(), Trans::no, b.view(), Trans::no, c.view()); },
        [&] {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(s.m), int(s.n), int(s.k), 1.0f, a.data(), int(s.k),
                      b.data(), int(s.n), 0.0f, c_ref.data(), int(s.n));
        });
    if (c.values() != c_ref.values()) {
      std::fprintf(stderr, "gemm bench: results differ for %s\n", s.name);
      return 1;
    }
    const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k);
    std::printf("%-40s %12.2f %12.2f %8.3f\n", s.name, flops / t_ours * 1e-9, flops / t_base * 1e-9, t_base / t_ours);
    sum_log_ratio += std::log(t_base / t_ours);
    ours_total += t_ours;
    base_total += t_base;
  }
  // Headline: total time over all shapes (dominated by the large ones), as GFLOP/s-weighted throughput.
  double flops_total = 0;
  for (const auto& s : shapes) flops_total += 2.0 * double(s.m) * double(s.n) * double(s.k);
  bench::print_result_json("gemm", flops_total / ours_total * 1e-9, flops_total / base_total * 1e-9, "GFLOP/s", true,
                           "\"geomean_ratio\": " + std::to_string(std::exp(sum_log_ratio / double(shapes.size()))) +
                               ", \"baseline_name\": \"cblas_sgemm (OpenBLAS, 1 thread)\"");
}
#endif
