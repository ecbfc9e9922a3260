// Memory model against hand-computed values from reference/numbers.md, and against the bytes the
// library's own parameter and optimizer containers hold for fp32 host training.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "mpar/nn/parameter.hpp"
#include "mpar/optim/adamw.hpp"
#include "mpar/plan.hpp"

using namespace mpar::plan;

namespace {
const GptModel gpt7b{36, 4096, 32, 2048, 51200};
ParallelConfig cfg(std::size_t tp, std::size_t pp, std::size_t dp) {
  ParallelConfig c;
  c.tp = tp, c.pp = pp, c.dp = dp;
  return c;
}
}  // namespace

TEST_CASE("GPT parameter count follows Narayanan et al.'s formula", "[plan][memory]") {
  const double l = 36, h = 4096, V = 51200, s = 2048;
  const double published = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h));
  CHECK(gpt7b.parameters() == Approx(published + 2 * h));       // + the final layer norm the formula leaves out
  CHECK(gpt7b.parameters() / 1e9 == Approx(7.5).margin(0.05));  // the 7.5 B row of Table 1
  // With full recomputation the hardware FLOPs are the paper's 96 B s l h^2 (1 + s/6h + V/(16 l h)).
  const double B = 512;
  CHECK(iteration_flops(gpt7b, B, Recompute::full) ==
        Approx(96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))));
  CHECK(iteration_flops(gpt7b, B, Recompute::none) == Approx(gpt7b.model_flops(B)));
}

TEST_CASE(
    "mixed-precision Adam keeps 16 bytes per parameter; ZeRO-1 keeps 4 + 12/N_d, ZeRO-2 2 + 14/N_d, ZeRO-3 14/N_d",
    "[plan][memory]") {
  CHECK(Precision::mixed_adam().model_state_bytes() == 16);
  const double psi = gpt7b.parameters();
  ParallelConfig c = cfg(1, 1, 8);
  // Rajbhandari et al.'s counts assume the gradients are reduced in place (Megatron-LM's semantics); mpar's own
  // buffers are added by hand below.
  const MemoryOptions in_place = MemoryOptions::megatron();
  const MemoryEstimate plain = rank_memory(gpt7b, c, Precision::mixed_adam(), 0, 1, in_place);
  CHECK(plain.parameters + plain.gradients + plain.optimizer == Approx(16 * psi));
  c.zero = ZeroStage::optimizer_states;
  const MemoryEstimate z = rank_memory(gpt7b, c, Precision::mixed_adam(), 0, 1, in_place);
  CHECK(z.parameters + z.gradients + z.optimizer == Approx(4 * psi + 12 * psi / 8));
  // mpar's ZeRO-1 keeps its shard of the 2-byte gradients between steps, next to the full ones.
  const MemoryEstimate zm = rank_memory(gpt7b, c, Precision::mixed_adam(), 0, 1);
  CHECK(zm.gradients - z.gradients == Approx(2 * psi / 8));
  CHECK(zm.accumulated_gradients == 0);
  // ZeRO-2 shards the 2-byte gradients too: 2 (16-bit weights) + 14 / N_d.
  c.zero = ZeroStage::gradients;
  const MemoryEstimate z2 = rank_memory(gpt7b, c, Precision::mixed_adam(), 0, 1, in_place);
  CHECK(z2.accumulated_gradients == 0);
  // mpar's backward accumulates the micro-batches into full-size 2-byte gradients during the step, above the
  // state between steps: at the peak as much gradient memory as mpar's ZeRO-1 (full gradients and a shard),
  // plus ZeRO-2's two flat buckets in flight.
  const MemoryEstimate z2m = rank_memory(gpt7b, c, Precision::mixed_adam(), 0, 1);
  CHECK(z2m.gradients == Approx(z2.gradients));
  CHECK(z2m.accumulated_gradients == Approx(2 * psi));
  CHECK(z2m.total() - z2.total() == Approx(2 * psi));
  CHECK(z2m.gradients + z2m.accumulated_gradients == Approx(zm.gradients));
  CHECK(z2m.total() - zm.total() == Approx(2 * std::min(MemoryOptions{}.dp_bucket_bytes, 2 * psi)));
  CHECK(z2.gradients == Approx(2 * psi / 8));
  CHECK(z2.parameters == Approx(z.parameters));
  CHECK(z2.optimizer == Approx(z.optimizer));
  CHECK(z2.parameters + z2.gradients + z2.optimizer == Approx(2 * psi + 14 * psi / 8));
  // ZeRO-3 keeps 1/N_d of the weights too, in the precision the optimizer updates: the 4-byte master only (the
  // 2-byte values are rounded from it as they are gathered), so (4 + 2 + 8) / N_d; plus two gathered units (a
  // layer and the prefetched next one, here the embedding on the first rank) of 2-byte weights, counted with
  // the communication buffers.
  c.zero = ZeroStage::parameters;
  const MemoryEstimate z3 = rank_memory(gpt7b, c, Precision::mixed_adam(), 0, 1, in_place);
  CHECK(z3.parameters == Approx(4 * psi / 8));
  CHECK(z3.parameters + z3.gradients + z3.optimizer == Approx(14 * psi / 8));
  const double hh = 4096, layer = 12 * hh * hh + 13 * hh;
  CHECK(z3.communication - z2.communication == Approx(2 * (std::max(layer, 51200 * hh + 2048 * hh) + layer)));
  // Tensor and pipeline splits divide the layers' weights, not the replicated norms and biases.
  const ParallelConfig t4 = cfg(4, 1, 1);
  const double h = 4096;
  CHECK(rank_parameters(gpt7b, t4, 0) ==
        Approx(36 * ((12 * h * h + 7 * h) / 4 + 6 * h) + 51200 * h / 4 + 2048 * h + 2 * h));
  const ParallelConfig p4 = cfg(1, 4, 1);
  CHECK(rank_parameters(gpt7b, p4, 1) == Approx(9 * (12 * h * h + 13 * h)));
  CHECK(rank_parameters(gpt7b, p4, 3) == Approx(9 * (12 * h * h + 13 * h) + 51200 * h + 2 * h));  // tied output copy
}

TEST_CASE("PipeDream-2BW keeps a second copy of the weights the optimizer updates", "[plan][memory][2bw]") {
  // By hand: mixed-precision Adam holds 16 bytes per parameter; 2BW adds the previous version, an fp32 copy and
  // its bf16 compute copy (4 + 2 bytes), so 22 per parameter, and under ZeRO-1 over 8 ranks 4 + 12/8 + 6 (the old
  // version stays whole).
  // fp32 host training: 16 bytes plus a 4-byte copy. Activations do not depend on the version count.
  const ParallelConfig base = cfg(1, 4, 8);
  ParallelConfig bw = base;
  bw.schedule = ScheduleKind::two_bw;
  const double psi1 = rank_parameters(gpt7b, base, 1);
  const MemoryEstimate one = rank_memory(gpt7b, base, Precision::mixed_adam(), 1, 4);
  const MemoryEstimate two = rank_memory(gpt7b, bw, Precision::mixed_adam(), 1, 4);
  CHECK(two.parameters + two.gradients + two.optimizer == Approx(22 * psi1));
  CHECK(two.parameters - one.parameters == Approx(6 * psi1));
  CHECK(two.activations == Approx(one.activations));
  bw.zero = ZeroStage::optimizer_states;
  const MemoryEstimate z = rank_memory(gpt7b, bw, Precision::mixed_adam(), 1, 4, MemoryOptions::megatron());
  CHECK(z.parameters + z.gradients + z.optimizer == Approx(4 * psi1 + 12 * psi1 / 8 + 6 * psi1));
  bw.zero = ZeroStage::none;
  const MemoryEstimate host = rank_memory(gpt7b, bw, Precision::fp32_host(8), 1, 4);
  CHECK(host.parameters + host.gradients + host.optimizer == Approx((16 + 4) * psi1));
}

TEST_CASE("activations per layer match Korthikanti et al.", "[plan][memory]") {
  const GptModel m{24, 4096, 32, 2048, 51200};
  const double s = 2048, b = 2, h = 4096, a = 32, t = 8, sbh = s * b * h;
  const Precision p = Precision::mixed_adam();
  CHECK(layer_activation_bytes(m, 2, 1, false, Recompute::none, p) == Approx(sbh * (34 + 5 * a * s / h)));
  CHECK(layer_activation_bytes(m, 2, 8, false, Recompute::none, p) ==
        Approx(sbh * (10 + 24 / t + 5 * a * s / (h * t))));
  CHECK(layer_activation_bytes(m, 2, 8, true, Recompute::none, p) == Approx(sbh / t * (34 + 5 * a * s / h)));
  CHECK(layer_activation_bytes(m, 2, 8, true, Recompute::selective, p) == Approx(34 * sbh / t));
  CHECK(layer_activation_bytes(m, 2, 8, false, Recompute::selective, p) == Approx(sbh * (10 + 24 / t)));
  CHECK(layer_activation_bytes(m, 2, 8, false, Recompute::full, p) == Approx(2 * sbh));
  // fp32 activations: every stored element doubles; the host's dropout stores no mask.
  CHECK(layer_activation_bytes(m, 2, 1, false, Recompute::none, Precision::fp32_host()) ==
        Approx(sbh * 64 + a * s * s * b * 8));
  CHECK(layer_activation_bytes(m, 2, 1, false, Recompute::none, Precision::fp32_host(8, 1)) ==
        Approx(sbh * (64 + 2) + a * s * s * b * (8 + 1)));
}

TEST_CASE("activation memory is the verifier's peak in-flight count times a chunk's layers", "[plan][memory]") {
  ParallelConfig c = cfg(2, 4, 1);
  c.microbatches = 16;
  c.recompute = Recompute::selective;
  ActivationPeaks peaks;
  const std::vector<double>& pk = peaks(c);  // 1F1B: rank r holds P - r micro-batches at its peak
  REQUIRE(pk.size() == 4);
  CHECK(pk[0] == 4);
  CHECK(pk[3] == 1);
  const double per_layer = layer_activation_bytes(gpt7b, 1, 2, false, Recompute::selective, Precision::mixed_adam());
  const MemoryEstimate r1 = rank_memory(gpt7b, c, Precision::mixed_adam(), 1, pk[1]);
  const MemoryEstimate r1_more = rank_memory(gpt7b, c, Precision::mixed_adam(), 1, pk[1] + 1);
  CHECK(r1_more.activations - r1.activations == Approx(9 * per_layer));
  // Zero-bubble schedules keep a set until its weight-gradient pass, not just its input gradient.
  ParallelConfig zb = c;
  zb.schedule = ScheduleKind::zb_h1;
  for (std::size_t r = 0; r < 4; ++r) CHECK(peaks(zb)[r] >= pk[r]);
  zb.schedule = ScheduleKind::zb_h2;
  CHECK(peaks(zb)[0] > pk[0]);       // ZB-H2 holds up to 2P - 1
  c.schedule = ScheduleKind::gpipe;  // GPipe holds all M
  CHECK(peaks(c)[0] == 16);
  const MemoryEstimate worst = peak_memory(gpt7b, c, Precision::mixed_adam(), peaks(c));
  CHECK(worst.pipeline_rank == 0);
  // Interleaving counts (micro-batch, chunk) pairs of layers / (P V) layers each.
  c.schedule = ScheduleKind::interleaved;
  c.virtual_stages = 3;
  CHECK(layers_per_chunk(gpt7b, c) == 3);
  CHECK(peaks(c)[0] > 4);
}

TEST_CASE("fp32 host model states equal the bytes nn::Parameter and AdamW hold", "[plan][memory][host]") {
  // One GPT layer built as Megatron shards it over tp, out of the library's Parameter type, with the
  // library's AdamW owning its states; the estimate must match the bytes actually held within 10 %.
  const GptModel m{2, 64, 4, 16, 96};
  for (std::size_t tp : {1u, 2u, 4u}) {
    const std::size_t h = m.hidden;
    std::vector<mpar::nn::Parameter> ps;
    auto add = [&](std::vector<std::size_t> shape, std::size_t sharded_dim, bool sharded, std::size_t rank) {
      mpar::nn::Parameter p;
      p.name = "p" + std::to_string(ps.size());
      p.id = ps.size();
      p.global_shape = shape;
      for (std::size_t d = 0; d < shape.size(); ++d) {
        const bool split = sharded && d == sharded_dim;
        p.local_box.push_back({split ? rank * (shape[d] / tp) : 0, split ? shape[d] / tp : shape[d]});
      }
      p.sharded_over_tensor = sharded;
      p.initialise(7, {});
      ps.push_back(std::move(p));
    };
    for (std::size_t layer = 0; layer < m.layers; ++layer) {
      add({h}, 0, false, 0), add({h}, 0, false, 0);           // ln1
      add({3 * h, h}, 0, true, 0), add({3 * h}, 0, true, 0);  // qkv (column parallel)
      add({h, h}, 1, true, 0), add({h}, 0, false, 0);         // projection (row parallel), bias replicated
      add({h}, 0, false, 0), add({h}, 0, false, 0);           // ln2
      add({4 * h, h}, 0, true, 0), add({4 * h}, 0, true, 0);  // fc1
      add({h, 4 * h}, 1, true, 0), add({h}, 0, false, 0);     // fc2
    }
    add({m.vocab, h}, 0, true, 0);                 // word embedding (vocabulary parallel)
    add({m.seq, h}, 0, false, 0);                  // positions
    add({h}, 0, false, 0), add({h}, 0, false, 0);  // final norm
    std::vector<mpar::nn::Parameter*> ptrs;
    for (auto& p : ps) ptrs.push_back(&p);
    mpar::optim::AdamW opt(ptrs, {});
    double held = 0;
    for (std::size_t i = 0; i < ps.size(); ++i)
      held +=
          double(ps[i].value.size() + ps[i].grad.size() + opt.first_moment(i).size() + opt.second_moment(i).size()) *
          sizeof(float);
    ParallelConfig c = cfg(tp, 1, 1);
    const MemoryEstimate e = estimate_memory(m, c, Precision::fp32_host(8));
    const double states = e.parameters + e.gradients + e.optimizer;
    INFO("tp = " << tp << ": held " << held << " bytes, estimated " << states);
    CHECK(std::abs(states / held - 1) < 0.10);
    CHECK(states == Approx(held));  // in fact exact: the layout is the same
  }
}

TEST_CASE("context parallelism: a rank keeps 1/cp of each sequence's activations; ZeRO shards over dp x cp",
          "[plan][memory][context]") {
  const GptModel m{24, 4096, 32, 2048, 51200};
  const double s = 2048, b = 2, h = 4096, a = 32, t = 8, sbh = s * b * h;
  const Precision p = Precision::mixed_adam();
  for (double cp : {2.0, 4.0}) {
    INFO("cp " << cp);
    const double sl = s / cp, sbhl = sbh / cp;
    // Korthikanti's 10 + 24/t per token element on the rank's s/cp tokens; ring attention keeps, instead of
    // the [s, s] probabilities, a copy of its output (2/t) and the row log-sum-exp: a fp32 values per token
    // and head shard. Nothing of it is recomputed selectively.
    const double ring = sbhl * (10 + 26 / t) + 4 * a * sl * b / t;
    CHECK(layer_activation_bytes(m, 2, 8, false, Recompute::none, p, true, std::size_t(cp)) == Approx(ring));
    CHECK(layer_activation_bytes(m, 2, 8, false, Recompute::selective, p, true, std::size_t(cp)) == Approx(ring));
    CHECK(layer_activation_bytes(m, 2, 8, false, Recompute::full, p, true, std::size_t(cp)) == Approx(2 * sbhl));
  }
  // The rank's whole activation memory under selective recomputation (no score matrices either way) about halves.
  ParallelConfig one = cfg(8, 1, 4), two = cfg(8, 1, 4);
  one.recompute = two.recompute = Recompute::selective;
  two.cp = 2;
  CHECK(two.gpus() == 64);
  const MemoryEstimate e1 = rank_memory(m, one, p, 0, 1), e2 = rank_memory(m, two, p, 0, 1);
  CHECK(e2.activations / e1.activations == Approx(0.5).epsilon(0.06));
  CHECK(e2.parameters == Approx(e1.parameters));  // every context rank holds a replica
  // ZeRO-1/2 shard over the gradient-reduction group: dp x cp = 8 ranks, as dp = 8 would.
  ParallelConfig z = cfg(8, 1, 4), z8 = cfg(8, 1, 8);
  z.cp = 2;
  z.zero = z8.zero = ZeroStage::gradients;
  const MemoryEstimate ez = rank_memory(m, z, p, 0, 1), ez8 = rank_memory(m, z8, p, 0, 1);
  CHECK(ez.optimizer == Approx(ez8.optimizer));
  CHECK(ez.gradients == Approx(ez8.gradients));
  CHECK(ez.parameters == Approx(ez8.parameters));
}
