// Two pipeline stages whose static feature counts disagree at the boundary (stage 0 returns 16
// features, stage 1 takes 32): the chain is constructed from the stage objects, as a user does.
// expect: static_out_features differs from the next stage's static_in_features
// expect: Fix: make the next stage's input size equal
#include <mpar/nn.hpp>
#include <mpar/pipeline/pipeline_part.hpp>
using namespace mpar;
#ifdef MPAR_VERIFY_CONTROL
constexpr std::size_t in1 = 16;
#else
constexpr std::size_t in1 = 32;
#endif
int main() {
  nn::Linear<8, 16> s0(8, 16, {.name = "s0"});
  nn::Linear<in1, 4> s1(in1, 4, {.name = "s1"});
  pipeline::PartChain chain(s0, s1);
  auto y = chain.get<1>().forward(nn::Act<Replicate>(nn::Activation({2, in1})));
  return int(chain.stages + y.size()) - 10;
}
