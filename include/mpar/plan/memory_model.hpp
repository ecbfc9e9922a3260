#pragma once
/**
 * @file Per-rank memory: model states (weights, gradients, optimizer states, optionally ZeRO-1, -2 or -3
 * sharded; a mixture of experts' over the data ranks holding the same experts), activations (Korthikanti et
 * al., arXiv 2205.05198) times the schedule's peak number of in-flight micro-batches, and communication buffers.
 */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "mpar/core/error.hpp"
#include "mpar/plan/model.hpp"
#include "mpar/plan/parallel_config.hpp"

namespace mpar::plan {

/**
 * @brief Bytes per element of everything a training rank keeps. `master_bytes` is the fp32 copy a
 * mixed-precision optimizer keeps next to 16-bit weights (0 when the weights are fp32 already);
 * `optimizer_bytes` the optimizer's own state (Adam: momentum and variance, 8 bytes).
 */
struct Precision {
  double weight_bytes = 2, grad_bytes = 2, master_bytes = 4, optimizer_bytes = 8;
  double activation_bytes = 2;  ///< a stored activation element
  double mask_bytes = 1;        ///< a stored dropout-mask element

  /** 16-bit weights, gradients and activations with fp32 master weights and Adam: 16 bytes per parameter. */
  [[nodiscard]] static constexpr Precision mixed_adam() { return {2, 2, 4, 8, 2, 1}; }
  /**
   * fp32 training as the host backend runs it: no 16-bit copies, fp32 activations.
   * `optimizer_bytes_per_param`: 8 for Adam(W), 4 for SGD with momentum, 0 for plain SGD.
   * `mask_bytes` 0: mpar's Dropout regenerates its mask from (seed, index) instead of storing it.
   */
  [[nodiscard]] static constexpr Precision fp32_host(double optimizer_bytes_per_param = 8, double mask_bytes = 0) {
    return {4, 4, 0, optimizer_bytes_per_param, 4, mask_bytes};
  }
  [[nodiscard]] constexpr double model_state_bytes() const {
    return weight_bytes + grad_bytes + master_bytes + optimizer_bytes;
  }
};

/** @brief A rank's memory, by kind, in bytes. */
struct MemoryEstimate {
  double parameters = 0, gradients = 0, optimizer = 0, activations = 0, communication = 0;
  /// ZeRO-2/3, during the step: the full-size gradients the backward accumulates the micro-batches into before
  /// each bucket is reduce-scattered into this rank's shard (`gradients` holds the shard kept between steps).
  double accumulated_gradients = 0;
  std::size_t pipeline_rank = 0;  ///< the rank this estimate is for (the fullest one from `peak_memory`)
  [[nodiscard]] constexpr double total() const {
    return parameters + gradients + optimizer + activations + communication + accumulated_gradients;
  }
};

/** @brief Knobs of the memory model that are not part of a parallel configuration. */
struct MemoryOptions {
  double dp_bucket_bytes = 25.0 * 1024 * 1024;  ///< one gradient bucket; two are in flight while reducing
  /**
   * Full recomputation as mpar's pipeline executor does it (`true`): a chunk keeps only its input per
   * in-flight micro-batch and re-runs the whole chunk before its backward, so one chunk's full
   * activations are alive at once. `false`: per-layer checkpoints (Megatron-LM), every layer keeps
   * its input and one layer is rebuilt at a time.
   */
  bool recompute_whole_chunk = true;
  /**
   * Send buffers (activations or gradients, one micro-batch's each) a pipeline rank holds at once. mpar's
   * executor frees each when its transfer completes and lets a send wait for the one this many sends earlier
   * (pipeline::ExecutorOptions::sends_in_flight, 2 by default), so they do not grow with the micro-batches.
   * Megatron-LM's count is the same: a send in flight each way.
   */
  double sends_in_flight = 2;
  /**
   * Korthikanti's count assumes dropout on the attention probabilities (its output and mask are kept
   * next to the softmax output). Without attention dropout (p = 0, as mpar's host trainer defaults to)
   * only the softmax output is kept.
   */
  bool attention_dropout = true;
  /**
   * mpar's data-parallel buckets are ranges of the rank's gradient arena, reduced in place (no bucket
   * buffers in flight without ZeRO-2/3), and its ZeRO-1 keeps its shard of the averaged gradient between
   * steps next to the full gradients (1.5 N gradient floats at dp = 2). `false`: the textbook count, with two
   * bucket buffers in flight and no shard kept (Megatron-LM's distributed optimizer).
   */
  bool zero1_gradient_shard = true;
  /**
   * mpar's backward accumulates the micro-batches into full-size per-parameter gradients even under ZeRO-2/3
   * (allocated when the passes begin, released bucket by bucket once final), so all of them are alive at the
   * activation peak. `false`: each micro-batch's gradient is reduce-scattered into the shard as it is made.
   */
  bool zero_full_gradient_accumulation = true;
  /**
   * Under sequence parallelism mpar's pipeline stages exchange whole rows (a stage all-gathers its last block's
   * output and the next keeps its own rows), so the send and receive buffers and the input a recomputed chunk
   * keeps are not divided by tp, and the tied head keeps its all-gathered input. `false`: Megatron-LM's
   * token-sharded boundaries, and an output layer that keeps its shard and all-gathers it again.
   */
  bool sequence_parallel_whole_boundaries = true;

  /** How mpar's pipeline executor behaves today (the default). */
  [[nodiscard]] static MemoryOptions mpar_executor() { return {}; }
  /** Megatron-LM's behaviour: per-layer activation checkpoints, token-sharded boundaries, textbook buckets. */
  [[nodiscard]] static MemoryOptions megatron() {
    MemoryOptions o;
    o.recompute_whole_chunk = false;
    o.zero1_gradient_shard = false;
    o.zero_full_gradient_accumulation = false;
    o.sequence_parallel_whole_boundaries = false;
    return o;
  }
};

/**
 * Activation bytes one transformer layer keeps for backward, per micro-batch, on one tensor rank.
 *
 * Korthikanti et al. count, for a layer of width h with a heads, s tokens and b sequences:
 * 16 sbh + 2 as^2 b stored activation elements and 2 sbh + as^2 b dropout-mask elements. With 16-bit
 * activations and 1-byte masks that is sbh (34 + 5as/h). Under tensor parallelism the layer-norm
 * inputs, the QKV and MLP inputs and the two dropout masks after the blocks (4 elements + 2 masks)
 * stay replicated unless sequence parallelism shards them; the rest divides by t. Selective
 * recomputation drops the as^2 b terms (in mpar: the probabilities `[b, a/t, s, s]` the attention core keeps,
 * its only as^2 b term, since mpar's attention has no dropout of its own); full recomputation keeps only the
 * layer input.
 */
[[nodiscard]] inline double layer_activation_bytes(const GptModel& m, std::size_t microbatch, std::size_t tp,
                                                   bool sequence_parallel, Recompute r, const Precision& p,
                                                   bool attention_dropout = true, std::size_t cp = 1) {
  // Under context parallelism a rank holds s/cp tokens of each sequence, and ring attention keeps, instead of
  // the probabilities, the row log-sum-exp (a values per token, fp32) and its own copy of its output (the
  // backward's rowsum(dO * O) reads it; the projection keeps its input too) (nn/ring_attention.hpp).
  const double s = double(m.seq) / double(cp), b = double(microbatch), h = double(m.hidden), a = double(m.heads),
               t = double(tp);
  const double sbh = s * b * h, as2b = a * s * s * b;
  const double e = p.activation_bytes, k = p.mask_bytes;
  if (r == Recompute::full) return e * sbh / (sequence_parallel ? t : 1.0);
  if (m.is_llama()) {
    // mpar's Llama block (nn/llama_block.hpp): no dropout. Replicated unless sequence parallel: both RMSNorms'
    // inputs and their per-row fp32 rstd, the QKV and gate-and-up projections' inputs. Split over tp: q, k, v
    // after each KV head is repeated for its group (3 h wide), the output projection's input, SiluGate's gate and
    // up [s b, 2f] and the down projection's input [s b, f]; the probabilities unless selectively recomputed.
    // Under context parallelism (nn/ring_grouped_query_attention.hpp) the ring core keeps q, k, v unrepeated (the
    // QKV width), its output and the fp32 log-sum-exp instead of the probabilities, next to the projection's input.
    const double f = double(m.ffn_size());
    const double replicated = 4 * e * sbh + 2 * 4.0 * s * b;
    const double sharded =
        cp > 1 ? e * (s * b * (m.qkv_width() + 2 * h) + 3 * s * b * f) : e * (4 * sbh + 3 * s * b * f);
    const double part = sequence_parallel ? (replicated + sharded) / t : replicated + sharded / t;
    if (cp > 1) return part + 4.0 * a * s * b / t;
    return part + (r == Recompute::selective ? 0.0 : e * as2b / t);
  }
  const double replicated = 4 * e * sbh + 2 * k * sbh;  // LN1/LN2 inputs, QKV and fc1 inputs; two block-output masks
  const double sharded = 12 * e * sbh;                  // Q, K, V, projection input, GeLU input, fc2 input
  if (cp > 1) {
    const double ring = (e * sbh + 4.0 * a * s * b) / t;  // output copy and log-sum-exp: not recomputed selectively
    return (sequence_parallel ? (replicated + sharded) / t : replicated + sharded / t) + ring;
  }
  const double scores = attention_dropout ? (2 * e + k) * as2b  // softmax output, its dropout output and mask
                                          : e * as2b;           // the softmax output alone
  const double sbh_part = sequence_parallel ? (replicated + sharded) / t : replicated + sharded / t;
  return sbh_part + (r == Recompute::selective ? 0.0 : scores / t);
}

/** How many transformer layers each chunk holds in the even split: layers / (pp * V). */
[[nodiscard]] inline std::size_t layers_per_chunk(const GptModel& m, const ParallelConfig& c) {
  require(c.pp * c.virtual_stages > 0 && m.layers % (c.pp * c.virtual_stages) == 0, "plan: ", m.layers,
          " layers do not divide into pp*v = ", c.pp, "*", c.virtual_stages,
          " equal chunks; choose pp and v whose product divides ", m.layers);
  return m.layers / (c.pp * c.virtual_stages);
}

/** Throws config_error unless `c.stage_layers` is empty (the even split) or splits the model over its stages. */
inline void check_stage_layers(const GptModel& m, const ParallelConfig& c) {
  if (c.stage_layers.empty()) return;
  std::size_t sum = 0;
  for (std::size_t n : c.stage_layers) sum += n;
  require(c.stage_layers.size() == c.stages() && sum == m.layers, "plan: the stage layout has ", c.stage_layers.size(),
          " stages holding ", sum, " blocks, but pp*v = ", c.pp, "*", c.virtual_stages,
          " stages must hold the model's ", m.layers);
}

/** Throws config_error unless `c.recompute_stages` is empty (`c.recompute` everywhere) or names every stage. */
inline void check_recompute_stages(const ParallelConfig& c) {
  require(c.recompute_stages.empty() || c.recompute_stages.size() == c.stages(),
          "plan: the recomputation per stage has ", c.recompute_stages.size(), " entries, but pp*v = ", c.pp, "*",
          c.virtual_stages, " stages; give one mode per stage (or none: the one setting for every stage)");
}

/**
 * Throws config_error unless `c.recompute_blocks` is empty or gives, per stage, nothing or one mode per block of
 * the stage, the most of them being what the stage recomputes (`recompute_of`).
 */
inline void check_recompute_blocks(const GptModel& m, const ParallelConfig& c);

/** The layers of local chunk `chunk` on pipeline rank `rank` (global stage chunk pp + rank). */
[[nodiscard]] inline std::size_t chunk_layer_count(const GptModel& m, const ParallelConfig& c, std::size_t rank,
                                                   std::size_t chunk) {
  if (c.stage_layers.empty()) return layers_per_chunk(m, c);
  check_stage_layers(m, c);
  return c.stage_layers[chunk * c.pp + rank];
}

/** The first layer of local chunk `chunk` on pipeline rank `rank`: that chunk is stage chunk pp + rank. */
[[nodiscard]] inline std::size_t first_chunk_layer(const GptModel& m, const ParallelConfig& c, std::size_t rank,
                                                   std::size_t chunk) {
  const std::size_t stage = chunk * c.pp + rank;
  if (c.stage_layers.empty()) return stage * layers_per_chunk(m, c);
  check_stage_layers(m, c);
  std::size_t first = 0;
  for (std::size_t s = 0; s < stage; ++s) first += c.stage_layers[s];
  return first;
}

inline void check_recompute_blocks(const GptModel& m, const ParallelConfig& c) {
  if (c.recompute_blocks.empty()) return;
  require(c.recompute_blocks.size() == c.stages(), "plan: the recomputation per block names ",
          c.recompute_blocks.size(), " stages, but pp*v = ", c.pp, "*", c.virtual_stages,
          " stages; give one list per stage (an empty one: every block as the stage)");
  for (std::size_t s = 0; s < c.stages(); ++s) {
    const std::vector<Recompute>& b = c.recompute_blocks[s];
    if (b.empty()) continue;
    const std::size_t n = chunk_layer_count(m, c, s % c.pp, s / c.pp);
    require(b.size() == n, "plan: the recomputation per block of stage ", s, " has ", b.size(),
            " modes, but the stage holds ", n, " blocks; give one mode per block");
    const Recompute most = *std::max_element(b.begin(), b.end());
    require(most == c.recompute_of(s), "plan: the blocks of stage ", s, " recompute at most ", recompute_name(most),
            ", but the stage is set to ", recompute_name(c.recompute_of(s)),
            "; a stage's mode is the most its blocks recompute");
  }
}

/** Calls `f(chunk, layer)` for every layer pipeline rank `rank` holds. */
template <class F>
void for_each_rank_layer(const GptModel& m, const ParallelConfig& c, std::size_t rank, F&& f) {
  for (std::size_t ch = 0; ch < c.virtual_stages; ++ch) {
    const std::size_t first = first_chunk_layer(m, c, rank, ch), n = chunk_layer_count(m, c, rank, ch);
    for (std::size_t i = 0; i < n; ++i) f(ch, first + i);
  }
}

/**
 * Parameters one tensor rank holds of layer `layer`, its experts not counted (`layer_expert_parameters`). A dense
 * layer splits (12h^2 + 7h) over tp (QKV, projection and fc1 weights and biases, fc2 weight) and replicates 6h
 * (projection and fc2 biases, two layer norms); an MoE layer splits the attention's 4h^2 + 3h and replicates 5h
 * and the gate [h, E]. A Llama layer splits its four weight matrices and replicates its two RMSNorm gains 2h.
 */
[[nodiscard]] inline double layer_rank_parameters(const GptModel& m, const ParallelConfig& c, std::size_t layer) {
  const double h = double(m.hidden), t = double(c.tp);
  // Llama: the QKV, projection and SwiGLU weights split, the two RMSNorm gains replicated.
  if (m.is_llama()) return (m.layer_parameters() - 2 * h) / t + 2 * h;
  return m.is_moe_layer(layer) ? (4 * h * h + 3 * h) / t + 5 * h + h * double(m.experts)
                               : (12 * h * h + 7 * h) / t + 6 * h;
}
/**
 * The experts one rank holds of layer `layer`: E / ep of an MoE layer, whole on every tensor rank, or each split over
 * the etp tensor ranks (`ParallelConfig::etp`); else none.
 */
[[nodiscard]] inline double layer_expert_parameters(const GptModel& m, const ParallelConfig& c, std::size_t layer) {
  return m.is_moe_layer(layer) ? double(m.experts / c.ep) * m.expert_parameters() / double(c.etp) : 0.0;
}

/**
 * Parameters held by one tensor rank of pipeline rank `rank`, the experts not counted (`rank_expert_parameters`):
 * its layers (`layer_rank_parameters`); the word embedding is vocabulary-parallel, the first rank holds it and
 * the positions, the last rank the tied output copy and the final norm (one copy when pp = 1). Llama: the first
 * rank holds the word embedding (no positions), the last the final RMSNorm and the untied vocabulary-parallel head,
 * both on the one rank when pp = 1.
 */
[[nodiscard]] inline double rank_parameters(const GptModel& m, const ParallelConfig& c, std::size_t rank) {
  const double h = double(m.hidden), t = double(c.tp);
  double n = 0;
  if (m.experts == 0) {  // every block alike: count them (the search asks this many times per configuration)
    for (std::size_t ch = 0; ch < c.virtual_stages; ++ch) n += double(chunk_layer_count(m, c, rank, ch));
    n *= layer_rank_parameters(m, c, 0);
  } else {
    for_each_rank_layer(m, c, rank, [&](std::size_t, std::size_t layer) { n += layer_rank_parameters(m, c, layer); });
  }
  const double word = double(m.vocab) * h / t;
  if (m.is_llama()) return n + (rank == 0 ? word : 0.0) + (rank + 1 == c.pp ? word + m.final_norm_parameters() : 0.0);
  if (rank == 0) n += word + double(m.seq) * h;
  if (rank + 1 == c.pp) n += (c.pp > 1 ? word : 0.0) + m.final_norm_parameters();
  return n;
}

/**
 * The experts pipeline rank `rank` holds: E / ep of each of its MoE layers, whole on every tensor rank (or 1/etp of
 * each with expert tensor parallelism). Their gradients reduce, and ZeRO shards them, over `expert_data_group()`.
 */
[[nodiscard]] inline double rank_expert_parameters(const GptModel& m, const ParallelConfig& c, std::size_t rank) {
  if (m.experts == 0) return 0.0;
  double n = 0;
  for_each_rank_layer(m, c, rank, [&](std::size_t, std::size_t layer) { n += layer_expert_parameters(m, c, layer); });
  return n;
}

/**
 * @brief What one MoE layer keeps and briefly needs per micro-batch on one rank (`parallel::MoeMlp`), in bytes.
 * T = s b tokens, C = ceil(capacity k T / E) slots per expert and source rank, E C slots in all, and ep C rows per
 * local expert. Kept for the backward: the input and the gate probabilities [T, h + E], the combined expert
 * outputs and every local expert's input rows and pre-GeLU values [E C, 2h + 4h / etp], the slots' tokens and
 * weights. The backward's peak: three [E C, h] exchange buffers, and per expert its output gradient and input
 * gradient [ep C, 2h] with the GeLU output, its gradient and the pre-GeLU gradient [ep C, 3 4h / etp].
 */
struct MoeLayerBytes {
  double stored = 0, workspace = 0;
};
/**
 * C: the slots every expert keeps per source rank in one micro-batch, ceil(capacity k T / E) for the rank's
 * T = s b tokens, or T without a capacity limit (`parallel::MoeMlp::capacity_for`).
 */
[[nodiscard]] inline double moe_expert_capacity(const GptModel& m, const ParallelConfig& c) {
  const double T = double(m.seq) / double(c.cp) * double(c.microbatch_size);
  return m.moe_capacity > 0 ? std::ceil(m.moe_capacity * double(m.moe_top_k) * T / double(m.experts)) : T;
}
[[nodiscard]] inline MoeLayerBytes moe_layer_bytes(const GptModel& m, const ParallelConfig& c, const Precision& p) {
  const double T = double(m.seq) / double(c.cp) * double(c.microbatch_size), h = double(m.hidden),
               f = 4 * h / double(c.etp), E = double(m.experts), e = p.activation_bytes;
  const double C = moe_expert_capacity(m, c);
  const double slots = E * C, rows = double(c.ep) * C;
  return {e * (T * (h + E) + slots * (2 * h + f) + 2 * E + 2) + 8 * slots,
          e * (3 * slots * h + rows * (2 * h + 3 * f))};
}

/** Bytes per parameter of PipeDream-2BW's second weight version: a copy of the weights the optimizer updates. */
[[nodiscard]] constexpr double two_bw_version_bytes(const Precision& p) {
  return p.master_bytes > 0 ? p.master_bytes : p.weight_bytes;
}

/**
 * Memory of pipeline rank `rank` (one of its tensor ranks) given the schedule's peak number of
 * (micro-batch, chunk) activation sets that rank holds at once, as the pipeline verifier reports it.
 */
[[nodiscard]] inline MemoryEstimate rank_memory(const GptModel& m, const ParallelConfig& c, const Precision& p,
                                                std::size_t rank, double peak_inflight, const MemoryOptions& o = {}) {
  require(rank < c.pp, "plan::rank_memory: pipeline rank ", rank, " is outside pp = ", c.pp);
  check_recompute_stages(c);
  check_recompute_blocks(m, c);
  require(c.ep >= 1 && c.dp % c.ep == 0 && (m.experts == 0 || m.experts % c.ep == 0), "plan::rank_memory: ep = ", c.ep,
          " must divide dp = ", c.dp, " (expert ranks are data ranks) and the ", m.experts, " experts");
  MemoryEstimate e;
  e.pipeline_rank = rank;
  const double psi = rank_parameters(m, c, rank);
  // The model states of `n` parameters whose gradients reduce (and ZeRO shards) over `zdp` ranks: the replicated
  // parameters over the data x context group, the experts over the data ranks holding the same ones.
  const bool zero_any = c.zero != ZeroStage::none, zero_grads = shards(c.zero, ZeroStage::gradients);
  auto add_model_states = [&](double n, double zdp) {
    // ZeRO-3 keeps only this rank's 1/dp of the weights at rest, in the precision the optimizer updates (the fp32
    // master where there is one: the gathered 16-bit values are rounded from it); each unit's full weights exist
    // only while the passes use it (counted with the communication buffers below).
    e.parameters += c.zero == ZeroStage::parameters ? n * two_bw_version_bytes(p) / zdp
                                                    : n * (p.weight_bytes + p.master_bytes / (zero_any ? zdp : 1.0));
    // 2BW keeps a second weight version: the previous step's weights as the optimizer holds them (the fp32
    // master when there is one, whole on every rank even under ZeRO-1), which the passes run on, and under mixed
    // precision its 16-bit compute copy (train_gpt's bf16 programs without a flush keep it; f16, flushed, does
    // not, and is counted with it, on the safe side).
    if (c.schedule == ScheduleKind::two_bw)
      e.parameters += n * (two_bw_version_bytes(p) + (p.master_bytes > 0 ? p.weight_bytes : 0.0));
    // ZeRO-2 keeps only this rank's 1/dp of the averaged gradient between steps. During the step mpar's layers
    // accumulate the micro-batches' gradients in full-size per-parameter buffers, allocated (zeroed) when the
    // passes begin and released bucket by bucket once the last micro-batch's backward has passed them: all of
    // them are alive at the activation peak, next to the shards.
    e.gradients += n * p.grad_bytes / (zero_grads ? zdp : 1.0);
    if (zero_grads && o.zero_full_gradient_accumulation) e.accumulated_gradients += n * p.grad_bytes;
    // ZeRO-1 alone: this rank's shard of the averaged gradient stays allocated between steps.
    if (c.zero == ZeroStage::optimizer_states && zdp > 1 && o.zero1_gradient_shard)
      e.gradients += n * p.grad_bytes / zdp;
    e.optimizer += n * p.optimizer_bytes / (zero_any ? zdp : 1.0);
  };
  add_model_states(psi, double(c.data_group()));
  const double experts = rank_expert_parameters(m, c, rank);
  if (experts > 0) add_model_states(experts, double(c.expert_data_group()));

  // s: the tokens of one sequence this rank holds (all of them, or 1/cp under context parallelism).
  const double s = double(m.seq) / double(c.cp), b = double(c.microbatch_size), h = double(m.hidden), t = double(c.tp);
  const double sbh = s * b * h;
  const double shard = c.sequence_parallel ? t : 1.0;
  const double boundary_shard = o.sequence_parallel_whole_boundaries ? 1.0 : shard;  // what crosses between stages
  // One layer's attention score elements alive at once: the whole [s, s] per head and sequence, or under
  // context parallelism one ring block of [s/2, s/2] (chunk by chunk) per head.
  const double scores = c.cp > 1 ? double(m.heads) * (s / 2) * (s / 2) : double(m.heads) * s * s * b;
  const double full_layer = layer_activation_bytes(m, c.microbatch_size, c.tp, c.sequence_parallel, Recompute::none, p,
                                                   o.attention_dropout, c.cp);
  // An MoE layer keeps the MoE's state instead of the dense MLP's inputs (fc1 input, replicated; GeLU and fc2
  // inputs, split over tp), on every tensor rank (the expert slices 1/etp of the widths: `moe_layer_bytes`).
  const double dense_mlp = p.activation_bytes * sbh * (c.sequence_parallel ? 9.0 / t : 1.0 + 8.0 / t);
  const MoeLayerBytes moe = m.experts > 0 ? moe_layer_bytes(m, c, p) : MoeLayerBytes{};
  // Per chunk, each block in its own recomputation mode (`ParallelConfig::block_recompute_of`): what one in-flight
  // micro-batch keeps, and what its backward rebuilds on top for a moment. The rank holds its in-flight sets at the
  // fullest chunk's size, and one backward (one chunk's rebuild) at a time.
  std::vector<double> chunk_stored(c.virtual_stages, 0.0), chunk_full(c.virtual_stages, 0.0);
  std::vector<bool> chunk_moe(c.virtual_stages, false);
  // A chunk whose blocks differ: the backward runs its blocks last first, so while block i rebuilds what it
  // recomputes, the micro-batch still holds what blocks 0..i keep (the later ones are freed). The most that reaches.
  std::vector<double> chunk_backward_peak(c.virtual_stages, 0.0);
  const double probabilities =
      c.cp == 1 ? (o.attention_dropout ? 2 * p.activation_bytes + p.mask_bytes : p.activation_bytes) * scores / t : 0.0;
  // Each chunk's first layer once: under an uneven layout it is a sum over the stages before it.
  std::vector<std::size_t> chunk_first(c.virtual_stages);
  for (std::size_t ch = 0; ch < c.virtual_stages; ++ch) chunk_first[ch] = first_chunk_layer(m, c, rank, ch);
  for_each_rank_layer(m, c, rank, [&](std::size_t ch, std::size_t layer) {
    const Recompute mode = c.block_recompute_of(ch * c.pp + rank, layer - chunk_first[ch]);
    const bool is_moe = m.is_moe_layer(layer);
    chunk_moe[ch] = chunk_moe[ch] || is_moe;
    const double swap = is_moe ? moe.stored - dense_mlp : 0.0;
    chunk_stored[ch] +=
        layer_activation_bytes(m, c.microbatch_size, c.tp, c.sequence_parallel, mode, p, o.attention_dropout, c.cp) +
        (mode == Recompute::full ? 0.0 : swap);
    chunk_full[ch] += full_layer + swap;
    const double rebuild = mode == Recompute::full        ? std::max(full_layer, full_layer + swap)
                           : mode == Recompute::selective ? probabilities
                                                          : 0.0;
    chunk_backward_peak[ch] = std::max(chunk_backward_peak[ch], chunk_stored[ch] + rebuild);
  });
  double held = 0, rebuilt = 0;  // the in-flight sets, and the largest rebuild on top of them
  for (std::size_t ch = 0; ch < c.virtual_stages; ++ch) {
    const Recompute mode = c.recompute_of(ch * c.pp + rank);
    // Recomputation rebuilds activations for the backward: a whole chunk at once (keeping only its input per
    // in-flight micro-batch), or one layer at a time. A chunk whose blocks differ recomputes block by block: each
    // full block keeps its input and is rebuilt alone, a selective one rebuilds its probabilities, each while the
    // blocks before it still hold theirs (`chunk_backward_peak`).
    const bool by_block = c.mixed_blocks(ch * c.pp + rank);
    if (mode == Recompute::full && o.recompute_whole_chunk && !by_block) {
      held = std::max(held, peak_inflight * p.activation_bytes * sbh / boundary_shard);
      rebuilt = std::max(rebuilt, chunk_full[ch]);
      continue;
    }
    held = std::max(held, peak_inflight * chunk_stored[ch]);
    if (by_block) {
      rebuilt = std::max(rebuilt, chunk_backward_peak[ch] - chunk_stored[ch]);
      continue;
    }
    if (mode == Recompute::full)
      rebuilt =
          std::max(rebuilt, chunk_moe[ch] ? std::max(full_layer, full_layer - dense_mlp + moe.stored) : full_layer);
    else if (mode == Recompute::selective && c.cp == 1)
      // One layer's probabilities, recomputed for its backward (nn::SelfAttention::set_selective_recompute), with
      // their dropout output and mask where the attention drops them out. Ring attention (cp > 1) keeps none to
      // drop.
      rebuilt = std::max(
          rebuilt, (o.attention_dropout ? 2 * p.activation_bytes + p.mask_bytes : p.activation_bytes) * scores / t);
  }
  const bool holds_moe = std::find(chunk_moe.begin(), chunk_moe.end(), true) != chunk_moe.end();
  double act = held + rebuilt;
  // Backward workspace: while a layer runs its backward, the gradients of its widest intermediates
  // (the 4h-wide MLP activation and the attention scores, or an MoE layer's exchange and expert buffers) are
  // alive next to everything stored.
  // (Llama: SwiGLU's gradient of its gate and up, [s b, 2f].)
  const double widest = m.is_llama() ? 2 * s * b * double(m.ffn_size()) : 4 * sbh;
  act += std::max(p.activation_bytes * (widest + scores) / t, holds_moe ? moe.workspace : 0.0);
  // Under sequence parallelism a column-parallel layer all-gathers its kept input again for its backward.
  if (c.sequence_parallel) act += p.activation_bytes * sbh;
  // Context parallelism: a block's input and its token-wise view are copied (whole rows) while it runs.
  if (c.cp > 1) act += 2 * p.activation_bytes * sbh;
  if (rank == 0 && !m.is_llama())                                                  // (Llama has no dropout)
    act += peak_inflight / double(c.virtual_stages) * p.mask_bytes * sbh / shard;  // embedding dropout mask
  if (rank + 1 == c.pp)  // final norm input, output-layer input, fp32 logits for the cross-entropy (one micro-batch)
    act += p.activation_bytes * sbh / shard + p.activation_bytes * sbh / boundary_shard +
           4.0 * s * b * double(m.vocab) / t;
  e.activations = act;

  double comm = 0;
  if (c.pp > 1) {
    const double boundary = p.activation_bytes * sbh / boundary_shard;  // one micro-batch's activation or gradient
    // The sends in flight (never more than the rank sends in a step) and two receive buffers.
    const double sends = double(c.microbatches) * (c.virtual_stages > 1 || (rank > 0 && rank + 1 < c.pp) ? 2.0 : 1.0);
    comm += (std::min(o.sends_in_flight, sends) + 2) * boundary;
  }
  // Tensor parallelism: the all-gathered layer input under sequence parallelism, otherwise the
  // all-reduce's scratch copy of one activation.
  if (c.tp > 1) comm += p.activation_bytes * sbh;
  // Ring attention: the K/V block held and the one arriving, and in backward their dK/dV travelling with them.
  if (c.cp > 1) comm += 8 * p.activation_bytes * sbh / t;
  // Two gradient buckets in flight: ZeRO-2/3's flat buckets; without them mpar reduces its buckets in place,
  // as ranges of the gradient arena (the textbook count keeps two buffers either way).
  const bool in_place_buckets = !shards(c.zero, ZeroStage::gradients) && o.zero1_gradient_shard;
  if (c.data_group() > 1 && !in_place_buckets) comm += 2 * std::min(o.dp_bucket_bytes, psi * p.grad_bytes);
  // ZeRO-3: the unit in use and the next one (prefetched) gathered at once; a unit is a layer, or the
  // embeddings / the head with the word embedding on the first and last pipeline rank (Llama: the word embedding
  // on the first, the final norm with the untied head on the last).
  if (c.zero == ZeroStage::parameters) {
    const double hh = double(m.hidden);
    double layer = 0;  // the largest of the rank's layers, its experts included
    for_each_rank_layer(m, c, rank, [&](std::size_t, std::size_t l) {
      layer = std::max(layer, layer_rank_parameters(m, c, l) + layer_expert_parameters(m, c, l));
    });
    const double word = double(m.vocab) * hh / t;
    const double ends = m.is_llama() ? std::max(rank == 0 ? word : 0.0, rank + 1 == c.pp ? word + hh : 0.0)
                        : rank == 0 || rank + 1 == c.pp ? word + double(m.seq) * hh
                                                        : 0.0;
    comm += (std::max(layer, ends) + layer) * p.weight_bytes;
  }
  e.communication = comm;
  return e;
}

/** The fullest pipeline rank, given each rank's peak in-flight count (size pp). */
[[nodiscard]] inline MemoryEstimate peak_memory(const GptModel& m, const ParallelConfig& c, const Precision& p,
                                                std::span<const double> peak_inflight_per_rank,
                                                const MemoryOptions& o = {}) {
  require(peak_inflight_per_rank.size() == c.pp, "plan::peak_memory: got ", peak_inflight_per_rank.size(),
          " in-flight counts for pp = ", c.pp, " pipeline ranks");
  MemoryEstimate best;
  for (std::size_t r = 0; r < c.pp; ++r) {
    const MemoryEstimate e = rank_memory(m, c, p, r, peak_inflight_per_rank[r], o);
    if (r == 0 || e.total() > best.total()) best = e;
  }
  return best;
}

}  // namespace mpar::plan
