// Attention heads that the static tensor-parallel size does not divide (attention is split by whole heads).
// expect: number of heads is not divisible by the static tensor-parallel size TP
#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
#ifdef MPAR_VERIFY_CONTROL
using A = SelfAttention<C, 768, 12, 4>;
#else
using A = SelfAttention<C, 768, 12, 8>;
#endif
constexpr bool checked = Stage<A>::valid;
int main() { return checked ? 0 : 1; }
