// A RowParallel layer fed a replicated tensor (GeLU directly on the replicated input, no ColumnParallel).
// expect: insert ColumnParallel before RowParallel
// expect: layers_do_not_compose.*Gelu.*RowParallel.*Replicate
#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
#ifdef MPAR_VERIFY_CONTROL
using S = Stage<ColumnParallel<C, 1024, 4096>, Gelu, RowParallel<C, 4096, 1024>>;
#else
using S = Stage<Linear<1024, 4096>, Gelu, RowParallel<C, 4096, 1024>>;
#endif
constexpr bool checked = S::valid;
int main() { return checked ? 0 : 1; }
