// A Shard on a dimension the tensor does not have.
// expect: Dim is not a dimension of the tensor
#include <mpar/core.hpp>
using namespace mpar;
int main() {
  DeviceMesh<2, 1, 1> mesh;
#ifdef MPAR_VERIFY_CONTROL
  auto box = Shard<1, MeshAxis::tensor>::local_box<2>({4, 4}, mesh, mesh.coord(0));
#else
  auto box = Shard<2, MeshAxis::tensor>::local_box<2>({4, 4}, mesh, mesh.coord(0));
#endif
  return int(box[0].extent);
}
