#include <catch2/catch.hpp>
#include <mpar/core.hpp>
#include <sstream>

using namespace mpar;

TEST_CASE("extents mix static and dynamic sizes", "[core][extents]") {
  Extents<dyn, 8, dyn> e(3, 5);
  CHECK(e.rank() == 3);
  CHECK(e.extent(0) == 3);
  CHECK(e.extent(1) == 8);
  CHECK(e.extent<2>() == 5);
  CHECK(e.size() == 120);
  CHECK(e.to_array() == std::array<std::size_t, 3>{3, 8, 5});
  std::ostringstream os;
  os << e;
  CHECK(os.str() == "(3,_8,5)");
  CHECK(Extents<dyn, 8, dyn>(3, 5) == e);
  CHECK_FALSE(Extents<dyn, 8, dyn>(3, 6) == e);
}

TEST_CASE("all-dynamic extents", "[core][extents]") {
  DynExtents<2> d(2, 7);
  CHECK(d.size() == 14);
  CHECK_FALSE(d.is_static(0));
}
