// A group that only has the blocking collectives (an all-reduce-only transport, say) models
// collective_communicator, so code that only all-reduces accepts it; code that needs the whole
// `communicator` (same_group) refuses it and names the part it lacks.
// expect: point_to_point_communicator
#include <cstddef>
#include <span>
#include <string>

#include <mpar/comm/communicator.hpp>

struct CollectivesOnly {
  int rank() const { return 0; }
  int size() const { return 1; }
  std::string name() const { return "solo"; }
  template <class T>
  void all_reduce(std::span<T>, mpar::ReduceOp) {}
  template <class T>
  void broadcast(std::span<T>, int) {}
  template <class T>
  void reduce(std::span<const T> s, std::span<T> r, mpar::ReduceOp, int) {
    copy(s, r);
  }
  template <class T>
  void all_gather(std::span<const T> s, std::span<T> r) {
    copy(s, r);
  }
  template <class T>
  void reduce_scatter(std::span<const T> s, std::span<T> r, mpar::ReduceOp) {
    copy(s, r);
  }
  template <class T>
  void gather(std::span<const T> s, std::span<T> r, int) {
    copy(s, r);
  }
  template <class T>
  void scatter(std::span<const T> s, std::span<T> r, int) {
    copy(s, r);
  }
  template <class T>
  void all_to_all(std::span<const T> s, std::span<T> r) {
    copy(s, r);
  }
  template <class T>
  void all_to_all_v(std::span<const T> s, std::span<const std::size_t>, std::span<T> r, std::span<const std::size_t>) {
    copy(s, r);
  }
  void barrier() {}
  template <class T>
  static void copy(std::span<const T> s, std::span<T> r) {
    for (std::size_t i = 0; i < s.size() && i < r.size(); ++i) r[i] = s[i];
  }
};

template <mpar::detail::collective_communicator C>
float average(C& c, float x) {
  c.all_reduce(std::span<float>(&x, 1), mpar::ReduceOp::sum);
  return x / float(c.size());
}

int main() {
  CollectivesOnly c;
  const float x = average(c, 2.0f);
#ifndef MPAR_VERIFY_CONTROL
  CollectivesOnly again = mpar::same_group(c);
  (void)again;
#endif
  return x == 2.0f ? 0 : 1;
}
