// Consecutive layers whose static feature sizes disagree (64 leave the column layer, 32 enter the row
// layer): the stage is constructed and run on 2 thread ranks.
// expect: consecutive layers disagree on the feature size
// expect: check_link.*Gelu.*RowParallel<.*32.*features<64>
#include <mpar/comm/threads.hpp>
#include <mpar/nn.hpp>
using namespace mpar;
using namespace mpar::nn;
using C = ThreadsCommunicator;
#ifdef MPAR_VERIFY_CONTROL
constexpr std::size_t ffn_in = 64;
#else
constexpr std::size_t ffn_in = 32;
#endif
int main() {
  run_threads(2, [](C& tp) {
    using Fc1 = ColumnParallel<C, 16, 64, 2>;
    using Fc2 = RowParallel<C, ffn_in, 16, 2>;
    Stage<Fc1, Gelu, Fc2> s(Fc1(tp, 16, 64, {.name = "fc1"}), Gelu{}, Fc2(tp, ffn_in, 16, {.name = "fc2"}));
    auto y = s.forward(Act<Replicate>(Activation({8, 16})));
    auto dx = s.backward(Act<Replicate>(Activation(y.shape())));
    return dx.size();
  });
}
