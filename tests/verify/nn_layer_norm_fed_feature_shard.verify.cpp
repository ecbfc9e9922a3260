// LayerNorm right after a ColumnParallel: its row statistics would see only this rank's features.
// expect: needs whole rows, but the previous layer returns a feature-sharded tensor
// expect: use RowParallel here
#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
#ifdef MPAR_VERIFY_CONTROL
using S = Stage<ColumnParallel<C, 1024, 4096, dyn, ColumnOptions{.gather_output = true}>, LayerNorm<>>;
#else
using S = Stage<ColumnParallel<C, 1024, 4096>, LayerNorm<>>;
#endif
constexpr bool checked = S::valid;
int main() { return checked ? 0 : 1; }
