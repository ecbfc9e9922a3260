// Uses mpar through the umbrella header: a sharded initialisation checked against the full tensor,
// the threads communicator's collectives, point-to-point and asynchronous calls on two ranks, and a GPT-2 and a
// Llama block forward and backward (the blocks a user composes, their templates instantiated here).
// It is compiled with -Wall -Wextra -Wpedantic -Werror: a warning in an mpar header fails the build.
#include <cstdio>
#include <mpar/mpar.hpp>
#include <mpar/tools.hpp>
#include <span>
#include <vector>

namespace {

/** Two ranks: every kind of call a training step makes; returns whether all results are right. */
bool threads_ok() {
  using namespace mpar;
  bool ok[2] = {false, false};
  run_threads(2, [&](ThreadsCommunicator& comm) {
    const int r = comm.rank();
    std::vector<float> v{float(r + 1), float(10 * (r + 1))};
    comm.all_reduce(std::span<float>(v), ReduceOp::sum);  // {3, 30}
    std::vector<float> got(1, -1.0f);
    const std::vector<float> mine{float(100 + r)};
    auto rq = comm.irecv(std::span<float>(got), 1 - r, 5);
    comm.send(std::span<const float>(mine), 1 - r, 5);
    rq.wait();
    std::vector<double> half(1), all{double(r), double(r)};
    comm.reduce_scatter(std::span<const double>(all), std::span<double>(half), ReduceOp::max);  // {1}
    std::vector<float> a(2, float(r));
    auto ar = comm.iall_reduce(std::span<float>(a), ReduceOp::max);
    ar.wait();
    auto sub = comm.split(0, -r, "pair");
    comm.barrier();
    ok[r] = v[0] == 3.0f && v[1] == 30.0f && got[0] == float(101 - r) && half[0] == 1.0 && a[0] == 1.0f &&
            sub.size() == 2 && sub.rank() == 1 - r;
  });
  return ok[0] && ok[1];
}

/** A GPT-2 block after a Llama block on one rank, forward and backward; returns whether the shapes are right. */
bool blocks_ok() {
  using namespace mpar;
  bool ok = false;
  run_threads(1, [&](ThreadsCommunicator& tp) {
    nn::LlamaBlock<ThreadsCommunicator> llama(
        tp, nn::LlamaBlockConfig{.hidden = 8, .heads = 2, .kv_heads = 1, .ffn = 16, .seq = 4, .name = "llama"});
    nn::TransformerBlock<ThreadsCommunicator> gpt(tp, nn::BlockConfig{.hidden = 8, .heads = 2, .ffn = 16, .seq = 4});
    nn::Activation x({8, 8});
    for (std::size_t i = 0; i < 8; ++i) x(i, i) = 1.0f;
    const nn::Act<Replicate> y = gpt.forward(llama.forward(nn::Act<Replicate>(x), 0), 0);
    const nn::Act<Replicate> dx = llama.backward(gpt.backward(y, 0), 0);
    ok = y.tensor().extent(0) == 8 && dx.tensor().extent(1) == 8;
  });
  return ok;
}

}  // namespace

int main() {
  using namespace mpar;
  DeviceMesh<2, 1, 1> mesh;
  const std::array<std::size_t, 2> global{4, 6};
  Tensor<float, 2> full(global);
  init_full(full, 7, 1, InitSpec::normal(1.0));
  for (std::size_t r = 0; r < mesh.world_size(); ++r) {
    const auto box = Shard<1, axis::tensor>::local_box<2>(global, mesh, mesh.coord(r));
    Tensor<float, 2> local({box[0].extent, box[1].extent});
    init_shard(local.view(), global, box, 7, 1, InitSpec::normal(1.0));
    if (local(1, 2) != full(1, box[1].offset + 2)) return 1;
  }
  Tensor<float, 2> c({4, 4});
  matmul<float>(full.slice(1, 0, 4), Trans::no, full.slice(1, 2, 6), Trans::yes, c.view());
  if (!threads_ok()) return 2;
  if (!blocks_ok()) return 4;
  if (plan::parse_schedule("1f1b") != plan::ScheduleKind::one_f_one_b) return 3;
  std::printf("mpar %s consumer ok\n", MPAR_VERSION_STRING);
  return 0;
}
