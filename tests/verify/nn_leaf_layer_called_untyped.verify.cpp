// A leaf layer called with a bare Tensor<float, 2> (no layout in its type), forward and backward, on 2
// thread ranks: its only public entries are the typed ones, so the layout check cannot be skipped.
// expect: a layer's forward takes a typed activation Act<Layout>, not a bare Tensor<float, 2>
// expect: a layer's backward takes the typed gradient Act<Layout> of its output
// expect: Fix: state the layout once where the tensor enters, e.g. layer.forward\(Act<Replicate>\(x\)\)
// expect: D = mpar::nn::ColumnParallel<mpar::ThreadsCommunicator, 16, 64>
#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
int main() {
  run_threads(2, [](C& tp) {
    ColumnParallel<C, 16, 64> fc(tp, 16, 64, {.name = "fc"});
    Activation x({8, 16}, 0.5f);
#ifdef MPAR_VERIFY_CONTROL
    Act<FeatureShard> y = fc.forward(Act<Replicate>(x));
    Act<Replicate> dx = fc.backward(Act<FeatureShard>(Activation(y.shape(), 1.0f)));
#else
    auto y = fc.forward(x);
    auto dx = fc.backward(Activation(y.shape(), 1.0f));
#endif
    return dx.size();
  });
}
