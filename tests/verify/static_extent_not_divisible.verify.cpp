// A static extent sharded over a static mesh axis that does not divide it.
// expect: not divisible by the static size of the mesh axis
#include <mpar/core.hpp>
using namespace mpar;
using Mesh = DeviceMesh<3, 1, 1>;
#ifdef MPAR_VERIFY_CONTROL
constexpr std::size_t hidden = 1023;  // 1023 = 3 * 341
#else
constexpr std::size_t hidden = 1024;
#endif
int main() { static_require_divisible<hidden, MeshAxis::tensor, Mesh>(); }
