// The Llama-class layers' CUDA kernels (backend/gpu/llama_kernels.hpp), launched by operation object as CudaBackend
// runs them, on the emulated runtime against the operations' host references (backend/ops/): RMSNorm forward and backward (the gain gradient accumulating), the
// rotary embedding forward and backward at large positions and in place, the SwiGLU gate forward and backward in
// place; shapes around the block, over several column-sum chunks, and empty.
#include <catch2/catch.hpp>

#include <cstdint>
#include <utility>
#include <vector>

#include "device_array.hpp"
#include "mpar/backend/gpu/llama_kernels.hpp"
#include "mpar/backend/ops/rmsnorm.hpp"
#include "mpar/backend/ops/rope.hpp"
#include "mpar/backend/ops/silu_gate.hpp"
#include "mpar/core/init.hpp"

namespace mpar::llama_kernels_emulation_test {

using emulation_test::DeviceArray;
using emulation_test::require_close;

std::vector<float> uniform_values(std::size_t n, std::uint64_t seed, float lo = -2.0f, float hi = 2.0f) {
  const CounterRng rng{seed, 7};
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * float(rng.uniform(i));
  return v;
}

// [rows, cols]: empty either way, one element, cols over the block (256), rows over the gain chunks (64).
const std::pair<std::size_t, std::size_t> llama_shapes[] = {{0, 5}, {4, 0}, {1, 1}, {3, 257}, {7, 300}, {130, 17}};

TEST_CASE("cuda kernels on the emulation: RMSNorm forward and backward equal the host") {
  for (auto [rows, cols] : llama_shapes) {
    INFO("rows = " << rows << ", cols = " << cols);
    const std::vector<float> x = uniform_values(rows * cols, 31), gain = uniform_values(cols, 32, 0.5f, 1.5f),
                             dy = uniform_values(rows * cols, 33), dgain0 = uniform_values(cols, 34);
    DeviceArray<float> dx_in(x), dgain_w(gain), y(rows * cols), rstd(rows), ddy(dy), grad(rows * cols), dgain(dgain0);
    std::vector<float> want(rows * cols), wrstd(rows), wgrad(rows * cols), wdgain = dgain0;
    gpu::launch(ops::rmsnorm_forward{rows, cols, 1e-6f, dx_in.get(), dgain_w.get(), y.get(), rstd.get()}, nullptr);
    ops::host_reference(ops::rmsnorm_forward{rows, cols, 1e-6f, x.data(), gain.data(), want.data(), wrstd.data()});
    require_close(y.host(), want, 1e-5, 1e-6);
    require_close(rstd.host(), wrstd, 1e-5);
    // The gain gradient adds to what is there, as every parameter gradient does.
    gpu::launch(
        ops::rmsnorm_backward{rows, cols, dx_in.get(), rstd.get(), dgain_w.get(), ddy.get(), grad.get(), dgain.get()},
        nullptr);
    ops::host_reference(
        ops::rmsnorm_backward{rows, cols, x.data(), wrstd.data(), gain.data(), dy.data(), wgrad.data(), wdgain.data()});
    require_close(grad.host(), wgrad, 1e-4, 1e-5);
    require_close(dgain.host(), wdgain, 1e-4, 1e-5);
    // In place (dx = dy): the gain's sums read dy before the input gradient overwrites it.
    dgain.upload(dgain0);
    gpu::launch(
        ops::rmsnorm_backward{rows, cols, dx_in.get(), rstd.get(), dgain_w.get(), ddy.get(), ddy.get(), dgain.get()},
        nullptr);
    require_close(ddy.host(), wgrad, 1e-4, 1e-5);
    require_close(dgain.host(), wdgain, 1e-4, 1e-5);
  }
}

TEST_CASE("cuda kernels on the emulation: the rotary embedding and its transpose equal the host, also in place") {
  // rows x heads x head_dim inside rows of ld columns (a QKV row: q and k heads rotated, the rest untouched).
  struct Shape {
    std::size_t rows, heads, head_dim, ld;
  };
  for (const Shape z : {Shape{0, 2, 4, 8}, Shape{1, 1, 2, 2}, Shape{5, 3, 8, 40}, Shape{33, 8, 16, 3 * 128}}) {
    for (const double theta : {1e4, 5e5}) {
      INFO("rows " << z.rows << ", heads " << z.heads << ", head_dim " << z.head_dim << ", theta " << theta);
      const std::vector<float> x = uniform_values(z.rows * z.ld, 41);
      std::vector<std::int32_t> pos(z.rows);
      for (std::size_t r = 0; r < z.rows; ++r) pos[r] = std::int32_t(r * 977 % 131072);  // up to 128K positions
      DeviceArray<float> dx_in(x), y(x);  // y starts as x: the columns outside the heads keep their values
      DeviceArray<std::int32_t> dpos(pos);
      std::vector<float> want = x, back = x;
      gpu::launch(ops::rope_forward{z.rows, z.heads, z.head_dim, z.ld, dpos.get(), theta, dx_in.get(), y.get()},
                  nullptr);
      ops::host_reference(
          ops::rope_forward{z.rows, z.heads, z.head_dim, z.ld, pos.data(), theta, x.data(), want.data()});
      require_close(y.host(), want, 1e-5, 1e-5);
      gpu::launch(ops::rope_backward{z.rows, z.heads, z.head_dim, z.ld, dpos.get(), theta, y.get(), y.get()},
                  nullptr);  // in place
      ops::host_reference(
          ops::rope_backward{z.rows, z.heads, z.head_dim, z.ld, pos.data(), theta, want.data(), back.data()});
      require_close(y.host(), back, 1e-5, 1e-5);
      require_close(y.host(), x, 1e-5, 1e-5);  // the transpose undoes the rotation
    }
  }
}

TEST_CASE("cuda kernels on the emulation: the SwiGLU gate forward and backward equal the host, also in place") {
  for (auto [rows, cols] : llama_shapes) {
    INFO("rows = " << rows << ", cols = " << cols);
    const std::vector<float> gate_up = uniform_values(rows * 2 * cols, 51, -6.0f, 6.0f),
                             dy = uniform_values(rows * cols, 52);
    DeviceArray<float> dgu(gate_up), y(rows * cols), ddy(dy), grad(rows * 2 * cols);
    std::vector<float> want(rows * cols), wgrad(rows * 2 * cols);
    gpu::launch(ops::silu_gate_forward{rows, cols, dgu.get(), y.get()}, nullptr);
    ops::host_reference(ops::silu_gate_forward{rows, cols, gate_up.data(), want.data()});
    require_close(y.host(), want, 1e-5, 1e-6);
    gpu::launch(ops::silu_gate_backward{rows, cols, dgu.get(), ddy.get(), grad.get()}, nullptr);
    ops::host_reference(ops::silu_gate_backward{rows, cols, gate_up.data(), dy.data(), wgrad.data()});
    require_close(grad.host(), wgrad, 1e-5, 1e-6);
    gpu::launch(ops::silu_gate_backward{rows, cols, dgu.get(), ddy.get(), dgu.get()}, nullptr);  // dgate_up = gate_up
    require_close(dgu.host(), wgrad, 1e-5, 1e-6);
  }
}

}  // namespace mpar::llama_kernels_emulation_test
