// What one training step asks of the backend, per rank, counted by CountingBackend around the real
// GptTrainer on thread ranks: operations issued (checked against a hand-derived formula), host
// synchronisations, and bytes of tensor memory the host touched. Printed for every layout, so the
// numbers in docs/performance.md can be reproduced.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <mpar/backend/stream/stream_backend.hpp>
#include <mpar/comm/stream_ordered_communicator.hpp>
#include <mpar/comm/threads.hpp>
#include <mpar/models/gpt_trainer.hpp>
#include <mpar/observe/counting_backend.hpp>
#if defined(__linux__) && defined(__x86_64__)
#include <sys/wait.h>
#include <unistd.h>

#include <mpar/backend/stream/host_access_trace.hpp>
#endif

#include "gpt_test_config.hpp"

using namespace mpar;
using observe::BackendCounts;
using observe::Op;
using Counting = observe::CountingBackend<HostBackend>;

namespace {

struct RankCounts {
  MeshCoord coord;
  std::size_t held = 0;       // parameters on the rank
  std::size_t updated = 0;    // parameters the optimizer updates (the head's tied copy is copied, not updated)
  BackendCounts step, again;  // the steady-state step (the second) and the one after it
};

/** Runs three steps on thread ranks and returns every rank's counts of steps 2 and 3 (the first builds caches). */
std::vector<RankCounts> count_steps(const models::GptTrainConfig& c) {
  std::vector<RankCounts> out(c.world_size());
  run_threads(int(c.world_size()), [&](ThreadsCommunicator& world) {
    models::GptTrainer<ThreadsCommunicator, Counting> t(world, c, testing::gpt_dataset());
    (void)t.train_step();  // the first step builds caches (GEMM primitives, buffers)
    const BackendCounts a = Counting::counts();
    (void)t.train_step();
    const BackendCounts b = Counting::counts();
    (void)t.train_step();
    const BackendCounts d = Counting::counts();
    RankCounts& r = out[std::size_t(world.rank())];
    r.coord = t.coord();
    r.step = b - a;
    r.again = d - b;
    r.updated = r.held = t.parameters().size();
    for (auto* p : t.parameters())
      if (p->name == "embed.token.weight" && r.coord.pipeline != 0) --r.updated;
  });
  return out;
}

void print(const std::string& name, const std::vector<RankCounts>& rs) {
  for (std::size_t i = 0; i < rs.size(); ++i) {
    const auto& s = rs[i].step;
    std::printf("%-28s rank %zu: launches %llu (gemms %llu), host syncs %llu, host bytes %llu\n    %s\n", name.c_str(),
                i, (unsigned long long)s.total_launches(), (unsigned long long)s.gemms(),
                (unsigned long long)s.host_syncs(), (unsigned long long)s.host_bytes, s.by_kind().c_str());
  }
}

/** Checks that hold at every layout: a blocking backend synchronises once per launch, steady steps repeat exactly. */
void check_common(const std::vector<RankCounts>& rs) {
  for (const auto& r : rs) {
    CHECK(r.step.total_launches() > 0);
    CHECK(r.step.host_syncs() == r.step.total_launches() + r.step.synchronize_calls + r.step.event_waits);
    CHECK(r.step.launches == r.again.launches);
    CHECK(r.step.host_bytes == r.again.host_bytes);
  }
}

/**
 * The operations one rank issues per step, derived by hand from the layers (dense GPT, fp32 compute,
 * no dropout), with M micro-batches of nb sequences, L_r blocks and H_r = heads / tp heads on the rank:
 * - a block's forward: 4 projection GEMMs + 3 bias adds (the MLP's first projection adds its bias and applies
 *   GeLU in its GEMM operation, `gemm_bias_gelu`), 2 layer norms, 2 residual adds, one causal softmax and 2
 *   attention products, each A = 1 strided-batched GEMM (a two-level batch over sequences and heads): 12 + 2 A;
 * - its backward (B + W): 3 GEMMs + 1 bias reduction per projection, 2 layer-norm backwards, 2 residual
 *   adds, GeLU and softmax backward and 4 attention products: 18 + 4 A;
 * - the first stage: the embedding lookup and the position embedding (one bias add over the micro-batch's
 *   sequences), forward and backward: 2 + 2;
 * - the last stage: final layer norm and head GEMM forward (+ the padding mask's bias add where this rank's
 *   vocabulary columns include padding), layer norm backward, 2 head GEMMs, 4 cross-entropy kernels
 *   (row max, sums, loss, logit gradient), the loss added into the step's statistics in rank memory
 *   (`accumulate`, no host read) and the executor's 1/M scale of the logit gradient;
 * - the activations layers keep for backward while receiving them by const reference are copied by the
 *   backend (`nn::backend_copy`, one `copy` each): in a block's forward the inputs of both layer norms and, in
 *   fp32 only, of the four projections: 2 + 4 (GeLU's input is the pre-activation the fused projection wrote,
 *   kept without a copy; the two dropouts, identity at p = 0, receive their inputs as rvalues and return them
 *   moved, no copy); in its backward the two dropouts' (whose inputs the residuals still read) and, in fp32
 *   only, the output gradients of three projections: 2 + 3 (the MLP's first projection receives GeLU's input
 *   gradient, which the layer made itself, as an rvalue and keeps it without a copy; under bf16 / f16 a
 *   projection keeps only the 16-bit conversion of its input and output gradient, made from the tensor it
 *   received); a stage's input (not the first)
 *   and output gradient (not the last); the final layer norm's input, the logits kept by the loss and
 *   the logit gradient kept for the head's W on the last stage;
 * - under bf16 / f16 (`nn::Autocast`) each of a block's four projections converts its input to 16 bits in the
 *   forward (one `convert`, instead of the copy) and its output gradient in the backward (one more, instead of
 *   the copy), but not its weight: it multiplies the optimizer's 16-bit copy (`Parameter::compute_copy`); the
 *   MLP's first projection gets that 16-bit gradient from GeLU's backward, which writes it and adds the bias
 *   gradient in the same operation on the host backends (`gelu_backward_bias`: one operation where GeLU's
 *   backward, the bias reduction and the conversion were three, - 2 per block backward),
 *   and attention converts q, k, v and the probabilities in the forward and
 *   the probabilities, dO and dS in the backward, rearranges the 16-bit q, k, v into dense per-head blocks (one
 *   `copy_2d_batched` each) in the forward and dO in the backward, where it also interleaves dQ, dK, dV (written
 *   dense) into dqkv (one more): + 9 per block forward, + 9 - 2 per block backward; the tied LM
 *   head converts its input in the forward (+ 1 on the last stage) and its logit gradient in the backward
 *   (instead of the copy kept for W: + 0), and its weight, the optimizer's copy too, not at all;
 * - full recomputation reruns each stage's forward once more in its backward;
 * - the optimizer: per parameter in the global norm one `sum_squares` (ZeRO: one over its shard), one `update_factors` (the norm, the
 *   clipping and loss-scale factor and the skip flag, which the updates read from rank memory), one
 *   `adamw_update` over the rank's parameter arena (ZeRO: over its shard of every bucket, contiguous), and one `zero` over the
 *   gradient arena, which holds every gradient of the rank (parallel/gradient_arena.hpp); under bf16 / f16 per parameter the passes read (`parameters()` on one stage) the
 *   mixed-precision swap on the stream: round the master into its 16-bit copy (`convert`) and widen the copy
 *   into the weight the passes read (`convert`), the master kept aside and restored by exchanging buffers
 *   (no operation): 2, except for the four projection weights of each block, which only GEMMs read
 *   (`Parameter::gemm_operand_only`): 1.
 * (With one-level batches this was A = min(nb, H_r) calls per product. Before attention was batched this was
 * 14 + 2 nb H_r and 18 + 4 nb H_r per block, one GEMM per (sequence,
 * head) and product, and the position embedding one add per sequence: 2 (1 + nb) on the first stage.)
 */
struct Expected {
  std::uint64_t forward = 0, backward = 0, per_step = 0;
};
Expected expected_launches(const models::GptTrainConfig& c, const RankCounts& r, std::size_t vocab) {
  const std::uint64_t M = std::uint64_t(c.microbatches);
  const std::uint64_t A = 1;  // one two-level batched GEMM per attention product
  const std::size_t stages = c.pp * std::size_t(c.chunks);
  const std::uint64_t L = c.model.layers / stages;
  auto padded = c;
  padded.pad_vocab_for_mesh();
  padded.model.vocab = vocab;
  const std::size_t pv = padded.model.padded_vocab(), cols_end = (r.coord.tensor + 1) * (pv / c.tp);
  const std::uint64_t mask = cols_end > vocab ? 1 : 0;
  const std::uint64_t half = c.precision == parallel::Precision::fp32 ? 0 : 1;  // the projections' 16-bit conversions
  Expected e;
  // The rank's stages (model chunks): r, r + pp, ... of pp x chunks.
  for (std::size_t stage = r.coord.pipeline; stage < stages; stage += c.pp) {
    const bool first = stage == 0, last = stage == stages - 1;
    // fp32 keeps copies; 16-bit only the conversions. The backward copies three output gradients, not four.
    const std::uint64_t projection_copies = 4 * (1 - half), gradient_copies = 3 * (1 - half);
    e.forward +=
        L * (12 + 2 * A + 2 + projection_copies + 9 * half) + (first ? 2 : 1) + (last ? 2 + mask + 1 + half : 0);
    e.backward += L * (18 + 4 * A + 2 + gradient_copies + (9 - 2) * half) + (first ? 2 : 0) +
                  (last ? 7 + 2 + 1 + 1 : 1);  // + accumulate
  }
  e.per_step = M * (e.forward + e.backward + (c.recompute ? e.forward : 0));
  return e;
}

/** Launches of the optimizer side: norms, the step's factors, updates, gradient zeroing, and ZeRO-1's scale of
 *  its reduce-scattered shard (the average over the data group): one over the blocks of every bucket. */
std::uint64_t optimizer_launches(const models::GptTrainConfig& c, const RankCounts& r) {
  const BackendCounts& s = r.step;
  const std::uint64_t projection_weights = 4 * (c.model.layers / c.pp);  // the rank's blocks, over all its chunks
  return s[Op::sum_squares] + s[Op::update_factors] + s[Op::adamw_update] + s[Op::sgd_update] + s[Op::zero] +
         (parallel::stage_number(c.zero) > 0 ? 1 : 0) +
         (c.precision != parallel::Precision::fp32 ? 2 * r.held - projection_weights : 0);
}

void check_dense(const std::string& name, const models::GptTrainConfig& c) {
  const auto rs = count_steps(c);
  print(name, rs);
  check_common(rs);
  const std::size_t vocab = testing::gpt_dataset().vocab_size();
  for (std::size_t i = 0; i < rs.size(); ++i) {
    INFO(name << ", rank " << i);
    const auto& r = rs[i];
    const Expected e = expected_launches(c, r, vocab);
    CHECK(r.step.total_launches() - optimizer_launches(c, r) == e.per_step);
    CHECK(r.step[Op::update_factors] == 1);
    // Under bf16 / f16 every GEMM of the dense model takes 16-bit operands (the projections, the tied head):
    // none is left in fp32.
    if (c.precision != parallel::Precision::fp32) CHECK(r.step[Op::gemm] == 0);
    if (c.precision != parallel::Precision::fp32) CHECK(r.step[Op::gemm_mixed] > 0);
    CHECK(r.step[Op::gemm_bias_gelu] ==
          std::uint64_t(c.microbatches) * (c.model.layers / c.pp) * (c.recompute ? 2 : 1));
    // Values, gradients and moments in arenas (ZeRO: the rank's blocks of every bucket back to back): one update.
    CHECK(r.step[Op::adamw_update] == 1);
    // Tensor rank 0 counts the replicated parameters in the norm; the others only their own shards. Without ZeRO
    // one sum per parameter; ZeRO sums its contiguous shard at once.
    if (parallel::stage_number(c.zero) > 0 && r.coord.tensor == 0)
      CHECK(r.step[Op::sum_squares] == 1);
    else if (r.coord.tensor == 0)
      CHECK(r.step[Op::sum_squares] == r.updated);
    else
      CHECK(r.step[Op::sum_squares] < r.updated);
    // Every gradient the rank holds (the tied copy included) lies in one arena, zeroed by one operation; then
    // the norm's accumulator and the step's losses.
    CHECK(r.step[Op::zero] == 3);
    // Each micro-batch's loss is added into the statistics on the last stage (and read with them, once).
    const bool last = r.coord.pipeline + 1 == c.pp;
    CHECK(r.step[Op::accumulate] == (last ? std::uint64_t(c.microbatches) : 0));
    // The step's explicit host waits (the optimizer's zeroed accumulator and its statistics read): at most two.
    // HostBackend's operations finish before they return, so there every launch is a host synchronisation too.
    CHECK(r.step.synchronize_calls + r.step.event_waits <= 2);
    CHECK(r.step.host_syncs() == r.step.total_launches() + r.step.synchronize_calls + r.step.event_waits);
  }
}

}  // namespace

TEST_CASE("step counts: one rank, the operations per step follow the hand-derived formula", "[models][counts]") {
  check_dense("tp1 pp1 dp1", testing::small_gpt(1, 1, 1));
}

TEST_CASE("step counts: on one rank the host touches only token ids and targets", "[models][counts]") {
  // Per micro-batch of t tokens: the [t, 1] id activation (written, value-initialised, copied once by the
  // executor: read + written, read by the embedding) and its placeholder gradient, the ids and targets
  // copied into rank memory. Everything else — activations, gradients, the logit gradient (allocated
  // uninitialised, written whole by the loss), the losses and the other statistics — is written by backend
  // operations (the losses accumulated in rank memory are read once per step with the statistics).
  auto c = testing::small_gpt(1, 1, 1);
  const auto rs = count_steps(c);
  const std::uint64_t t = c.microbatch_size() * c.model.seq, f = sizeof(float);
  const std::uint64_t per_mb = t * f * (2 + 2 + 1 + 1) + t * sizeof(std::int32_t) * 2;
  CHECK(rs[0].step.host_bytes == std::uint64_t(c.microbatches) * per_mb);
}

TEST_CASE("step counts: tensor, pipeline and data parallel layouts, every schedule", "[models][counts]") {
  check_dense("tp2", testing::small_gpt(2, 1, 1));
  check_dense("tp4", testing::small_gpt(4, 1, 1));
  check_dense("pp2 1f1b", testing::small_gpt(1, 2, 1));
  check_dense("pp2 gpipe", testing::small_gpt(1, 2, 1, "gpipe"));
  check_dense("pp2 zb_h1", testing::small_gpt(1, 2, 1, "zb_h1"));
  check_dense("pp2 zb_h2", testing::small_gpt(1, 2, 1, "zb_h2"));
  auto il = testing::small_gpt(1, 2, 1, "interleaved_1f1b");
  il.chunks = 2;
  check_dense("pp2 interleaved", il);
  check_dense("dp2", testing::small_gpt(1, 1, 2));
  check_dense("tp2 pp2", testing::small_gpt(2, 2, 1));
}

TEST_CASE("step counts: recomputation, ZeRO-1, bf16 and f16", "[models][counts]") {
  auto rc = testing::small_gpt(1, 2, 1);
  rc.recompute = true;
  check_dense("pp2 recompute", rc);
  auto z = testing::small_gpt(1, 1, 2);
  z.zero = parallel::ZeroStage::optimizer_states;
  check_dense("dp2 zero1", z);
  auto b = testing::small_gpt(1, 1, 1);
  b.precision = parallel::Precision::bf16;
  check_dense("bf16", b);
  auto f = testing::small_gpt(1, 1, 1);
  f.precision = parallel::Precision::f16;
  check_dense("f16", f);
}

TEST_CASE("step counts: each block recomputes what its own mode says, the stage is not rerun whole",
          "[models][counts][recompute_blocks]") {
  // The fused GEMM + bias + GeLU runs once per block and micro-batch in the forward, and again for every block
  // that recomputes fully (selective recomputation redoes the attention core only): with blocks full, none on
  // the first stage and selective, full on the second, each rank runs three per micro-batch; the whole-stage
  // recomputation four.
  using enum nn::Recompute;
  auto c = testing::small_gpt(1, 2, 1);
  c.recompute_stages = {full, full};
  c.recompute_blocks = {{full, none}, {selective, full}};
  const auto M = std::uint64_t(c.microbatches);
  const auto mixed = count_steps(c);
  c.recompute_blocks = {{full, full}, {full, full}};  // alike: the executor reruns each stage
  const auto whole = count_steps(c);
  c.recompute_stages.clear(), c.recompute_blocks.clear();
  const auto kept = count_steps(c);
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("pipeline rank " << r);
    CHECK(kept[r].step[Op::gemm_bias_gelu] == 2 * M);
    CHECK(mixed[r].step[Op::gemm_bias_gelu] == 3 * M);
    CHECK(whole[r].step[Op::gemm_bias_gelu] == 4 * M);
  }
}

TEST_CASE("step counts: ZeRO-1, -2 and -3 update the rank's shard of every bucket with one launch per step",
          "[models][counts][zero]") {
  // 4 KiB buckets: the model's gradients fill several, and this rank's block of each holds pieces of several
  // parameters; the update, the average and the norm still run once over all the blocks.
  for (int stage : {1, 2, 3})
    for (const char* precision : {"fp32", "bf16"}) {
      auto z = testing::small_gpt(1, 1, 2);
      z.zero = parallel::zero_stage_from_number(stage);
      z.precision = parallel::parse_precision(precision);
      z.bucket_bytes = 4096;
      const std::string name = "dp2 zero" + std::to_string(stage) + " " + precision;
      const auto rs = count_steps(z);
      print(name, rs);
      check_common(rs);
      for (const auto& r : rs) {
        INFO(name);
        CHECK(r.step[Op::adamw_update] == 1);
        CHECK(r.step[Op::sum_squares] == 1);
        CHECK(r.step[Op::update_factors] == 1);
      }
    }
  auto tp = testing::small_gpt(2, 1, 2);  // tensor rank 1 sums only its shards' runs, still one update
  tp.zero = parallel::ZeroStage::parameters;
  tp.bucket_bytes = 4096;
  const auto rs = count_steps(tp);
  check_common(rs);
  for (const auto& r : rs) {
    INFO("tp2 dp2 zero3, rank " << r.coord.tensor);
    CHECK(r.step[Op::adamw_update] == 1);
    if (r.coord.tensor == 0) CHECK(r.step[Op::sum_squares] == 1);
  }
}

TEST_CASE("step counts: expert parallel MoE (printed; counts repeat from step to step)", "[models][counts]") {
  auto e = testing::small_gpt(1, 1, 1);
  e.ep = 2;
  e.model.experts = 2;
  e.model.moe_top_k = 1;
  const auto rs = count_steps(e);
  print("ep2 moe", rs);
  check_common(rs);
  // Expert ranks do the same work on different tokens, except the norm: expert rank 0 alone counts the
  // parameters replicated over the expert group (one sum_squares each), the others only their experts.
  auto without_norm = [](BackendCounts c) {
    c.launches[std::size_t(Op::sum_squares)] = 0;
    return c.launches;
  };
  CHECK(without_norm(rs[0].step) == without_norm(rs[1].step));
  CHECK(rs[0].step[Op::sum_squares] > rs[1].step[Op::sum_squares]);
  CHECK(rs[0].step[Op::gather_rows] > 0);
  // The routing is backend operations with static sizes: per MoE block and micro-batch one decision, its
  // statistics, loss and slots, one dispatch gather, the combine forward and backward and the input gradient's
  // scatter, the gate gradient; the backward adds the load-balancing loss and the dropped count to the step's
  // statistics (2 accumulates besides each micro-batch's loss). The same on every rank and every step.
  const std::uint64_t m = std::uint64_t(e.microbatches), blocks = e.model.layers;  // moe_every = 1: all blocks
  for (const auto& r : rs) {
    for (Op op : {Op::moe_route, Op::moe_gate_stats, Op::moe_aux_loss, Op::moe_slots, Op::moe_gate_backward,
                  Op::gather_rows, Op::scatter_add_rows_backward})
      CHECK(r.step[op] == m * blocks);
    CHECK(r.step[Op::scatter_add_rows] == 2 * m * blocks);
    CHECK(r.step[Op::scatter_rows] == 0);  // the experts' rows are contiguous blocks of the exchange: copies
    CHECK(r.step[Op::accumulate] == m + 2 * m * blocks);
  }
}

#if defined(__linux__) && defined(__x86_64__)
TEST_CASE("step counts: a steady MoE step at ep2 touches no rank memory from the host (HostAccessTrace)",
          "[models][counts][moe][discrete]") {
  // DiscreteHostBackend's rank memory faults on any host access; the trace records each one instead and lets
  // the run go on. In a child process: the trace installs process-wide signal handlers. Exit status 0: the
  // third step (steady: caches and staging built) recorded no access; 1: it did (printed to stderr).
  using B = DiscreteHostBackend;
  auto e = testing::small_gpt(1, 1, 1);
  e.ep = 2;
  e.model.experts = 4;
  e.model.moe_top_k = 2;  // 4 experts, two per rank, top-2 at the default capacity factor (drops)
  const pid_t pid = fork();
  if (pid == 0) {
    int code = 0;
    {
      stream::HostAccessTrace trace;
      std::size_t before = 0, after = 0;
      run_threads(2, [&](ThreadsCommunicator& w) {
        B::init_rank();
        StreamOrderedCommunicator<ThreadsCommunicator, B> world(w);
        models::GptTrainer<StreamOrderedCommunicator<ThreadsCommunicator, B>, B> t(world, e, testing::gpt_dataset());
        (void)t.train_step();
        (void)t.train_step();
        B::synchronize();
        w.barrier();  // both ranks past their second step
        if (w.rank() == 0) before = trace.accesses(false) + trace.accesses(true);
        w.barrier();
        (void)t.train_step();
        B::synchronize();
        w.barrier();
        if (w.rank() == 0) after = trace.accesses(false) + trace.accesses(true);
      });
      if (after != before) {
        trace.print(stderr);
        code = 1;
      }
    }
    _exit(code);
  }
  REQUIRE(pid > 0);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
#endif

namespace {
/** Host memory whose fresh allocations are all-ones bytes (a NaN in every float): storage the layers
 *  allocate uninitialised and a kernel does not overwrite whole shows up as a NaN loss. */
class NanFilledMemory final : public MemoryResource {
 public:
  [[nodiscard]] void* allocate(std::size_t bytes) override {
    void* p = ::operator new(bytes);
    std::memset(p, 0xff, bytes);
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept override { ::operator delete(p); }
  [[nodiscard]] const char* name() const noexcept override { return "nan-filled host"; }
};

std::vector<double> losses(const models::GptTrainConfig& c, bool nan_filled) {
  std::vector<double> out;
  std::mutex m;
  run_threads(int(c.world_size()), [&](ThreadsCommunicator& world) {
    NanFilledMemory nan_memory;
    std::optional<ScopedMemoryResource> use;
    if (nan_filled) use.emplace(nan_memory);
    {
      models::GptTrainer<ThreadsCommunicator> t(world, c, testing::gpt_dataset());
      for (int s = 0; s < 3; ++s) {
        const double l = t.train_step().loss;
        if (world.rank() == 0) {
          std::lock_guard<std::mutex> lock(m);
          out.push_back(l);
        }
      }
    }
  });
  return out;
}
}  // namespace

TEST_CASE("uninitialised layer storage: training on memory pre-filled with NaN gives the same losses",
          "[models][counts]") {
  auto rc = testing::small_gpt(1, 2, 1);
  rc.recompute = true;
  auto il = testing::small_gpt(1, 2, 1, "interleaved_1f1b");
  il.chunks = 2;
  for (const auto& c :
       {testing::small_gpt(1, 1, 1), testing::small_gpt(2, 1, 1), testing::small_gpt(1, 1, 2), rc, il}) {
    INFO("tp " << c.tp << " pp " << c.pp << " dp " << c.dp << " " << pipeline::schedule_name(c.schedule));
    const auto clean = losses(c, false), nan = losses(c, true);
    REQUIRE(clean.size() == 3);
    CHECK(std::isfinite(clean.back()));
    CHECK(nan == clean);
  }
}
