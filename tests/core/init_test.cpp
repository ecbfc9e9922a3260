#include <catch2/catch.hpp>
#include <cmath>
#include <mpar/core.hpp>

using namespace mpar;

TEST_CASE("initialisation does not depend on sharding", "[core][init]") {
  const std::array<std::size_t, 2> global{6, 10};
  Tensor<float, 2> full(global);
  init_full(full, 42, 3, InitSpec::normal(0.02));
  for (std::size_t tp : {1, 2, 3, 4}) {
    DeviceMesh<dyn, 1, 1> mesh(tp);
    for (std::size_t r = 0; r < tp; ++r) {
      const auto box = Shard<1, axis::tensor>::local_box<2>(global, mesh, mesh.coord(r));
      Tensor<float, 2> local({box[0].extent, box[1].extent});
      init_shard(local.view(), global, box, 42, 3, InitSpec::normal(0.02));
      for (std::size_t i = 0; i < box[0].extent; ++i)
        for (std::size_t j = 0; j < box[1].extent; ++j) REQUIRE(local(i, j) == full(i, box[1].offset + j));
    }
  }
}

TEST_CASE("counter-based values: distinct streams, plausible moments", "[core][init]") {
  Tensor<double, 1> a({20000}), b({20000});
  init_full(a, 1, 0, InitSpec::normal(1.0));
  init_full(b, 1, 1, InitSpec::normal(1.0));
  double mean = 0, var = 0;
  for (double v : a.values()) mean += v;
  mean /= 20000;
  for (double v : a.values()) var += (v - mean) * (v - mean);
  var /= 20000;
  CHECK(std::fabs(mean) < 0.03);
  CHECK(std::fabs(var - 1.0) < 0.05);
  CHECK(a.values() != b.values());
  Tensor<float, 1> u({1000});
  init_full(u, 9, 0, InitSpec::uniform(0.5));
  for (float v : u.values()) REQUIRE((v > -0.5f && v < 0.5f));
}
