#include <catch2/catch.hpp>
#include <mpar/core.hpp>
#include <sstream>

using namespace mpar;

TEST_CASE("owning tensor: access, slicing, copying, printing", "[core][tensor]") {
  Tensor<float, 2> t({3, 4});
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t j = 0; j < 4; ++j) t(i, j) = float(10 * i + j);
  CHECK(t.size() == 12);
  CHECK(t.stride(0) == 4);

  auto cols = t.slice(1, 1, 3);
  CHECK(cols.extent(0) == 3);
  CHECK(cols.extent(1) == 2);
  CHECK_FALSE(cols.is_contiguous());
  CHECK(cols(2, 1) == 22.0f);
  cols(0, 0) = -1.0f;
  CHECK(t(0, 1) == -1.0f);  // a view aliases its tensor

  Tensor<float, 2> copy(cols);
  CHECK(copy.shape() == Shape<2>{3, 2});
  CHECK(copy(2, 1) == 22.0f);

  std::ostringstream os;
  os << t.slice(0, 1, 2);
  CHECK(os.str() == "Tensor f32 (1,4) [[10, 11, 12, 13]]");

  CHECK_THROWS_WITH(t.slice(1, 2, 5), Catch::Contains("outside extent 4"));
  CHECK_THROWS_WITH(cols.span(), Catch::Contains("strided"));
}

TEST_CASE("rank 4 tensors and 16-bit element types", "[core][tensor]") {
  Tensor<bf16, 4> t({2, 3, 4, 5}, bf16(1.5f));
  CHECK(float(t(1, 2, 3, 4)) == 1.5f);
  auto s = t.slice(2, 1, 3).slice(0, 1, 2);
  CHECK(s.extent(0) == 1);
  CHECK(s.extent(2) == 2);
  CHECK(&s(0, 0, 0, 0) == &t(1, 0, 1, 0));
  Tensor<float, 4> f(t.shape());
  copy_into(TensorView<const bf16, 4>(t.view()), f.view());
  CHECK(f(1, 2, 3, 4) == 1.5f);
}

TEST_CASE("tensor construction from values checks the count", "[core][tensor]") {
  CHECK_THROWS_WITH((Tensor<float, 2>({2, 2}, std::vector<float>{1, 2, 3})), Catch::Contains("3 values"));
}
