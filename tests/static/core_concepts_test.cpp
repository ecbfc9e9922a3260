// Static tests: walls of static_assert for the core concepts and layout rules. Compiling this file is the test.
#include <mpar/core.hpp>
#include <vector>

namespace {
using namespace mpar;

// ---- extents ----
static_assert(sizeof(Extents<4, 8>) == 1, "fully static extents are empty");
struct HoldsStaticExtents {
  [[no_unique_address]] Extents<2, 3> e;
  int payload;
};
static_assert(sizeof(HoldsStaticExtents) == sizeof(int), "static extents as a member cost zero bytes");
static_assert(sizeof(Extents<dyn, 8>) == sizeof(std::size_t), "only dynamic sizes are stored");
static_assert(Extents<4, 8>{}.size() == 32);
static_assert(Extents<dyn, 8>(3).extent(0) == 3 && Extents<dyn, 8>(3).extent(1) == 8);
static_assert(Extents<dyn, 8, dyn>::rank_dynamic() == 2);
static_assert(mpar::detail::extents_type<Extents<1>> && !mpar::detail::extents_type<int>);

// ---- element types ----
static_assert(mpar::detail::element_type<float> && mpar::detail::element_type<double> &&
              mpar::detail::element_type<bf16> && mpar::detail::element_type<f16>);
static_assert(!mpar::detail::element_type<int> && !mpar::detail::element_type<std::vector<float>>);
static_assert(std::is_same_v<compute_type_t<bf16>, float> && std::is_same_v<compute_type_t<double>, double>);
static_assert(sizeof(bf16) == 2 && sizeof(f16) == 2);
static_assert(bf16(1.0f).bits == 0x3f80 && f16(1.0f).bits == 0x3c00, "conversions are constexpr");

// ---- tensors ----
static_assert(tensor<Tensor<float, 2>> && tensor<TensorView<const f16, 4>>);
static_assert(!tensor<std::vector<float>> && !tensor<float>);

// ---- layouts ----
static_assert(layout<Replicate> && layout<Shard<1, axis::tensor>> && layout<Partial<ReduceOp::sum, axis::tensor>>);
static_assert(layout<Layout2D<Shard<0, axis::tensor_row>, Shard<1, axis::tensor_col>>>);
static_assert(!layout<int> && !layout<Extents<2>>);
static_assert(Replicate::is_replicated && !Replicate::is_partial);
static_assert(Shard<1, axis::data>::sharded_dim == 1 && Shard<1, axis::data>::axis == axis::data);
static_assert(Partial<ReduceOp::sum, axis::tensor>::is_partial && !Partial<ReduceOp::sum, axis::tensor>::is_replicated);
static_assert(Layout2D<Shard<0, axis::tensor_row>, Partial<ReduceOp::sum, axis::tensor_col>>::is_partial);
static_assert(std::is_empty_v<Shard<0, axis::tensor>> && std::is_final_v<Shard<0, axis::tensor>>,
              "layouts are final empty tags");

// ---- mesh and divisibility ----
static_assert(mpar::detail::device_mesh<DeviceMesh<2, 2, 2>> && mpar::detail::device_mesh<DynamicMesh> &&
              !mpar::detail::device_mesh<int>);
static_assert(sizeof(DeviceMesh<2, 2, 2, 1>) == 2 * sizeof(std::size_t),
              "a static mesh stores only the tensor-grid and context factors");
static_assert(DeviceMesh<2, 2, 2>{}.world_size() == 8);
static_assert(DeviceMesh<2, 2, 2>{}.coord(1).tensor == 1 && DeviceMesh<2, 2, 2>{}.coord(2).data == 1,
              "tensor is the innermost axis, then data");
static_assert(DeviceMesh<2, 2, 2>{}.coord(4).pipeline == 1, "pipeline is the outermost axis");
static_assert(statically_divisible_v<1024, 4> && !statically_divisible_v<1000, 3>);
static_assert(statically_divisible_v<dyn, 3> && statically_divisible_v<1000, dyn>,
              "dynamic sizes are checked at run time");
static_assert(block_of(10, 4, 0) == Block{0, 3} && block_of(10, 4, 1) == Block{3, 3} &&
                  block_of(10, 4, 2) == Block{6, 2} && block_of(10, 4, 3) == Block{8, 2},
              "the first n % p ranks get one more element");
}  // namespace
