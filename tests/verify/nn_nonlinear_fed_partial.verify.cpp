// A nonlinear layer (GeLU) fed the Partial output of a RowParallel that defers its reduction: the stage
// is constructed and run on 2 thread ranks.
// expect: Gelu \(a nonlinear layer\) is fed a Partial<sum, tensor>
// expect: insert AllReduce
// expect: check_link.*RowParallel.*RowReduce::none.*Gelu.*Partial<
#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
using Col = ColumnParallel<C, 16, 64>;
using RowDeferred = RowParallel<C, 64, 16, dyn, RowReduce::none>;
int main() {
  run_threads(2, [](C& tp) {
#ifdef MPAR_VERIFY_CONTROL
    Stage<Col, Gelu, RowDeferred, AllReduce<C>, Gelu> s(
        Col(tp, 16, 64, {.name = "fc1"}), Gelu{}, RowDeferred(tp, 64, 16, {.name = "fc2"}), AllReduce<C>(tp), Gelu{});
#else
    Stage<Col, Gelu, RowDeferred, Gelu> s(Col(tp, 16, 64, {.name = "fc1"}), Gelu{}, RowDeferred(tp, 64, 16, {.name = "fc2"}),
                                          Gelu{});
#endif
    auto y = s.forward(Act<Replicate>(Activation({8, 16})));
    auto dx = s.backward(Act<Replicate>(Activation(y.shape())));
    return dx.size();
  });
}
