// A hand-written block (no Stage) that feeds the Partial output of a RowParallel that defers its
// reduction straight into GeLU, built and run on 2 thread ranks.
// expect: Gelu \(a nonlinear layer\) is fed a Partial<sum, tensor>
// expect: insert AllReduce
#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
#ifdef MPAR_VERIFY_CONTROL
constexpr RowReduce reduce = RowReduce::all_reduce;
#else
constexpr RowReduce reduce = RowReduce::none;
#endif
int main() {
  run_threads(2, [](C& tp) {
    ColumnParallel<C> fc1(tp, 16, 64, {.name = "fc1"});
    RowParallel<C, dyn, dyn, dyn, reduce> fc2(tp, 64, 16, {.name = "fc2"});
    Gelu act1, act2;
    const Act<Replicate> x(Activation({8, 16}));
    auto y = act2.forward(fc2.forward(act1.forward(fc1.forward(x))));
    auto dx = fc1.backward(act1.backward(fc2.backward(act2.backward(Act<Replicate>(Activation(y.shape()))))));
    return dx.size();
  });
}
