// `init_values(block, x)`: a parameter block's counter-based initial values written by the backend in rank
// memory. Compared element by element, bit for bit, with an independent evaluation of the formula of
// core/init.hpp (SplitMix64 over seed, parameter and global index; Box-Muller for the normal), written out
// here with the block walked by nested loops over its coordinates rather than by dividing the local index.
#include <catch2/catch.hpp>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <exception>
#include <numbers>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <mpar/backend/host/host_backend.hpp>
#include <mpar/backend/stream/stream_backend.hpp>
#include <mpar/nn/parameter.hpp>
#include <mpar/observe/counting_backend.hpp>

using namespace mpar;

namespace {

std::uint64_t splitmix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
double unit(std::uint64_t seed, std::uint64_t stream, std::uint64_t counter) {
  const std::uint64_t bits = splitmix(splitmix(splitmix(seed) ^ stream) ^ counter);
  return (double(bits >> 11) + 0.5) / 9007199254740992.0;  // 2^53
}
/** The documented formula of one element, evaluated directly. */
double reference_value(std::uint64_t seed, std::uint64_t id, std::uint64_t g, const InitSpec& s) {
  switch (s.kind) {
    case InitSpec::Kind::normal: {
      const double u1 = unit(seed, id, 2 * g), u2 = unit(seed, id, 2 * g + 1);
      return s.scale * (std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
    }
    case InitSpec::Kind::uniform:
      return s.scale * (2.0 * unit(seed, id, g) - 1.0);
    case InitSpec::Kind::constant:
      return s.scale;
  }
  return 0.0;
}

/** A block of up to three dimensions (unused trailing dimensions have extent 1). */
struct Case {
  std::vector<std::size_t> global;
  std::vector<Block> box;
};

/** The block's values in row-major order, each from its coordinates in the whole parameter. */
template <class T>
std::vector<T> reference_block(const Case& c, std::uint64_t seed, std::uint64_t id, const InitSpec& s) {
  std::array<std::size_t, 3> gs{1, 1, 1}, off{0, 0, 0}, ext{1, 1, 1};
  const std::size_t pad = 3 - c.global.size();
  for (std::size_t d = 0; d < c.global.size(); ++d) {
    gs[pad + d] = c.global[d];
    off[pad + d] = c.box[d].offset;
    ext[pad + d] = c.box[d].extent;
  }
  std::vector<T> out;
  for (std::size_t i = off[0]; i < off[0] + ext[0]; ++i)
    for (std::size_t j = off[1]; j < off[1] + ext[1]; ++j)
      for (std::size_t k = off[2]; k < off[2] + ext[2]; ++k)
        out.push_back(T(reference_value(seed, id, (i * gs[1] + j) * gs[2] + k, s)));
  return out;
}

/** Runs `init_values` over backend B on a fresh rank thread; the block's values copied back to the host. */
template <class B, class T>
std::vector<T> backend_block(const InitBlock& block) {
  std::vector<T> out;
  std::exception_ptr error;
  std::thread rank([&] {
    try {
      B::init_rank();
      const std::size_t n = std::size_t(block.size());
      Buffer<T> x = B::template allocate<T>(n);
      typename B::template pinned_buffer<T> h(n);
      B::run(ops::init_values<T>{.block = block, .x = x.data()});
      B::template copy_to_host_async<T>(n, x.data(), h.data());
      B::synchronize();
      out.assign(h.data(), h.data() + n);
    } catch (...) {
      error = std::current_exception();
    }
  });
  rank.join();
  if (error) std::rethrow_exception(error);
  return out;
}

template <class T>
auto bits_of(T v) {
  if constexpr (sizeof(T) == 4)
    return std::bit_cast<std::uint32_t>(v);
  else
    return std::bit_cast<std::uint64_t>(v);
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c{
      {{1}, {{0, 1}}},                          // one element
      {{37}, {{0, 37}}},                        // a prime: no vector width divides it
      {{130}, {{65, 65}}},                      // the second half of a 1-D shard
      {{6, 10}, {{0, 6}, {3, 5}}},              // a column block (Shard<1>)
      {{9, 13}, {{4, 3}, {0, 13}}},             // a row block (Shard<0>)
      {{5, 7, 11}, {{1, 3}, {2, 4}, {5, 6}}},   // a block inside every dimension of a 3-D tensor
      {{4, 3, 17}, {{0, 4}, {0, 3}, {0, 17}}},  // a whole 3-D tensor (expert weights)
      {{2, 1}, {{0, 2}, {1, 0}}},               // an empty block
  };
  return c;
}

template <class B, class T>
void check_against_reference() {
  const std::array<InitSpec, 4> specs{InitSpec::normal(0.02), InitSpec::normal(1.0), InitSpec::uniform(0.5),
                                      InitSpec::constant(-1.25)};
  const std::array<std::uint64_t, 3> seeds{0, 42, (std::uint64_t(1) << 40) + 3};
  std::uint64_t compared = 0;
  for (const Case& c : cases())
    for (std::uint64_t seed : seeds)
      for (const InitSpec& s : specs) {
        const std::uint64_t id = seed % 7 + 3 * std::uint64_t(c.global.size());
        const InitBlock block = make_init_block(seed, id, c.global, c.box, s);
        const std::vector<T> want = reference_block<T>(c, seed, id, s);
        const std::vector<T> got = backend_block<B, T>(block);
        REQUIRE(got.size() == want.size());
        for (std::size_t k = 0; k < got.size(); ++k) {
          INFO(B::name << ": seed " << seed << ", kind " << int(s.kind) << ", element " << k);
          REQUIRE(bits_of(got[k]) == bits_of(want[k]));
        }
        compared += got.size();
      }
  CHECK(compared > 1000);  // the empty block aside, every case compared something
}

}  // namespace

TEMPLATE_TEST_CASE("init_values: every backend writes the formula's values bit for bit", "[backend][init]", HostBackend,
                   StreamHostBackend, DiscreteHostBackend) {
  check_against_reference<TestType, float>();
  check_against_reference<TestType, double>();
}

TEST_CASE("init_values: a block outside its parameter or of too many dimensions is refused, named", "[backend][init]") {
  const std::vector<std::size_t> global{6, 10};
  const std::vector<Block> outside{{0, 6}, {8, 3}};
  try {
    (void)make_init_block(1, 2, global, outside, InitSpec::normal(0.02), "'fc.weight'");
    FAIL("a block past the global extent was accepted");
  } catch (const std::exception& e) {
    const std::string m = e.what();
    CHECK(m.find("'fc.weight'") != std::string::npos);
    CHECK(m.find("dimension 1") != std::string::npos);
    CHECK(m.find("global extent 10") != std::string::npos);
  }
  const std::vector<std::size_t> five(5, 2);
  const std::vector<Block> five_box(5, Block{0, 2});
  CHECK_THROWS_WITH(make_init_block(1, 2, five, five_box, InitSpec::normal(0.02)),
                    Catch::Contains("5 dimensions") && Catch::Contains("at most 4"));
  nn::Parameter p;
  p.name = "bad.weight";
  p.global_shape = {4};
  p.local_box = {{2, 3}};
  CHECK_THROWS_WITH(p.initialise<HostBackend>(1, InitSpec::normal(0.02)), Catch::Contains("bad.weight"));
}

TEST_CASE("Parameter::initialise<B> equals the host-computed initialise and is one init_values per parameter",
          "[backend][init]") {
  using Counting = observe::CountingBackend<HostBackend>;
  const std::array<std::size_t, 2> global{12, 7};
  const Box<2> box{Block{4, 4}, Block{0, 7}};
  const nn::Parameter host =
      nn::make_parameter<2>("w", 5, global, box, "Shard<0, tensor>", true, 9, InitSpec::normal(0.02));
  const auto before = Counting::counts();
  const nn::Parameter dev =
      nn::make_parameter<Counting, 2>("w", 5, global, box, "Shard<0, tensor>", true, 9, InitSpec::normal(0.02));
  const auto d = Counting::counts() - before;
  CHECK(d[observe::Op::init_values] == 1);
  CHECK(d[observe::Op::zero] == 1);  // the gradient
  CHECK(d.host_bytes == 0);
  REQUIRE(dev.value.size() == host.value.size());
  for (std::size_t k = 0; k < dev.value.size(); ++k) {
    REQUIRE(bits_of(dev.value[k]) == bits_of(host.value[k]));
    REQUIRE(dev.grad[k] == 0.0f);
  }
}
