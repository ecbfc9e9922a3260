// The online-softmax operations on CudaBackend (gpu/online_softmax.hpp) against their host reference
// (backend/ops/online_softmax.hpp, itself checked against softmax over the concatenated blocks in tests/nn): the same
// inputs through both, two blocks in a row (the second rescales what the first left), odd sizes, a causal
// diagonal, rows that see no key, padded strides. Float rounding apart (the device reduces in another order):
// norm-relative 1e-5. Skipped without a GPU.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "../nn/nn_test_support.hpp"
#include "cuda_test_support.hpp"
#include "mpar/backend/ops/online_softmax.hpp"
#include "mpar/cuda.hpp"

using namespace mpar;
using namespace mpar::cuda_testing;
using mpar::testing::rel_err;

namespace {

std::vector<float> osm_values(std::size_t n, std::uint64_t stream) {
  return uniform_values<float>(n, CounterRng{91, stream}, 3.0);
}

/** The log-sum-exps compared where finite; -inf (a row that saw no key) must be -inf on both. */
void check_same_lse(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  std::vector<float> g, w;
  for (std::size_t e = 0; e < want.size(); ++e) {
    if (std::isinf(want[e])) {
      CHECK(got[e] == want[e]);
      continue;
    }
    g.push_back(got[e]), w.push_back(want[e]);
  }
  CHECK(rel_err(g, w) <= 1e-5);
}

}  // namespace

TEST_CASE("online softmax on CudaBackend equals the host reference", "[cuda][online_softmax]") {
  CudaBackend::init_rank(0);
  static_assert(mpar::detail::online_softmax_backend<CudaBackend>);
  // 3 heads, 5 query rows at positions 6..10 (padded: statistics 8 apart, output rows 3 x 3 + 2 wide); key blocks
  // at positions 0..3 (all visible) and 4..10 (the causal diagonal); then rows at -2..2, of which two see nothing.
  const std::size_t heads = 3, rows = 5, dim = 3, ss = rows + 3, ld = heads * dim + 2;
  for (std::ptrdiff_t query_pos : {std::ptrdiff_t(6), std::ptrdiff_t(-2)}) {
    INFO("queries from position " << query_pos);
    std::vector<float> m(heads * ss, -std::numeric_limits<float>::infinity()), l(heads * ss, 0.0f),
        out = osm_values(rows * ld, 1);
    auto dm = upload(m), dl = upload(l), dout_acc = upload(out);
    std::size_t k0 = 0;
    for (std::size_t cols : {std::size_t(4), std::size_t(7)}) {
      const SoftmaxBlock b{heads, rows, cols, dim, ss, ld, query_pos - std::ptrdiff_t(k0)};
      std::vector<float> sc = osm_values(heads * rows * cols, 10 + k0);
      auto dsc = upload(sc);
      host_reference(ops::online_softmax_update{
          .block = b, .scores = sc.data(), .row_max = m.data(), .row_sum = l.data(), .out = out.data()});
      CudaBackend::run(ops::online_softmax_update{
          .block = b, .scores = dsc.data(), .row_max = dm.data(), .row_sum = dl.data(), .out = dout_acc.data()});
      CHECK(rel_err(download(dsc), sc) <= 1e-5);
      CHECK(rel_err(download(dl), l) <= 1e-5);
      CHECK(rel_err(download(dout_acc), out) <= 1e-5);
      check_same_lse(download(dm), m);
      k0 += cols;
    }
    host_reference(ops::online_softmax_finish{heads, rows, dim, ss, ld, m.data(), l.data(), out.data()});
    CudaBackend::run(ops::online_softmax_finish{heads, rows, dim, ss, ld, dm.data(), dl.data(), dout_acc.data()});
    CHECK(rel_err(download(dout_acc), out) <= 1e-5);
    check_same_lse(download(dm), m);

    // The backward over the host's forward results, so each operation is compared on equal inputs.
    const std::vector<float> go = osm_values(rows * ld, 2);
    std::vector<float> delta(heads * ss, 0.0f);
    auto dgo = upload(go), dres = upload(out), ddelta = upload(delta), dlse = upload(m);
    host_reference(ops::online_softmax_delta{heads, rows, dim, ss, ld, go.data(), out.data(), delta.data()});
    CudaBackend::run(ops::online_softmax_delta{heads, rows, dim, ss, ld, dgo.data(), dres.data(), ddelta.data()});
    CHECK(rel_err(download(ddelta), delta) <= 1e-5);
    ddelta = upload(delta);
    k0 = 0;
    for (std::size_t cols : {std::size_t(4), std::size_t(7)}) {
      const SoftmaxBlock b{heads, rows, cols, dim, ss, ld, query_pos - std::ptrdiff_t(k0)};
      std::vector<float> p = osm_values(heads * rows * cols, 20 + k0), dp = osm_values(heads * rows * cols, 30 + k0);
      auto dpp = upload(p), ddp = upload(dp);
      host_reference(ops::online_softmax_backward{
          .block = b, .lse = m.data(), .delta = delta.data(), .p = p.data(), .dp = dp.data()});
      CudaBackend::run(ops::online_softmax_backward{
          .block = b, .lse = dlse.data(), .delta = ddelta.data(), .p = dpp.data(), .dp = ddp.data()});
      CHECK(rel_err(download(dpp), p) <= 1e-5);
      CHECK(rel_err(download(ddp), dp) <= 1e-5);
      k0 += cols;
    }
  }
}
