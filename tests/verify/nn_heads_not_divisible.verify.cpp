// Attention heads that the static tensor-parallel size does not divide (attention is split by whole
// heads): the layer is constructed and run, as a user would.
// expect: number of heads is not divisible by the static tensor-parallel size TP
#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
#ifdef MPAR_VERIFY_CONTROL
using A = SelfAttention<C, 96, 12, 4>;
#else
using A = SelfAttention<C, 96, 12, 8>;
#endif
int main() {
  run_threads(4, [](C& tp) {
    A attn(tp, AttentionConfig{.hidden = 96, .heads = 12, .seq = 4});
    auto y = attn.forward(Act<Replicate>(Activation({8, 96})));
    auto dx = attn.backward(Act<Replicate>(Activation(y.shape())));
    return dx.size();
  });
}
