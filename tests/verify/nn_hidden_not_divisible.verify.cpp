// A static hidden (output) size that a static tensor-parallel size does not divide.
// expect: static output size Out is not divisible by the static tensor-parallel size TP
#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
#ifdef MPAR_VERIFY_CONTROL
using L = ColumnParallel<C, 1000, 4096, 8>;
#else
using L = ColumnParallel<C, 1000, 4100, 8>;  // 4100 = 8 * 512.5
#endif
constexpr bool checked = Stage<L>::valid;
int main() { return checked ? 0 : 1; }
