#include <catch2/catch.hpp>
#include <mpar/core.hpp>
#include <vector>

using namespace mpar;

namespace {
// Law: over all coordinates of the sharded axes, the local boxes tile the global tensor exactly once.
template <class L, std::size_t R, class M>
void check_tiles_exactly_once(const std::array<std::size_t, R>& global, const M& mesh) {
  std::size_t total = 1;
  for (auto e : global) total *= e;
  std::vector<int> hits(total, 0);
  for (std::size_t rank = 0; rank < mesh.world_size(); ++rank) {
    const MeshCoord c = mesh.coord(rank);
    // Only ranks that differ on the axes the layout uses hold distinct blocks; count those once.
    if (c.pipeline != 0 || c.data != 0 || c.expert != 0) continue;
    const auto box = L::template local_box<R>(global, mesh, c);
    std::array<std::size_t, R> idx{};
    std::size_t n = 1;
    for (auto& b : box) n *= b.extent;
    for (std::size_t k = 0; k < n; ++k) {
      std::size_t rem = k, flat = 0;
      for (std::size_t d = R; d-- > 0;) {
        idx[d] = rem % box[d].extent;
        rem /= box[d].extent;
      }
      for (std::size_t d = 0; d < R; ++d) flat = flat * global[d] + box[d].offset + idx[d];
      ++hits[flat];
    }
  }
  for (std::size_t i = 0; i < total; ++i) REQUIRE(hits[i] == 1);
}
}  // namespace

TEST_CASE("shards tile the global tensor exactly once for every coordinate", "[core][layout]") {
  for (std::size_t tp : {1, 2, 3, 4, 5}) {
    DeviceMesh<dyn, 1, 1> mesh(tp);
    for (std::size_t n : {0, 1, 7, 12, 13}) {
      check_tiles_exactly_once<Shard<0, axis::tensor>, 2>({n, 3}, mesh);
      check_tiles_exactly_once<Shard<1, axis::tensor>, 2>({3, n}, mesh);
      check_tiles_exactly_once<Shard<2, axis::tensor>, 3>({2, 3, n}, mesh);
    }
  }
}

TEST_CASE("2D shards tile the global tensor exactly once", "[core][layout]") {
  for (auto [r, c] : {std::pair<std::size_t, std::size_t>{2, 2}, {2, 3}, {3, 1}}) {
    DeviceMesh<dyn, 1, 1> mesh(r * c);
    mesh.with_tensor_grid(r, c);
    using L = Layout2D<Shard<0, axis::tensor_row>, Shard<1, axis::tensor_col>>;
    check_tiles_exactly_once<L, 2>({7, 11}, mesh);
    check_tiles_exactly_once<L, 2>({6, 6}, mesh);
  }
}

TEST_CASE("replicated and partial layouts hold the whole extent", "[core][layout]") {
  DeviceMesh<4, 1, 1> mesh;
  for (std::size_t rank = 0; rank < 4; ++rank) {
    CHECK(local_extents<Replicate, 2>({5, 6}, mesh, mesh.coord(rank)) == std::array<std::size_t, 2>{5, 6});
    CHECK(local_extents<Partial<ReduceOp::sum, axis::tensor>, 2>({5, 6}, mesh, mesh.coord(rank)) ==
          std::array<std::size_t, 2>{5, 6});
  }
}

TEST_CASE("uneven splits are rejected where a layer needs equal shards", "[core][layout]") {
  DeviceMesh<dyn, 1, 1> mesh(3);
  CHECK_NOTHROW(require_even_split<Shard<1, axis::tensor>, 2>({4, 9}, mesh));
  CHECK_THROWS_WITH(
      (require_even_split<Shard<1, axis::tensor>, 2>({4, 10}, mesh, "ColumnParallel")),
      Catch::Contains("ColumnParallel") && Catch::Contains("size 10") && Catch::Contains("tensor axis size 3"));
}

TEST_CASE("mesh rank <-> coordinate round trip, tensor innermost", "[core][mesh]") {
  DeviceMesh<dyn, dyn, dyn, dyn> mesh(2, 3, 2, 2);
  CHECK(mesh.world_size() == 24);
  for (std::size_t r = 0; r < 24; ++r) CHECK(mesh.rank(mesh.coord(r)) == r);
  CHECK(mesh.coord(1).tensor == 1);
  CHECK(mesh.coord(2).expert == 1);
  CHECK(mesh.coord(4).data == 1);
  CHECK(mesh.coord(8).pipeline == 1);
  CHECK_THROWS_WITH(mesh.coord(24), Catch::Contains("rank 24"));
  CHECK_THROWS_WITH((DeviceMesh<dyn, 1, 1>(0)), Catch::Contains("tensor axis has size 0"));
  CHECK_THROWS_WITH((DeviceMesh<dyn, 1, 1>(4).with_tensor_grid(3, 2)), Catch::Contains("3 x 2"));
}

TEST_CASE("the context axis is the innermost factor of the data axis", "[core][mesh]") {
  // tp 2, pp 2, data axis 6 = dp 3 x cp 2: rank = ((pipeline * 6 + data) * 1 + expert) * 2 + tensor.
  DynamicMesh mesh(2, 2, 6, 1);
  CHECK(mesh.size(axis::context) == 1);  // without with_context every rank is its own context group
  CHECK(mesh.coord(3).context == 0);
  mesh.with_context(2);
  CHECK(mesh.size(axis::context) == 2);
  CHECK(mesh.size(axis::data) == 6);  // the whole gradient-averaging group
  for (std::size_t r = 0; r < mesh.world_size(); ++r) {
    const MeshCoord c = mesh.coord(r);
    CHECK(c.context == (r / 2) % 2);  // by hand: the data index is (r / 2) % 6, its innermost factor of 2
    CHECK(mesh.rank(c) == r);
  }
  CHECK_THROWS_WITH(DynamicMesh(1, 1, 6, 1).with_context(4), Catch::Contains("cp = 4") && Catch::Contains("6"));
}
