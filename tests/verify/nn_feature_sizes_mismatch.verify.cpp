// Consecutive layers whose static feature sizes disagree (4096 leave the column layer, 2048 enter the row layer).
// expect: consecutive layers disagree on the feature size
// expect: layers_do_not_compose.*Gelu.*RowParallel<.*2048
#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
#ifdef MPAR_VERIFY_CONTROL
constexpr std::size_t ffn_in = 4096;
#else
constexpr std::size_t ffn_in = 2048;
#endif
using S = Stage<ColumnParallel<C, 1024, 4096, 4>, Gelu, RowParallel<C, ffn_in, 1024, 4>>;
constexpr bool checked = S::valid;
int main() { return checked ? 0 : 1; }
