// mpar's CUDA kernels (backend/gpu/kernels.hpp, row_kernels.hpp) run on the emulated runtime against the host
// reference (backend/host/), over shapes that are not multiples of the block, span several blocks, or are empty.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "device_array.hpp"
#include "mpar/backend/gpu/kernels.hpp"
#include "mpar/backend/gpu/row_kernels.hpp"
#include "mpar/backend/host/kernels.hpp"
#include "mpar/backend/host/optimizer_kernels.hpp"
#include "mpar/backend/host/row_kernels.hpp"
#include "mpar/core/init.hpp"

namespace mpar::kernels_emulation_test {

using emulation_test::DeviceArray;
using emulation_test::require_close;

std::vector<float> values(std::size_t n, std::uint64_t seed, float lo = -2.0f, float hi = 2.0f) {
  const CounterRng rng{seed, 7};
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * float(rng.uniform(i));
  return v;
}
std::vector<std::int32_t> ids(std::size_t n, std::int32_t lo, std::int32_t hi, std::uint64_t seed) {
  const CounterRng rng{seed, 9};
  std::vector<std::int32_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = lo + std::int32_t(rng.uniform(i) * double(hi - lo));
  return v;
}

// Element counts around the block (256) and the grid-stride loop: empty, one, a partial block, several blocks.
const std::size_t lengths[] = {0, 1, 255, 256, 257, 1000, 3 * 256 + 5};
// [rows, cols] with cols below, at and over the block, and rows spanning several column-sum chunks (64).
const std::pair<std::size_t, std::size_t> shapes[] = {{0, 5}, {4, 0}, {1, 1}, {3, 257}, {7, 300}, {5, 31}, {130, 17}};

TEST_CASE("cuda kernels on the emulation: elementwise kernels equal the host") {
  for (std::size_t n : lengths) {
    INFO("n = " << n);
    const std::vector<float> x = values(n, 1), z = values(n, 2);
    DeviceArray<float> dx(x), dz(z), dy(n);
    std::vector<float> want(n);

    gpu::gelu_forward(n, dx.get(), dy.get());
    host::gelu_forward(n, x.data(), want.data());
    require_close(dy.host(), want);

    gpu::gelu_backward(n, dx.get(), dz.get(), dy.get());
    host::gelu_backward(n, x.data(), z.data(), want.data());
    require_close(dy.host(), want);

    gpu::add(n, dx.get(), dz.get(), dy.get());
    host::add(n, x.data(), z.data(), want.data());
    require_close(dy.host(), want, 0, 0);

    want = x;
    gpu::scale(n, 0.75f, dx.get());
    host::scale(n, 0.75f, want.data());
    require_close(dx.host(), want, 0, 0);

    DeviceArray<bf16> half(n);
    gpu::convert(n, dz.get(), half.get());
    const std::vector<bf16> got = half.host();
    for (std::size_t i = 0; i < n; ++i) REQUIRE(got[i] == bf16(z[i]));  // round to nearest even, as the host
  }
}

TEST_CASE("cuda kernels on the emulation: bias and column sums equal the host") {
  for (auto [rows, cols] : shapes) {
    INFO("rows = " << rows << ", cols = " << cols);
    const std::vector<float> y0 = values(rows * cols, 3), bias = values(cols, 4);
    DeviceArray<float> y(y0), b(bias), db(cols);
    std::vector<float> want = y0, want_db(cols, 0.5f);
    gpu::bias_add_forward(rows, cols, b.get(), y.get());
    host::bias_add_forward(rows, cols, bias.data(), want.data());
    require_close(y.host(), want, 0, 0);

    db.upload(std::vector<float>(cols, 0.5f));  // accumulates, as on the host
    gpu::bias_add_backward(rows, cols, y.get(), db.get());
    host::bias_add_backward(rows, cols, want.data(), want_db.data());
    require_close(db.host(), want_db);
  }
}

TEST_CASE("cuda kernels on the emulation: softmax, causal softmax and their backward equal the host") {
  for (auto [rows, cols] : shapes) {
    for (bool causal : {false, true}) {
      if (causal && cols == 0) continue;  // the host reference's causal mask divides by cols
      INFO("rows = " << rows << ", cols = " << cols << ", causal = " << causal);
      const std::vector<float> x = values(rows * cols, 5, -4, 4), dy = values(rows * cols, 6);
      DeviceArray<float> dx(x), ddy(dy), y(rows * cols), grad(rows * cols);
      std::vector<float> want(rows * cols), want_grad(rows * cols);
      gpu::softmax_forward(rows, cols, dx.get(), y.get(), causal, 0.5f);
      host::softmax_forward(rows, cols, x.data(), want.data(), causal, 0.5f);
      require_close(y.host(), want);

      gpu::softmax_backward(rows, cols, y.get(), ddy.get(), grad.get());
      host::softmax_backward(rows, cols, want.data(), dy.data(), want_grad.data());
      require_close(grad.host(), want_grad, 1e-4, 1e-6);
    }
  }
}

TEST_CASE("cuda kernels on the emulation: layer norm forward and backward equal the host") {
  for (auto [rows, cols] : shapes) {
    INFO("rows = " << rows << ", cols = " << cols);
    const std::vector<float> x = values(rows * cols, 7, -3, 5), gamma = values(cols, 8), beta = values(cols, 9),
                             dy = values(rows * cols, 10);
    DeviceArray<float> dx(x), dg(gamma), dbeta(beta), ddy(dy), y(rows * cols), mean(rows), rstd(rows),
        grad(rows * cols), dgamma(cols), ddbeta(cols);
    std::vector<float> want(rows * cols), wmean(rows), wrstd(rows), wgrad(rows * cols), wdgamma(cols, 0.0f),
        wdbeta(cols, 0.0f);
    gpu::layernorm_forward(rows, cols, dx.get(), dg.get(), dbeta.get(), y.get(), mean.get(), rstd.get());
    host::layernorm_forward(rows, cols, x.data(), gamma.data(), beta.data(), want.data(), wmean.data(), wrstd.data());
    require_close(y.host(), want, 1e-4, 1e-5);
    require_close(mean.host(), wmean, 1e-5, 1e-6);
    require_close(rstd.host(), wrstd, 1e-5);

    dgamma.zero();
    ddbeta.zero();
    gpu::layernorm_backward(rows, cols, dx.get(), mean.get(), rstd.get(), dg.get(), ddy.get(), grad.get(), dgamma.get(),
                            ddbeta.get());
    host::layernorm_backward(rows, cols, x.data(), wmean.data(), wrstd.data(), gamma.data(), dy.data(), wgrad.data(),
                             wdgamma.data(), wdbeta.data());
    require_close(grad.host(), wgrad, 1e-4, 1e-5);
    require_close(dgamma.host(), wdgamma, 1e-4, 1e-5);
    require_close(ddbeta.host(), wdbeta, 1e-4, 1e-5);
  }
}

TEST_CASE("cuda kernels on the emulation: cross-entropy and the vocabulary-parallel pieces equal the host") {
  for (auto [rows, cols] : shapes) {
    if (cols == 0) continue;  // no class to predict
    INFO("rows = " << rows << ", cols = " << cols);
    const std::vector<float> logits = values(rows * cols, 11, -6, 6);
    const std::vector<std::int32_t> targets = ids(rows, 0, std::int32_t(cols), 12);
    DeviceArray<float> dl(logits), probs(rows * cols), loss(1), grad(rows * cols);
    DeviceArray<std::int32_t> dt(targets);
    std::vector<float> wprobs(rows * cols), wgrad(rows * cols);
    gpu::cross_entropy_forward(rows, cols, dl.get(), dt.get(), probs.get(), loss.get());
    const float wloss = host::cross_entropy_forward(rows, cols, logits.data(), targets.data(), wprobs.data());
    require_close(probs.host(), wprobs);
    if (rows > 0) require_close(loss.host(), {wloss}, 1e-5, 1e-6);  // no rows: the host's mean is 0 / 0
    gpu::cross_entropy_backward(rows, cols, probs.get(), dt.get(), grad.get(), 2.0f);
    host::cross_entropy_backward(rows, cols, wprobs.data(), targets.data(), wgrad.data(), 2.0f);
    require_close(grad.host(), wgrad);

    // This rank holds the vocabulary columns [offset, offset + cols) of a larger vocabulary.
    const std::size_t offset = 3;
    const std::vector<std::int32_t> global_targets = ids(rows, 0, std::int32_t(cols + 6), 13);
    DeviceArray<std::int32_t> dgt(global_targets);
    DeviceArray<float> row_max(rows), sumexp(rows), target_logit(rows), vloss(1), vgrad(rows * cols);
    std::vector<float> wmax(rows), wsum(rows), wtarget(rows), wvgrad(rows * cols);
    gpu::vocab_parallel_max(rows, cols, dl.get(), row_max.get());
    host::vocab_parallel_max(rows, cols, logits.data(), wmax.data());
    require_close(row_max.host(), wmax, 0, 0);
    gpu::vocab_parallel_sumexp(rows, cols, offset, dl.get(), dgt.get(), row_max.get(), sumexp.get(),
                               target_logit.get());
    host::vocab_parallel_sumexp(rows, cols, offset, logits.data(), global_targets.data(), wmax.data(), wsum.data(),
                                wtarget.data());
    require_close(sumexp.host(), wsum);
    require_close(target_logit.host(), wtarget, 0, 0);
    gpu::vocab_parallel_loss(rows, row_max.get(), sumexp.get(), target_logit.get(), vloss.get());
    float want_loss = 0;
    for (std::size_t r = 0; r < rows; ++r) want_loss += (std::log(wsum[r]) + wmax[r] - wtarget[r]) / float(rows);
    require_close(vloss.host(), {want_loss}, 1e-5, 1e-6);
    gpu::vocab_parallel_backward(rows, cols, offset, dl.get(), dgt.get(), row_max.get(), sumexp.get(), vgrad.get());
    host::vocab_parallel_backward(rows, cols, offset, logits.data(), global_targets.data(), wmax.data(), wsum.data(),
                                  wvgrad.data());
    require_close(vgrad.host(), wvgrad);
  }
}

TEST_CASE("cuda kernels on the emulation: dropout and embeddings equal the host") {
  for (auto [rows, cols] : shapes) {
    INFO("rows = " << rows << ", cols = " << cols);
    const host::DropoutMask mask{
        .seed = 21, .stream = 4, .p = 0.3, .global_cols = cols + 10, .row_offset = 2, .col_offset = 5};
    const std::vector<float> x = values(rows * cols, 14);
    DeviceArray<float> dx(x), y(rows * cols);
    std::vector<float> want(rows * cols);
    gpu::dropout_apply(mask, rows, cols, dx.get(), y.get());
    host::dropout_apply(mask, rows, cols, x.data(), want.data());
    require_close(y.host(), want, 0, 0);

    // Embedding: `rows` tokens of width `cols` over this rank's vocabulary rows [4, 4 + 9), ids repeat.
    const std::size_t vocab_offset = 4, vocab_local = 9;
    const std::vector<std::int32_t> tok = ids(rows, 0, 16, 15);
    const std::vector<float> table = values(vocab_local * cols, 16), dout = values(rows * cols, 17);
    DeviceArray<std::int32_t> dtok(tok);
    DeviceArray<float> dtable(table), out(rows * cols), ddout(dout), dtable_grad(vocab_local * cols);
    std::vector<float> wout(rows * cols), wgrad(vocab_local * cols, 0.0f);
    gpu::embedding_forward(rows, cols, dtok.get(), dtable.get(), out.get(), vocab_offset, vocab_local);
    host::embedding_forward(rows, cols, tok.data(), table.data(), wout.data(), vocab_offset, vocab_local);
    require_close(out.host(), wout, 0, 0);
    dtable_grad.zero();
    gpu::embedding_backward(rows, cols, dtok.get(), ddout.get(), dtable_grad.get(), vocab_offset, vocab_local);
    host::embedding_backward(rows, cols, tok.data(), dout.data(), wgrad.data(), vocab_offset, vocab_local);
    require_close(dtable_grad.host(), wgrad);
  }
}

TEST_CASE("cuda kernels on the emulation: optimizer steps, sums of squares and update factors equal the host") {
  for (std::size_t n : lengths) {
    INFO("n = " << n);
    const std::vector<float> w0 = values(n, 18), g = values(n, 19), m0 = values(n, 20, -0.1f, 0.1f),
                             v0 = values(n, 21, 0.0f, 0.2f);
    const UpdateFactors factors{.grad_scale = 0.5f, .skip = 0.0f};
    DeviceArray<float> w(w0), dg(g), m(m0), v(v0);
    std::vector<float> ww = w0, wm = m0, wv = v0;
    gpu::adamw_update(n, w.get(), dg.get(), m.get(), v.get(), 0.9f, 0.95f, 1e-8f, 1e-2f, 0.1f, 0.19f, 0.0975f, 0.5f);
    host::adamw_update(n, ww.data(), g.data(), wm.data(), wv.data(), 0.9f, 0.95f, 1e-8f, 1e-2f, 0.1f, 0.19f, 0.0975f,
                       &factors);
    require_close(w.host(), ww, 0, 0);  // operation for operation: the same bits
    require_close(m.host(), wm, 0, 0);
    require_close(v.host(), wv, 0, 0);

    DeviceArray<float> buf(n);
    std::vector<float> wbuf(n);
    gpu::sgd_update(n, w.get(), dg.get(), buf.get(), 0.9f, 0.1f, true, 0.05f, 0.01f, true, 0.5f);
    host::sgd_update(n, ww.data(), g.data(), wbuf.data(), 0.9f, 0.1f, true, 0.05f, 0.01f, true, &factors);
    require_close(w.host(), ww, 0, 0);
    require_close(buf.host(), wbuf, 0, 0);

    DeviceArray<double> squares(1), norm(1);
    DeviceArray<UpdateFactors> dfactors(1);
    squares.upload({0.25});
    gpu::sum_squares_accumulate(n, dg.get(), squares.get());
    double want = 0.25;
    host::sum_squares(n, g.data(), &want);
    require_close(squares.host(), {want}, 1e-6);  // blocks sum in float

    double wnorm = 0;
    UpdateFactors wfactors{};
    gpu::update_factors(squares.get(), 1.0, 0.5f, true, norm.get(), dfactors.get());
    const double got_squares = squares.host()[0];
    host::update_factors(&got_squares, 1.0, 0.5f, true, &wnorm, &wfactors);
    REQUIRE(norm.host()[0] == wnorm);
    REQUIRE(dfactors.host()[0].grad_scale == wfactors.grad_scale);
    REQUIRE(dfactors.host()[0].skip == wfactors.skip);
  }
}

TEST_CASE("cuda kernels on the emulation: row gather, scatter and scatter-add equal the host") {
  for (auto [rows, d] : shapes) {
    INFO("rows = " << rows << ", d = " << d);
    const std::size_t slots = rows + 3;  // the row space the indices name; -1 marks an empty slot
    std::vector<std::int32_t> index(rows);
    for (std::size_t i = 0; i < rows; ++i) index[i] = i % 4 == 3 ? -1 : std::int32_t((i * 5) % slots);
    std::vector<std::int32_t> distinct(rows);  // scatter_rows needs distinct destinations
    for (std::size_t i = 0; i < rows; ++i) distinct[i] = i % 4 == 3 ? -1 : std::int32_t(slots - 1 - i);
    const std::vector<float> table = values(slots * d, 22), src = values(rows * d, 23), weight = values(rows, 24),
                             dy = values(slots * d, 25);
    DeviceArray<std::int32_t> di(index), dd(distinct);
    DeviceArray<float> dtable(table), dsrc(src), dw(weight), ddy(dy), out(rows * d), big(slots * d),
        dsrc_grad(rows * d), dot(rows);
    std::vector<float> want(rows * d), wbig(slots * d, 0.0f), wgrad(rows * d), wdot(rows);

    gpu::gather_rows(rows, d, di.get(), dtable.get(), out.get());
    host::gather_rows(rows, d, index.data(), table.data(), want.data());
    require_close(out.host(), want, 0, 0);

    big.zero();
    gpu::scatter_rows(rows, d, dd.get(), dsrc.get(), big.get());
    host::scatter_rows(rows, d, distinct.data(), src.data(), wbig.data());
    require_close(big.host(), wbig, 0, 0);

    big.zero();
    std::fill(wbig.begin(), wbig.end(), 0.0f);
    gpu::scatter_add_rows(rows, d, di.get(), dw.get(), dsrc.get(), big.get());
    host::scatter_add_rows(rows, d, index.data(), weight.data(), src.data(), wbig.data());
    require_close(big.host(), wbig);

    gpu::scatter_add_rows_backward(rows, d, di.get(), dw.get(), ddy.get(), dsrc.get(), dsrc_grad.get(), dot.get());
    host::scatter_add_rows_backward(rows, d, index.data(), weight.data(), dy.data(), src.data(), wgrad.data(),
                                    wdot.data());
    require_close(dsrc_grad.host(), wgrad, 0, 0);
    require_close(dot.host(), wdot, 1e-5, 1e-5);
  }
}

}  // namespace mpar::kernels_emulation_test
