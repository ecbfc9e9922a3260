// Compute copies in fp32 of fp32 masters are not mixed precision: ComputeCopies takes bf16 or f16 only.
// expect: (constraints not satisfied|satisfy|constraint)
// expect: half_precision
#include <mpar/parallel/mixed_precision.hpp>
using namespace mpar;
#ifdef MPAR_VERIFY_CONTROL
using Compute = bf16;
#else
using Compute = float;
#endif
int main() {
  parallel::ComputeCopies<Compute> copies({});
  return int(copies.size());
}
