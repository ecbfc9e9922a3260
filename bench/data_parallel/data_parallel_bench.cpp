// Data-parallel step time: bucketed all-reduces launched during the backward (mpar::parallel::DataParallel)
// against the same backward followed by one blocking all-reduce of every gradient (the no-overlap baseline).
// Ranks are threads; the "model" is a stack of square linear layers whose backward is two GEMMs per layer.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "mpar/backend/host/host_backend.hpp"
#include "mpar/comm/threads.hpp"
#include "mpar/parallel/data_parallel.hpp"

using namespace mpar;

namespace {
struct Sizes {
  std::size_t hidden, layers, batch, bucket_bytes;
  int reps;
};

/** The backward of `layers` linear layers: dW = X^T dY, dX = dY W^T, last layer first; `ready(l)` after each. */
template <class Ready>
void backward(const Sizes& s, std::vector<nn::Parameter>& w, const std::vector<float>& x, std::vector<float>& dy,
              std::vector<float>& dx, Ready&& ready) {
  const std::size_t h = s.hidden, b = s.batch;
  for (std::size_t l = s.layers; l-- > 0;) {
    gemm<float>(Trans::yes, Trans::no, h, h, b, 1.0f, x.data(), h, dy.data(), h, 1.0f, w[l].grad.data(), h);
    gemm<float>(Trans::no, Trans::yes, b, h, h, 1.0f, dy.data(), h, w[l].value.data(), h, 0.0f, dx.data(), h);
    std::swap(dy, dx);
    ready(w[l]);
  }
}
}  // namespace

int main(int argc, char** argv) {
  const bool smoke = bench::has_flag(argc, argv, "--smoke");
  const Sizes s = smoke ? Sizes{64, 4, 16, 16 << 10, 1} : Sizes{768, 12, 128, 4 << 20, 9};
  const int dp = 2;
  double ours = 0, baseline = 0;
  std::size_t buckets = 0;
  run_threads(dp, [&](ThreadsCommunicator& world) {
    HostBackend::init_rank();
    std::vector<nn::Parameter> w(s.layers);
    std::vector<nn::Parameter*> ps;
    for (std::size_t l = 0; l < s.layers; ++l) {
      w[l].name = "layer" + std::to_string(l) + ".weight";
      w[l].id = l;
      w[l].global_shape = {s.hidden, s.hidden};
      w[l].local_box = {Block{0, s.hidden}, Block{0, s.hidden}};
      w[l].initialise(1, InitSpec::normal(0.02));
      ps.push_back(&w[l]);
    }
    std::vector<float> x(s.batch * s.hidden, 0.5f), dy0(s.batch * s.hidden, 0.01f), dy, dx(dy0.size());
    parallel::DataParallel<ThreadsCommunicator> ddp(ps, world, {.bucket_bytes = s.bucket_bytes});
    std::vector<float> flat;
    auto overlapped = [&] {
      dy = dy0;
      backward(s, w, x, dy, dx, [&](nn::Parameter& p) { ddp.mark_ready(p); });
      ddp.finish();
    };
    auto after = [&] {
      dy = dy0;
      backward(s, w, x, dy, dx, [](nn::Parameter&) {});
      // the baseline: one flat all-reduce once the backward is over
      flat.resize(s.layers * s.hidden * s.hidden);
      for (std::size_t l = 0; l < s.layers; ++l)
        std::memcpy(&flat[l * s.hidden * s.hidden], w[l].grad.data(), w[l].grad.size() * sizeof(float));
      world.all_reduce(std::span<float>(flat), ReduceOp::sum);
      for (std::size_t l = 0; l < s.layers; ++l)
        for (std::size_t i = 0; i < w[l].grad.size(); ++i) w[l].grad[i] = flat[l * s.hidden * s.hidden + i] / dp;
    };
    auto timed = [&](auto& f) {
      world.barrier();
      for (auto& p : w) p.zero_grad();
      return bench::time_once(f);
    };
    timed(overlapped);
    timed(after);
    std::vector<double> a, b;
    for (int r = 0; r < s.reps; ++r) {
      a.push_back(timed(overlapped));
      b.push_back(timed(after));
    }
    if (world.rank() == 0) {
      ours = bench::median(a) * 1e3;
      baseline = bench::median(b) * 1e3;
      buckets = ddp.bucket_count();
    }
  });
  std::printf("data parallel step, dp=%d threads, %zu layers of %zux%zu, batch %zu per rank, %zu buckets\n", dp,
              s.layers, s.hidden, s.hidden, s.batch, buckets);
  std::printf("  overlapped buckets: %.2f ms   all-reduce after backward: %.2f ms (medians of %d)\n", ours, baseline,
              s.reps);
  bench::print_result_json("data_parallel_overlap", ours, baseline, "ms", false,
                           "\"dp\": " + std::to_string(dp) + ", \"buckets\": " + std::to_string(buckets));
}
