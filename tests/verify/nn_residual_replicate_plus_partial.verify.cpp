// A residual that adds a replicated input to the Partial output of a RowParallel that defers its
// reduction: every rank would add x to its own addend, so the sum would count x twice. Partial +
// Partial is fine (the control variant adds two Partial tensors, then reduces).
// expect: mpar::nn::add: a residual adds a Partial<sum, tensor> tensor to a tensor of another layout
// expect: Fix: reduce the Partial one first
#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
using Row = RowParallel<C, dyn, dyn, dyn, RowReduce::none>;
int main() {
  run_threads(2, [](C& tp) {
    ColumnParallel<C> fc1(tp, 16, 64, {.name = "fc1"}), fc3(tp, 16, 64, {.name = "fc3"});
    Row fc2(tp, 64, 16, {.name = "fc2"}), fc4(tp, 64, 16, {.name = "fc4"});
    const Act<Replicate> x(Activation({8, 16}));
#ifdef MPAR_VERIFY_CONTROL
    Act<TensorPartial> both = add(fc2.forward(fc1.forward(x)), fc4.forward(fc3.forward(x)));
    Act<Replicate> h = ReduceToReplicate::forward<HostBackend>(tp, std::move(both));
#else
    auto h = add(fc2.forward(fc1.forward(x)), x);
#endif
    return h.size();
  });
}
