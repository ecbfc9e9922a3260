#pragma once
/**
 * @file Seconds per pipeline action and per collective: compute from FLOPs and bytes at achievable
 * device rates (GEMM, elementwise), communication from the alpha-beta model in collective_cost.hpp.
 * Everything the search needs to hand the pipeline simulator its action costs.
 */
#include <algorithm>
#include <cstddef>
#include <map>
#include <optional>
#include <tuple>

#include "mpar/core/error.hpp"
#include "mpar/plan/collective_cost.hpp"
#include "mpar/plan/memory_model.hpp"
#include "mpar/plan/model.hpp"
#include "mpar/plan/parallel_config.hpp"
#include "mpar/plan/topology.hpp"

namespace mpar::plan {

/** @brief Measured per-layer action times for one (tp, micro-batch size, recompute), replacing the FLOP model. */
struct MeasuredLayerCosts {
  double forward = 0;          ///< one layer's forward, seconds
  double backward_input = 0;   ///< its backward for inputs (including any recomputation)
  double backward_weight = 0;  ///< its backward for weights
};

/**
 * @brief The device and network constants of the cost model. Defaults are assumptions documented in
 * docs/planner.md; `load_calibration` (calibration.hpp) overwrites them with measurements.
 */
struct Calibration {
  /**
   * Achievable fraction of peak for transformer GEMMs. Calibrated once against Megatron-LM's
   * Table 1 (arXiv 2104.04473) on A100; see docs/planner.md for the fit and the residuals.
   */
  double gemm_efficiency = 0.65;
  double elementwise_efficiency = 0.8;     ///< achievable fraction of HBM bandwidth for elementwise kernels
  double bandwidth_efficiency = 0.8;       ///< achievable fraction of nominal link bandwidth (nccl-tests bus bandwidth)
  std::optional<double> gemm_flops_per_s;  ///< measured: replaces peak * gemm_efficiency
  std::optional<double> elementwise_bytes_per_s;  ///< measured: replaces HBM * elementwise_efficiency
  std::optional<Link> intra, inter;               ///< measured per-GPU links: replace nominal * bandwidth_efficiency
  /** Measured per-layer costs keyed by (tp, microbatch_size, recompute). */
  std::map<std::tuple<std::size_t, std::size_t, Recompute>, MeasuredLayerCosts> layer_costs;
};

/** @brief Seconds of one chunk's actions for one micro-batch on one pipeline rank. */
struct ChunkCosts {
  double forward = 0, backward_input = 0, backward_weight = 0;
  [[nodiscard]] constexpr double backward() const { return backward_input + backward_weight; }
  [[nodiscard]] friend constexpr ChunkCosts operator+(const ChunkCosts& a, const ChunkCosts& b) {
    return {a.forward + b.forward, a.backward_input + b.backward_input, a.backward_weight + b.backward_weight};
  }
};

/** @brief The per-operation-class work of one layer's forward on one tensor rank, and its collectives. */
struct LayerWork {
  double linear_flops = 0;     ///< QKV, projection, MLP GEMMs: 24 b s h^2 / t
  double attention_flops = 0;  ///< Q K^T and scores x V: 4 b s^2 h / t
  /// HBM traffic of those two batched GEMMs (the score matrices written and read back, Q, K, V and the output):
  /// with a head dimension below the device's FLOP-per-byte ratio they are bandwidth-bound.
  double attention_bytes = 0;
  double attention_backward_bytes = 0;    ///< the same for their four gradient GEMMs
  double elementwise_bytes = 0;           ///< HBM traffic of layer norms, softmax, GeLU, dropout, residuals (forward)
  double elementwise_backward_bytes = 0;  ///< the same kernels' backward, counted kernel by kernel
  double softmax_bytes = 0;  ///< the part of elementwise_bytes in the attention core (selective recompute redoes it)
  double tp_collective_bytes = 0;  ///< each of the forward all-reduces (or reduce-scatter + all-gather pairs)
  std::size_t tp_collectives = 2;  ///< forward tensor-parallel collectives: attention's and the MLP's (MoE: one)
  double ring_block_bytes = 0;     ///< context parallelism: one K/V block sent around the ring (cp - 1 hops)
  /// MoE: the gate and the experts' GEMMs over the rank's E C slots (2 T h E + 16 h^2 E C), on every tensor rank,
  /// the experts' part divided by etp when each expert is split over the tensor ranks.
  double expert_flops = 0;
  double all_to_all_bytes = 0;  ///< MoE: each of the forward's two all-to-alls (dispatch, combine), E C h elements
  /// MoE with expert tensor parallelism: the all-reduce over the tensor ranks of the slots' partial outputs (forward)
  /// and of their partial input gradients (backward), E C h elements each.
  double expert_reduce_bytes = 0;
};

/**
 * @brief Turns a model, a cluster and a calibration into seconds per action and per collective.
 */
class CostModel {
 public:
  CostModel(GptModel m, Cluster c, Calibration cal = {}, Precision p = Precision::mixed_adam())
      : model_(m), cluster_(c), cal_(std::move(cal)), precision_(p) {
    model_.validate();
    cluster_.validate();
  }

  [[nodiscard]] const GptModel& model() const { return model_; }
  [[nodiscard]] const Cluster& cluster() const { return cluster_; }
  [[nodiscard]] const Calibration& calibration() const { return cal_; }
  [[nodiscard]] const Precision& precision() const { return precision_; }

  [[nodiscard]] double gemm_rate() const {
    return cal_.gemm_flops_per_s.value_or(cluster_.peak_flops * cal_.gemm_efficiency);
  }
  [[nodiscard]] double elementwise_rate() const {
    return cal_.elementwise_bytes_per_s.value_or(cluster_.hbm_bandwidth * cal_.elementwise_efficiency);
  }
  [[nodiscard]] Network network() const {
    Network n;
    n.intra = cal_.intra.value_or(
        Link{cluster_.intra_node_bandwidth * cal_.bandwidth_efficiency, cluster_.intra_node_latency});
    n.inter = cal_.inter.value_or(
        Link{cluster_.inter_node_bandwidth_per_gpu() * cal_.bandwidth_efficiency, cluster_.inter_node_latency});
    return n;
  }

  /**
   * One layer's forward work on one tensor rank. Elementwise traffic counts each kernel's reads and
   * writes in activation elements: outside the tensor-parallel region (replicated unless sequence
   * parallel) two layer norms (2 each) and two dropout+residual kernels (3 each + mask); inside it
   * the fused bias-GeLU (8 over the 4h-wide MLP); in the attention core the fused scale-mask-softmax
   * and the attention dropout (4 per score element + mask). Backward, kernel by kernel: the layer norms
   * read input and gradient and write one (3 each), the dropouts read gradient and mask (2 + mask each),
   * the two residual branches' gradients are summed (3 each); bias-GeLU reads input and gradient (12 over
   * 4h); softmax reads output and gradient (3) and the attention dropout gradient and mask (2 + mask).
   *
   * A Llama layer (`GptModel::family`) counts its own kernels instead (see the body).
   *
   * `moe`: the layer's MLP is a mixture of experts (`parallel::MoeMlp`): the attention keeps its split GEMMs and
   * its one collective, and every tensor rank runs the gate and its E / ep experts over ep C rows each (E C slots:
   * C per expert and source rank, empty ones included, as the capacity-bounded dispatch computes them), GeLU over
   * [E C, 4h] (8 per slot element of width h), the dispatch and combine copies (2 + 2) and the gate's softmax over
   * [T, E] (2), and sends two all-to-alls. With expert tensor parallelism (etp = tp) each rank runs 1/etp of every
   * expert's GEMMs and GeLU and all-reduces the slots' outputs over the tensor ranks (and their input gradients).
   */
  [[nodiscard]] LayerWork layer_work(const ParallelConfig& c, bool moe = false) const {
    // Under context parallelism (cp > 1) a rank works on s / cp tokens of each sequence and on 1/cp of its
    // attention scores (zig-zag chunks balance the causal work), and sends its K/V block around the ring.
    const double S = double(model_.seq), cp = double(c.cp), s = S / cp;
    const double b = double(c.microbatch_size), h = double(model_.hidden), a = double(model_.heads);
    const double t = double(c.tp), e = precision_.activation_bytes, k = precision_.mask_bytes;
    const double sbh = s * b * h;
    LayerWork w;
    w.linear_flops = 24.0 * b * s * h * h / t;
    w.attention_flops = 4.0 * b * S * S * h / t / cp;
    const double replicated = c.sequence_parallel ? t : 1.0, scores = a * S * S * b / t / cp;
    w.attention_bytes = e * (2 * scores + 4 * sbh / t);           // scores out and back in; Q, K, V in, output out
    w.attention_backward_bytes = e * (4 * scores + 7 * sbh / t);  // dP out, P and dS twice in; Q K V dO in, dQ dK dV
    w.softmax_bytes = (4 * e + k) * scores;
    w.elementwise_bytes = (10 * e + 2 * k) * sbh / replicated + 8 * e * sbh / t + w.softmax_bytes;
    w.elementwise_backward_bytes = (16 * e + 2 * k) * sbh / replicated + 12 * e * sbh / t + (5 * e + k) * scores;
    w.tp_collective_bytes = c.tp > 1 ? e * sbh : 0.0;
    w.ring_block_bytes = c.cp > 1 ? 2 * e * sbh / t : 0.0;
    if (model_.is_llama()) {
      // Llama (nn/llama_block.hpp): QKV h (h + 2 kv d), projection h^2 and SwiGLU 3 h f per token; no dropout.
      // Outside the tensor-parallel region two RMSNorms (2 each) and two residual additions (3 each); inside it the
      // KV heads repeated into q, k, v (read the fused h + 2 kv d, write 3h), the rotation of q and k (read and
      // write 2h) and SiluGate (read 2f, write f); the softmax reads and writes each score. Backward: the norms
      // (3 each) and the residual gradients' sums (3 each); the rotation back, the KV copies summed (as forward),
      // SiluGate reading its input and gradient and writing one (5 f); softmax 3 per score.
      const double f = double(model_.ffn_size()), sb = s * b, qkv = model_.qkv_width();
      w.linear_flops = 2.0 * sb * h * (qkv + h + 3 * f) / t;
      const double core_copies = e * sb * (qkv + 3 * h + 4 * h) / t;
      w.softmax_bytes = 2 * e * scores;
      w.elementwise_bytes = 10 * e * sbh / replicated + core_copies + 3 * e * sb * f / t + w.softmax_bytes;
      w.elementwise_backward_bytes = 12 * e * sbh / replicated + core_copies + 5 * e * sb * f / t + 3 * e * scores;
      w.ring_block_bytes = c.cp > 1 ? e * sb * (qkv - h) / t : 0.0;  // only the KV heads travel the ring
      return w;
    }
    if (moe) {
      const double T = s * b, E = double(model_.experts), slots = E * moe_expert_capacity(model_, c);
      w.linear_flops = 8.0 * b * s * h * h / t;  // QKV and the projection
      const double etp = double(c.etp);
      w.expert_flops = 2.0 * T * h * E + 16.0 * h * h * slots / etp;
      // the experts' MLP for the dense one: GeLU (split with the experts), the copies, the gate's softmax
      const double experts_mlp = (4 + 8 / etp) * e * slots * h + 2 * e * T * E;
      w.expert_reduce_bytes = c.etp > 1 ? e * slots * h : 0.0;
      w.elementwise_bytes += experts_mlp - 8 * e * sbh / t;
      w.elementwise_backward_bytes += 2 * experts_mlp - 12 * e * sbh / t;
      w.tp_collectives = 1;
      w.all_to_all_bytes = e * slots * h;
    }
    return w;
  }

  /** One all-to-all of `bytes` per rank over the expert group (an MoE layer's dispatch or combine). */
  [[nodiscard]] double all_to_all_seconds(double bytes, const ParallelConfig& c, const GroupPlacement& g) const {
    if (c.ep <= 1 || bytes <= 0) return 0.0;
    return best_collective(Collective::all_to_all, bytes, g.expert, network()).seconds;
  }

  /** One tensor-parallel all-reduce of `bytes` (or its reduce-scatter + all-gather pair under sequence parallelism). */
  [[nodiscard]] double tp_collective_seconds(double bytes, const ParallelConfig& c, const GroupPlacement& g) const {
    if (c.tp <= 1 || bytes <= 0) return 0.0;
    if (c.sequence_parallel)
      return best_collective(Collective::reduce_scatter, bytes, g.tensor, network()).seconds +
             best_collective(Collective::all_gather, bytes, g.tensor, network()).seconds;
    return best_collective(Collective::all_reduce, bytes, g.tensor, network()).seconds;
  }

  /**
   * Per-layer costs of one micro-batch under `c.recompute`: from measurements when calibrated for (tp, mbs,
   * recompute), else from the work model. `moe`: an MoE layer (`layer_work`), always from the work model (the
   * measurements are of dense layers).
   */
  [[nodiscard]] ChunkCosts layer_costs(const ParallelConfig& c, const GroupPlacement& g, bool moe = false) const {
    return layer_costs(c, g, moe, c.recompute);
  }
  /** The same for a layer that recomputes `mode` (a stage's own choice: `ParallelConfig::recompute_of`). */
  [[nodiscard]] ChunkCosts layer_costs(const ParallelConfig& c, const GroupPlacement& g, bool moe,
                                       Recompute mode) const {
    // (Measurements are of whole sequences: a context-parallel layer uses the work model.)
    if (auto it = cal_.layer_costs.find({c.tp, c.microbatch_size, mode});
        !moe && c.cp == 1 && it != cal_.layer_costs.end())
      return {it->second.forward, it->second.backward_input, it->second.backward_weight};
    const LayerWork w = layer_work(c, moe);
    const double gemm = gemm_rate(), ew = elementwise_rate();
    const double ar = double(w.tp_collectives) * tp_collective_seconds(w.tp_collective_bytes, c, g);
    // Dispatch and combine: two all-to-alls forward, their two transposes backward; with expert tensor parallelism
    // one all-reduce of the slots over the tensor ranks in each direction.
    const double a2a =
        2 * all_to_all_seconds(w.all_to_all_bytes, c, g) + tp_collective_seconds(w.expert_reduce_bytes, c, g);
    const double core = attention_core_seconds(w);
    ChunkCosts l;
    l.forward = (w.linear_flops + w.expert_flops) / gemm + core + w.elementwise_bytes / ew + ar + a2a;
    // Backward for inputs: the linear layers' input gradients, both attention-core GEMMs' gradients
    // (no weights there), the elementwise kernels' backward.
    // The experts' input and weight gradients are one backward in mpar (`MoeMlp::backward`), counted here.
    l.backward_input = (w.linear_flops + 2 * w.expert_flops) / gemm + attention_core_seconds(w, true) +
                       w.elementwise_backward_bytes / ew + ar + a2a;
    // Sequence parallelism keeps each column-parallel layer's input as a token shard and all-gathers it
    // again for the weight gradient: one more all-gather per tensor-parallel collective.
    if (c.sequence_parallel && c.tp > 1)
      l.backward_input += double(w.tp_collectives) *
                          best_collective(Collective::all_gather, w.tp_collective_bytes, g.tensor, network()).seconds;
    l.backward_weight = w.linear_flops / gemm;
    if (c.cp > 1) {
      // The ring: cp - 1 K/V hops overlap the block compute (only what exceeds it shows); in backward the
      // dK/dV of a step travels after that step's compute, so its hops add in full.
      const double hop = send_recv_seconds(w.ring_block_bytes, g.context.nodes > 1, network());
      const double hops = double(c.cp - 1) * hop, attn = w.attention_flops / gemm;
      l.forward += std::max(0.0, hops - attn);
      l.backward_input += hops + std::max(0.0, hops - 2 * attn);
    }
    if (mode == Recompute::full) l.backward_input += l.forward;
    // Selective: the attention core's forward again (Q K^T, softmax, dropout, scores x V; Korthikanti et al.).
    if (mode == Recompute::selective) l.backward_input += core + w.softmax_bytes / ew;
    return l;
  }

  /** Tokens of one micro-batch on one rank: s / cp of each of its sequences. */
  [[nodiscard]] double tokens(const ParallelConfig& c) const {
    return double(model_.seq) / double(c.cp) * double(c.microbatch_size);
  }

  /**
   * The attention core's batched GEMMs (forward, or with `backward` their four gradient products) on the
   * roofline: the slower of their FLOPs at the GEMM rate and their HBM traffic at the elementwise rate.
   */
  [[nodiscard]] double attention_core_seconds(const LayerWork& w, bool backward = false) const {
    const double f = backward ? 2 * w.attention_flops : w.attention_flops;
    return std::max(f / gemm_rate(), (backward ? w.attention_backward_bytes : w.attention_bytes) / elementwise_rate());
  }

  /**
   * Costs of local chunk `chunk` on pipeline rank `rank` for one micro-batch: its layers (the even split, or
   * `c.stage_layers`), each recomputing what the stage, or the block itself, does (`c.block_recompute_of`), plus
   * the embedding on the first global stage and the final norm, logits and cross-entropy on the last.
   */
  [[nodiscard]] ChunkCosts chunk_costs(const ParallelConfig& c, std::size_t rank, std::size_t chunk,
                                       const GroupPlacement& g) const {
    check_recompute_stages(c);
    check_recompute_blocks(model_, c);
    const std::size_t count = chunk_layer_count(model_, c, rank, chunk),
                      first = first_chunk_layer(model_, c, rank, chunk);
    const std::size_t global = chunk * c.pp + rank;
    ChunkCosts r;
    // The blocks by mode (one group unless the stage's blocks differ: `ParallelConfig::mixed_blocks`), dense and MoE.
    for (Recompute mode : {Recompute::none, Recompute::selective, Recompute::full}) {
      if (!c.mixed_blocks(global) && mode != c.recompute_of(global)) continue;
      double moe = 0, n = 0;
      for (std::size_t b = first; b < first + count; ++b)
        if (c.block_recompute_of(global, b - first) == mode) (model_.is_moe_layer(b) ? moe : n) += 1.0;
      if (n > 0) {
        const ChunkCosts l = layer_costs(c, g, false, mode);
        r.forward += n * l.forward, r.backward_input += n * l.backward_input,
            r.backward_weight += n * l.backward_weight;
      }
      if (moe > 0) {
        const ChunkCosts x = layer_costs(c, g, true, mode);
        r.forward += moe * x.forward, r.backward_input += moe * x.backward_input,
            r.backward_weight += moe * x.backward_weight;
      }
    }
    if (global == 0) r = r + embedding_costs(c, g);
    if (global + 1 == c.stages()) r = r + head_costs(c, g);
    return r;
  }

  /**
   * The first stage's own work per micro-batch: lookup, positions and dropout (Llama: the lookup alone); backward
   * scatters into the table.
   */
  [[nodiscard]] ChunkCosts embedding_costs(const ParallelConfig& c, const GroupPlacement& g) const {
    const double e = precision_.activation_bytes, sbh = tokens(c) * double(model_.hidden);
    const double ar = tp_collective_seconds(e * sbh, c, g);  // vocabulary-parallel lookup sums over tp
    const double forward = model_.is_llama() ? 2 * e : 4 * e + precision_.mask_bytes;
    return {forward * sbh / elementwise_rate() + ar, 3 * e * sbh / elementwise_rate(), 0.0};
  }

  /** The last stage's own work per micro-batch: final norm, logits (vocabulary-parallel) and the fp32 loss. */
  [[nodiscard]] ChunkCosts head_costs(const ParallelConfig& c, const GroupPlacement& g) const {
    const double sb = tokens(c), h = double(model_.hidden), V = double(model_.vocab), t = double(c.tp);
    const double e = precision_.activation_bytes, sbh = sb * h, gemm = gemm_rate(), ew = elementwise_rate();
    const double logits = 2.0 * sb * h * V / t;
    const double ce_bytes = 4.0 * sb * V / t;                        // fp32 logits
    const double ce_ar = tp_collective_seconds(3 * 4.0 * sb, c, g);  // max, sum-exp and target logit over tp
    return {logits / gemm + (4 * e * sbh + 3 * ce_bytes) / ew + ce_ar,
            logits / gemm + (6 * e * sbh + 2 * ce_bytes) / ew, logits / gemm};
  }

  /** Sending one micro-batch's activation (or gradient) to the next stage: each tensor rank sends its 1/t slice. */
  [[nodiscard]] double p2p_seconds(const ParallelConfig& c, const GroupPlacement& g) const {
    if (c.pp <= 1) return 0.0;
    const double bytes = precision_.activation_bytes * double(model_.seq) / double(c.cp) * double(c.microbatch_size) *
                         double(model_.hidden);
    double t = send_recv_seconds(bytes / double(c.tp), g.pipeline_cross_node, network());
    if (c.tp > 1 &&
        !c.sequence_parallel)  // the receiving tensor group all-gathers the slices (Megatron's scatter-gather)
      t += best_collective(Collective::all_gather, bytes, g.tensor, network()).seconds;
    return t;
  }

  /**
   * Data-parallel gradient reduction of `params` parameters: all-reduce, or reduce-scatter + weight all-gather
   * under ZeRO-1; over the data x context group, or with `experts` over the ranks holding the same experts.
   */
  [[nodiscard]] double dp_reduce_seconds(double params, const ParallelConfig& c, const GroupPlacement& g,
                                         bool experts = false) const {
    const double reduce = bucket_reduce_seconds(params, c, g, experts);
    if (c.zero == parallel::ZeroStage::none || reduce == 0) return reduce;
    return reduce + best_collective(Collective::all_gather, params * precision_.weight_bytes,
                                    experts ? g.expert_data : g.data, network())
                        .seconds;
  }
  /**
   * The part of `dp_reduce_seconds` a gradient bucket runs in the backward's overlap: the all-reduce, or under
   * ZeRO the reduce-scatter (the weights' all-gather follows the optimizer step).
   */
  [[nodiscard]] double bucket_reduce_seconds(double params, const ParallelConfig& c, const GroupPlacement& g,
                                             bool experts = false) const {
    if ((experts ? c.expert_data_group() : c.data_group()) <= 1 || params <= 0) return 0.0;
    return best_collective(c.zero != parallel::ZeroStage::none ? Collective::reduce_scatter : Collective::all_reduce,
                           params * precision_.grad_bytes, experts ? g.expert_data : g.data, network())
        .seconds;
  }

  /**
   * The optimizer step over this rank's `params` replicated parameters and `expert_params` experts (ZeRO-1: its
   * shards of them, 1/(dp cp) and 1/(dp / ep)): an elementwise pass over all model states.
   */
  [[nodiscard]] double optimizer_seconds(double params, const ParallelConfig& c, double expert_params = 0) const {
    const double share = c.zero != parallel::ZeroStage::none
                             ? params / double(c.data_group()) + expert_params / double(c.expert_data_group())
                             : params + expert_params;
    return 2.0 * share * precision_.model_state_bytes() / elementwise_rate();
  }

 private:
  GptModel model_;
  Cluster cluster_;
  Calibration cal_;
  Precision precision_;
};

}  // namespace mpar::plan

namespace mpar::plan {

/**
 * FLOPs the hardware executes per iteration over `batch` sequences, recomputation included; with
 * full recomputation this is Narayanan et al.'s 96 B s l h^2 (1 + s/(6h) + V/(16 l h)), the figure
 * their TFLOP/s per GPU are computed from.
 */
[[nodiscard]] constexpr double iteration_flops(const GptModel& m, double batch, Recompute r) {
  const double s = double(m.seq), h = double(m.hidden), l = double(m.layers);
  double f = m.model_flops(batch);
  if (r == Recompute::full)
    for (std::size_t b = 0; b < m.layers; ++b) f += m.layer_forward_flops(b, batch);
  if (r == Recompute::selective) f += batch * l * 4.0 * s * s * h;
  return f;
}

/**
 * The same for `c`'s recomputation, stage by stage (block by block) where the stages (their blocks) differ
 * (`ParallelConfig::recompute_stages`, `recompute_blocks`).
 */
[[nodiscard]] inline double iteration_flops(const GptModel& m, const ParallelConfig& c, double batch) {
  if (!c.mixed_recompute()) return iteration_flops(m, batch, c.recompute_of(0));
  const double s = double(m.seq), h = double(m.hidden);
  double f = m.model_flops(batch);
  for (std::size_t rank = 0; rank < c.pp; ++rank)
    for_each_rank_layer(m, c, rank, [&](std::size_t chunk, std::size_t layer) {
      const Recompute r = c.block_recompute_of(chunk * c.pp + rank, layer - first_chunk_layer(m, c, rank, chunk));
      if (r == Recompute::full) f += m.layer_forward_flops(layer, batch);
      if (r == Recompute::selective) f += batch * 4.0 * s * s * h;
    });
  return f;
}

}  // namespace mpar::plan
