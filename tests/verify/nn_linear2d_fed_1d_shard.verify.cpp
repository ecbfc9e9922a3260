// A 2D-parallel layer (Linear2D, SUMMA on a 2 x 2 tensor grid) fed the 1D feature shard of a
// ColumnParallel, on 4 thread ranks.
// expect: Linear2D .* needs a tensor sharded on both grid axes
// expect: Fix: feed it another Linear2D
#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
int main() {
  run_threads(4, [](C& tp) {
    auto grid = make_tensor_grid(tp, 2, 2);
    Linear2D<C> l2(grid, 16, 16, {.name = "l2"});
#ifdef MPAR_VERIFY_CONTROL
    const Act<GridShard> x(Activation({4, 8}));
#else
    ColumnParallel<C> fc(tp, 16, 32, {.name = "fc"});
    const auto x = fc.forward(Act<Replicate>(Activation({8, 16})));
#endif
    auto y = l2.forward(x);
    auto dx = l2.backward(Act<GridShard>(Activation(y.shape())));
    return dx.size();
  });
}
