// A pipeline whose stage type ends in another layout than it starts with: every pipeline stage has this
// type, so stage 1 would read stage 0's feature-sharded output as a replicated input. The executor is
// constructed and stepped on 2 thread ranks, as a user does.
// expect: pipeline::Executor: the stage type returns a layout
// expect: Fix: end the stage in the layout it starts with
// expect: Executor<mpar::nn::Stage<mpar::nn::ColumnParallel<mpar::ThreadsCommunicator, 16, 64> >
#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>
#include <mpar/pipeline.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
using Col = ColumnParallel<C, 16, 64>;
using Row = RowParallel<C, 64, 16>;
#ifdef MPAR_VERIFY_CONTROL
using S = Stage<Col, Gelu, Row>;
#else
using S = Stage<Col>;
#endif
int main() {
  run_threads(2, [](C& pp) {
    auto one = C::single();
#ifdef MPAR_VERIFY_CONTROL
    S stage(Col(one, 16, 64, {.name = "fc1"}), Gelu{}, Row(one, 64, 16, {.name = "fc2"}));
#else
    S stage(Col(one, 16, 64, {.name = "fc1"}));
#endif
    pipeline::Executor<S, C> ex(pp, pipeline::make_programs<pipeline::OneFOneB>({2, 2}), {&stage});
    std::vector<Act<Replicate>> in{Act<Replicate>(Activation({4, 16})), Act<Replicate>(Activation({4, 16}))};
    return int(ex.step(in, [](const auto&, int, auto&) { return 0.0; }).loss);
  });
}
