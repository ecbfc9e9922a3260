// Uses mpar through the umbrella header: a sharded initialisation checked against the full tensor.
#include <cstdio>
#include <mpar/mpar.hpp>

int main() {
  using namespace mpar;
  DeviceMesh<2, 1, 1> mesh;
  const std::array<std::size_t, 2> global{4, 6};
  Tensor<float, 2> full(global);
  init_full(full, 7, 1, InitSpec::normal(1.0));
  for (std::size_t r = 0; r < mesh.world_size(); ++r) {
    const auto box = Shard<1, axis::tensor>::local_box<2>(global, mesh, mesh.coord(r));
    Tensor<float, 2> local({box[0].extent, box[1].extent});
    init_shard(local.view(), global, box, 7, 1, InitSpec::normal(1.0));
    if (local(1, 2) != full(1, box[1].offset + 2)) return 1;
  }
  Tensor<float, 2> c({4, 4});
  matmul<float>(full.slice(1, 0, 4), Trans::no, full.slice(1, 2, 6), Trans::yes, c.view());
  std::printf("mpar %s consumer ok\n", MPAR_VERSION_STRING);
  return 0;
}
