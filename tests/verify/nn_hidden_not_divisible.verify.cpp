// A static hidden (output) size that a static tensor-parallel size does not divide: the layer is
// constructed and run, as a user would.
// expect: static output size Out is not divisible by the static tensor-parallel size TP
#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
#ifdef MPAR_VERIFY_CONTROL
constexpr std::size_t out = 96;
#else
constexpr std::size_t out = 100;  // 100 = 8 * 12.5
#endif
int main() {
  run_threads(8, [](C& tp) {
    ColumnParallel<C, 16, out, 8> fc(tp, 16, out, {.name = "fc"});
    auto y = fc.forward(Act<Replicate>(Activation({4, 16})));
    auto dx = fc.backward(Act<FeatureShard>(Activation(y.shape())));
    return dx.size();
  });
}
