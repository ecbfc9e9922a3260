// A sequence-parallel LayerNorm (token-sharded output) fed to a ColumnParallel that is not sequence
// parallel, in a hand-written block on 2 thread ranks.
// expect: ColumnParallel expects a Replicate input but is fed a token-sharded tensor
// expect: ColumnOptions\{.sequence_parallel = true\}
#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
#ifdef MPAR_VERIFY_CONTROL
using Col = ColumnParallel<C, dyn, dyn, dyn, ColumnOptions{.sequence_parallel = true}>;
#else
using Col = ColumnParallel<C>;
#endif
int main() {
  run_threads(2, [](C& tp) {
    LayerNorm<TokenShard, C> ln(tp, 16, 1, 0, "ln");
    Col fc(tp, 16, 64, {.name = "fc"});
    const Act<TokenShard> x(Activation({4, 16}));
    auto y = fc.forward(ln.forward(x));
    auto dx = ln.backward(fc.backward(Act<FeatureShard>(Activation(y.shape()))));
    return dx.size();
  });
}
