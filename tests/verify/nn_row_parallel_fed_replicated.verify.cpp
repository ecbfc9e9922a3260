// A RowParallel layer fed a replicated tensor (GeLU directly on the replicated input, no ColumnParallel):
// the stage is constructed and run on 2 thread ranks, as a user would.
// expect: insert ColumnParallel before RowParallel
// expect: check_link.*Gelu.*RowParallel.*Replicate
#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
int main() {
  run_threads(2, [](C& tp) {
#ifdef MPAR_VERIFY_CONTROL
    Stage<ColumnParallel<C, 16, 64>, Gelu, RowParallel<C, 64, 16>> s(
        ColumnParallel<C, 16, 64>(tp, 16, 64, {.name = "fc1"}), Gelu{},
        RowParallel<C, 64, 16>(tp, 64, 16, {.name = "fc2"}));
#else
    Stage<Linear<16, 64>, Gelu, RowParallel<C, 64, 16>> s(Linear<16, 64>(16, 64, {.name = "fc1"}), Gelu{},
                                                          RowParallel<C, 64, 16>(tp, 64, 16, {.name = "fc2"}));
#endif
    auto y = s.forward(Act<Replicate>(Activation({8, 16})));
    auto dx = s.backward(Act<Replicate>(Activation(y.shape())));
    return dx.size();
  });
}
