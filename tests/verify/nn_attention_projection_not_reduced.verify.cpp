// Attention written by hand (QKV column-parallel, the core on this rank's heads, output projection
// row-parallel) whose output projection does not reduce: its Partial output then meets the replicated
// input in the residual, on 2 thread ranks.
// expect: mpar::nn::add: a residual adds a Partial<sum, tensor> tensor
// expect: RowReduce::all_reduce on the RowParallel
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
    const std::size_t hidden = 16, heads = 4, seq = 4;
    ColumnParallel<C, dyn, dyn, dyn, ColumnOptions{.groups = 3}> qkv(tp, hidden, hidden, {.name = "qkv"});
    RowParallel<C, dyn, dyn, dyn, reduce> proj(tp, hidden, hidden, {.name = "proj"});
    const AttentionCore core{heads / 2, hidden / heads, seq};
    Buffer<float> probs;
    const Act<Replicate> x(Activation({8, hidden}));
    auto q = qkv.forward(x);
    const Act<FeatureShard> o(core.forward<HostBackend>(q.tensor(), probs, "attention"));
    auto h = add(proj.forward(o), x);
    return h.size();
  });
}
