// GPT transformer block, forward + backward in bf16 on one GPU, built from mpar's CUDA backend
// (cuBLASLt GEMMs with fused bias/GeLU epilogues, batched attention GEMMs, mpar kernels).
// Reports block TFLOP/s and MFU against the device's dense bf16 peak, the raw cuBLAS TFLOP/s of
// the block's largest GEMM shape as the baseline, and an all-reduce bus-bandwidth table.
//
//   bench_cuda_block [--smoke] [--reps N] [--peak TFLOPS]
//
// Last line: {"bench": "cuda_block", "ours": block TFLOP/s (largest hidden), "baseline": cuBLAS GEMM
// TFLOP/s of that block's largest GEMM, "unit": "TFLOP/s", "ratio": ours / baseline, ...}. Without a
// CUDA device it says so and prints the same line with "skipped": true and null numbers.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"
#include "mpar/cuda.hpp"

using namespace mpar;

namespace {

cudaStream_t S() { return gpu::current_stream(); }

/** Fills a device array with a deterministic pattern in [-scale, scale) (values do not affect speed). */
template <class T>
gpu::DeviceBuffer<T> filled(std::size_t n, std::uint64_t seed, double scale) {
  std::vector<T> h(n);
  const CounterRng rng{seed, 3};
  for (std::size_t i = 0; i < n; ++i) h[i] = convert<T>(scale * (2.0 * rng.uniform(i % 65536) - 1.0));
  return gpu::to_device(std::span<const T>(h), S());
}

/** Median milliseconds of `reps` timed runs of f after `warm` untimed ones. */
template <class F>
double median_ms(int warm, int reps, F&& f) {
  for (int i = 0; i < warm; ++i) f();
  gpu::Event a(true), b(true);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    a.record(S());
    f();
    b.record(S());
    b.synchronize();
    ms.push_back(gpu::Event::elapsed_ms(a, b));
  }
  return bench::median(ms);
}

/** One GPT-2-style pre-LN block: weights [out, in] (y = x W^T + b), fp32 gradient accumulators. */
struct GptBlock {
  std::size_t s, h, heads, d;
  using B = bf16;
  gpu::DeviceBuffer<B> wqkv, bqkv, wo, bo, w1, b1, w2, b2, g1, be1, g2, be2;
  gpu::DeviceBuffer<float> dwqkv, dbqkv, dwo, dbo, dw1, db1, dw2, db2, dg1, dbe1, dg2, dbe2;
  gpu::DeviceBuffer<B> x, ln1, qkv, scores, probs, attn, x1, ln2, pre, act, y;
  gpu::DeviceBuffer<float> mean1, rstd1, mean2, rstd2;
  gpu::DeviceBuffer<B> dy, dact, dln2, dx1, dattn, dprobs, dqkv, dln1, dx, tmp;

  GptBlock(std::size_t seq, std::size_t hidden)
      : s(seq), h(hidden), heads(hidden / 128), d(128), wqkv(filled<B>(3 * h * h, 1, 0.02)),
        bqkv(filled<B>(3 * h, 2, 0.02)), wo(filled<B>(h * h, 3, 0.02)), bo(filled<B>(h, 4, 0.02)),
        w1(filled<B>(4 * h * h, 5, 0.02)), b1(filled<B>(4 * h, 6, 0.02)), w2(filled<B>(4 * h * h, 7, 0.02)),
        b2(filled<B>(h, 8, 0.02)), g1(filled<B>(h, 9, 1.0)), be1(filled<B>(h, 10, 0.1)), g2(filled<B>(h, 11, 1.0)),
        be2(filled<B>(h, 12, 0.1)), dwqkv(3 * h * h, S()), dbqkv(3 * h, S()), dwo(h * h, S()), dbo(h, S()),
        dw1(4 * h * h, S()), db1(4 * h, S()), dw2(4 * h * h, S()), db2(h, S()), dg1(h, S()), dbe1(h, S()), dg2(h, S()),
        dbe2(h, S()), x(filled<B>(s * h, 13, 1.0)), ln1(s * h, S()), qkv(3 * s * h, S()), scores(heads * s * s, S()),
        probs(heads * s * s, S()), attn(s * h, S()), x1(s * h, S()), ln2(s * h, S()), pre(4 * s * h, S()),
        act(4 * s * h, S()), y(s * h, S()), mean1(s, S()), rstd1(s, S()), mean2(s, S()), rstd2(s, S()),
        dy(filled<B>(s * h, 14, 0.01)), dact(4 * s * h, S()), dln2(s * h, S()), dx1(s * h, S()), dattn(s * h, S()),
        dprobs(heads * s * s, S()), dqkv(3 * s * h, S()), dln1(s * h, S()), dx(s * h, S()), tmp(s * h, S()) {
    for (auto* g : {&dwqkv, &dbqkv, &dwo, &dbo, &dw1, &db1, &dw2, &db2, &dg1, &dbe1, &dg2, &dbe2}) g->zero();
  }

  /** Full-sequence attention GEMMs plus the dense GEMMs: 72 s h^2 + 12 s^2 h (Narayanan et al., per layer, batch 1). */
  [[nodiscard]] double flops() const {
    return 72.0 * double(s) * double(h) * double(h) + 12.0 * double(s) * double(s) * double(h);
  }

  /** y = x W^T (+ bias, + GeLU with the pre-activation kept) through cuBLASLt. */
  void linear(const B* in, const B* w, const B* bias, std::size_t out_f, std::size_t in_f, B* out,
              gpu::Epilogue ep = gpu::Epilogue::bias, B* aux = nullptr) {
    gpu::gemm_lt<B>(Trans::no, Trans::yes, s, out_f, in_f, 1.0f, in, in_f, w, in_f, 0.0f, out, out_f, ep, bias, aux,
                    aux ? out_f : 0);
  }
  /** dW += dy^T x (fp32), db += colsum(dy), dx = dy W. */
  void linear_backward(const B* in, const B* w, const B* dout, std::size_t out_f, std::size_t in_f, float* dw,
                       float* db, B* din) {
    gpu::gemm<B, float>(Trans::yes, Trans::no, out_f, in_f, s, 1.0f, dout, out_f, in, in_f, 1.0f, dw, in_f);
    gpu::bias_add_backward(s, out_f, dout, db);
    gpu::gemm<B>(Trans::no, Trans::no, s, in_f, out_f, 1.0f, dout, out_f, w, in_f, 0.0f, din, in_f);
  }

  void forward() {
    const float scale = 1.0f / std::sqrt(float(d));
    const std::int64_t sd = std::int64_t(d), ss = std::int64_t(s * s);
    gpu::layernorm_forward(s, h, x.data(), g1.data(), be1.data(), ln1.data(), mean1.data(), rstd1.data());
    linear(ln1.data(), wqkv.data(), bqkv.data(), 3 * h, h, qkv.data());
    // scores_i = Q_i K_i^T: head i's Q and K are column blocks of qkv [s, 3h]
    gpu::gemm_strided_batched<B>(Trans::no, Trans::yes, s, s, d, 1.0f, qkv.data(), 3 * h, sd, qkv.data() + h, 3 * h, sd,
                                 0.0f, scores.data(), s, ss, heads);
    gpu::softmax_forward(heads * s, s, scores.data(), probs.data(), true, scale);
    gpu::gemm_strided_batched<B>(Trans::no, Trans::no, s, d, s, 1.0f, probs.data(), s, ss, qkv.data() + 2 * h, 3 * h,
                                 sd, 0.0f, attn.data(), h, sd, heads);
    linear(attn.data(), wo.data(), bo.data(), h, h, tmp.data());
    gpu::add(s * h, x.data(), tmp.data(), x1.data());
    gpu::layernorm_forward(s, h, x1.data(), g2.data(), be2.data(), ln2.data(), mean2.data(), rstd2.data());
    linear(ln2.data(), w1.data(), b1.data(), 4 * h, h, act.data(), gpu::Epilogue::gelu_bias, pre.data());
    linear(act.data(), w2.data(), b2.data(), h, 4 * h, tmp.data());
    gpu::add(s * h, x1.data(), tmp.data(), y.data());
  }

  void backward() {
    const float scale = 1.0f / std::sqrt(float(d));
    const std::int64_t sd = std::int64_t(d), ss = std::int64_t(s * s);
    linear_backward(act.data(), w2.data(), dy.data(), h, 4 * h, dw2.data(), db2.data(), dact.data());
    gpu::gelu_backward(4 * s * h, pre.data(), dact.data(), dact.data());
    linear_backward(ln2.data(), w1.data(), dact.data(), 4 * h, h, dw1.data(), db1.data(), dln2.data());
    gpu::layernorm_backward(s, h, x1.data(), mean2.data(), rstd2.data(), g2.data(), dln2.data(), tmp.data(), dg2.data(),
                            dbe2.data());
    gpu::add(s * h, dy.data(), tmp.data(), dx1.data());
    linear_backward(attn.data(), wo.data(), dx1.data(), h, h, dwo.data(), dbo.data(), dattn.data());
    // dP_i = dO_i V_i^T ; dV_i = P_i^T dO_i
    gpu::gemm_strided_batched<B>(Trans::no, Trans::yes, s, s, d, 1.0f, dattn.data(), h, sd, qkv.data() + 2 * h, 3 * h,
                                 sd, 0.0f, dprobs.data(), s, ss, heads);
    gpu::gemm_strided_batched<B>(Trans::yes, Trans::no, s, d, s, 1.0f, probs.data(), s, ss, dattn.data(), h, sd, 0.0f,
                                 dqkv.data() + 2 * h, 3 * h, sd, heads);
    gpu::softmax_backward(heads * s, s, probs.data(), dprobs.data(), dprobs.data(), scale);
    // dQ_i = dS_i K_i ; dK_i = dS_i^T Q_i
    gpu::gemm_strided_batched<B>(Trans::no, Trans::no, s, d, s, 1.0f, dprobs.data(), s, ss, qkv.data() + h, 3 * h, sd,
                                 0.0f, dqkv.data(), 3 * h, sd, heads);
    gpu::gemm_strided_batched<B>(Trans::yes, Trans::no, s, d, s, 1.0f, dprobs.data(), s, ss, qkv.data(), 3 * h, sd,
                                 0.0f, dqkv.data() + h, 3 * h, sd, heads);
    linear_backward(ln1.data(), wqkv.data(), dqkv.data(), 3 * h, h, dwqkv.data(), dbqkv.data(), dln1.data());
    gpu::layernorm_backward(s, h, x.data(), mean1.data(), rstd1.data(), g1.data(), dln1.data(), tmp.data(), dg1.data(),
                            dbe1.data());
    gpu::add(s * h, dx1.data(), tmp.data(), dx.data());
  }
};

struct Row {
  std::size_t hidden = 0;
  double block_ms = 0, block_tflops = 0, gemm_tflops = 0;
};

/** All-reduce bandwidth: algbw = bytes / time; busbw = algbw * 2 (n - 1) / n (nccl-tests' definition). */
template <class Comm>
void allreduce_table(const char* what, std::vector<Comm>& comms, const std::vector<int>& devices,
                     const std::vector<std::size_t>& sizes, int reps) {
  const int p = int(comms.size());
  std::printf("\nall-reduce, %s, %d ranks, bf16 sum (median of %d)\n", what, p, reps);
  std::printf("%14s %12s %14s %14s\n", "bytes", "time (us)", "algbw (GB/s)", "busbw (GB/s)");
  for (std::size_t bytes : sizes) {
    const std::size_t n = bytes / sizeof(bf16);
    std::vector<double> us(static_cast<std::size_t>(p));
    std::vector<std::thread> th;
    for (int r = 0; r < p; ++r)
      th.emplace_back([&, r] {
        CudaBackend::init_rank(devices[std::size_t(r)]);
        gpu::DeviceBuffer<bf16> buf(n, S());
        buf.zero();
        Comm& c = comms[std::size_t(r)];
        for (int w = 0; w < 2; ++w) c.all_reduce(buf.span(), ReduceOp::sum);
        std::vector<double> t;
        for (int i = 0; i < reps; ++i) {
          c.barrier();
          CudaBackend::synchronize();
          const auto t0 = std::chrono::steady_clock::now();
          c.all_reduce(buf.span(), ReduceOp::sum);
          CudaBackend::synchronize();
          t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        }
        us[std::size_t(r)] = bench::median(t);
      });
    for (auto& t : th) t.join();
    const double u = *std::max_element(us.begin(), us.end());
    const double alg = double(bytes) / (u * 1e-6) / 1e9;
    std::printf("%14zu %12.1f %14.2f %14.2f\n", bytes, u, alg, alg * 2.0 * (p - 1) / p);
  }
}

}  // namespace

namespace {
int run(int argc, char** argv) {
  const bool smoke = bench::has_flag(argc, argv, "--smoke");
  int reps = smoke ? 2 : 10;
  double peak = 989.0;  // H200 SXM dense bf16 (docs/reference numbers)
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--reps") reps = std::max(1, std::atoi(argv[i + 1]));
    if (std::string(argv[i]) == "--peak") peak = std::atof(argv[i + 1]);
  }
  const int ndev = gpu::device_count();
  if (ndev == 0) {
    std::printf(
        "bench_cuda_block: no CUDA device visible; nothing measured (run scripts/gpu-check.sh on a GPU machine)\n");
    std::printf(
        "{\"bench\": \"cuda_block\", \"ours\": null, \"baseline\": null, \"unit\": \"TFLOP/s\", \"ratio\": null, "
        "\"skipped\": true, \"reason\": \"no CUDA device\"}\n");
    return 0;
  }
  CudaBackend::init_rank(0);
  cudaDeviceProp prop{};
  gpu::check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("device 0: %s, %d SMs, %.1f GiB; %d device(s) visible; MFU against %.0f TFLOP/s dense bf16\n", prop.name,
              prop.multiProcessorCount, double(prop.totalGlobalMem) / (1 << 30), ndev, peak);

  const std::size_t seq = smoke ? 256 : 2048;
  const std::vector<std::size_t> hiddens = smoke ? std::vector<std::size_t>{256} : std::vector<std::size_t>{4096, 8192};
  std::vector<Row> rows;
  std::printf("\nGPT block forward+backward, bf16, batch 1, sequence %zu, head dim 128 (median of %d)\n", seq, reps);
  std::printf("%8s %12s %14s %8s %24s\n", "hidden", "block (ms)", "block TFLOP/s", "MFU", "cuBLAS s x 4h x h TFLOP/s");
  for (std::size_t h : hiddens) {
    Row row;
    row.hidden = h;
    {
      GptBlock blk(seq, h);
      row.block_ms = median_ms(2, reps, [&] {
        blk.forward();
        blk.backward();
      });
      row.block_tflops = blk.flops() / (row.block_ms * 1e-3) / 1e12;
    }
    {  // the block's largest GEMM: [s, h] x [h, 4h] (fc1 forward), bf16 in, bf16 out, fp32 accumulation
      auto a = filled<bf16>(seq * h, 20, 1.0), b = filled<bf16>(4 * h * h, 21, 0.02);
      gpu::DeviceBuffer<bf16> c(seq * 4 * h, S());
      const double ms = median_ms(2, reps, [&] {
        gpu::gemm<bf16>(Trans::no, Trans::yes, seq, 4 * h, h, 1.0f, a.data(), h, b.data(), h, 0.0f, c.data(), 4 * h);
      });
      row.gemm_tflops = 2.0 * double(seq) * double(4 * h) * double(h) / (ms * 1e-3) / 1e12;
    }
    std::printf("%8zu %12.3f %14.1f %7.1f%% %24.1f\n", h, row.block_ms, row.block_tflops,
                100.0 * row.block_tflops / peak, row.gemm_tflops);
    rows.push_back(row);
  }

  const std::vector<std::size_t> sizes = smoke ? std::vector<std::size_t>{1 << 16, 1 << 20}
                                               : std::vector<std::size_t>{1 << 20, 1 << 24, 1 << 26, 1 << 28, 1 << 30};
  if (ndev >= 2) {
    const int p = std::min(ndev, 8);
    const ncclUniqueId id = NcclCommunicator::make_unique_id();
    std::vector<std::optional<NcclCommunicator>> made(static_cast<std::size_t>(p));
    std::vector<std::thread> th;
    for (int r = 0; r < p; ++r) th.emplace_back([&, r] { made[std::size_t(r)].emplace(id, r, p, r); });
    for (auto& t : th) t.join();
    std::vector<NcclCommunicator> comms;
    std::vector<int> devs;
    for (int r = 0; r < p; ++r) comms.push_back(std::move(*made[std::size_t(r)])), devs.push_back(r);
    allreduce_table("NcclCommunicator, one rank per GPU", comms, devs, sizes, reps);
  } else {
    std::printf("\nNCCL all-reduce needs two or more GPUs (NCCL refuses two ranks on one device); one is visible.\n");
  }
  {
    auto comms = gpu::DeviceCommunicator::create(4, 0);
    allreduce_table("gpu::DeviceCommunicator, 4 thread-ranks sharing GPU 0", comms, std::vector<int>(4, 0), sizes,
                    reps);
  }

  const Row& last = rows.back();
  std::string extra = "\"hidden\": " + std::to_string(last.hidden) + ", \"seq\": " + std::to_string(seq) +
                      ", \"mfu\": " + std::to_string(last.block_tflops / peak) +
                      ", \"peak_tflops\": " + std::to_string(peak) + ", \"device\": \"" + prop.name + "\"";
  for (const Row& r : rows)
    extra += ", \"block_tflops_h" + std::to_string(r.hidden) + "\": " + std::to_string(r.block_tflops) +
             ", \"gemm_tflops_h" + std::to_string(r.hidden) + "\": " + std::to_string(r.gemm_tflops);
  bench::print_result_json("cuda_block", last.block_tflops, last.gemm_tflops, "TFLOP/s", true, extra);
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // still end with the JSON line the tooling expects
    std::printf("bench_cuda_block: FAILED: %s\n", e.what());
    std::printf(
        "{\"bench\": \"cuda_block\", \"ours\": null, \"baseline\": null, \"unit\": \"TFLOP/s\", "
        "\"ratio\": null, \"error\": true}\n");
    return 1;
  }
}
