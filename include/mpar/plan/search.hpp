#pragma once
/**
 * @file The strategy search: enumerate tensor x pipeline x data sizes (and, when asked, context-parallel
 * sizes), micro-batch size and count, schedule (and V), recomputation (one setting for every stage, the least
 * each pipeline rank's memory allows, or per block inside each rank's stages the fastest counts of full, selective
 * and no recomputation that fit), ZeRO-1/2/3 and sequence parallelism; reject what cannot run or does not
 * fit (saying why); time the rest with the pipeline simulator; rank by predicted step time.
 *
 * Fast at scale because the pipeline is simulated for one pipeline's P ranks only (data-parallel
 * replicas are identical), the verifier's peak activations are cached per (schedule, P, M, V) and
 * only consulted when memory bounds do not already decide, and candidates are simulated in order of
 * a compute lower bound, stopping once that bound cannot beat the k-th best.
 */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "mpar/core/error.hpp"
#include "mpar/plan/cost_model.hpp"
#include "mpar/plan/memory_model.hpp"
#include "mpar/plan/model.hpp"
#include "mpar/plan/parallel_config.hpp"
#include "mpar/plan/pipeline_timing.hpp"
#include "mpar/plan/stage_partition.hpp"
#include "mpar/plan/topology.hpp"

namespace mpar::plan {

inline constexpr double gib = 1024.0 * 1024.0 * 1024.0;

/** @brief Dimensions of the search; a set field is fixed, an empty one searched. */
struct SearchSpace {
  std::optional<std::size_t> tp, pp, dp, microbatch_size, virtual_stages;
  /// Context-parallel size. Fixed by default, at 1 (sequences are not split); empty to search every divisor of
  /// the GPU count that cuts the sequence into 2 x cp zig-zag chunks (`mpar-plan --cp auto`). Not searched
  /// unless asked because it is a choice for long sequences: at a short one it ties with data parallelism in
  /// time and would win the table on memory alone. The other axes share gpus / cp.
  std::optional<std::size_t> cp = 1;
  /// Expert-parallel size (a divisor of dp): fixed, or empty (the default) to search every divisor of dp that
  /// divides the model's experts. A dense model has ep = 1 only.
  std::optional<std::size_t> ep;
  /// Tensor parallelism inside the experts (`ParallelConfig::etp` = tp): fixed on or off, or empty (the default) to
  /// try both where the model has experts and tp > 1.
  std::optional<bool> expert_tensor_parallel;
  std::optional<ScheduleKind> schedule;
  /// Also try PipeDream-2BW where pp > 1 and no schedule is fixed (`mpar-plan --asynchronous on`). Off by default:
  /// its weights lag one step, which changes what training computes, so it is the user's choice to allow, and the
  /// search then takes it where it is faster and its second weight version fits.
  bool asynchronous = false;
  std::optional<Recompute> recompute;
  /// Constraints on the ZeRO stage (`mpar-plan --zero1/--zero2/--zero3 on|off`): whether it shards at least the
  /// optimizer states, the gradients, the parameters; unset: searched.
  std::optional<bool> zero1, zero2, zero3, sequence_parallel;
  std::vector<std::size_t> microbatch_sizes{1, 2, 4, 8};  ///< tried when microbatch_size is not fixed
  std::size_t max_virtual_stages = 8;                     ///< largest V tried for the interleaved schedule
  /// Besides the even split of the blocks over the pp * V stages, try the cost-balanced one
  /// (`balanced_stage_layers`: the embedding and the head weighted in, stages without blocks allowed) where it
  /// differs; `mpar-plan --partition even` turns it off. The trainer runs either (`train_gpt --plan`).
  bool balance_stages = true;
  /// Besides one recomputation setting for every stage, try the per-rank mix where no one setting is the least
  /// every rank fits with: each pipeline rank (all its chunks) takes the least recomputation (none, selective, full)
  /// within the memory budget, as under 1F1B, where rank r holds about pp - r micro-batches in flight, the first
  /// ranks recompute and the last do not. Only when the recomputation is searched (`recompute` unset).
  bool mix_recompute = true;
  /// Besides, where it is tried, the per-block mix (`per_block_recompute`): inside each pipeline rank's chunks some
  /// blocks recompute fully, some selectively, the rest nothing, the fastest counts that fit. Also when pp = 1.
  bool mix_block_recompute = true;
};

/** @brief How the search judges and reports. */
struct SearchOptions {
  std::size_t top_k = 10;                ///< configurations returned
  double usable_memory_fraction = 0.95;  ///< of GPU memory, the rest left to the allocator and runtime
  MemoryOptions memory;
  Placement placement = Placement::tensor_innermost;
};

/** @brief A configuration that fits, with its predicted memory and time. */
struct Candidate {
  ParallelConfig config;
  MemoryEstimate memory;
  double step_seconds = 0;        ///< one optimizer step (global batch)
  double pipeline_seconds = 0;    ///< makespan of the pipeline programs (simulator)
  double dp_exposed_seconds = 0;  ///< data-parallel reduction not hidden behind backward
  double optimizer_seconds = 0;   ///< optimizer step (+ ZeRO-1 weight all-gather)
  double bubble_fraction = 0;     ///< idle share of the pipeline ranks' compute lanes
  double tflops_per_gpu = 0;      ///< hardware FLOPs (recomputation included) per second per GPU
  double samples_per_second = 0;
  GroupPlacement placement;
  Placement ordering = Placement::tensor_innermost;
  std::vector<std::size_t> stage_layers;  ///< blocks per global stage: `config.stage_layers`, or the even split
};

/**
 * @brief The order of the plan's table: the faster step first; at equal modelled time the smaller per-GPU peak
 * (more headroom), then the even stage partition (the trainer runs it), then the lower ZeRO stage (fewer collectives per step and a simpler checkpoint for the same
 * result: under pipeline micro-batching ZeRO-2 holds the accumulated gradients in full and saves nothing over
 * ZeRO-1), then less recomputation before more.
 */
inline bool ranks_before(const Candidate& a, const Candidate& b) {
  const auto key = [](const Candidate& c) {
    return std::tuple(c.step_seconds, c.memory.total(), !c.config.stage_layers.empty(),
                      parallel::stage_number(c.config.zero), int(c.config.recompute));
  };
  return key(a) < key(b);
}

/** @brief A configuration the search did not keep, and why. `kind` groups reasons for counting. */
struct Rejection {
  ParallelConfig config;
  std::string kind;    ///< "heads", "topology", "layers", "batch", "schedule", "memory", "bound"
  std::string reason;  ///< a sentence naming the sizes and what would change it
};

/** @brief The search's answer. */
struct Plan {
  std::vector<Candidate> best;      ///< fastest first
  std::vector<Rejection> rejected;  ///< the first few of each kind
  std::map<std::string, std::size_t> rejected_by_kind;
  std::size_t considered = 0, simulated = 0, verified_shapes = 0;
  bool balance_stages = false;  ///< whether cost-balanced stage partitions were searched (`SearchSpace`)
  std::size_t balanced = 0;     ///< configurations also tried with a cost-balanced stage partition (it differed)
  /// Configurations with recomputation chosen per pipeline rank (`SearchSpace::mix_recompute`), counted in
  /// `considered` too.
  std::size_t mixed = 0;
  std::size_t mixed_blocks = 0;            ///< of `mixed`, those with recomputation chosen per block inside the stages
  std::vector<std::size_t> context_sizes;  ///< the context-parallel sizes searched (one when fixed)
  /** The best configuration again with its tensor groups spread over nodes (data-innermost ordering), when that differs. */
  std::optional<Candidate> broken_topology;
};

/** @brief A problem: model, cluster and the global batch (sequences per optimizer step). */
struct Problem {
  GptModel model;
  Cluster cluster;
  std::size_t global_batch = 0;
  void validate() const {
    model.validate();
    cluster.validate();
    require(global_batch > 0, "problem: --global-batch must be at least 1");
  }
};

namespace detail {

[[nodiscard]] inline std::vector<std::size_t> divisors(std::size_t n) {
  std::vector<std::size_t> d;
  for (std::size_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      d.push_back(i);
      if (i * i != n) d.push_back(n / i);
    }
  std::sort(d.begin(), d.end());
  return d;
}

/**
 * Empty when the fixed sizes of `space` fit `gpus / cp` GPUs per context rank, else why not (naming the option
 * to change).
 */
[[nodiscard]] inline std::string fixed_sizes_problem(const SearchSpace& space, std::size_t gpus, std::size_t cp) {
  const std::size_t N = gpus / cp;  // what tp x pp x dp share
  if (space.tp && space.pp && space.dp && *space.tp * *space.pp * *space.dp != N)
    return cp > 1 ? mpar::detail::cat("--tp ", *space.tp, " x --pp ", *space.pp, " x --dp ", *space.dp, " x --cp ", cp,
                                      " = ", *space.tp * *space.pp * *space.dp * cp, " GPUs, but --gpus is ", gpus,
                                      "; make the product equal --gpus or leave one free")
                  : mpar::detail::cat("--tp ", *space.tp, " x --pp ", *space.pp, " x --dp ", *space.dp, " = ",
                                      *space.tp * *space.pp * *space.dp, " GPUs, but --gpus is ", N,
                                      "; make the product equal --gpus or leave one free");
  for (auto [v, name] : {std::pair{space.tp, "--tp"}, std::pair{space.pp, "--pp"}, std::pair{space.dp, "--dp"}})
    if (v && (*v < 1 || N % *v != 0))
      return mpar::detail::cat(name, " ", *v, " does not divide --gpus ", N, "; choose a divisor of ", N);
  if (space.tp && space.pp && N % (*space.tp * *space.pp) != 0)
    return mpar::detail::cat("--tp ", *space.tp, " x --pp ", *space.pp, " does not divide --gpus ", N);
  return {};
}

/**
 * The context-parallel sizes to search: the fixed one (checked: it divides the GPUs and the fixed sizes fit the
 * rest), or every divisor of the GPU count whose 2 x cp zig-zag chunks divide the sequence and leave room for
 * the fixed sizes. Throws config_error when none is left, saying why.
 */
[[nodiscard]] inline std::vector<std::size_t> context_sizes(const Problem& p, const SearchSpace& space) {
  const std::size_t gpus = p.cluster.gpus;
  if (space.cp) {
    const std::size_t cp = *space.cp;
    require(cp >= 1 && gpus % cp == 0, "--cp ", cp, " does not divide --gpus ", gpus, "; choose a divisor of ", gpus);
    const std::string why = fixed_sizes_problem(space, gpus, cp);
    require(why.empty(), why);
    return {cp};
  }
  std::vector<std::size_t> out;
  std::string first_problem;
  for (std::size_t cp : divisors(gpus)) {
    if (p.model.seq % (2 * cp) != 0 && cp > 1) continue;  // zig-zag chunks: structural_problem says why per config
    std::string why = fixed_sizes_problem(space, gpus, cp);
    if (why.empty())
      out.push_back(cp);
    else if (first_problem.empty())
      first_problem = std::move(why);
  }
  require(!out.empty(), first_problem, " (for every context-parallel size --cp auto tried)");
  return out;
}

/**
 * Parameters of local chunk `chunk` on pipeline rank `rank`, its experts not counted (`chunk_expert_parameters`):
 * its layers plus the embedding pieces of the first and last stage.
 */
[[nodiscard]] inline double chunk_parameters(const GptModel& m, const ParallelConfig& c, std::size_t rank,
                                             std::size_t chunk) {
  const double h = double(m.hidden), t = double(c.tp);
  const std::size_t global = chunk * c.pp + rank, first = first_chunk_layer(m, c, rank, chunk);
  double n = 0;
  for (std::size_t l = first; l < first + chunk_layer_count(m, c, rank, chunk); ++l)
    n += layer_rank_parameters(m, c, l);
  if (m.is_llama()) {  // the word embedding first, the final RMSNorm and the untied head last
    if (global == 0) n += double(m.vocab) * h / t;
    if (global + 1 == c.stages()) n += double(m.vocab) * h / t + h;
    return n;
  }
  if (global == 0) n += double(m.vocab) * h / t + double(m.seq) * h;
  if (global + 1 == c.stages())
    n += (c.pp > 1 ? double(m.vocab) * h / t : 0.0) + 2 * h;  // tied output copy on another rank
  return n;
}
/** The experts local chunk `chunk` on pipeline rank `rank` holds: E / ep of each of its MoE layers. */
[[nodiscard]] inline double chunk_expert_parameters(const GptModel& m, const ParallelConfig& c, std::size_t rank,
                                                    std::size_t chunk) {
  const std::size_t first = first_chunk_layer(m, c, rank, chunk), end = first + chunk_layer_count(m, c, rank, chunk);
  double n = 0;
  for (std::size_t l = first; l < end; ++l) n += layer_expert_parameters(m, c, l);
  return n;
}

/** The expert-parallel sizes to try for `dp` data ranks: the fixed one, else every divisor of dp dividing the experts. */
[[nodiscard]] inline std::vector<std::size_t> expert_sizes(const GptModel& m, const SearchSpace& space,
                                                           std::size_t dp) {
  if (space.ep) return {*space.ep};
  std::vector<std::size_t> out;
  for (std::size_t ep : divisors(dp))
    if (ep == 1 || (m.experts > 0 && m.experts % ep == 0)) out.push_back(ep);
  return out;
}

}  // namespace detail

/**
 * @brief Predicts step time and memory of one configuration (it must be structurally valid: see
 * `structural_problem`). `peaks` supplies the verifier's activation peaks.
 */
[[nodiscard]] inline Candidate evaluate(const CostModel& cm, const ParallelConfig& c, ActivationPeaks& peaks,
                                        const SearchOptions& o = {}, std::optional<Placement> ordering = {}) {
  const GptModel& m = cm.model();
  Candidate r;
  r.config = c;
  r.ordering = ordering.value_or(o.placement);
  r.placement = place(c, cm.cluster().gpus_per_node, r.ordering);
  r.memory = peak_memory(m, c, cm.precision(), peaks(c), o.memory);
  r.stage_layers = stage_layout(m, c);

  StageCosts sc;
  sc.chunk.assign(c.pp, std::vector<ChunkCosts>(c.virtual_stages));
  for (std::size_t rk = 0; rk < c.pp; ++rk)
    for (std::size_t ch = 0; ch < c.virtual_stages; ++ch) sc.chunk[rk][ch] = cm.chunk_costs(c, rk, ch, r.placement);
  sc.p2p = cm.p2p_seconds(c, r.placement);

  double opt = 0, gather = 0;
  for (std::size_t rk = 0; rk < c.pp; ++rk) {
    double params = 0, experts = 0;
    for (std::size_t ch = 0; ch < c.virtual_stages; ++ch) {
      params += detail::chunk_parameters(m, c, rk, ch);
      experts += detail::chunk_expert_parameters(m, c, rk, ch);
    }
    opt = std::max(opt, cm.optimizer_seconds(params, c, experts));
    if (c.zero != parallel::ZeroStage::none && c.data_group() > 1) {
      const double w = cm.precision().weight_bytes;
      const double once =
          best_collective(Collective::all_gather, params * w, r.placement.data, cm.network()).seconds +
          best_collective(Collective::all_gather, experts * w, r.placement.expert_data, cm.network()).seconds;
      // ZeRO-3 gathers every unit before each micro-batch's forward and again before its backward, instead of
      // once after the step; counted as not overlapped (the prefetch hides part of it), so it is an upper bound.
      gather = std::max(gather, c.zero == parallel::ZeroStage::parameters ? 2.0 * double(c.microbatches) * once : once);
    }
  }
  sc.optimizer = opt;
  const PipelineTiming pt = time_pipeline(c, sc);
  r.pipeline_seconds = pt.makespan;
  r.bubble_fraction = pt.bubble_fraction;

  // Data-parallel reduction as the executor overlaps it: each layer's gradient bucket is reduced as
  // soon as the chunk's last backward produces it, one bucket after another on the rank's network lane.
  double lane_end = pt.grads_reference_end;
  if (c.data_group() > 1) {
    for (std::size_t rk = 0; rk < c.pp; ++rk) {
      struct Bucket {
        double ready, params, experts;  // experts: reduced over the ranks holding the same ones
      };
      std::vector<Bucket> buckets;
      for (std::size_t ch = 0; ch < c.virtual_stages; ++ch) {
        const double t0 = pt.grads_ready[rk][ch].first, t1 = pt.grads_ready[rk][ch].second;
        // A chunk without blocks (next to the embedding or the head) still reduces its own parameters: one bucket.
        const std::size_t L = chunk_layer_count(m, c, rk, ch), first = first_chunk_layer(m, c, rk, ch);
        const std::size_t B = std::max<std::size_t>(L, 1);
        const double total = detail::chunk_parameters(m, c, rk, ch), per_bucket = total / double(B);
        for (std::size_t l = 0; l < B; ++l)
          buckets.push_back({t0 + (t1 - t0) * double(l + 1) / double(B), per_bucket,
                             l < L ? layer_expert_parameters(m, c, first + l) : 0.0});
      }
      std::sort(buckets.begin(), buckets.end(), [](const Bucket& a, const Bucket& b) { return a.ready < b.ready; });
      // ZeRO reduce-scatters here and all-gathers the weights after the step (`gather` above).
      double lane = 0;
      for (const Bucket& b : buckets)
        lane = std::max(lane, b.ready) + cm.bucket_reduce_seconds(b.params, c, r.placement) +
               cm.bucket_reduce_seconds(b.experts, c, r.placement, true);
      lane_end = std::max(lane_end, lane);
    }
  }
  r.dp_exposed_seconds = lane_end - pt.grads_reference_end;
  const double finish = pt.makespan + r.dp_exposed_seconds;
  r.optimizer_seconds = (c.schedule == ScheduleKind::two_bw ? 0.0 : opt) + gather;  // 2BW steps inside its programs
  r.step_seconds = finish + r.optimizer_seconds;
  const double batch = double(c.microbatches * c.microbatch_size * c.dp);
  r.samples_per_second = batch / r.step_seconds;
  r.tflops_per_gpu = iteration_flops(m, c, batch) / r.step_seconds / double(c.gpus()) / 1e12;
  return r;
}

/**
 * @brief Memory of the fullest pipeline rank of `c`, with the verifier's activation peaks for its
 * schedule. The entry point for checking the model against a measured run: for fp32 training on the
 * host backend pass `Precision::fp32_host(optimizer bytes per parameter)`.
 */
[[nodiscard]] inline MemoryEstimate estimate_memory(const GptModel& m, const ParallelConfig& c, const Precision& p,
                                                    const MemoryOptions& o = {}) {
  ActivationPeaks peaks;
  return peak_memory(m, c, p, peaks(c), o);
}

/** Empty when `c` can run at all (heads, layers, batch and schedule shape), else a rejection. */
[[nodiscard]] inline std::optional<Rejection> structural_problem(const Problem& p, const ParallelConfig& c) {
  auto rej = [&](const char* kind, std::string why) { return Rejection{c, kind, std::move(why)}; };
  const GptModel& m = p.model;
  if (m.heads % c.tp != 0)
    return rej("heads", mpar::detail::cat("tp=", c.tp, " does not divide the ", m.heads, " attention heads"));
  if (m.is_llama() && m.kv_head_count() % c.tp != 0)
    return rej("heads", mpar::detail::cat("tp=", c.tp, " does not divide the ", m.kv_head_count(),
                                          " key/value heads (Llama's attention is split by whole KV heads)"));
  if (m.ffn_size() % c.tp != 0)
    return rej("heads", mpar::detail::cat("tp=", c.tp, " does not divide the MLP width ", m.ffn_size()));
  if (c.tp > p.cluster.gpus_per_node || p.cluster.gpus_per_node % c.tp != 0)
    return rej(
        "topology",
        mpar::detail::cat("tp=", c.tp, " does not fit inside a node of ", p.cluster.gpus_per_node,
                          " GPUs; tensor-parallel groups must stay on NVLink (choose tp dividing --gpus-per-node)"));
  try {
    (void)place(c, p.cluster.gpus_per_node, Placement::tensor_innermost);
  } catch (const config_error& e) {
    return rej("topology", e.what());
  }
  if (m.layers % (c.pp * c.virtual_stages) != 0)
    return rej("layers", mpar::detail::cat(m.layers, " layers do not split evenly into pp*v = ", c.pp, "*",
                                           c.virtual_stages, " chunks"));
  if (c.virtual_stages > 1 && c.schedule != ScheduleKind::interleaved)
    return rej("schedule", mpar::detail::cat(schedule_name(c.schedule), " runs one chunk per rank; v=",
                                             c.virtual_stages, " needs interleaved_1f1b"));
  if (c.schedule == ScheduleKind::interleaved && c.virtual_stages < 2)
    return rej("schedule", "interleaved_1f1b needs v >= 2 chunks per rank (v = 1 is 1f1b)");
  if (c.cp > 1 && m.seq % (2 * c.cp) != 0)
    return rej("context", mpar::detail::cat("sequence length ", m.seq, " is not divisible by 2 x cp = ", 2 * c.cp,
                                            " (zig-zag chunks)"));
  if (c.ep > 1 && m.experts == 0)
    return rej("experts", mpar::detail::cat("ep=", c.ep, " spreads experts, but the model has none"));
  if (c.ep > 1 && (c.dp % c.ep != 0 || m.experts % c.ep != 0))
    return rej("experts", mpar::detail::cat("ep=", c.ep, " must divide dp=", c.dp,
                                            " (expert ranks are data ranks) and the ", m.experts, " experts"));
  if (c.etp != 1 && (m.experts == 0 || c.etp != c.tp))
    return rej("experts",
               mpar::detail::cat("etp=", c.etp, " splits experts over the tensor ranks: it needs experts and ",
                                 "etp = tp (", c.tp, ")"));
  if (c.sequence_parallel && m.experts > 0)
    return rej("experts",
               "the MoE blocks are not sequence-parallel in mpar (train_gpt refuses it); sp needs a dense "
               "model");
  if (c.cp > 1 && m.experts > 0)
    return rej("context",
               "mpar does not combine context parallelism with experts (the load-balancing statistics "
               "would need the context group); cp > 1 needs a dense model");
  if (c.cp > 1 && c.sequence_parallel)
    return rej("context",
               "sequence parallelism and context parallelism are not combined in mpar (cp > 1 needs sp off)");
  if (p.global_batch % (c.dp * c.microbatch_size) != 0)
    return rej("batch", mpar::detail::cat("global batch ", p.global_batch, " is not a multiple of dp*mbs = ", c.dp, "*",
                                          c.microbatch_size));
  if (std::string why = schedule_problem(c); !why.empty()) return rej("schedule", why);
  if (c.schedule == ScheduleKind::two_bw && c.zero == parallel::ZeroStage::parameters)
    return rej("schedule",
               "2bw keeps a second full weight version, which ZeRO-3's sharded weights do not have (train_gpt "
               "refuses it)");
  return std::nullopt;
}

/**
 * @brief The per-rank recomputation mix of `c` (its stage layout kept): every pipeline rank, all its chunks,
 * recomputes the least (none before selective before full) whose memory fits `budget` with the rank's in-flight
 * activation sets. Empty when some rank fits none of them, or when every rank takes the same (that is a uniform
 * configuration). The mix's `recompute` names the most any rank recomputes.
 */
[[nodiscard]] inline std::optional<ParallelConfig> per_rank_recompute(const GptModel& m, const ParallelConfig& c,
                                                                      const Precision& p, ActivationPeaks& peaks,
                                                                      double budget, const MemoryOptions& o = {}) {
  ParallelConfig probe = c;
  probe.recompute_stages.clear();
  std::vector<Recompute> per_rank(c.pp);
  const std::vector<double>* verified = nullptr;  // asked for only where the bounds 1 and M*V disagree
  for (std::size_t r = 0; r < c.pp; ++r) {
    bool found = false;
    for (Recompute mode : {Recompute::none, Recompute::selective, Recompute::full}) {
      probe.recompute = mode;
      // A rank's memory depends on its own chunks' modes only: the uniform setting stands for the rank's choice.
      const auto need = [&](double inflight) { return rank_memory(m, probe, p, r, inflight, o).total(); };
      bool fits = need(double(c.microbatches * c.virtual_stages)) <= budget;
      if (!fits && need(1.0) <= budget) {
        if (!verified) verified = &peaks(c);
        fits = need((*verified)[r]) <= budget;
      }
      if (fits) {
        per_rank[r] = mode, found = true;
        break;
      }
    }
    if (!found) return std::nullopt;
  }
  if (std::all_of(per_rank.begin(), per_rank.end(), [&](Recompute x) { return x == per_rank.front(); }))
    return std::nullopt;
  ParallelConfig mixed = c;
  mixed.recompute = *std::max_element(per_rank.begin(), per_rank.end());
  mixed.recompute_stages.resize(c.stages());
  for (std::size_t s = 0; s < c.stages(); ++s) mixed.recompute_stages[s] = per_rank[s % c.pp];
  return mixed;
}

/**
 * @brief The per-block recomputation of `c` (its stage layout kept), Galvatron's inner level: on every pipeline
 * rank, of the n blocks each of its chunks holds, f recompute fully, s selectively and the rest nothing, (f, s)
 * the pair of least modelled time, f T_full + s T_selective + (n - f - s) T_none per micro-batch (T: a block's
 * forward and backward), whose memory fits `budget`; among equally fast pairs the one recomputing the fewest
 * blocks, then the fewest fully. The blocks of a dense model's stage cost alike, so the knapsack over blocks is one
 * over counts, and exact: for each f the least fitting s is the fastest, and since the memory falls as s grows
 * (once one selective block's rebuild is counted) it is found by bisection. A stage lists its full blocks first,
 * then the selective ones. Empty when some rank fits no pair, when the model has experts (its blocks differ), when
 * a rank's chunks hold different block counts, or when no stage mixes its blocks (that is a uniform or per-rank
 * configuration).
 */
[[nodiscard]] inline std::optional<ParallelConfig> per_block_recompute(const GptModel& m, const ParallelConfig& c,
                                                                       const CostModel& cm, const GroupPlacement& g,
                                                                       ActivationPeaks& peaks, double budget,
                                                                       const MemoryOptions& o = {}) {
  if (m.experts > 0) return std::nullopt;
  using enum Recompute;
  const auto seconds = [&](Recompute mode) {
    const ChunkCosts l = cm.layer_costs(c, g, false, mode);
    return l.forward + l.backward_input + l.backward_weight;
  };
  const double t_none = seconds(none), t_selective = seconds(selective), t_full = seconds(full);
  ParallelConfig mixed = c;
  mixed.recompute_stages.assign(c.stages(), c.recompute);
  mixed.recompute_blocks.assign(c.stages(), {});
  const std::vector<double>* verified = nullptr;  // asked for only where the bounds 1 and M*V disagree
  bool any_mixed = false;
  for (std::size_t r = 0; r < c.pp; ++r) {
    const std::size_t n = chunk_layer_count(m, c, r, 0);
    for (std::size_t ch = 1; ch < c.virtual_stages; ++ch)
      if (chunk_layer_count(m, c, r, ch) != n) return std::nullopt;
    // The rank's chunks with f full and s selective blocks each; the other ranks' lists do not change its memory.
    const auto set = [&](std::size_t f, std::size_t s) {
      for (std::size_t ch = 0; ch < c.virtual_stages; ++ch) {
        std::vector<Recompute>& b = mixed.recompute_blocks[ch * c.pp + r];
        b.assign(n, none);
        std::fill(b.begin(), b.begin() + std::ptrdiff_t(f), full);
        std::fill(b.begin() + std::ptrdiff_t(f), b.begin() + std::ptrdiff_t(f + s), selective);
        mixed.recompute_stages[ch * c.pp + r] = f > 0 ? full : s > 0 ? selective : none;
      }
    };
    const auto fits = [&](std::size_t f, std::size_t s) {
      set(f, s);
      const auto need = [&](double inflight) { return rank_memory(m, mixed, cm.precision(), r, inflight, o).total(); };
      if (need(double(c.microbatches * c.virtual_stages)) <= budget) return true;
      if (need(1.0) > budget) return false;
      if (!verified) verified = &peaks(c);
      return need((*verified)[r]) <= budget;
    };
    std::optional<std::tuple<double, std::size_t, std::size_t>> best;  // (time, recomputed blocks, full blocks)
    for (std::size_t f = 0; f <= n; ++f) {
      std::optional<std::size_t> least;
      if (fits(f, 0)) {
        least = 0;
      } else if (f < n && fits(f, n - f)) {
        std::size_t lo = 1, hi = n - f;  // fits(f, hi); find the least s in [lo, hi] that fits
        while (lo < hi) {
          const std::size_t mid = lo + (hi - lo) / 2;
          if (fits(f, mid))
            hi = mid;
          else
            lo = mid + 1;
        }
        least = hi;
      }
      if (!least) continue;
      const std::size_t s = *least;
      const auto key =
          std::make_tuple(double(f) * t_full + double(s) * t_selective + double(n - f - s) * t_none, f + s, f);
      if (!best || key < *best) best = key;
    }
    if (!best) return std::nullopt;
    const std::size_t f = std::get<2>(*best), s = std::get<1>(*best) - f;
    set(f, s);
    const bool mixes = (f > 0) + (s > 0) + (f + s < n) > 1;
    any_mixed = any_mixed || mixes;
    if (!mixes)  // every block alike: the stage's mode says it
      for (std::size_t ch = 0; ch < c.virtual_stages; ++ch) mixed.recompute_blocks[ch * c.pp + r].clear();
  }
  if (!any_mixed) return std::nullopt;
  mixed.recompute = *std::max_element(mixed.recompute_stages.begin(), mixed.recompute_stages.end());
  return mixed;
}

/** Searches `space` for `p`; see the file comment. Throws config_error when fixed sizes contradict the cluster. */
[[nodiscard]] inline Plan search(const Problem& p, const CostModel& cm, const SearchSpace& space = {},
                                 const SearchOptions& o = {}) {
  p.validate();
  const std::vector<std::size_t> context_sizes = detail::context_sizes(p, space);
  if (space.microbatch_size) require(*space.microbatch_size >= 1, "--microbatch-size must be at least 1");
  if (space.virtual_stages) require(*space.virtual_stages >= 1, "--virtual-stages must be at least 1");
  if (space.ep)
    require(*space.ep == 1 || (p.model.experts > 0 && p.model.experts % *space.ep == 0), "--ep ", *space.ep,
            p.model.experts == 0 ? mpar::detail::cat(" spreads experts, but the model has none; add --experts N")
                                 : mpar::detail::cat(" does not divide the ", p.model.experts,
                                                     " experts; choose a divisor of --experts"));

  Plan plan;
  plan.context_sizes = context_sizes;
  plan.balance_stages = space.balance_stages;
  const double budget = p.cluster.memory_bytes * o.usable_memory_fraction;
  ActivationPeaks peaks;
  std::map<std::string, std::size_t> examples;
  auto reject = [&](Rejection r) {
    ++plan.rejected_by_kind[r.kind];
    auto& n = examples[r.kind];
    if (n >= 3) return;  // a few distinct examples per kind are enough to say why
    for (const Rejection& x : plan.rejected)
      if (x.kind == r.kind && x.reason == r.reason) return;
    ++n;
    plan.rejected.push_back(std::move(r));
  };

  struct Feasible {
    ParallelConfig c;
    double bound;
  };
  std::vector<Feasible> feasible;
  // The balanced layout depends on the per-block costs only, not on the schedule, micro-batch count or ZeRO.
  std::map<std::tuple<std::size_t, std::size_t, std::size_t, std::size_t, std::size_t, Recompute, int, std::size_t,
                      std::size_t>,
           std::vector<std::size_t>>
      layouts;
  // The fullest rank's memory as far as the budget needs it told: activations grow with the in-flight count,
  // between 1 and M*V; the verifier decides only in between.
  auto memory_need = [&](const ParallelConfig& c) {
    std::vector<double> lo(c.pp, 1.0), hi(c.pp, double(c.microbatches * c.virtual_stages));
    const double need_lo = peak_memory(p.model, c, cm.precision(), lo, o.memory).total();
    if (need_lo <= budget && peak_memory(p.model, c, cm.precision(), hi, o.memory).total() > budget)
      return peak_memory(p.model, c, cm.precision(), peaks(c), o.memory).total();
    return need_lo;
  };
  // Memory, then a compute lower bound; what fits joins the candidates to simulate.
  auto admit = [&](const ParallelConfig& c) {
    const std::size_t pp = c.pp, v = c.virtual_stages;
    const double need = memory_need(c);
    if (need > budget) {
      reject({c, "memory",
              mpar::detail::cat("needs at least ", std::round(need / gib * 10) / 10, " GiB per GPU but ",
                                std::round(budget / gib * 10) / 10, " GiB are usable (", o.usable_memory_fraction * 100,
                                " % of ", p.cluster.memory_bytes / gib,
                                " GiB); more recomputation, ZeRO-1, ZeRO-2 or ZeRO-3, larger tp/pp",
                                p.model.experts > 0 ? ", a larger ep" : "", " or a smaller micro-batch would help")});
      return false;
    }
    // Lower bound: the busiest rank computes M micro-batches through all its chunks without a gap.
    const GroupPlacement g = place(c, p.cluster.gpus_per_node, o.placement);
    double bound = 0;
    for (std::size_t rk = 0; rk < pp; ++rk) {
      double work = 0;
      for (std::size_t ch = 0; ch < v; ++ch) {
        const ChunkCosts cc = cm.chunk_costs(c, rk, ch, g);
        work += cc.forward + cc.backward();
      }
      bound = std::max(bound, work * double(c.microbatches));
    }
    feasible.push_back({c, bound});
    return true;
  };

  // Whether `c`'s stage layout fits with no recomputation at all: where it does, no mix can recompute less.
  auto fits_without_recompute = [&](const ParallelConfig& c) {
    ParallelConfig none = c;
    none.recompute = Recompute::none;
    return memory_need(none) <= budget;
  };
  // The recomputation mixes of a configuration that fits with full recomputation (its stage layout kept, even or
  // balanced): the least each pipeline rank fits with, and per block inside each rank's stages.
  auto try_recompute_mixes = [&](const ParallelConfig& c) {
    if (!space.mix_recompute || space.recompute) return;
    if (c.pp > 1)
      if (auto mixed = per_rank_recompute(p.model, c, cm.precision(), peaks, budget, o.memory)) {
        ++plan.considered, ++plan.mixed;
        admit(*mixed);
      }
    if (space.mix_block_recompute)
      if (auto blocks = per_block_recompute(p.model, c, cm, place(c, p.cluster.gpus_per_node, o.placement), peaks,
                                            budget, o.memory)) {
        ++plan.considered, ++plan.mixed, ++plan.mixed_blocks;
        admit(*blocks);
      }
  };

  for (std::size_t cp : context_sizes) {
    const std::size_t N = p.cluster.gpus / cp;  // GPUs per context rank: what tp x pp x dp share
    const std::vector<std::size_t> all = detail::divisors(N);
    for (std::size_t tp : all) {
      if (space.tp && tp != *space.tp) continue;
      for (std::size_t pp : all) {
        if (space.pp && pp != *space.pp) continue;
        if (N % (tp * pp) != 0 || pp > p.model.layers) continue;
        const std::size_t dp = N / (tp * pp);
        if (space.dp && dp != *space.dp) continue;
        for (std::size_t ep : detail::expert_sizes(p.model, space, dp)) {
          std::vector<ScheduleKind> schedules;
          if (space.schedule)
            schedules = {*space.schedule};
          else if (pp == 1)
            schedules = {ScheduleKind::one_f_one_b};  // one stage: every synchronous schedule is the same
          else
            schedules = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved, ScheduleKind::zb_h1,
                         ScheduleKind::zb_h2};
          if (space.asynchronous && !space.schedule && pp > 1) schedules.push_back(ScheduleKind::two_bw);
          std::vector<std::size_t> mbss =
              space.microbatch_size ? std::vector<std::size_t>{*space.microbatch_size} : space.microbatch_sizes;
          for (std::size_t mbs : mbss)
            for (ScheduleKind s : schedules) {
              std::vector<std::size_t> vs;
              if (space.virtual_stages)
                vs = {*space.virtual_stages};
              else if (s == ScheduleKind::interleaved)
                for (std::size_t v = 2; v <= space.max_virtual_stages; ++v) vs.push_back(v);
              else
                vs = {1};
              for (std::size_t v : vs) {
                // Whether the even split fits with no recomputation, per ZeRO stage, SP and expert tensor parallelism:
                // where it does not and full recomputation does, the per-rank mix of the two is tried.
                bool none_fits[4][4] = {};
                for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
                  if (space.recompute && rc != *space.recompute) continue;
                  for (int z = 0; z < 4;
                       ++z) {  // ZeRO stage: 0, 1 (states sharded), 2 (gradients too), 3 (parameters too)
                    if (space.zero1 ? (bool(z) != *space.zero1) : (z >= 1 && dp * cp == 1)) continue;
                    if (space.zero2 ? ((z >= 2) != *space.zero2) : (z == 2 && dp * cp == 1))
                      continue;  // ZeRO-3 shards gradients too
                    if (space.zero3 ? ((z == 3) != *space.zero3) : (z == 3 && dp * cp == 1)) continue;
                    for (int mode = 0; mode < 4; ++mode) {  // sequence parallelism (bit 0), expert tp (bit 1)
                      const int spi = mode & 1;
                      const bool etp = (mode & 2) != 0;
                      if (space.sequence_parallel ? (bool(spi) != *space.sequence_parallel)
                                                  : (spi == 1 && (tp == 1 || cp > 1)))
                        continue;
                      if (space.expert_tensor_parallel ? (etp != *space.expert_tensor_parallel)
                                                       : (etp && (tp == 1 || p.model.experts == 0)))
                        continue;
                      ParallelConfig c;
                      c.tp = tp, c.pp = pp, c.dp = dp, c.cp = cp, c.ep = ep, c.microbatch_size = mbs, c.schedule = s,
                      c.virtual_stages = v;
                      c.recompute = rc, c.zero = parallel::zero_stage_from_number(z), c.sequence_parallel = bool(spi);
                      c.etp = etp ? tp : 1;
                      c.microbatches = std::max<std::size_t>(1, p.global_batch / (dp * mbs));
                      ++plan.considered;
                      if (auto why = structural_problem(p, c)) {
                        reject(std::move(*why));
                        continue;
                      }
                      // Besides the even split, the cost-balanced partition (the embedding and the head weighted
                      // in), when it differs, and where that does not fit the balanced one within each stage's
                      // memory: the simulator decides which is fastest.
                      const bool even_fits = admit(c);
                      if (rc == Recompute::none) none_fits[z][mode] = even_fits;
                      if (rc == Recompute::full && even_fits && !none_fits[z][mode]) try_recompute_mixes(c);
                      if (space.balance_stages && c.stages() > 1) {
                        const GroupPlacement g = place(c, p.cluster.gpus_per_node, o.placement);
                        const auto key = std::make_tuple(tp, cp, ep, dp, mbs, rc, mode, pp, v);
                        auto it = layouts.find(key);
                        if (it == layouts.end()) it = layouts.emplace(key, balanced_stage_layers(cm, c, g)).first;
                        const std::vector<std::size_t> even = stage_layout(p.model, c);
                        bool tried = false, fits = even_fits;
                        ParallelConfig balanced = c;
                        if (it->second != even) {
                          balanced.stage_layers = it->second;
                          tried = true;
                          fits = admit(balanced);
                          if (rc == Recompute::full && fits && !fits_without_recompute(balanced))
                            try_recompute_mixes(balanced);
                        }
                        // With one set in flight per rank every block costs every rank the same memory, so the
                        // ranks' total does not depend on the layout: above pp budgets no layout fits, and most
                        // configurations that cannot fit are told without verifying their schedule.
                        const auto room_for = [&](const std::vector<std::size_t>& limits) {
                          std::size_t room = 0;
                          for (std::size_t n : limits) room += n;
                          return !limits.empty() && room >= p.model.layers;
                        };
                        double least_total = 0;
                        if (!fits && v == 1 && p.model.experts == 0)
                          for (std::size_t r = 0; r < pp; ++r)
                            least_total += rank_memory(p.model, c, cm.precision(), r, 1.0, o.memory).total();
                        if (!fits && v == 1 && p.model.experts == 0 && least_total <= double(pp) * budget) {
                          std::vector<std::size_t> limits =
                              stage_layer_limits(p.model, c, cm.precision(), peaks(c), budget, o.memory);
                          if (room_for(limits)) {
                            std::vector<std::size_t> capped = balanced_stage_layers(cm, c, g, std::move(limits));
                            if (capped != even && capped != it->second) {
                              balanced.stage_layers = std::move(capped);
                              tried = true;
                              if (admit(balanced) && rc == Recompute::full && !fits_without_recompute(balanced))
                                try_recompute_mixes(balanced);
                            }
                          }
                        }
                        if (tried) ++plan.balanced;
                      }
                    }
                  }
                }
              }
            }
        }
      }
    }
  }

  std::stable_sort(feasible.begin(), feasible.end(),
                   [](const Feasible& a, const Feasible& b) { return a.bound < b.bound; });
  for (const Feasible& f : feasible) {
    if (plan.best.size() >= o.top_k && f.bound >= plan.best.back().step_seconds) {
      reject({f.c, "bound",
              mpar::detail::cat("cannot beat the slowest of the best ", o.top_k, " (", plan.best.back().step_seconds,
                                " s): its busiest rank alone computes for ", f.bound, " s")});
      continue;
    }
    Candidate cand = evaluate(cm, f.c, peaks, o);
    ++plan.simulated;
    if (cand.memory.total() > budget) {  // the verifier's exact peaks can exceed the lower bound that let it through
      reject({f.c, "memory",
              mpar::detail::cat("needs ", std::round(cand.memory.total() / gib * 10) / 10, " GiB per GPU but ",
                                std::round(budget / gib * 10) / 10, " GiB are usable")});
      continue;
    }
    auto at = std::upper_bound(plan.best.begin(), plan.best.end(), cand, ranks_before);
    plan.best.insert(at, std::move(cand));
    if (plan.best.size() > o.top_k) plan.best.pop_back();
  }
  plan.verified_shapes = peaks.verified();

  if (!plan.best.empty()) {
    const ParallelConfig& c = plan.best.front().config;
    try {
      const GroupPlacement broken = place(c, p.cluster.gpus_per_node, Placement::data_innermost);
      if (!broken.tensor_inside_node()) plan.broken_topology = evaluate(cm, c, peaks, o, Placement::data_innermost);
    } catch (const config_error&) {
      // data-innermost groups would not even sit evenly on nodes here: nothing to compare against
    }
  }
  return plan;
}

}  // namespace mpar::plan
