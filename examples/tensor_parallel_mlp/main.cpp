// Tensor-parallel Megatron MLP on the threads communicator, checked against the single-rank MLP.
//
//   tensor_parallel_mlp [TP]      (default 2; TP must divide the FFN size 256)
//
// Every rank builds its shard of the same MLP (the initialisation depends only on the seed, the
// parameter id and the global element index), runs forward and backward on the replicated input,
// and the outputs and the re-assembled weight gradients are compared with the serial MLP.
// Prints the largest errors and PASS/FAIL; the exit code is 0 on PASS.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include <mpar/mpar.hpp>

using namespace mpar;
using namespace mpar::nn;

int main(int argc, char** argv) {
  const int tp_size = argc > 1 ? std::atoi(argv[1]) : 2;
  const MlpConfig cfg{/*hidden=*/64, /*ffn=*/256, /*seed=*/2024, /*id_base=*/0, "mlp"};
  const std::size_t tokens = 16;

  Activation x({tokens, cfg.hidden}), dy({tokens, cfg.hidden});
  init_full(x, 1, 1000, InitSpec::normal(1.0));
  init_full(dy, 1, 1001, InitSpec::normal(1.0));

  // The reference: Linear -> Gelu -> Linear on one rank.
  auto serial = make_serial_mlp(cfg);
  const Activation y_ref = serial.forward(Act<Replicate>(x)).tensor();
  const Activation dx_ref = serial.backward(Act<Replicate>(dy)).tensor();
  const auto& w1_ref = serial.get<0>().weight();  // [hidden, ffn]

  double max_y = 0, max_dx = 0, max_dw1 = 0;
  std::mutex m;
  try {
    run_threads(tp_size, [&](ThreadsCommunicator& tp) {
      HostBackend::init_rank();
      // Stage<ColumnParallel, Gelu, RowParallel>: one all-reduce forward, one backward.
      auto mlp = make_mlp(tp, cfg);
      // The layouts are in the types: a replicated input gives a replicated output, and the gradient
      // of a replicated output is replicated again after the column layer's all-reduce.
      const Act<Replicate> y = mlp.forward(Act<Replicate>(x));
      const Act<Replicate> dx = mlp.backward(Act<Replicate>(dy));
      // fc1's weight is split by columns: this rank holds columns [offset, offset + extent).
      const Parameter& w1 = mlp.get<0>().weight();
      const Block cols = w1.local_box[1];
      double ey = 0, edx = 0, ew = 0;
      for (std::size_t i = 0; i < y.size(); ++i) ey = std::max(ey, double(std::abs(y.data()[i] - y_ref.data()[i])));
      for (std::size_t i = 0; i < dx.size(); ++i)
        edx = std::max(edx, double(std::abs(dx.data()[i] - dx_ref.data()[i])));
      for (std::size_t r = 0; r < cfg.hidden; ++r)
        for (std::size_t c = 0; c < cols.extent; ++c)
          ew =
              std::max(ew, double(std::abs(w1.grad[r * cols.extent + c] - w1_ref.grad[r * cfg.ffn + cols.offset + c])));
      std::lock_guard l(m);
      max_y = std::max(max_y, ey), max_dx = std::max(max_dx, edx), max_dw1 = std::max(max_dw1, ew);
    });
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  const double tol = 1e-4;  // absolute, on values of order 1
  const bool pass = max_y <= tol && max_dx <= tol && max_dw1 <= tol;
  std::printf("tensor-parallel MLP, TP=%d, hidden=%zu, ffn=%zu, tokens=%zu\n", tp_size, cfg.hidden, cfg.ffn, tokens);
  std::printf("max |error|: output %.3g, input gradient %.3g, fc1 weight gradient %.3g (tolerance %.0e)\n", max_y,
              max_dx, max_dw1, tol);
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
