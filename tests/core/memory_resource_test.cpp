// Memory resources: the caching resource reuses blocks by size class, bounds what it keeps, gives
// memory back on release and on upstream exhaustion, and serves Buffer/Tensor like any resource.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <new>
#include <stdexcept>
#include <thread>

#include "mpar/core/caching_memory_resource.hpp"
#include "mpar/core/tensor.hpp"
#include "mpar/nn/parameter.hpp"

using namespace mpar;

namespace {

/** Host memory that counts its calls and refuses to hold more than `limit` bytes at once. */
class CountingResource final : public MemoryResource {
 public:
  explicit CountingResource(std::size_t limit = std::size_t(-1)) : limit_(limit) {}
  [[nodiscard]] void* allocate(std::size_t bytes) override {
    if (held + bytes > limit_) throw std::bad_alloc();
    ++allocations;
    held += bytes;
    void* p = ::operator new(bytes);
    live[p] = bytes;
    return p;
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    ++frees;
    held -= bytes;
    mismatched += live[p] != bytes;
    live.erase(p);
    ::operator delete(p);
  }
  [[nodiscard]] const char* name() const noexcept override { return "counting"; }

  std::size_t allocations = 0, frees = 0, held = 0, mismatched = 0;
  std::map<void*, std::size_t> live;

 private:
  std::size_t limit_;
};

}  // namespace

TEST_CASE("caching resource: size classes round up by at most 512 bytes or 12.5 %", "[core][memory]") {
  STATIC_REQUIRE(CachingMemoryResource::size_class(0) == 512);
  STATIC_REQUIRE(CachingMemoryResource::size_class(1) == 512);
  STATIC_REQUIRE(CachingMemoryResource::size_class(513) == 1024);
  STATIC_REQUIRE(CachingMemoryResource::size_class(std::size_t(1) << 20) == std::size_t(1) << 20);
  STATIC_REQUIRE(CachingMemoryResource::size_class((std::size_t(1) << 20) + 1) ==
                 (std::size_t(1) << 20) + (std::size_t(1) << 17));
  STATIC_REQUIRE(CachingMemoryResource::size_class(std::size_t(2) << 20) == std::size_t(2) << 20);
  for (std::size_t b = 1; b < (std::size_t(64) << 20); b = b * 3 / 2 + 7) {
    const std::size_t c = CachingMemoryResource::size_class(b);
    INFO(b << " -> " << c);
    CHECK(c >= b);
    CHECK((c - b < 512 || double(c - b) <= 0.125 * double(b)));
    CHECK(CachingMemoryResource::size_class(c) == c);  // a class is its own class
  }
}

TEST_CASE("caching resource: a repeated allocation pattern reaches the upstream only once", "[core][memory]") {
  CountingResource up;
  {
    CachingMemoryResource cache(up);
    CHECK(std::string(cache.name()) == "caching(counting)");
    for (int step = 0; step < 5; ++step) {
      ScopedMemoryResource scoped(cache);
      Tensor<float, 2> a({64, 33}), b({7, 5});
      Buffer<double> c(1000, 1.0);
      a(3, 4) = 2.0f;
      CHECK(a(3, 4) == 2.0f);
      CHECK(c[999] == 1.0);
    }
    const CacheStats st = cache.stats();
    CHECK(up.allocations == 3);
    CHECK(st.upstream_allocations == 3);
    CHECK(st.hits == 12);
    CHECK(st.in_use == 0);
    CHECK(st.cached == CachingMemoryResource::size_class(64 * 33 * 4) + CachingMemoryResource::size_class(7 * 5 * 4) +
                           CachingMemoryResource::size_class(8000));
    CHECK(st.peak_in_use == st.cached);
    CHECK(up.frees == 0);
    cache.release();
    CHECK(up.frees == 3);
    CHECK(cache.stats().cached == 0);
  }
  CHECK(up.held == 0);
  CHECK(up.mismatched == 0);  // every block went back with the size it was allocated with
}

TEST_CASE("caching resource: the bound on cached bytes, destruction, frees on another thread", "[core][memory]") {
  CountingResource up;
  {
    CachingMemoryResource cache(up, 4096);
    void* a = cache.allocate(3000);  // class 3072
    void* b = cache.allocate(3000);
    cache.deallocate(a, 3000);  // kept: 3072 <= 4096
    cache.deallocate(b, 3000);  // would exceed the bound: back upstream
    CHECK(up.frees == 1);
    CHECK(cache.stats().cached == 3072);
    Buffer<float>* moved = nullptr;
    {
      ScopedMemoryResource scoped(cache);
      moved = new Buffer<float>(100, 1.0f);
    }
    std::thread([&] { delete moved; }).join();  // the allocator remembers its resource
    CHECK(cache.stats().in_use == 0);
  }
  CHECK(up.held == 0);  // destruction returned the cache
}

TEST_CASE("caching resource: when the upstream is exhausted, the cache is released and the request retried",
          "[core][memory]") {
  CountingResource up(8192);
  CachingMemoryResource cache(up);
  void* a = cache.allocate(4096);
  void* b = cache.allocate(2048);
  cache.deallocate(a, 4096);
  cache.deallocate(b, 2048);       // 6144 bytes cached, upstream holds them
  void* c = cache.allocate(6000);  // class 6144: only fits once the cache went back
  CHECK(c != nullptr);
  CHECK(cache.stats().cached == 0);
  CHECK_THROWS_AS(cache.allocate(8192), std::bad_alloc);  // genuinely too big: the upstream's error
  cache.deallocate(c, 6000);
}

TEST_CASE("memory resource: an allocation that fails names what was being allocated and its size", "[core]") {
  CountingResource limited(1 << 20);  // 1 MiB: a 1024 x 1024 float parameter (4 MiB) does not fit
  ScopedMemoryResource scope(limited);
  const std::array<std::size_t, 2> shape{1024, 1024};
  CHECK_THROWS_WITH(
      nn::make_parameter<2>("big.weight", 1, shape, Box<2>{Block{0, 1024}, Block{0, 1024}}, "Replicate", false, 1,
                            InitSpec::normal(0.02)),
      Catch::Contains("cannot allocate parameter 'big.weight' (local block [1024, 1024]): 4194304 bytes") &&
          Catch::Contains("of counting memory"));
  // Still a std::bad_alloc for handlers that catch that; without a label, the buffer is named as such.
  CHECK_THROWS_AS(Buffer<float>(1 << 20), std::bad_alloc);
  CHECK_THROWS_WITH(Buffer<float>(1 << 20), Catch::Contains("cannot allocate a tensor buffer: 4194304 bytes"));
  {
    const AllocationLabel outer("the outer thing");
    const AllocationLabel inner("the activations of micro-batch 3");
    CHECK_THROWS_WITH(Buffer<float>(1 << 20), Catch::Contains("cannot allocate the activations of micro-batch 3"));
  }
  CHECK(limited.held == 0);
}

namespace {
/** Host memory handed out pre-filled with the byte 0xAB, so a write by the container shows. */
class PatternResource final : public MemoryResource {
 public:
  [[nodiscard]] void* allocate(std::size_t bytes) override {
    void* p = ::operator new(bytes ? bytes : 1);
    std::memset(p, 0xAB, bytes);
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept override { ::operator delete(p); }
  [[nodiscard]] const char* name() const noexcept override { return "pattern"; }
};
template <class T>
bool untouched(const Buffer<T>& b) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(b.data());
  for (std::size_t i = 0; i < b.size() * sizeof(T); ++i)
    if (bytes[i] != 0xAB) return false;
  return true;
}
}  // namespace

TEST_CASE("uninitialized_buffer: the container writes nothing; copies and ordinary buffers are initialised",
          "[core][memory]") {
  PatternResource r;
  const Buffer<float> f = uninitialized_buffer<float>(300, r);
  const Buffer<bf16> h = uninitialized_buffer<bf16>(300, r);  // bf16 zero-initialises its bits when constructed
  const Buffer<std::int32_t> i = uninitialized_buffer<std::int32_t>(7, r);
  CHECK(f.size() == 300);
  CHECK(untouched(f));
  CHECK(untouched(h));
  CHECK(untouched(i));
  CHECK(&f.get_allocator().resource() == &r);
  // Growing it keeps the rule; a copy is an ordinary buffer again, and so is a buffer made without the tag.
  Buffer<float> grown = uninitialized_buffer<float>(4, r);
  grown.resize(600);
  CHECK(untouched(grown));
  ScopedMemoryResource use(r);
  Buffer<float> copy(f);
  copy.resize(400);
  CHECK(copy[350] == 0.0f);
  const Buffer<float> ordinary(50);
  for (float x : ordinary) REQUIRE(x == 0.0f);
}
