// A user's backend that runs every operation but the rotary embedding's: RMSNorm and the SwiGLU gate, which use
// only their own operations, build and run on it; the rotary embedding is refused at compile time, naming the
// operations it needs and the fix. The layers are constructed and run, as a user would.
// expect: backend B does not run ops::rope_forward and ops::rope_backward
// expect: give B a run\(op\) for them
#include <concepts>
#include <mpar/nn.hpp>
#include <vector>
using namespace mpar;
using namespace mpar::nn;
struct HostWithoutRotary : HostBackend {
  template <class Op>
    requires(!std::same_as<Op, ops::rope_forward> && !std::same_as<Op, ops::rope_backward>)
  static void run(const Op& op) { HostBackend::run(op); }
};
int main() {
  RMSNorm<Replicate, NoComm, HostWithoutRotary> norm(8, 1, 0, "norm");
  SiluGate<HostWithoutRotary> gate(4);
  auto y = gate.forward(norm.forward(Act<Replicate>(Activation({4, 8}))));
#ifndef MPAR_VERIFY_CONTROL
  Rotary<HostWithoutRotary> rope(4);
  auto r = rope.forward(y, std::vector<std::int32_t>{0, 1, 2, 3});
  return int(r.size());
#else
  return int(y.size());
#endif
}
