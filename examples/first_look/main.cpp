#include <cstdio>
#include <mpar/mpar.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
using Fc1 = ColumnParallel<C, 16, 64>;  // W1 split by columns: returns Shard<1, tensor>
using Fc2 = RowParallel<C, 64, 16>;     // W2 split by rows: takes Shard<1, tensor>, all-reduces

int main() {
  run_threads(2, [](C& tp) {  // two tensor-parallel ranks on CPU threads
    Stage<Fc1, Gelu, Fc2> mlp(Fc1(tp, 16, 64, {.seed = 1, .name = "fc1"}), Gelu{},
                              Fc2(tp, 64, 16, {.seed = 1, .id_base = 2, .name = "fc2"}));
    Act<Replicate> x(Activation({8, 16}, 0.5f));                                    // every rank holds the whole input
    Act<Replicate> y = mlp.forward(x);                                              // one all-reduce
    Act<Replicate> dx = mlp.backward(Act<Replicate>(Activation(y.shape(), 1.0f)));  // one all-reduce
    std::printf("rank %d: y %zux%zu, dx %zux%zu\n", tp.rank(), y.extent(0), y.extent(1), dx.extent(0), dx.extent(1));
  });
}
