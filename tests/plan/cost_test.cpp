// Alpha-beta collectives, per-action costs, the pipeline simulator wiring, and calibration.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "mpar/plan.hpp"

using namespace mpar::plan;

namespace {
const Network net{{100e9, 2e-6}, {10e9, 10e-6}};  // intra 100 GB/s, inter 10 GB/s per GPU
}  // namespace

TEST_CASE("ring, tree and hierarchical collectives follow the alpha-beta formulas", "[plan][cost]") {
  const double S = 1e9;
  const GroupShape node8{8, 1};
  CHECK(collective_seconds(Collective::all_reduce, Algorithm::ring, S, node8, net) ==
        Approx(14 * 2e-6 + 2.0 * 7 / 8 * S / 100e9));
  CHECK(collective_seconds(Collective::reduce_scatter, Algorithm::ring, S, node8, net) ==
        Approx(7 * 2e-6 + 7.0 / 8 * S / 100e9));
  CHECK(collective_seconds(Collective::all_gather, Algorithm::ring, S, node8, net) ==
        collective_seconds(Collective::reduce_scatter, Algorithm::ring, S, node8, net));
  CHECK(collective_seconds(Collective::all_reduce, Algorithm::tree, S, node8, net) ==
        Approx(2 * (3 * 2e-6 + S / 100e9)));
  CHECK(collective_seconds(Collective::all_reduce, Algorithm::ring, S, {1, 1}, net) == 0);

  // 4 nodes x 8: the ring crosses nodes on 8 NICs at once (8 x 10 GB/s < 100 GB/s NVLink) with inter-node hops.
  const GroupShape g{32, 4};
  CHECK(collective_seconds(Collective::all_reduce, Algorithm::ring, S, g, net) ==
        Approx(62 * 10e-6 + 2.0 * 31 / 32 * S / 80e9));
  // Hierarchical: reduce-scatter in the node, all-reduce an eighth across 4 nodes, all-gather in the node.
  const double intra = 7 * 2e-6 + 7.0 / 8 * S / 100e9, inter = 3 * 10e-6 + 3.0 / 4 * (S / 8) / 10e9;
  CHECK(collective_seconds(Collective::all_reduce, Algorithm::hierarchical, S, g, net) == Approx(2 * (intra + inter)));
  // One member per node: every byte crosses the network.
  CHECK(collective_seconds(Collective::all_reduce, Algorithm::ring, S, {4, 4}, net) ==
        Approx(6 * 10e-6 + 1.5 * S / 10e9));
  CHECK(send_recv_seconds(S, true, net) == Approx(10e-6 + S / 10e9));
  CHECK(send_recv_seconds(S, false, net) == Approx(2e-6 + S / 100e9));
}

TEST_CASE("the fastest algorithm depends on size: tree when latency-bound, ring when bandwidth-bound", "[plan][cost]") {
  const GroupShape g{256, 32};
  CHECK(best_collective(Collective::all_reduce, 1024, g, net).algorithm == Algorithm::tree);
  const CollectiveTime big = best_collective(Collective::all_reduce, 4e9, {8, 1}, net);
  CHECK(big.algorithm == Algorithm::ring);  // 2(n-1)/n of the buffer beats the tree's 2x once latency is negligible
  CHECK(big.seconds == collective_seconds(Collective::all_reduce, Algorithm::ring, 4e9, {8, 1}, net));
  // Every algorithm is at least as slow as the best one.
  for (Algorithm a : {Algorithm::ring, Algorithm::tree, Algorithm::hierarchical})
    CHECK(best_collective(Collective::all_reduce, 64e6, g, net).seconds <=
          collective_seconds(Collective::all_reduce, a, 64e6, g, net));
  CHECK_THROWS_WITH(collective_seconds(Collective::all_reduce, Algorithm::ring, 1, {6, 4}, net),
                    Catch::Contains("cannot sit evenly on 4 nodes"));
}

TEST_CASE("action costs come from FLOPs at the GEMM rate, elementwise bytes at HBM rate, and TP collectives",
          "[plan][cost]") {
  const GptModel m{8, 1024, 16, 512, 1000};
  Cluster c = a100_selene(8);
  Calibration cal;
  cal.gemm_efficiency = 0.5;
  const CostModel cm(m, c, cal);
  ParallelConfig p;
  p.pp = 2, p.dp = 4, p.microbatches = 4;
  const GroupPlacement g = place(p, 8, Placement::tensor_innermost);
  const LayerWork w = cm.layer_work(p);
  CHECK(w.linear_flops == Approx(24.0 * 512 * 1024 * 1024));
  CHECK(w.attention_flops == Approx(4.0 * 512 * 512 * 1024));
  const ChunkCosts l = cm.layer_costs(p, g);
  const double gemm = 312e12 * 0.5, ew = 2.039e12 * 0.8;
  // The attention core's GEMMs on the roofline: with 64-wide heads they move more bytes than they compute.
  const double core = std::max(w.attention_flops / gemm, w.attention_bytes / ew);
  CHECK(core == Approx(w.attention_bytes / ew));
  CHECK(cm.attention_core_seconds(w) == Approx(core));
  CHECK(cm.attention_core_seconds(w, true) ==
        Approx(std::max(2 * w.attention_flops / gemm, w.attention_backward_bytes / ew)));
  CHECK(l.forward == Approx(w.linear_flops / gemm + core + w.elementwise_bytes / ew));
  CHECK(l.backward_weight == Approx(w.linear_flops / gemm));
  // The linear layers' forward + backward GEMMs are 3x their forward: 72 b s h^2.
  CHECK((l.forward + l.backward()) - (w.elementwise_bytes + w.elementwise_backward_bytes) / ew - core -
            cm.attention_core_seconds(w, true) ==
        Approx(72.0 * 512 * 1024 * 1024 / gemm));
  // Elementwise backward, kernel by kernel (no dropout masks at k = 1 byte here; e = 2): (16e + 2k) s b h outside,
  // 12e s b h in the MLP, (5e + k) a s^2 b in the attention core.
  CHECK(w.elementwise_backward_bytes == Approx(34.0 * 512 * 1024 + 24.0 * 512 * 1024 + 11.0 * 16 * 512 * 512));
  // Full recomputation adds one forward to the backward-input half; selective only the attention core.
  p.recompute = Recompute::full;
  CHECK(cm.layer_costs(p, g).backward_input == Approx(l.backward_input + l.forward));
  p.recompute = Recompute::selective;
  CHECK(cm.layer_costs(p, g).backward_input > l.backward_input);
  CHECK(cm.layer_costs(p, g).backward_input < l.backward_input + l.forward);
  // Tensor parallelism divides the GEMMs and adds all-reduces.
  p.recompute = Recompute::none;
  p.tp = 4, p.dp = 1;
  const GroupPlacement g4 = place(p, 8, Placement::tensor_innermost);
  const ChunkCosts l4 = cm.layer_costs(p, g4);
  const double ar = best_collective(Collective::all_reduce, 2.0 * 512 * 1024, g4.tensor, cm.network()).seconds;
  CHECK(ar > 0);
  CHECK(l4.backward_weight == Approx(l.backward_weight / 4));
  CHECK(l4.forward > l.forward / 4 + 2 * ar * 0.999);
  // The last stage pays for the logits, the first for the embedding.
  p.tp = 1, p.dp = 4;
  CHECK(cm.chunk_costs(p, 1, 0, g).forward > cm.chunk_costs(p, 0, 0, g).forward);
  CHECK(cm.chunk_costs(p, 0, 0, g).forward > 4 * l.forward);
}

TEST_CASE("pipeline time and bubble come from the pipeline simulator replaying the executor's programs",
          "[plan][cost]") {
  ParallelConfig c;
  c.pp = 4, c.microbatches = 8, c.schedule = ScheduleKind::one_f_one_b;
  StageCosts sc;
  sc.chunk.assign(4, std::vector<ChunkCosts>(1, ChunkCosts{1.0, 1.0, 1.0}));
  const PipelineTiming t = time_pipeline(c, sc);
  CHECK(t.makespan == Approx((8 + 3) * 3.0));               // (M + P - 1)(F + B + W)
  CHECK(t.bubble_fraction == Approx(3.0 / 11));             // (P-1)/(M+P-1), numbers.md
  CHECK(t.grads_ready[0][0].second == Approx(t.makespan));  // rank 0 finishes the last backward
  CHECK(t.grads_ready[3][0].second < t.makespan);           // the last stage is done earlier: room to overlap
  c.schedule = ScheduleKind::zb_h2;                         // 2W >= F + B: no bubble left in the steady state
  sc.chunk.assign(4, std::vector<ChunkCosts>(1, ChunkCosts{1.0, 1.0, 1.0}));
  CHECK(time_pipeline(c, sc).makespan < (8 + 3) * 3.0);
  c.schedule = ScheduleKind::interleaved, c.virtual_stages = 2;
  sc.chunk.assign(4, std::vector<ChunkCosts>(2, ChunkCosts{0.5, 0.5, 0.5}));
  CHECK(time_pipeline(c, sc).makespan == Approx(8 * 3.0 + 3 * 3.0 / 2));  // bubble shrinks by V
}

TEST_CASE("PipeDream-2BW is timed as the trainer runs it: 16 steps per program, each update a barrier",
          "[plan][cost][2bw]") {
  ParallelConfig c;
  c.pp = 4, c.microbatches = 8;
  StageCosts sc;
  sc.chunk.assign(4, std::vector<ChunkCosts>(1, ChunkCosts{1.0, 1.0, 1.0}));
  c.schedule = ScheduleKind::one_f_one_b;
  const PipelineTiming flush = time_pipeline(c, sc);
  c.schedule = ScheduleKind::two_bw;
  const PipelineTiming bw = time_pipeline(c, sc);
  // By hand, with F = 1 and a backward 2 (B + W): 1F1B idles 3 (P - 1) per rank per step, the whole bubble.
  // Without the flush the first step of a program still does; each later one idles 2 (P - 1) per rank: the next
  // step's warm-up forwards fill the cool-down, and the update waits for the first stage's last backward. So a
  // program of K = 16 steps takes K M 3 + 3 (P - 1) + 2 (P - 1) (K - 1) time units.
  const double K = 16, M = 8, P = 4;
  CHECK(flush.makespan == Approx((M + P - 1) * 3.0));
  CHECK(bw.makespan == Approx((K * M * 3 + 3 * (P - 1) + 2 * (P - 1) * (K - 1)) / K));
  // The bubble as a count of idle slots summed over the ranks (F one slot, B two): 1F1B's 3 (P - 1) per rank,
  // 2bw's (3 + 2 (K - 1)) (P - 1) / K, what StepReport::idle_slots reports for the trainer's program.
  CHECK(flush.idle_slots == 4 * 3 * 3);
  CHECK(bw.idle_slots == Approx(P * (P - 1) * (3 + 2 * (K - 1)) / K));
  CHECK(bw.bubble_fraction < flush.bubble_fraction);
}

TEST_CASE("calibration from JSON lines replaces the defaults", "[plan][calibration]") {
  const Cluster c = a100_selene(64);
  // Two sizes on one node: exactly alpha = 5 us, bandwidth 200 GB/s under the ring model.
  auto ring_ar = [](double bytes, double n, double a, double bw) {
    return 2 * (n - 1) * a + 2 * (n - 1) / n * bytes / bw;
  };
  std::ostringstream f;
  f << "{\"metric\":\"gemm\",\"flops\":2.0e12,\"seconds\":0.01}\n"
    << "\n{\"metric\":\"step_time\",\"seconds\":1.5,\"tags\":{\"rank\":0}}\n"  // not ours: ignored
    << "{\"metric\":\"elementwise\",\"bytes\":3.0e9,\"seconds\":0.002}\n"
    << "{\"metric\":\"collective\",\"op\":\"all_reduce\",\"ranks\":8,\"nodes\":1,\"bytes\":1e6,\"seconds\":"
    << ring_ar(1e6, 8, 5e-6, 200e9) << "}\n"
    << "{\"metric\":\"collective\",\"op\":\"all_reduce\",\"ranks\":8,\"nodes\":1,\"bytes\":1e9,\"seconds\":"
    << ring_ar(1e9, 8, 5e-6, 200e9) << "}\n"
    << "{\"metric\":\"collective\",\"op\":\"all_gather\",\"ranks\":16,\"nodes\":2,\"bytes\":1e9,\"seconds\":0.05}\n"
    << "{\"metric\":\"action\",\"op\":\"forward\",\"layers\":2,\"tp\":8,\"microbatch_size\":1,\"recompute\":\"full\","
       "\"seconds\":0.02}\n"
    << "{\"metric\":\"action\",\"op\":\"backward\",\"layers\":2,\"tp\":8,\"microbatch_size\":1,\"recompute\":\"full\","
       "\"seconds\":0.08}\n";
  const Calibration cal = load_calibration(f.str(), c);
  REQUIRE(cal.gemm_flops_per_s);
  CHECK(*cal.gemm_flops_per_s == Approx(2e14));
  CHECK(*cal.elementwise_bytes_per_s == Approx(1.5e12));
  REQUIRE(cal.intra);
  CHECK(cal.intra->latency == Approx(5e-6));
  CHECK(cal.intra->bandwidth == Approx(200e9));
  REQUIRE(cal.inter);  // one size: bandwidth fitted with the default latency
  CHECK(cal.inter->latency == c.inter_node_latency);
  CHECK(15 * cal.inter->latency + 15.0 / 16 * 1e9 / 8 / cal.inter->bandwidth == Approx(0.05));

  const GptModel m{8, 1024, 16, 512, 1000};
  const CostModel measured(m, c, cal), nominal(m, c);
  CHECK(measured.gemm_rate() == Approx(2e14));
  CHECK(measured.network().intra.bandwidth == Approx(200e9));
  ParallelConfig p;
  p.tp = 8, p.dp = 8, p.recompute = Recompute::full;
  const GroupPlacement g = place(p, 8, Placement::tensor_innermost);
  const ChunkCosts l = measured.layer_costs(p, g);
  CHECK(l.forward == Approx(0.01));
  CHECK(l.backward_input == Approx(0.02));
  CHECK(l.backward_weight == Approx(0.02));
  CHECK(nominal.layer_costs(p, g).forward != Approx(0.01));

  CHECK_THROWS_WITH(load_calibration(std::string("{\"metric\":\"gemm\",\"flops\":1}\n{\"metric\": }\n"), c),
                    Catch::Contains("line 1") && Catch::Contains("seconds"));
  CHECK_THROWS_WITH(load_calibration(std::string("{\"metric\":\"gemm\" \"flops\":1}\n"), c),
                    Catch::Contains("line 1, column"));
  CHECK_THROWS_WITH(
      load_calibration(
          std::string(
              "{\"metric\":\"collective\",\"op\":\"gossip\",\"ranks\":2,\"nodes\":1,\"bytes\":1,\"seconds\":1}"),
          c),
      Catch::Contains("gossip"));
}
