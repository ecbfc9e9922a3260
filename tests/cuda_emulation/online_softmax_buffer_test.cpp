// The online-softmax kernels (backend/gpu/online_softmax.hpp, launched as the operation objects of
// backend/ops/online_softmax.hpp) and the buffer kernels (buffer_ops.hpp) on the emulated runtime against their host
// references: two key blocks in a row (the second rescales what the first
// left), a causal diagonal, rows that see no key, padded strides; fill and init_values over a sharded block.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "device_array.hpp"
#include "mpar/backend/gpu/buffer_ops.hpp"
#include "mpar/backend/gpu/online_softmax.hpp"
#include "mpar/backend/host/buffer_ops.hpp"
#include "mpar/backend/ops/online_softmax.hpp"
#include "mpar/core/init.hpp"

namespace mpar::online_softmax_emulation_test {

using emulation_test::DeviceArray;
using emulation_test::require_close;

std::vector<float> scores(std::size_t n, std::uint64_t stream) {
  const CounterRng rng{91, stream};
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float(6.0 * rng.uniform(i) - 3.0);
  return v;
}

/** Equal within float rounding; infinities (a row that saw no key) must be the same infinity. */
void require_same(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    if (std::isinf(want[i])) REQUIRE(got[i] == want[i]);
  std::vector<float> g, w;
  for (std::size_t i = 0; i < want.size(); ++i)
    if (!std::isinf(want[i])) g.push_back(got[i]), w.push_back(want[i]);
  require_close(g, w, 1e-5, 1e-6);
}

TEST_CASE("cuda kernels on the emulation: the online-softmax steps equal the host") {
  // 3 heads, 5 query rows (statistics 8 apart, output rows 3 x 3 + 2 wide); key blocks of 4 and 300 columns
  // (more than a block's threads); queries at positions 6.. (the second block has the causal diagonal) and -2..
  // (two rows see nothing).
  const std::size_t heads = 3, rows = 5, dim = 3, ss = rows + 3, ld = heads * dim + 2;
  for (std::ptrdiff_t query_pos : {std::ptrdiff_t(6), std::ptrdiff_t(-2)}) {
    INFO("queries from position " << query_pos);
    std::vector<float> m(heads * ss, -std::numeric_limits<float>::infinity()), l(heads * ss, 0.0f),
        out = scores(rows * ld, 1);
    DeviceArray<float> dm(m), dl(l), dout(out);
    std::size_t k0 = 0;
    for (std::size_t cols : {std::size_t(4), std::size_t(300)}) {
      const SoftmaxBlock b{heads, rows, cols, dim, ss, ld, query_pos - std::ptrdiff_t(k0)};
      std::vector<float> sc = scores(heads * rows * cols, 10 + k0);
      DeviceArray<float> dsc(sc);
      host_reference(ops::online_softmax_update{
          .block = b, .scores = sc.data(), .row_max = m.data(), .row_sum = l.data(), .out = out.data()});
      gpu::launch(ops::online_softmax_update{
          .block = b, .scores = dsc.get(), .row_max = dm.get(), .row_sum = dl.get(), .out = dout.get()});
      require_same(dsc.host(), sc);
      require_same(dl.host(), l);
      require_same(dout.host(), out);
      require_same(dm.host(), m);
      k0 += cols;
    }
    host_reference(ops::online_softmax_finish{heads, rows, dim, ss, ld, m.data(), l.data(), out.data()});
    gpu::launch(ops::online_softmax_finish{heads, rows, dim, ss, ld, dm.get(), dl.get(), dout.get()});
    require_same(dout.host(), out);
    require_same(dm.host(), m);

    const std::vector<float> go = scores(rows * ld, 2);
    std::vector<float> delta(heads * ss, 0.0f);
    DeviceArray<float> dgo(go), dres(out), ddelta(delta), dlse(m);
    host_reference(ops::online_softmax_delta{heads, rows, dim, ss, ld, go.data(), out.data(), delta.data()});
    gpu::launch(ops::online_softmax_delta{heads, rows, dim, ss, ld, dgo.get(), dres.get(), ddelta.get()});
    require_same(ddelta.host(), delta);
    ddelta.upload(delta);
    k0 = 0;
    for (std::size_t cols : {std::size_t(4), std::size_t(300)}) {
      const SoftmaxBlock b{heads, rows, cols, dim, ss, ld, query_pos - std::ptrdiff_t(k0)};
      std::vector<float> p = scores(heads * rows * cols, 20 + k0), dp = scores(heads * rows * cols, 30 + k0);
      DeviceArray<float> dpp(p), ddp(dp);
      host_reference(ops::online_softmax_backward{
          .block = b, .lse = m.data(), .delta = delta.data(), .p = p.data(), .dp = dp.data()});
      gpu::launch(ops::online_softmax_backward{
          .block = b, .lse = dlse.get(), .delta = ddelta.get(), .p = dpp.get(), .dp = ddp.get()});
      require_same(dpp.host(), p);
      require_same(ddp.host(), dp);
      k0 += cols;
    }
  }
}

TEST_CASE("cuda kernels on the emulation: fill, zero and init_values equal the host") {
  for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(257), std::size_t(3 * 256 + 5)}) {
    INFO("n = " << n);
    DeviceArray<double> d(n);
    gpu::fill(n, 2.5, d.get());
    REQUIRE(d.host() == std::vector<double>(n, 2.5));
    gpu::zero(n, d.get());
    REQUIRE(d.host() == std::vector<double>(n, 0.0));
  }
  // A [20, 259] block at (5, 17) of a [37, 300] parameter: rows of the block are not rows of the parameter.
  for (const InitSpec& spec : {InitSpec::normal(0.02), InitSpec::uniform(0.1), InitSpec::constant(1.5)}) {
    InitBlock block{.seed = 7, .param_id = 3, .spec = spec, .rank = 2};
    block.global[0] = 37, block.global[1] = 300;
    block.offset[0] = 5, block.offset[1] = 17;
    block.extent[0] = 20, block.extent[1] = 259;
    const std::size_t n = block.size();
    DeviceArray<float> d(n);
    std::vector<float> want(n);
    gpu::init_values(block, d.get());
    host::init_values(block, want.data());
    require_close(d.host(), want, 0, 0);  // the same function, operation for operation
  }
}

}  // namespace mpar::online_softmax_emulation_test
