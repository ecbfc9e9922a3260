// The MoE feed-forward half of a block fed a feature-sharded tensor (a ColumnParallel's output): the gate
// would score a fraction of each token's features. The layers are constructed and called on 2 thread ranks.
// expect: MoeMlp \(a mixture of experts\) needs whole token rows
// expect: Fix: reduce a Partial input first .*gather a feature shard \(GatherFeatures\)
// expect: MoeFfn<.*>::forward.*L = mpar::Shard<1, mpar::MeshAxis::tensor>
#include <mpar/comm/threads.hpp>
#include <mpar/models/moe_block.hpp>
#include <mpar/nn.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
#ifdef MPAR_VERIFY_CONTROL
using Col = ColumnParallel<C, 16, 16, dyn, ColumnOptions{.gather_output = true}>;
#else
using Col = ColumnParallel<C, 16, 16>;
#endif
int main() {
  run_threads(2, [](C& tp) {
    auto one = C::single();
    parallel::MoeConfig cfg;
    cfg.d_model = 16;
    cfg.d_ff = 32;
    cfg.experts = 2;
    models::MoeFfn<C> ffn(parallel::MoeMlp<C>(cfg, one));
    Col col(tp, 16, 16, {.name = "proj"});
    auto y = ffn.forward(col.forward(Act<Replicate>(Activation({4, 16}))), 0);
    return int(ffn.backward(y, 0).size());
  });
}
