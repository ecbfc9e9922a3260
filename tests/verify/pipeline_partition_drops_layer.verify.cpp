// A static partition of 10 layers into stages of 4 + 3 + 2 would silently drop the last layer.
// expect: static assertion failed
// expect: must cover exactly the N layers of the model
#include <mpar/pipeline/partition.hpp>
using namespace mpar::pipeline;
#ifdef MPAR_VERIFY_CONTROL
using Split = StaticPartition<10, 4, 3, 3>;
#else
using Split = StaticPartition<10, 4, 3, 2>;
#endif
int main() { return int(Split::stages); }
