// Two stages whose static feature counts disagree at the boundary: stage 0 returns 16 features, stage 1 takes 32.
// expect: static assertion failed
// expect: static_out_features differs from the next stage's static_in_features
#include <mpar/nn.hpp>
#include <mpar/pipeline/stage_concept.hpp>
using namespace mpar;
#ifdef MPAR_VERIFY_CONTROL
using Chain = pipeline::StageChain<nn::Linear<8, 16>, nn::Linear<16, 4>>;
#else
using Chain = pipeline::StageChain<nn::Linear<8, 16>, nn::Linear<32, 4>>;
#endif
static_assert(Chain::compatible);
int main() {}
