// A non-tensor passed where a tensor is required.
// expect: (constraints not satisfied|satisfy)
// expect: requires +tensor<T>
#include <mpar/core.hpp>
#include <vector>
using namespace mpar;
template <tensor T>
std::size_t elements(const T& t) {
  return t.size();
}
int main() {
#ifdef MPAR_VERIFY_CONTROL
  Tensor<float, 2> x({2, 2});
#else
  std::vector<float> x(4);
#endif
  return int(elements(x));
}
