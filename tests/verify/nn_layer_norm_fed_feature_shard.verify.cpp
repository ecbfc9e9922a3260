// LayerNorm right after a ColumnParallel: its row statistics would see only this rank's features. The
// stage is constructed and run on 2 thread ranks.
// expect: needs whole rows .* is fed a feature-sharded tensor
// expect: use RowParallel before it
// expect: check_link.*ColumnParallel.*LayerNorm.*Shard<1
#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
#ifdef MPAR_VERIFY_CONTROL
using Col = ColumnParallel<C, 16, 64, dyn, ColumnOptions{.gather_output = true}>;
#else
using Col = ColumnParallel<C, 16, 64>;
#endif
int main() {
  run_threads(2, [](C& tp) {
    Stage<Col, LayerNorm<>> s(Col(tp, 16, 64, {.name = "fc"}), LayerNorm<>(64, 1, 2, "ln"));
    auto y = s.forward(Act<Replicate>(Activation({8, 16})));
    auto dx = s.backward(Act<Replicate>(Activation(y.shape())));
    return dx.size();
  });
}
