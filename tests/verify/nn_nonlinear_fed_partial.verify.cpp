// A nonlinear layer (GeLU) fed the Partial output of a RowParallel that defers its reduction.
// expect: nonlinear layer .* is fed a Partial<sum, tensor>
// expect: insert AllReduce
#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
using Col = ColumnParallel<C, 1024, 4096>;
using RowDeferred = RowParallel<C, 4096, 1024, dyn, RowReduce::none>;
#ifdef MPAR_VERIFY_CONTROL
using S = Stage<Col, Gelu, RowDeferred, AllReduce<C>, Gelu>;
#else
using S = Stage<Col, Gelu, RowDeferred, Gelu>;
#endif
constexpr bool checked = S::valid;
int main() { return checked ? 0 : 1; }
