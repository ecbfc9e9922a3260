// CudaBackend::init_values (a grid-stride kernel over core/init.hpp's MPAR_HOST_DEVICE functions) against the
// host reference host::init_values, element by element, for blocks of every rank the layers use, sizes that
// no vector or block width divides, and each kind of initialisation.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "mpar/backend/gpu/cuda_backend.hpp"
#include "mpar/backend/host/buffer_ops.hpp"

using namespace mpar;

namespace {

struct InitCase {
  std::vector<std::size_t> global;
  std::vector<Block> box;
};

template <class T>
std::vector<T> on_device(const InitBlock& block) {
  const std::size_t n = std::size_t(block.size());
  gpu::DeviceBuffer<T> d(n, gpu::current_stream());
  CudaBackend::run(ops::init_values<T>{.block = block, .x = d.data()});
  return gpu::to_host(d.data(), n, gpu::current_stream());
}

/** Units in the last place between two doubles of the same sign. */
std::uint64_t ulps(double a, double b) {
  const auto x = std::bit_cast<std::int64_t>(a), y = std::bit_cast<std::int64_t>(b);
  return std::uint64_t(x > y ? x - y : y - x);
}

}  // namespace

TEST_CASE("init_values: the CUDA kernel writes the host function's values", "[cuda][init]") {
  const std::vector<InitCase> cases{
      {{1}, {{0, 1}}},
      {{100003}, {{0, 100003}}},                  // many blocks of the grid, a prime size
      {{1000, 37}, {{0, 1000}, {11, 19}}},        // a column shard
      {{64, 129}, {{32, 32}, {0, 129}}},          // a row shard
      {{4, 33, 65}, {{1, 2}, {0, 33}, {7, 41}}},  // expert weights, one block in every dimension
      {{3, 5, 7, 9}, {{0, 3}, {1, 3}, {2, 5}, {4, 5}}},
  };
  const InitSpec specs[] = {InitSpec::normal(0.02), InitSpec::uniform(0.1), InitSpec::constant(1.0)};
  std::uint64_t double_normal_differ = 0, double_normal = 0;
  for (const InitCase& c : cases)
    for (std::uint64_t seed : {std::uint64_t(0), std::uint64_t(1234), (std::uint64_t(1) << 52) + 5})
      for (const InitSpec& s : specs) {
        const InitBlock block = make_init_block(seed, seed % 11 + 2, c.global, c.box, s);
        const std::size_t n = std::size_t(block.size());
        std::vector<float> want(n);
        host::init_values(block, want.data());
        const std::vector<float> got = on_device<float>(block);
        // fp32 parameters: the same bits (the hashing, the uniform and the rounding are the host's; the normal's
        // logarithm and cosine differ from glibc's by at most a few units of the double, below fp32's rounding).
        for (std::size_t k = 0; k < n; ++k) {
          INFO("seed " << seed << ", kind " << int(s.kind) << ", element " << k);
          REQUIRE(std::bit_cast<std::uint32_t>(got[k]) == std::bit_cast<std::uint32_t>(want[k]));
        }
        std::vector<double> want64(n);
        host::init_values(block, want64.data());
        const std::vector<double> got64 = on_device<double>(block);
        for (std::size_t k = 0; k < n; ++k) {
          INFO("double, seed " << seed << ", kind " << int(s.kind) << ", element " << k);
          if (s.kind == InitSpec::Kind::normal) {
            REQUIRE(ulps(got64[k], want64[k]) <= 4);  // libdevice's log and cos against glibc's
            double_normal_differ += got64[k] != want64[k] ? 1 : 0;
            ++double_normal;
          } else {
            REQUIRE(std::bit_cast<std::uint64_t>(got64[k]) == std::bit_cast<std::uint64_t>(want64[k]));
          }
        }
      }
  WARN("double normal values that differ from the host's in the last places: " << double_normal_differ << " of "
                                                                               << double_normal);
}
