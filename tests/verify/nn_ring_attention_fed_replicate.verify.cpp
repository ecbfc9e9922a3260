// Ring attention fed a replicated QKV: its tokens must be zig-zag chunks over the context axis with the
// heads over the tensor axis. Constructed and run on 2 thread ranks.
// expect: RingAttention takes QKV whose tokens are zig-zag chunks over the context axis
// expect: Act<ContextHeads>
#include <mpar/comm/threads.hpp>
#include <mpar/nn/ring_attention.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
#ifdef MPAR_VERIFY_CONTROL
using In = ContextHeads;
#else
using In = Replicate;
#endif
int main() {
  run_threads(2, [](C& context) {
    RingAttention<C> ring(context, {.heads = 2, .head_dim = 4, .seq = 8});
    auto y = ring.forward(Act<In>(Activation({8, 24})));
    auto dx = ring.backward(Act<In>(Activation(y.shape())));
    return dx.size();
  });
}
