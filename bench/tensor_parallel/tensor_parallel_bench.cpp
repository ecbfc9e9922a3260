// Transformer block forward + backward: mpar's TransformerBlock at TP = 1 against the same block written
// directly with CBLAS and loops (the cost of the abstraction), and at TP = 2 on the threads communicator
// (speed-up, and the share of time spent inside collectives).
//
// Usage: bench_tensor_parallel [--smoke]. Last line: JSON with ours/baseline in tokens/s (TP = 1).
//
// The ratio is the cost of the abstraction (typed activations, layers, caches) only when mpar's host GEMM
// is the baseline's CBLAS: configure with -DMPAR_HOST_GEMM=cblas. With the default oneDNN GEMM it also
// measures oneDNN against the CBLAS library; the JSON's "host_gemm" says which build produced it.
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>

#include "baseline_block.hpp"
#include "bench_util.hpp"

using namespace mpar;
using Comm = ThreadsCommunicator;

namespace {

/** The GEMM behind mpar's float layers in this build (CMake's MPAR_HOST_GEMM). */
#if defined(MPAR_HAVE_ONEDNN)
constexpr const char* host_gemm = "onednn";
#elif defined(MPAR_HAVE_CBLAS)
constexpr const char* host_gemm = "cblas";
#else
constexpr const char* host_gemm = "portable";
#endif

/** Forwards to a communicator and adds the wall time spent inside its calls to `seconds`. */
class TimingCommunicator {
 public:
  TimingCommunicator(Comm inner, double* seconds) : inner_(std::move(inner)), seconds_(seconds) {}
  [[nodiscard]] int rank() const { return inner_.rank(); }
  [[nodiscard]] int size() const { return inner_.size(); }
  [[nodiscard]] std::string name() const { return inner_.name(); }
  template <class F>
  decltype(auto) timed(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    struct Add {
      double* s;
      std::chrono::steady_clock::time_point t0;
      ~Add() { *s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
    } add{seconds_, t0};
    return f();
  }
  template <class T>
  void all_reduce(std::span<T> d, ReduceOp op) {
    timed([&] { inner_.all_reduce(d, op); });
  }
  template <class T>
  void broadcast(std::span<T> d, int r) {
    timed([&] { inner_.broadcast(d, r); });
  }
  template <class T>
  void reduce(std::span<const T> s, std::span<T> d, ReduceOp op, int r) {
    timed([&] { inner_.reduce(s, d, op, r); });
  }
  template <class T>
  void all_gather(std::span<const T> s, std::span<T> d) {
    timed([&] { inner_.all_gather(s, d); });
  }
  template <class T>
  void reduce_scatter(std::span<const T> s, std::span<T> d, ReduceOp op) {
    timed([&] { inner_.reduce_scatter(s, d, op); });
  }
  template <class T>
  void gather(std::span<const T> s, std::span<T> d, int r) {
    timed([&] { inner_.gather(s, d, r); });
  }
  template <class T>
  void scatter(std::span<const T> s, std::span<T> d, int r) {
    timed([&] { inner_.scatter(s, d, r); });
  }
  template <class T>
  void all_to_all(std::span<const T> s, std::span<T> d) {
    timed([&] { inner_.all_to_all(s, d); });
  }
  template <class T>
  void all_to_all_v(std::span<const T> s, std::span<const std::size_t> sc, std::span<T> d,
                    std::span<const std::size_t> dc) {
    timed([&] { inner_.all_to_all_v(s, sc, d, dc); });
  }
  template <class T>
  void send(std::span<const T> d, int p, int t) {
    timed([&] { inner_.send(d, p, t); });
  }
  template <class T>
  void recv(std::span<T> d, int p, int t) {
    timed([&] { inner_.recv(d, p, t); });
  }
  void barrier() {
    timed([&] { inner_.barrier(); });
  }
  template <class T>
  auto iall_reduce(std::span<T> d, ReduceOp op) {
    return inner_.iall_reduce(d, op);
  }
  template <class T>
  auto iall_gather(std::span<const T> s, std::span<T> d) {
    return inner_.iall_gather(s, d);
  }
  template <class T>
  auto ireduce_scatter(std::span<const T> s, std::span<T> d, ReduceOp op) {
    return inner_.ireduce_scatter(s, d, op);
  }
  template <class T>
  auto isend(std::span<const T> d, int p, int t) {
    return inner_.isend(d, p, t);
  }
  template <class T>
  auto irecv(std::span<T> d, int p, int t) {
    return inner_.irecv(d, p, t);
  }
  TimingCommunicator split(int color, int key) { return TimingCommunicator(inner_.split(color, key), seconds_); }

 private:
  Comm inner_;
  double* seconds_;
};
static_assert(communicator<TimingCommunicator>);

/** The 1-minute load average (/proc/loadavg), reported with the result: timings on a loaded machine are noise. */
double load_average() {
  double l = -1.0;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1.0;
    std::fclose(f);
  }
  return l;
}

nn::Activation filled(std::size_t rows, std::size_t cols, std::uint64_t stream) {
  nn::Activation a({rows, cols});
  const CounterRng rng{1, stream};
  for (std::size_t i = 0; i < a.size(); ++i) a.data()[i] = float(rng.normal(i));
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const bool smoke = bench::has_flag(argc, argv, "--smoke");
  const std::size_t h = smoke ? 64 : 1024, heads = smoke ? 4 : 16, ffn = 4 * h, seq = smoke ? 32 : 256, tokens = seq;
  const int reps = smoke ? 2 : 7;
  const nn::BlockConfig cfg{h, heads, ffn, seq, 0.0, 42, 0, "block"};
  HostBackend::init_rank();
  const nn::Activation x_raw = filled(tokens, h, 1), dy = filled(tokens, h, 2);
  const nn::Act<Replicate> x(x_raw);  // the block's input, stated replicated over the tensor group

  // ---- TP = 1: mpar block against the hand-written CBLAS block, measured alternately ----
  auto one = Comm::single();
  nn::TransformerBlock<Comm> block(one, cfg);
  baseline::Block base(tokens, h, heads, ffn, seq);
  const std::vector<float> xv(x_raw.values().begin(), x_raw.values().end()),
      dyv(dy.values().begin(), dy.values().end());
  // Alternating runs; besides the two medians, the median of the per-pair ratios is reported, which is
  // robust to load changes on a shared machine.
  auto run_ours = [&] { (void)block.backward(block.forward(x), 0); };
  auto run_base = [&] { (void)base.backward((base.forward(xv), dyv)); };
  run_ours(), run_base();
  std::vector<double> to, tb, pair_ratio;
  for (int r = 0; r < reps; ++r) {
    to.push_back(bench::time_once(run_ours));
    tb.push_back(bench::time_once(run_base));
    pair_ratio.push_back(tb.back() / to.back());
  }
  const double t_ours = bench::median(to), t_base = bench::median(tb), paired_ratio = bench::median(pair_ratio);

  // ---- TP = 2 on the threads communicator ----
  std::vector<double> tp2_iter, tp2_comm;
  std::mutex m;
  run_threads(2, [&](Comm& raw) {
    HostBackend::init_rank();
    double comm_seconds = 0;
    TimingCommunicator tp(raw, &comm_seconds);
    nn::TransformerBlock<TimingCommunicator> b(tp, cfg);
    (void)b.backward(b.forward(x), 0);  // warm-up
    for (int r = 0; r < reps; ++r) {
      raw.barrier();
      comm_seconds = 0;
      const double t = bench::time_once([&] { (void)b.backward(b.forward(x), 0); });
      if (raw.rank() == 0) {
        std::lock_guard l(m);
        tp2_iter.push_back(t);
        tp2_comm.push_back(comm_seconds);
      }
    }
  });
  const double t_tp2 = bench::median(tp2_iter), c_tp2 = bench::median(tp2_comm);

  const double ours = double(tokens) / t_ours, baseline_tps = double(tokens) / t_base, tp2 = double(tokens) / t_tp2;
  std::printf("transformer block fwd+bwd: tokens=%zu hidden=%zu heads=%zu ffn=%zu, median of %d\n", tokens, h, heads,
              ffn, reps);
  std::printf("  TP=1 mpar        %9.3f ms  %10.1f tokens/s\n", 1e3 * t_ours, ours);
  std::printf("  TP=1 CBLAS loops %9.3f ms  %10.1f tokens/s  (mpar / baseline = %.3f; median of paired ratios %.3f)\n",
              1e3 * t_base, baseline_tps, ours / baseline_tps, paired_ratio);
  std::printf("  mpar's host GEMM: %s (%s)\n", host_gemm,
              std::string(host_gemm) == "cblas"
                  ? "the same library as the baseline: the ratio is the cost of the abstraction"
                  : "not the baseline's CBLAS: the ratio also compares GEMM libraries; configure with "
                    "-DMPAR_HOST_GEMM=cblas for the abstraction alone");
  std::printf(
      "  TP=2 mpar        %9.3f ms  %10.1f tokens/s  speed-up %.2fx; in collectives %.3f ms (%.1f%%), compute %.3f "
      "ms\n",
      1e3 * t_tp2, tp2, t_ours / t_tp2, 1e3 * c_tp2, 100.0 * c_tp2 / t_tp2, 1e3 * (t_tp2 - c_tp2));
  char extra[400];
  std::snprintf(
      extra, sizeof extra,
      "\"hidden\": %zu, \"tokens\": %zu, \"paired_ratio\": %.4f, \"tp2_tokens_per_s\": %.6g, \"tp2_speedup\": %.4f, "
      "\"tp2_comm_fraction\": %.4f, \"host_gemm\": \"%s\", \"loadavg\": %.2f",
      h, tokens, paired_ratio, tp2, t_ours / t_tp2, c_tp2 / t_tp2, host_gemm, load_average());
  bench::print_result_json("tensor_parallel_block", ours, baseline_tps, "tokens/s", true, extra);
  return 0;
}
