// Interleaved 1F1B with M = 6 micro-batches on P = 4 stages: M must be a multiple of P.
// expect: static assertion failed
// expect: M \(micro-batches\) must be a multiple of P \(stages\)
#include <mpar/pipeline/static_schedule.hpp>
using namespace mpar::pipeline;
#ifdef MPAR_VERIFY_CONTROL
using S = StaticSchedule<Interleaved1F1B, 4, 8, 2>;
#else
using S = StaticSchedule<Interleaved1F1B, 4, 6, 2>;
#endif
int main() { return S::verified ? 0 : 1; }
