// mpar's host GEMM (HostBackend's ops::gemm: the per-thread primitive cache, the one-thread guard and the
// argument checks around oneDNN's matmul) against a raw oneDNN matmul primitive created once and
// executed on the same operands, in fp32 and bf16 x bf16 -> fp32; OpenBLAS's cblas_sgemm is printed for
// reference. Goal: no abstraction cost (ratio >= 0.95). Everything runs on one thread, as a rank does.
// Then attention's batched products (train_gpt's default micro-batch: 4 sequences x 4 heads, seq 64,
// head 64): ops::gemm_strided_batched with a two-level batch (sequences x heads, operands at
// attention's strides inside the qkv matrix) against a raw oneDNN 4-D matmul on the same memory, with the
// per-matrix loop (one 2-D GEMM per (sequence, head)) printed for reference.
// bf16 rows also time mpar's avx512_bf16 kernel (host/avx512_bf16_gemm.hpp), pinned, where the CPU has it:
// its GFLOP/s and its speed against oneDNN's bf16 matmul (paired runs) and oneDNN's fp32 one of the same
// shape; the attention table adds the per-matrix loop on it. The JSON line adds the geometric means of
// those two ratios over the 2-D shapes (null without avx512_bf16) and the kernel mpar's bf16 GEMM uses.
// Last line: ours / baseline = GFLOP/s over all shapes, batched products and both precisions (total flops /
// total median time), ratio > 1: mpar is faster; loadavg says how busy the machine was (measure on an idle one).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mpar/backend/host/avx512_bf16_gemm.hpp>  // the kernel, also in a oneDNN build (bf16_gemm_kernel.hpp)
#include <mpar/mpar.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "bench_util.hpp"

#if !defined(MPAR_HAVE_ONEDNN)
int main() {
  std::printf(
      "{\"bench\": \"gemm\", \"skipped\": true, \"reason\": \"mpar was configured with MPAR_HOST_GEMM=%s, not "
      "onednn\"}\n",
      mpar::host_gemm_library);
}
#else
#include <dlfcn.h>

#include <oneapi/dnnl/dnnl.hpp>
#if defined(MPAR_HAVE_CBLAS)
#include <cblas.h>
#endif

namespace {
/** A raw oneDNN matmul, set up the way a direct user of oneDNN would: primitive and memories made once. */
struct RawMatmul {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  dnnl::matmul primitive;
  dnnl::memory a, b, c;
  RawMatmul(std::size_t m, std::size_t n, std::size_t k, bool ta, dnnl::memory::data_type in, void* pa, void* pb,
            float* pc) {
    using dims = dnnl::memory::dims;
    const auto M = dnnl::memory::dim(m), N = dnnl::memory::dim(n), K = dnnl::memory::dim(k);
    const dnnl::memory::desc a_md({M, K}, in, ta ? dims{1, M} : dims{K, 1}), b_md({K, N}, in, dims{N, 1}),
        c_md({M, N}, dnnl::memory::data_type::f32, dims{N, 1});
    primitive = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), engine));
    a = dnnl::memory(a_md, engine, pa);
    b = dnnl::memory(b_md, engine, pb);
    c = dnnl::memory(c_md, engine, pc);
  }
  void run() {
    primitive.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    stream.wait();
  }
};

/** A raw oneDNN batched matmul over [outer, inner, rows, cols] operands at arbitrary strides, made once. */
struct RawBatchedMatmul {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  dnnl::matmul primitive;
  dnnl::memory a, b, c;
  using dims = dnnl::memory::dims;
  RawBatchedMatmul(const dims& a_dims, const dims& a_str, const dims& b_dims, const dims& b_str, const dims& c_dims,
                   const dims& c_str, dnnl::memory::data_type in, void* pa, void* pb, float* pc) {
    const dnnl::memory::desc a_md(a_dims, in, a_str), b_md(b_dims, in, b_str),
        c_md(c_dims, dnnl::memory::data_type::f32, c_str);
    primitive = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), engine));
    a = dnnl::memory(a_md, engine, pa);
    b = dnnl::memory(b_md, engine, pb);
    c = dnnl::memory(c_md, engine, pc);
  }
  void run() {
    primitive.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    stream.wait();
  }
};

double max_abs_diff(const std::vector<float>& x, const std::vector<float>& y) {
  double d = 0;
  for (std::size_t i = 0; i < x.size(); ++i) d = std::max(d, double(std::fabs(x[i] - y[i])));
  return d;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace mpar;
  const bool smoke = bench::has_flag(argc, argv, "--smoke");
  HostBackend::init_rank();
  // The raw baseline runs on one thread too: oneDNN (OpenMP build) follows this thread's OpenMP setting.
  if (auto set = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"))) set(1);
  struct Shape {
    const char* name;
    std::size_t m, n, k;
    bool ta;  // A stored transposed (the weight-gradient GEMMs x^T dy)
  };
  std::vector<Shape> shapes = {{"256x1024x256", 256, 1024, 256, false},
                               {"256x256x1024", 256, 256, 1024, false},
                               {"gpt qkv (2048 tok, 256->768)", 2048, 768, 256, false},
                               {"gpt fc1 (2048 tok, 256->1024)", 2048, 1024, 256, false},
                               {"gpt fc2 dW (x^T dy, 2048 tok)", 1024, 256, 2048, true}};
  if (smoke) shapes = {{"64x64x64", 64, 64, 64, false}, {"64x48x32 ta", 64, 48, 32, true}};
  const int reps = smoke ? 1 : 21;

  std::printf("host GEMM, one thread, median of %d alternating runs; isa of mpar's kernels: %s; bf16 kernel: %s\n",
              reps, host::isa_name(host::active_isa()), host::bf16_gemm_kernel_name(host::bf16_gemm_kernel()));
  // The avx512_bf16 kernel, pinned, beside oneDNN's bf16 (paired runs) and fp32 matmuls of the same shape.
  const bool kernel_runs = host::cpu_has_avx512_bf16();
  std::printf("%-32s %6s %12s %12s %8s %14s %12s %10s %10s\n", "shape MxNxK", "type", "mpar GFLOP/s", "oneDNN GFLOP/s",
              "ratio", "OpenBLAS sgemm", "avx512_bf16", "x dnn bf16", "x dnn f32");
  double flops_total = 0, ours_total = 0, base_total = 0, sum_log_ratio = 0;
  double kernel_vs_bf16_log = 0, kernel_vs_f32_log = 0;  // the avx512_bf16 kernel against oneDNN, 2-D shapes
  int cases = 0, kernel_cases = 0;
  for (const auto& s : shapes) {
    const std::size_t a_cols = s.ta ? s.m : s.k;
    std::vector<float> a(s.m * s.k), b(s.k * s.n), c(s.m * s.n), c_raw(s.m * s.n), c_blas(s.m * s.n);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = init_value(1, 0, i, InitSpec::uniform(1));
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = init_value(1, 1, i, InitSpec::uniform(1));
    std::vector<bf16> ah(a.size()), bh(b.size());
    for (std::size_t i = 0; i < a.size(); ++i) ah[i] = bf16(a[i]);
    for (std::size_t i = 0; i < b.size(); ++i) bh[i] = bf16(b[i]);
    const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k);
    const Trans ta = s.ta ? Trans::yes : Trans::no;

    double blas_gflops = 0, onednn_f32_time = 0;
#if defined(MPAR_HAVE_CBLAS)
    {
      auto sgemm = [&] {
        cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, CblasNoTrans, int(s.m), int(s.n), int(s.k), 1.0f,
                    a.data(), int(a_cols), b.data(), int(s.n), 0.0f, c_blas.data(), int(s.n));
      };
      sgemm();  // warm-up
      std::vector<double> times;
      for (int r = 0; r < reps; ++r) times.push_back(bench::time_once(sgemm));
      blas_gflops = flops / bench::median(times) * 1e-9;
    }
#endif
    for (const bool half : {false, true}) {
      RawMatmul raw(s.m, s.n, s.k, s.ta, half ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32,
                    half ? static_cast<void*>(ah.data()) : static_cast<void*>(a.data()),
                    half ? static_cast<void*>(bh.data()) : static_cast<void*>(b.data()), c_raw.data());
      auto ours = [&] {
        if (half)
          HostBackend::run(ops::gemm<bf16, float>{.ta = ta,
                                                  .tb = Trans::no,
                                                  .m = s.m,
                                                  .n = s.n,
                                                  .k = s.k,
                                                  .alpha = 1.0f,
                                                  .a = ah.data(),
                                                  .lda = a_cols,
                                                  .b = bh.data(),
                                                  .ldb = s.n,
                                                  .beta = 0.0f,
                                                  .c = c.data(),
                                                  .ldc = s.n});
        else
          HostBackend::run(ops::gemm<float>{.ta = ta,
                                            .tb = Trans::no,
                                            .m = s.m,
                                            .n = s.n,
                                            .k = s.k,
                                            .alpha = 1.0f,
                                            .a = a.data(),
                                            .lda = a_cols,
                                            .b = b.data(),
                                            .ldb = s.n,
                                            .beta = 0.0f,
                                            .c = c.data(),
                                            .ldc = s.n});
      };
      const auto [t_ours, t_base] = bench::paired_medians(reps, ours, [&] { raw.run(); });
      // Same library, same problem: the results must agree to fp32 rounding (summation order may differ).
      const double diff = max_abs_diff(c, c_raw);
      if (!(diff <= 1e-4 * double(s.k))) {
        std::fprintf(stderr, "gemm bench: mpar and raw oneDNN differ by %g for %s (%s)\n", diff, s.name,
                     half ? "bf16" : "f32");
        return 1;
      }
      if (!half) onednn_f32_time = t_base;
      std::printf("%-32s %6s %12.1f %12.1f %8.3f %14.1f", s.name, half ? "bf16" : "f32", flops / t_ours * 1e-9,
                  flops / t_base * 1e-9, t_base / t_ours, blas_gflops);
      if (half && kernel_runs) {
        host::ScopedBf16GemmKernel pin(host::Bf16GemmKernel::avx512_bf16);
        const auto [t_kernel, t_bf16] = bench::paired_medians(reps, ours, [&] { raw.run(); });
        if (!(max_abs_diff(c, c_raw) <= 1e-4 * double(s.k))) {
          std::fprintf(stderr, "gemm bench: the avx512_bf16 kernel and raw oneDNN differ for %s\n", s.name);
          return 1;
        }
        std::printf(" %12.1f %10.3f %10.3f", flops / t_kernel * 1e-9, t_bf16 / t_kernel, onednn_f32_time / t_kernel);
        kernel_vs_bf16_log += std::log(t_bf16 / t_kernel);
        kernel_vs_f32_log += std::log(onednn_f32_time / t_kernel);
        ++kernel_cases;
      }
      std::printf("\n");
      flops_total += flops;
      ours_total += t_ours;
      base_total += t_base;
      sum_log_ratio += std::log(t_base / t_ours);
      ++cases;
    }
  }

  // Attention's products over a micro-batch: one two-level batched call each.
  const std::size_t nb = smoke ? 2 : 4, heads = smoke ? 2 : 4, seq = smoke ? 16 : 64, hd = smoke ? 8 : 64;
  const std::size_t hl = heads * hd, ld = 3 * hl, ss = seq * seq;
  std::vector<float> qkv(nb * seq * ld), probs(nb * heads * ss), go(nb * seq * hl), out(nb * seq * ld),
      out_raw(out.size());
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = init_value(2, 0, i, InitSpec::uniform(1));
  for (std::size_t i = 0; i < probs.size(); ++i) probs[i] = init_value(2, 1, i, InitSpec::uniform(1));
  for (std::size_t i = 0; i < go.size(); ++i) go[i] = init_value(2, 2, i, InitSpec::uniform(1));
  std::vector<bf16> qkv_h(qkv.size()), probs_h(probs.size()), go_h(go.size());
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv_h[i] = bf16(qkv[i]);
  for (std::size_t i = 0; i < probs.size(); ++i) probs_h[i] = bf16(probs[i]);
  for (std::size_t i = 0; i < go.size(); ++i) go_h[i] = bf16(go[i]);
  /** One operand: which buffer, its leading dimension and where head h of sequence b starts. */
  struct Operand {
    int buffer;  // 0 qkv, 1 probs, 2 dO
    std::size_t offset, ld, seq, head;
  };
  const Operand q{0, 0, ld, seq * ld, hd}, k{0, hl, ld, seq * ld, hd}, v{0, 2 * hl, ld, seq * ld, hd},
      p{1, 0, seq, heads * ss, ss}, g{2, 0, hl, seq * hl, hd};
  struct Product {
    const char* name;
    bool ta, tb;
    std::size_t m, n, k;
    Operand a, b;
    std::size_t c_offset, ldc, c_seq, c_head;  // into `out`, a [tokens, 3 hl] gradient or [b, h, s, s] scores
  };
  const std::vector<Product> products = {
      {"attn scores q k^T", false, true, seq, seq, hd, q, k, 0, seq, heads * ss, ss},
      {"attn out P v", false, false, seq, hd, seq, p, v, 0, hl, seq * hl, hd},
      {"attn dV = P^T dO", true, false, seq, hd, seq, p, g, 2 * hl, ld, seq * ld, hd},
      {"attn dQ = dS k", false, false, seq, hd, seq, p, k, 0, ld, seq * ld, hd}};
  std::printf("\nattention products, %zu sequences x %zu heads, seq %zu, head %zu: one batched call each\n", nb, heads,
              seq, hd);
  std::printf("%-32s %6s %12s %12s %8s %14s %12s\n", "product", "type", "mpar GFLOP/s", "oneDNN GFLOP/s", "ratio",
              "2-D loop", "avx512_bf16 loop");
  double b_ours = 0, b_base = 0, b_log = 0;
  int b_cases = 0;
  for (const auto& pr : products)
    for (const bool half : {false, true}) {
      auto ptr = [&](const Operand& o) -> void* {
        if (half) {
          bf16* base = o.buffer == 0 ? qkv_h.data() : o.buffer == 1 ? probs_h.data() : go_h.data();
          return base + o.offset;
        }
        float* base = o.buffer == 0 ? qkv.data() : o.buffer == 1 ? probs.data() : go.data();
        return base + o.offset;
      };
      using dims = dnnl::memory::dims;
      auto d = [](std::size_t x) { return dnnl::memory::dim(x); };
      RawBatchedMatmul raw(dims{d(nb), d(heads), d(pr.m), d(pr.k)},
                           dims{d(pr.a.seq), d(pr.a.head), pr.ta ? 1 : d(pr.a.ld), pr.ta ? d(pr.a.ld) : 1},
                           dims{d(nb), d(heads), d(pr.k), d(pr.n)},
                           dims{d(pr.b.seq), d(pr.b.head), pr.tb ? 1 : d(pr.b.ld), pr.tb ? d(pr.b.ld) : 1},
                           dims{d(nb), d(heads), d(pr.m), d(pr.n)}, dims{d(pr.c_seq), d(pr.c_head), d(pr.ldc), 1},
                           half ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32, ptr(pr.a), ptr(pr.b),
                           out_raw.data() + pr.c_offset);
      const Trans ta = pr.ta ? Trans::yes : Trans::no, tb = pr.tb ? Trans::yes : Trans::no;
      auto call = [&](auto* a, auto* b) {
        using T = std::remove_const_t<std::remove_pointer_t<decltype(a)>>;
        HostBackend::run(ops::gemm_strided_batched<T, float>{.ta = ta,
                                                             .tb = tb,
                                                             .m = pr.m,
                                                             .n = pr.n,
                                                             .k = pr.k,
                                                             .alpha = 1.0f,
                                                             .a = a,
                                                             .lda = pr.a.ld,
                                                             .stride_a = BatchStrides{pr.a.seq, pr.a.head},
                                                             .b = b,
                                                             .ldb = pr.b.ld,
                                                             .stride_b = BatchStrides{pr.b.seq, pr.b.head},
                                                             .beta = 0.0f,
                                                             .c = out.data() + pr.c_offset,
                                                             .ldc = pr.ldc,
                                                             .stride_c = BatchStrides{pr.c_seq, pr.c_head},
                                                             .batch = BatchExtents{nb, heads}});
      };
      auto loop = [&](auto* a, auto* b) {
        using T = std::remove_const_t<std::remove_pointer_t<decltype(a)>>;
        for (std::size_t i = 0; i < nb; ++i)
          for (std::size_t j = 0; j < heads; ++j)
            HostBackend::run(ops::gemm<T, float>{.ta = ta,
                                                 .tb = tb,
                                                 .m = pr.m,
                                                 .n = pr.n,
                                                 .k = pr.k,
                                                 .alpha = 1.0f,
                                                 .a = a + i * pr.a.seq + j * pr.a.head,
                                                 .lda = pr.a.ld,
                                                 .b = b + i * pr.b.seq + j * pr.b.head,
                                                 .ldb = pr.b.ld,
                                                 .beta = 0.0f,
                                                 .c = out.data() + pr.c_offset + i * pr.c_seq + j * pr.c_head,
                                                 .ldc = pr.ldc});
      };
      auto ours = [&] {
        if (half)
          call(static_cast<const bf16*>(ptr(pr.a)), static_cast<const bf16*>(ptr(pr.b)));
        else
          call(static_cast<const float*>(ptr(pr.a)), static_cast<const float*>(ptr(pr.b)));
      };
      auto per_matrix = [&] {
        if (half)
          loop(static_cast<const bf16*>(ptr(pr.a)), static_cast<const bf16*>(ptr(pr.b)));
        else
          loop(static_cast<const float*>(ptr(pr.a)), static_cast<const float*>(ptr(pr.b)));
      };
      const auto [t_ours, t_base] = bench::paired_medians(reps, ours, [&] { raw.run(); });
      std::vector<double> loop_times;
      per_matrix();
      for (int r = 0; r < reps; ++r) loop_times.push_back(bench::time_once(per_matrix));
      double kernel_loop_gflops = 0;  // the per-matrix loop on the avx512_bf16 kernel, pinned
      const double flops = 2.0 * double(nb * heads) * double(pr.m) * double(pr.n) * double(pr.k);
      if (half && kernel_runs) {
        host::ScopedBf16GemmKernel pin(host::Bf16GemmKernel::avx512_bf16);
        std::vector<double> kernel_times;
        per_matrix();
        for (int r = 0; r < reps; ++r) kernel_times.push_back(bench::time_once(per_matrix));
        kernel_loop_gflops = flops / bench::median(kernel_times) * 1e-9;
      }
      const double diff = max_abs_diff(out, out_raw);
      if (!(diff <= 1e-4 * double(pr.k))) {
        std::fprintf(stderr, "gemm bench: mpar and raw oneDNN differ by %g for %s (%s)\n", diff, pr.name,
                     half ? "bf16" : "f32");
        return 1;
      }
      std::printf("%-32s %6s %12.1f %12.1f %8.3f %14.1f", pr.name, half ? "bf16" : "f32", flops / t_ours * 1e-9,
                  flops / t_base * 1e-9, t_base / t_ours, flops / bench::median(loop_times) * 1e-9);
      if (kernel_loop_gflops > 0) std::printf(" %12.1f", kernel_loop_gflops);
      std::printf("\n");
      flops_total += flops;
      ours_total += t_ours;
      base_total += t_base;
      sum_log_ratio += std::log(t_base / t_ours);
      ++cases;
      b_ours += t_ours;
      b_base += t_base;
      b_log += std::log(t_base / t_ours);
      ++b_cases;
    }
  bench::print_result_json(
      "gemm", flops_total / ours_total * 1e-9, flops_total / base_total * 1e-9, "GFLOP/s", true,
      "\"geomean_ratio\": " + std::to_string(std::exp(sum_log_ratio / cases)) +
          ", \"batched_ratio\": " + std::to_string(b_base / b_ours) +
          ", \"batched_geomean_ratio\": " + std::to_string(std::exp(b_log / b_cases)) + ", \"bf16_kernel\": \"" +
          host::bf16_gemm_kernel_name(host::bf16_gemm_kernel()) + "\", \"avx512_bf16_vs_onednn_bf16_geomean\": " +
          (kernel_cases ? std::to_string(std::exp(kernel_vs_bf16_log / kernel_cases)) : "null") +
          ", \"avx512_bf16_vs_onednn_f32_geomean\": " +
          (kernel_cases ? std::to_string(std::exp(kernel_vs_f32_log / kernel_cases)) : "null") +
          ", \"baseline_name\": \"raw oneDNN matmul (1 thread)\", \"loadavg\": " + mpar::bench::load_average());
}
#endif
