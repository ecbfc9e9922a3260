#pragma once
/**
 * @file Hybrid tensor × pipeline × data (× context, × expert) training of the GPT model on one rank of a
 * device mesh.
 *
 * `GptTrainer` is what `examples/train_gpt` runs, and what the equivalence tests drive: every rank of
 * a `tp × cp × pp × dp` mesh constructs one with the same configuration and calls `train_step()` in
 * lockstep. Per step it
 * 1. takes its data-parallel block of the global batch (a pure function of the step, so every layout
 *    trains on the same samples) and splits it into micro-batches;
 * 2. runs the pipeline schedule's program through `pipeline::Executor` (tensor-parallel collectives
 *    inside the layers, activations and gradients between stages); as each layer's gradients become
 *    final in the last micro-batch, its data-parallel bucket starts reducing (overlap);
 * 3. sums the tied embedding / head gradients over the first and last pipeline stage;
 * 4. hands the rest to its optimizer, one `parallel::DistributedOptimizer` composed from the configuration
 *    (precision, gradient sync, update rule; see docs/training.md): `optimizer.step(lr)` finishes the
 *    data-parallel reduction (plain all-reduce, or ZeRO-1 reduce-scatter), computes the global gradient norm
 *    in rank memory (tensor and pipeline groups; replicas and the tied copy counted once), turns it into the
 *    kernels' factors (clipping x 1 / loss scale; the f16 overflow skip) on the device, steps AdamW or SGD
 *    with the warm-up + cosine learning rate, and reads the step's statistics (loss, aux loss, norm, skip)
 *    back once;
 * 5. copies the embedding to the head's tied copy. The norm, the factors and the update are operations of
 *    the backend `B`, like the layers', so a CUDA rank runs them on its device.
 *
 * A captured step (`GptTrainConfig::graph`, docs/training.md): on a backend that models `graph_backend`, the steps
 * after `graph_warmup` eager ones are launches of the step captured once; its inputs (token ids, targets, the learning
 * rate) come in through pinned staging and fixed rank buffers, and the host reads the statistics after the launch.
 *
 * Context parallelism (`cp > 1`, docs/context-parallel.md): ranks are ordered tensor, context, data, pipeline
 * (Megatron-LM's tp-cp-dp-pp); the mesh's data axis holds data x context ranks, context innermost. Each context
 * rank takes zig-zag chunks r and 2 cp - 1 - r of every sequence of its data rank's batch, its blocks attend by
 * a ring over the cp ranks, and the gradients are averaged over data x context (every parameter is a replica
 * on the cp ranks, each holding its tokens' share): the loss and every update equal the single-rank run's.
 *
 * Expert parallelism (`ep > 1`, a model with MoE blocks) lives inside data parallelism, as in
 * Megatron-LM and DeepSpeed-MoE: the batch is split over dp x ep ranks; parameters outside the experts
 * are replicated over them and their gradients averaged over all dp x ep ranks; each expert lives on one
 * expert rank of each data replica and its gradient (which already holds every token routed to it from
 * the expert group) is averaged over the data group and divided by ep. With MoE, micro-batch m of the
 * step is the same set of sequences under every layout (each token-group rank takes its share of it),
 * and the load-balancing statistics are all-reduced over that token group, so routing, losses and every
 * gradient equal the single-rank run's.
 *
 * ZeRO-3 (`zero = 3`): the weights are sharded over the data group at rest (this rank keeps its fp32 block of
 * each bucket); each stage gathers a unit — the embeddings, a block, the head — just before its forward and its
 * input-gradient backward and releases it right after, with the next unit's gather in flight meanwhile
 * (`GptPipelinePart::on_unit_use`, `parallel::GatheredUnits`). Saving, loading and `with_full_parameters` gather all.
 *
 * PipeDream-2BW (`schedule = ScheduleKind::two_bw`): the weights lag one step by design. The passes of step t run on
 * W(t-1), the weights before step t-1's update (at step 0, with no older version, on W(0)), and step t's
 * update applies their gradient to the current W(t): W(t+1) = update(W(t), g(W(t-1))). Each rank keeps
 * W(t-1) beside W(t) (one more fp32 copy of its parameters) and swaps it in for the passes. The reference
 * it trains to is the synchronous single-rank run with that stash done by hand (tests/models, docs/pipeline.md).
 * `train_step` runs each step as one program (1F1B order), so steps are separated by a flush and the bubble is
 * 1F1B's; `train_steps(k)` runs k steps as one program without a flush (fp32, bf16): each stage updates right after its
 * last backward of a step while the first stages already run the next step's forwards, a micro-batch's backward
 * on its forward's version, with the same numbers (`StepReport::idle_slots` per step: 1F1B's 3 (pp - 1) per rank
 * for the program's first step, 2 (pp - 1) for each later one). A checkpoint holds W(t-1) too, so a resumed run
 * continues with lag 1.
 *
 * Mixed precision (`bf16`, `f16`), with the numerics of GPU AMP: the passes run inside an
 * `nn::Autocast` scope of the 16-bit type, so the linear layers' GEMMs take 16-bit weights and
 * activations and accumulate in fp32 (outputs fp32); layer norm, softmax, GeLU, the loss and the
 * optimizer's fp32 master weights stay fp32 (the other weights the passes read are rounded to the
 * 16-bit type by the optimizer's `begin_compute`).
 */
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "mpar/backend/detail/graph_backend.hpp"
#include "mpar/backend/host_staging.hpp"
#include "mpar/comm/communicator.hpp"
#include "mpar/comm/host_message_communicator.hpp"
#include "mpar/comm/mesh_comms.hpp"
#include "mpar/comm/same_on_every_rank.hpp"
#include "mpar/core/mesh.hpp"
#include "mpar/data/char_dataset.hpp"
#include "mpar/data/token_source.hpp"
#include "mpar/io/blocks.hpp"
#include "mpar/io/checkpoint.hpp"
#include "mpar/io/safetensors_gpt2.hpp"
#include "mpar/io/staged_blocks.hpp"
#include "mpar/io/training_checkpoint.hpp"
#include "mpar/models/gpt.hpp"
#include "mpar/nn/autocast.hpp"
#include "mpar/nn/rank_tokens.hpp"
#include "mpar/nn/recompute.hpp"
#include "mpar/observe/timed_communicator.hpp"
#include "mpar/optim/adamw.hpp"
#include "mpar/optim/clip.hpp"
#include "mpar/optim/loss_scaler.hpp"
#include "mpar/optim/lr_schedule.hpp"
#include "mpar/optim/sgd.hpp"
#include "mpar/parallel/distributed_optimizer.hpp"
#include "mpar/parallel/gathered_units.hpp"
#include "mpar/pipeline/executor.hpp"
#include "mpar/pipeline/partition.hpp"
#include "mpar/pipeline/schedules.hpp"
#include "mpar/pipeline/simulator.hpp"
#include "mpar/train/batch_slicing.hpp"
#include "mpar/train/captured_step.hpp"
#include "mpar/train/resume_checks.hpp"
#include "mpar/train/step_metrics.hpp"
#include "mpar/train/tied_across_stages.hpp"
#include "mpar/train/weight_lag.hpp"

namespace mpar::models {

/** @brief Everything a training run needs to know; `validate` checks it against the world size first. */
struct GptTrainConfig {
  GptConfig model;
  std::size_t tp = 1, pp = 1, dp = 1;
  std::size_t ep = 1;  ///< expert-parallel size (needs model.experts, a multiple of it)
  /// Context-parallel size: each sequence split over cp ranks in zig-zag chunks, attention by a ring over them
  /// (docs/context-parallel.md). Rank order tensor, context, data, pipeline (Megatron-LM's tp-cp-dp-pp).
  std::size_t cp = 1;
  /// The pipeline schedule (`--schedule`): 2BW's weights lag one step (see GptTrainer).
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::one_f_one_b;
  int microbatches = 2;    ///< per data-parallel rank and step
  int chunks = 1;          ///< model chunks per pipeline rank (interleaved_1f1b)
  bool recompute = false;  ///< full activation recomputation on every stage (--recompute)
  /// Transformer blocks per global pipeline stage (--stage-layers): pp x chunks entries, stage s = chunk x pp + rank
  /// as `pipeline::global_stage` numbers them, summing to `model.layers` (a stage may hold none). Empty: the even
  /// split.
  std::vector<std::size_t> stage_layers;
  /// Per global stage (same order), what it recomputes in backward (--recompute-stages): nothing, the attention
  /// core's probabilities (selective) or the whole stage (full). Empty: `recompute` on every stage. Giving both is
  /// refused.
  std::vector<nn::Recompute> recompute_stages;
  /// Optionally, per global stage, what each of its blocks recomputes (--recompute-stages with a stage written as
  /// its blocks' modes joined by ':', e.g. full:none,none): empty, or one entry per stage, each empty (every block
  /// as the stage) or one mode per block of the stage, the most of them being the stage's `recompute_stages` entry.
  /// A stage whose blocks differ recomputes block by block: a full block keeps only its input and reruns its own
  /// forward, instead of the executor rerunning the whole stage.
  std::vector<std::vector<nn::Recompute>> recompute_blocks;
  parallel::Precision precision = parallel::Precision::fp32;     ///< f16 adds dynamic loss scaling
  parallel::UpdateRule optimizer = parallel::UpdateRule::adamw;  ///< SGD with momentum 0.9, or AdamW
  parallel::ZeroStage zero = parallel::ZeroStage::none;          ///< what is sharded over the data axis (--zero N)
  std::size_t global_batch = 8;  ///< sequences per optimizer step, over all data-parallel ranks
  std::size_t steps = 100;
  double lr = 3e-3, min_lr = 3e-4;
  std::size_t warmup = 10;
  float weight_decay = 0.01f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  ///< AdamW (and ZeRO-1 AdamW) moments and denominator
  /// Which parameters weight decay applies to; empty: `optim::decays_weight_matrices` (matrices and embeddings;
  /// no bias, the fused QKV bias [3, hidden] included, and no layer-norm parameter).
  std::function<bool(const nn::Parameter&)> decays;
  double clip = 1.0;  ///< global-norm clipping threshold; 0 disables clipping
  std::size_t bucket_bytes = std::size_t(1) << 20;
  std::uint64_t data_seed = 1234;
  /// Capture the training step once and replay it (CUDA Graphs, `graph_backend`; --graph): the first
  /// `graph_warmup` steps run eagerly, the next one is captured and launched, and every later `train_step()`
  /// writes the step's token ids, targets and learning rate into pinned staging and launches the graph, whose
  /// first operations copy them into fixed rank buffers (PyTorch's warm-up-then-capture pattern). fp32
  /// or bf16, AdamW without ZeRO, over tensor and data parallelism; `validate` refuses the layouts whose step cannot
  /// be captured yet (pipeline, context, experts, f16, SGD, ZeRO; docs/cuda.md).
  bool graph = false;
  /// Eager steps before the capture (--graph-warmup; at least 1: it allocates what the step keeps — staging,
  /// 16-bit copies — and carries AdamW's count into rank memory, waits a capture could not hold).
  std::size_t graph_warmup = 3;
  /// Top-k gradient compression with error feedback over the data group (--grad-topk; 0: the dense all-reduce):
  /// each replica sends this share of every gradient tensor, its largest entries of gradient + residual, and carries
  /// the rest into the next step (`parallel::GradSync::topk`, docs/training.md). dp (x cp) > 1, no ZeRO, no experts
  /// over ranks (ep 1), fp32 or bf16, host backend; `validate` refuses the rest naming the fix.
  double grad_topk_density = 0;

  [[nodiscard]] std::size_t world_size() const { return tp * cp * pp * dp * ep; }
  /** Global pipeline stages: pp x chunks. */
  [[nodiscard]] std::size_t stages() const { return pp * std::size_t(std::max(chunks, 1)); }
  /** The blocks of each global stage: `stage_layers`, or the even split. Throws as `validate` does. */
  [[nodiscard]] pipeline::Partition partition() const {
    if (stage_layers.empty()) return pipeline::Partition::even(model.layers, stages());
    validate_stage_layers();
    return {model.layers, stage_layers, pipeline::EmptyStages::allowed};
  }
  /** What global stage `s` recomputes in backward. */
  [[nodiscard]] nn::Recompute recompute_of(std::size_t s) const {
    if (!recompute_stages.empty()) return recompute_stages.at(s);
    return recompute ? nn::Recompute::full : nn::Recompute::none;
  }
  /** What block `b` (counted from the stage's first) of global stage `s` recomputes. */
  [[nodiscard]] nn::Recompute block_recompute_of(std::size_t s, std::size_t b) const {
    if (recompute_blocks.empty() || recompute_blocks.at(s).empty()) return recompute_of(s);
    return recompute_blocks[s].at(b);
  }
  /** Whether the blocks of global stage `s` recompute differently (the stage then recomputes block by block). */
  [[nodiscard]] bool mixed_blocks(std::size_t s) const {
    if (recompute_blocks.empty()) return false;
    const auto& b = recompute_blocks.at(s);
    return std::any_of(b.begin(), b.end(), [&](nn::Recompute r) { return r != b.front(); });
  }
  /**
   * "none,selective,full": per-stage modes as --recompute-stages takes them; a stage with per-block modes
   * (`blocks`, empty or one list per stage) as its blocks' modes joined by ':' ("full:none,selective").
   */
  [[nodiscard]] static std::string join_recompute(const std::vector<nn::Recompute>& v,
                                                  const std::vector<std::vector<nn::Recompute>>& blocks = {}) {
    std::string out;
    for (std::size_t i = 0; i < v.size(); ++i) {
      out += i ? "," : "";
      if (i < blocks.size() && !blocks[i].empty())
        for (std::size_t b = 0; b < blocks[i].size(); ++b)
          out += (b ? ":" : "") + std::string(nn::recompute_name(blocks[i][b]));
      else
        out += nn::recompute_name(v[i]);
    }
    return out;
  }
  /** Ranks that take different samples: data x expert. */
  [[nodiscard]] std::size_t batch_ranks() const { return dp * ep; }
  [[nodiscard]] std::size_t local_batch() const { return global_batch / batch_ranks(); }
  [[nodiscard]] std::size_t microbatch_size() const { return local_batch() / std::size_t(microbatches); }
  /** Raises `model.vocab_multiple` to a multiple of `tp` (their lcm), so the padded vocabulary splits over the tensor axis; GptTrainer applies it. */
  void pad_vocab_for_mesh() {
    if (tp >= 1) model.vocab_multiple = std::lcm(model.vocab_multiple ? model.vocab_multiple : 1, tp);
  }

  /** The optimizer's configuration: precision, update rule, ZeRO stage, hyper-parameters, clipping, buckets. */
  [[nodiscard]] parallel::OptimizerConfig optimizer_config() const {
    parallel::OptimizerConfig o;
    o.precision = precision;
    o.rule = optimizer;
    o.zero = zero;
    o.adamw.lr = float(lr);
    o.adamw.weight_decay = weight_decay;
    o.adamw.beta1 = beta1;
    o.adamw.beta2 = beta2;
    o.adamw.eps = eps;
    o.adamw.decays = decays ? decays : std::function<bool(const nn::Parameter&)>(optim::decays_weight_matrices);
    o.sgd = optim::SgdConfig{float(lr), 0.9f, 0.0f};
    if (grad_topk_density > 0) {
      o.sync = parallel::GradSync::topk;
      o.topk_density = grad_topk_density;
    }
    o.clip = clip;
    o.bucket_bytes = bucket_bytes;
    return o;
  }

  /** Throws config_error with what to change, before any work starts. */
  void validate(std::size_t world) const {
    require(tp >= 1 && pp >= 1 && dp >= 1 && ep >= 1 && cp >= 1,
            "train: --tp, --pp, --dp, --ep and --cp must be at least 1");
    if (cp > 1)
      require(world == world_size(), "train: tp x cp x pp x dp = ", tp, " x ", cp, " x ", pp, " x ", dp, " = ",
              world_size(), " ranks, but the job has ", world, "; change --tp/--cp/--pp/--dp or the number of ranks");
    else if (ep == 1)
      require(world == world_size(), "train: tp x pp x dp = ", tp, " x ", pp, " x ", dp, " = ", world_size(),
              " ranks, but the job has ", world, "; change --tp/--pp/--dp or the number of ranks");
    else
      require(world == world_size(), "train: tp x pp x dp x ep = ", tp, " x ", pp, " x ", dp, " x ", ep, " = ",
              world_size(), " ranks, but the job has ", world, "; change --tp/--pp/--dp/--ep or the number of ranks");
    require(microbatches >= 1 && chunks >= 1, "train: --microbatches and --chunks must be at least 1");
    if (ep == 1)
      require(global_batch % (dp * std::size_t(microbatches)) == 0, "train: the global batch ", global_batch,
              " must split evenly into dp (", dp, ") x microbatches (", microbatches,
              ") equal micro-batches; use --batch as a multiple of ", dp * std::size_t(microbatches));
    else
      require(global_batch % (batch_ranks() * std::size_t(microbatches)) == 0, "train: the global batch ", global_batch,
              " must split evenly into dp (", dp, ") x ep (", ep, ") x microbatches (", microbatches,
              ") equal micro-batches (expert ranks take different samples); use --batch as a multiple of ",
              batch_ranks() * std::size_t(microbatches));
    const int z = parallel::stage_number(zero);
    require(!(z > 0 && optimizer != parallel::UpdateRule::adamw), "train: ZeRO-", z,
            " shards AdamW states; use --optimizer adamw with --zero ", z);
    require(!(zero == parallel::ZeroStage::parameters && schedule == pipeline::ScheduleKind::two_bw),
            "train: --schedule 2bw keeps a second full weight version, which ZeRO-3's sharded weights do not have; "
            "use --zero 2 or another schedule");
    require(chunks == 1 || schedule == pipeline::ScheduleKind::interleaved, "train: --chunks ", chunks,
            " needs --schedule interleaved_1f1b");
    require(steps >= 1 && warmup <= steps, "train: need --steps >= 1 and --warmup <= --steps; got --steps ", steps,
            " and --warmup ", warmup);
    if (cp > 1) validate_context();
    if (!stage_layers.empty()) validate_stage_layers();
    validate_recompute_stages();
    if (model.sequence_parallel) validate_sequence_parallel();
    if (graph) validate_graph();
    if (grad_topk_density != 0) validate_grad_topk();
    model.validate(tp, ep);
    // The even split gives every stage a block; a given partition may leave stages empty (validate_stage_layers).
    require(!stage_layers.empty() || stages() <= model.layers, "train: ", stages(),
            " pipeline stages (pp x chunks) for only ", model.layers,
            " layers; the even split gives every stage at least one block: lower --pp/--chunks, raise --layers, or "
            "give --stage-layers with stages that hold none");
    // The schedule's own checks (e.g. interleaved needs M a multiple of P), with its sentence.
    (void)pipeline::make_programs(schedule, pipeline::ScheduleConfig{int(pp), microbatches, chunks, 1});
  }
  /**
   * What a captured step (`graph`) needs of the rest of the configuration: a step with no host decision inside
   * and no collective the capture cannot record. Each refusal names the option and the fix.
   */
  void validate_graph() const {
    require(graph_warmup >= 1,
            "train: --graph-warmup 0: the first step must run eagerly (it allocates the staging "
            "and copies the step keeps, and carries AdamW's count into rank memory, waits a capture cannot hold); "
            "use --graph-warmup 1 or more");
    require(pp == 1, "train: --graph with --pp ", pp,
            ": the pipeline's messages between stages and their headers, checked on the host, are not captured yet; "
            "use --pp 1 (tensor and data parallelism are captured), or drop --graph");
    require(cp == 1, "train: --graph with --cp ", cp,
            ": ring attention's exchanges are not captured yet; use --cp 1, or drop --graph");
    require(precision != parallel::Precision::f16,
            "train: --graph with --precision f16: the dynamic loss scale is chosen on the host "
            "after each step and passed to the backward and the update as a host value, which a captured step would "
            "freeze; use --precision bf16 or fp32 (no loss scaling), or drop --graph");
    require(optimizer == parallel::UpdateRule::adamw, "train: --graph with --optimizer ", parallel::name_of(optimizer),
            ": SGD takes the learning rate as a host value, which a captured step would freeze (AdamW reads it "
            "from rank memory); use --optimizer adamw, or drop --graph");
    require(zero == parallel::ZeroStage::none, "train: --graph with --zero ", parallel::stage_number(zero),
            ": ZeRO's update takes the learning rate as a host value; use --zero 0, or drop --graph");
    require(model.experts == 0, "train: --graph with --experts ", model.experts,
            ": the step report's dropped-token count is reduced on the host; use --experts 0, or drop --graph");
    require(model.dropout == 0.0, "train: --graph with --dropout ", model.dropout,
            ": each step's dropout masks are keyed by the step number, a host value which a captured step would "
            "freeze (every replay would drop the same elements); use --dropout 0, or drop --graph");
  }
  /** What top-k gradient compression (`grad_topk_density`) needs of the rest of the configuration, naming the fix. */
  void validate_grad_topk() const {
    require(grad_topk_density > 0 && grad_topk_density <= 1, "train: --grad-topk ", grad_topk_density,
            " is not a share of the gradient; give a density in (0, 1], e.g. 0.01 (or 0 for the dense all-reduce)");
    require(dp * cp > 1, "train: --grad-topk compresses the gradient reduction over the data-parallel ranks, and ",
            "--dp is 1: there is nothing to compress; use --dp 2 or more, or drop --grad-topk");
    require(ep == 1, "train: --grad-topk with --ep ", ep,
            ": the experts' gradients reduce over the data group and the rest over data x expert ranks, and the "
            "compression covers one group; use --ep 1, or drop --grad-topk");
    require(zero == parallel::ZeroStage::none, "train: --grad-topk with --zero ", parallel::stage_number(zero),
            ": ZeRO reduce-scatters each gradient into shards, which the compressed exchange (every replica's top "
            "entries, summed everywhere) does not produce; use --zero 0, or drop --grad-topk");
    require(precision != parallel::Precision::f16,
            "train: --grad-topk with --precision f16: the residual carried to the next step would hold gradients "
            "scaled by an older loss scale (and an overflowed step's infinities); use --precision bf16 or fp32, or "
            "drop --grad-topk");
    require(!graph,
            "train: --grad-topk with --graph: the compression selects the entries on the host, between "
            "operations a captured step cannot leave; drop --graph or --grad-topk");
  }

  /**
   * A user-given stage partition: one block count per global stage, each at least 1, covering the model's blocks
   * once. A stage holding only the embedding or the head (no block) is refused: the trainer's stages are not
   * tested without blocks yet.
   */
  void validate_stage_layers() const {
    const std::size_t S = stages();
    std::size_t sum = 0;
    for (std::size_t n : stage_layers) sum += n;
    const std::string given = "--stage-layers " + join_counts(stage_layers);
    require(stage_layers.size() == S, "train: ", given, " gives ", stage_layers.size(),
            " stage(s), but pp x chunks = ", pp, " x ", chunks, " = ", S,
            " stages (stage s = chunk x pp + rank); give ", S, " comma-separated block counts summing to --layers ",
            model.layers);
    require(sum == model.layers, "train: ", given, " covers ", sum, " block(s), but the model has --layers ",
            model.layers, sum < model.layers ? " (blocks would be dropped)" : " (blocks would be doubled)",
            "; give block counts summing to ", model.layers);
  }
  /** Per-stage recomputation: one flag per global stage, and not beside `recompute`. */
  void validate_recompute_stages() const {
    require(recompute_blocks.empty() || !recompute_stages.empty(),
            "train: per-block recomputation needs the per-stage modes beside it (--recompute-stages sets both)");
    if (recompute_stages.empty()) return;
    require(!recompute, "train: --recompute and --recompute-stages both say which stages recompute; give one");
    require(recompute_stages.size() == stages(), "train: --recompute-stages gives ", recompute_stages.size(),
            " mode(s), but pp x chunks = ", pp, " x ", chunks, " = ", stages(),
            " stages (stage s = chunk x pp + rank); give ", stages(),
            " comma-separated modes (none, selective or full; 0 and 1 for none and full)");
    if (recompute_blocks.empty()) return;
    require(recompute_blocks.size() == stages(), "train: the per-block recomputation names ", recompute_blocks.size(),
            " stage(s), but pp x chunks = ", stages(), " stages; give one list per stage");
    const pipeline::Partition part = partition();
    for (std::size_t s = 0; s < stages(); ++s) {
      const auto& b = recompute_blocks[s];
      if (b.empty()) continue;
      const std::size_t n = part.end(s) - part.begin(s);
      require(b.size() == n, "train: --recompute-stages gives stage ", s, " ", b.size(), " per-block mode(s) (",
              join_recompute({recompute_stages[s]}, {b}), "), but the stage holds ", n,
              " block(s); give one mode per block joined by ':', or one mode for the whole stage");
      const nn::Recompute most = *std::max_element(b.begin(), b.end());
      require(most == recompute_stages[s], "train: the blocks of stage ", s, " recompute at most ",
              nn::recompute_name(most), ", but the stage's mode is ", nn::recompute_name(recompute_stages[s]),
              "; a stage's mode is the most its blocks recompute");
    }
  }
  /** "1,3,2": counts as --stage-layers takes them. */
  [[nodiscard]] static std::string join_counts(const std::vector<std::size_t>& v) {
    std::string out;
    for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
    return out;
  }
  /** What sequence parallelism needs of the rest of the configuration, each refusal naming the fix. */
  void validate_sequence_parallel() const {
    require(cp == 1, "train: --sequence-parallel with --cp ", cp,
            ": ring attention's blocks hold whole rows of their zig-zag chunks and have no token-sharded form; use "
            "--cp 1, or drop --sequence-parallel");
    // As Megatron-LM asks: every pass (a micro-batch, a validation batch, generation's single window) then splits.
    require(model.seq % tp == 0, "train: --sequence-parallel splits each sequence's ", model.seq, " tokens over --tp ",
            tp, " ranks, which does not divide them; use --seq a multiple of ", tp, " or a --tp dividing ", model.seq);
  }
  /** What context parallelism (cp > 1) needs of the rest of the configuration, each refusal naming the fix. */
  void validate_context() const {
    require(model.seq % (2 * cp) == 0, "train: --seq ", model.seq, " is not divisible by 2 x --cp = ", 2 * cp,
            " (each sequence splits into 2 x --cp equal chunks, two per context rank); use --seq a multiple of ",
            2 * cp, " or a --cp dividing ", model.seq, " / 2");
    require(model.experts == 0 && ep == 1, "train: --cp ", cp,
            " with mixture of experts (--experts/--ep) is not "
            "supported (the load-balancing statistics would need the context group); use --cp 1 or --experts 0");
  }
};

/**
 * @brief What identifies a token source in a checkpoint (manifest `user` entries `data.*`): its
 * fingerprint (vocabulary size, length in tokens and a hash of its token ids; a character dataset's
 * hash covers its vocabulary, which character each id means, too). `GptTrainer::resume` refuses a
 * checkpoint whose data identity differs from the run's.
 */
[[nodiscard]] inline std::map<std::string, std::string> data_identity(const data::SourceRef& source) {
  const data::DataFingerprint fp = source.fingerprint();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fp.hash));
  return {{"data.vocab", std::to_string(fp.vocab)}, {"data.tokens", std::to_string(fp.tokens)}, {"data.hash", hex}};
}

/**
 * @brief Every setting of a run that the ranks must agree on (the model, the layout, the schedule, precision,
 * optimizer and its hyper-parameters, the step count, the data's identity), named by train_gpt's options.
 */
[[nodiscard]] inline std::vector<RankSetting> training_settings(const GptTrainConfig& c, const data::SourceRef& data) {
  auto num = [](double v) {
    char s[32];
    std::snprintf(s, sizeof s, "%.17g", v);
    return std::string(s);
  };
  auto count = [](std::size_t v) { return std::to_string(v); };
  const GptConfig& m = c.model;
  std::vector<RankSetting> s{
      {"--model", std::string(name_of(m.family))},
      {"--kv-heads", count(m.kv_heads)},
      {"--rope-theta", num(m.rope_theta)},
      {"--vocab", count(m.vocab)},
      {"--hidden", count(m.hidden)},
      {"--heads", count(m.heads)},
      {"--layers", count(m.layers)},
      {"--seq", count(m.seq)},
      {"the MLP width (GptConfig::ffn)", count(m.ffn)},
      {"--dropout", num(m.dropout)},
      {"--seed", std::to_string(m.seed)},
      {"--experts", count(m.experts)},
      {"--topk", count(m.moe_top_k)},
      {"--capacity", num(m.moe_capacity)},
      {"--aux-coef", num(m.moe_aux_weight)},
      {"--moe-every", count(m.moe_every)},
      {"--tp", count(c.tp)},
      {"--pp", count(c.pp)},
      {"--dp", count(c.dp)},
      {"--ep", count(c.ep)},
      {"--cp", count(c.cp)},
      {"--schedule", std::string(pipeline::schedule_name(c.schedule))},
      {"--microbatches", std::to_string(c.microbatches)},
      {"--chunks", std::to_string(c.chunks)},
      {"--recompute", c.recompute ? "on" : "off"},
      {"--stage-layers", c.stage_layers.empty() ? "even" : GptTrainConfig::join_counts(c.stage_layers)},
      {"--recompute-stages", c.recompute_stages.empty()
                                 ? std::string("all or none")
                                 : GptTrainConfig::join_recompute(c.recompute_stages, c.recompute_blocks)},
      {"--sequence-parallel", m.sequence_parallel ? "on" : "off"},
      {"--precision", std::string(parallel::name_of(c.precision))},
      {"--optimizer", std::string(parallel::name_of(c.optimizer))},
      {"--zero", std::to_string(parallel::stage_number(c.zero))},
      {"--batch", count(c.global_batch)},
      {"--steps", count(c.steps)},
      {"--lr", num(c.lr)},
      {"--min-lr", num(c.min_lr)},
      {"--warmup", count(c.warmup)},
      {"--weight-decay", num(c.weight_decay)},
      {"--beta1", num(c.beta1)},
      {"--beta2", num(c.beta2)},
      {"--eps", num(c.eps)},
      {"--clip", num(c.clip)},
      {"--bucket-kib (in bytes)", count(c.bucket_bytes)},
      {"--data-seed", std::to_string(c.data_seed)},
      {"--graph", c.graph ? "on" : "off"},
      {"--graph-warmup", count(c.graph_warmup)},
      {"--grad-topk", num(c.grad_topk_density)}};
  for (const auto& [key, value] : data_identity(data)) s.push_back({"--data (" + key + ")", value});
  return s;
}

/** @brief What one step did, the same on every rank (losses and ratios are averaged over the world). */
struct StepReport {
  std::size_t step = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double aux_loss =
      0;  ///< MoE load-balancing loss (summed over MoE blocks, mean over micro-batches); in the objective, not in `loss`
  std::size_t dropped = 0;  ///< MoE token-to-expert assignments dropped by the capacity limit this step (all ranks)
  bool skipped = false;     ///< f16 overflow: weights unchanged
  /// f16: the dynamic loss scale after this step (lowered after a skipped one). A step skipped while the scale it
  /// ran with, the previous report's, was already `optim::LossScalerConfig::min_scale` overflowed unscaled. 1 at
  /// other precisions.
  double loss_scale = 1;
  /// Optimizer steps between the weights this step's passes used and the ones it updated: 1 under 2bw from the
  /// second step on (the passes of step t use the weights before step t-1's update), else 0.
  std::size_t weight_lag = 0;
  double wall = 0;    ///< seconds, slowest rank
  double bubble = 0;  ///< measured pipeline idle share of the step (mean over ranks)
  /// The bubble as a count from the programs this step ran (`pipeline::idle_slots`: idle slots summed over the
  /// pipeline ranks, a forward one slot, a backward two, per step): 3 (pp - 1) per rank for 1F1B and for 2bw by
  /// `train_step`; for 2bw by `train_steps(k)`, (3 + 2 (k - 1)) (pp - 1) / k, each update a barrier. The planner
  /// predicts the same count (plan::PipelineTiming).
  double idle_slots = 0;
  double communication = 0;  ///< share of the step spent in collectives and transfers (mean over ranks)
  double tokens_per_second = 0;
  pipeline::StepStats stats;  ///< this rank's executor measurements (timeline included)
  /// `GptTrainConfig::graph`: this step was one launch of the captured step. Nothing ran on the host between its
  /// operations, so there are no executor measurements: `stats`, `bubble` and `communication` are zero.
  bool replayed = false;
};

/** @brief Bytes this rank holds, by kind. */
struct MemoryBreakdown {
  std::size_t parameters = 0, gradients = 0, optimizer_states = 0, compute_copies = 0;
};

/**
 * @brief One rank of a hybrid-parallel GPT training job over world communicator `Comm`, computing on
 * backend `B` (HostBackend, or CudaBackend from an nvcc translation unit).
 */
template <communicator Comm, backend B = HostBackend>
class GptTrainer {
 public:
  using TensorComm = observe::TimedCommunicator<Comm>;
  using Stage = GptPipelinePart<TensorComm, B>;
  using Zero = parallel::ZeroAdamW<Comm, B>;

  /**
   * Every rank constructs its trainer with the same configuration and a `data::token_source` (a
   * `CharDataset`, `TokenFile`, `TokenVector` or any model of the concept), which must outlive the trainer.
   */
  GptTrainer(Comm& world, GptTrainConfig config, data::SourceRef data)
      : cfg_(validated(std::move(config), world)), data_(data),
        mesh_(DynamicMesh(cfg_.tp, cfg_.pp, cfg_.dp * cfg_.cp, cfg_.ep)
                  .with_context(cfg_.cp)),  // data axis: data x context
        comms_(make_mesh_comms(world, mesh_)), tensor_(same_group(comms_.tensor)), pipe_(same_group(comms_.pipeline)),
        data_comm_(same_group(comms_.data)), coord_(split_context(mesh_.coord(std::size_t(world.rank())), cfg_.cp)),
        replica_comm_(replica_group(world)), expert_t_(same_group(comms_.expert)), tokens_t_(same_group(replica_comm_)),
        context_t_(comms_.data.split(int(coord_.data), int(coord_.context))), slicing_(batch_slicing()),
        schedule_(cfg_.lr, cfg_.min_lr, cfg_.warmup, cfg_.steps) {
    require(data_.vocab_size() <= cfg_.model.vocab, "train: the data ", data_.describe(), " has a vocabulary of ",
            data_.vocab_size(), " ids but the model only ", cfg_.model.vocab,
            "; set the model's vocab (--vocab) to at least ", data_.vocab_size());
    B::init_rank();  // before the stages allocate: the backend chooses where this rank's tensors live
    // Before any collective whose sizes depend on the configuration (the splits above do not).
    require_same_settings(training_settings(cfg_, data_), "train");
    build_stages();
    build_embedding_group();
    build_optimizer();
    if (cfg_.graph) build_graph_inputs();
  }

  /**
   * Collective: throws `config_error` on every rank when the ranks were given different `settings` (the
   * constructor checks `training_settings`; a program adds what its own loop depends on, e.g. checkpoint
   * and validation options), naming each that differs (`require_same_on_every_rank`).
   */
  void require_same_settings(const std::vector<RankSetting>& settings, std::string_view who) {
    quiet_for_host_messages();
    with_host_world([&](auto& world) { require_same_on_every_rank(world, settings, who); });
  }

  /** Runs the next step on every rank (collective over the world). */
  StepReport train_step() {
    if constexpr (mpar::detail::graph_backend<B>)
      if (cfg_.graph) return graph_train_step();
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t step = step_;
    tensor_.reset();
    expert_t_.reset();
    tokens_t_.reset();
    context_t_.reset();
    const double dp_comm_before = optimizer_->sync_seconds();
    const double lr = schedule_(step);

    // 1. This data rank's samples as micro-batches, and where they sit in the step's batch (dropout's keys).
    std::vector<nn::Act<Replicate>> inputs = split_microbatches(local_batch(step));
    set_token_coordinates(step);

    // 2. The pipeline program: forwards, backwards (data-parallel buckets start as gradients finish).
    if (before_passes_) before_passes_();
    const bool lagged = lag_ && lag_->swap_in_previous();  // 2bw: the passes run on the version before the last update
    start_step_statistics();
    pipeline::StepStats stats = run_passes(
        inputs, PassKind::train, optimizer_->losses(),
        optimizer_->loss_scale(), [&](int mb) -> const auto& { return targets_[std::size_t(mb)]; });
    if (lag_) lag_->restore_and_keep(lagged);  // 2bw: the current weights again, and a copy for the next step's passes
    if (after_passes_) after_passes_();

    // 3-6. Tied weights; the optimizer: data-parallel reduction, norm, clipping, loss scaling, the update.
    const auto t_opt = std::chrono::steady_clock::now();
    sum_tied_gradients();
    const parallel::StepStatistics st = optimizer_->step(lr);
    executor_->check_received_headers();  // the stream has passed this step's header copies: no further wait
    copy_embedding_to_head();  // unchanged values after a skipped step: harmless, and no host decision needed
    zero_grad();
    stats.compute += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_opt).count();
    ++step_;

    const double comm_s = stats.communication + tensor_.seconds() + expert_t_.seconds() + tokens_t_.seconds() +
                          context_t_.seconds() + (optimizer_->sync_seconds() - dp_comm_before);
    StepReport r = report(step, lr, st, std::move(stats), t0, comm_s);
    r.weight_lag = lagged ? 1 : 0;
    return r;
  }

  /**
   * @brief Runs the next `steps` steps (collective over the world), one report each. Under 2bw in fp32 or bf16 they are one
   * program without a flush: every stage updates right after its last backward of a step, while the first stages
   * already run the next step's forwards, and each micro-batch's backward uses its forward's weight version (two
   * versions kept, `WeightVersions::per_batch`: step t's passes on W(t-1), as `train_step`'s). The numbers equal
   * `steps` calls of `train_step`; the bubble per step is lower (`StepReport::idle_slots`). Otherwise, or for one
   * step, it is `steps` calls of `train_step`. Each report's `stats` is the program's (timeline included) on the
   * last step of the program, empty on the others; `bubble` and `communication` are the program's shares.
   */
  std::vector<StepReport> train_steps(std::size_t steps) {
    std::vector<StepReport> out;
    if (!runs_without_flush(steps)) {
      for (std::size_t i = 0; i < steps; ++i) out.push_back(train_step());
      return out;
    }
    const auto t_program = std::chrono::steady_clock::now();
    tensor_.reset();
    expert_t_.reset();
    tokens_t_.reset();
    context_t_.reset();
    const std::size_t first = step_, M = std::size_t(cfg_.microbatches);
    std::vector<nn::Act<Replicate>> inputs;
    for (std::size_t i = 0; i < steps; ++i) {
      auto step_inputs = split_microbatches(local_batch(first + i), int(i * M));
      for (auto& x : step_inputs) inputs.push_back(std::move(x));
    }
    set_token_coordinates(first, M);
    start_step_statistics();
    const bool lagged_start = lag_->has_previous();
    auto comm_seconds = [&] {
      return tensor_.seconds() + expert_t_.seconds() + tokens_t_.seconds() + context_t_.seconds() +
             optimizer_->sync_seconds();
    };
    auto t_step = t_program;
    double comm_before = comm_seconds();
    // Each stage's update of step t, inside the program right after its last backward of t: the same collectives
    // in the same order on every rank as `train_step`'s, then the next step's losses, statistics and buckets reset.
    auto update = [&](const std::vector<nn::Parameter*>&) {
      optimizer_->end_compute();
      const std::size_t step = step_;
      const double lr = schedule_(step);
      const auto t_opt = std::chrono::steady_clock::now();
      sum_tied_gradients();
      const parallel::StepStatistics st = optimizer_->step(lr);
      copy_embedding_to_head();
      zero_grad();
      pipeline::StepStats none;
      none.compute = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_opt).count();
      const double comm = comm_seconds();
      StepReport r = report(step, lr, st, std::move(none), t_step, comm - comm_before);
      r.weight_lag = lagged_start || step > first ? 1 : 0;
      out.push_back(std::move(r));
      comm_before = comm;
      t_step = std::chrono::steady_clock::now();
      ++step_;
      start_step_statistics();
      optimizer_->begin_compute();  // ZeRO-2's fresh gradient shards for the next step
      for (auto& s : stages_) s->begin_step();
    };
    auto& exec = flush_free_executor(steps);
    pipeline::StepStats stats = run_passes(
        inputs, PassKind::train, optimizer_->losses(),
        optimizer_->loss_scale(), [&](int mb) -> const auto& { return targets_[std::size_t(mb)]; }, update, &exec);
    exec.check_received_headers();
    require(out.size() == steps, "GptTrainer::train_steps: rank ", comms_.world.rank(), " ran ", out.size(),
            " updates in a program of ", steps, " steps");
    // The program's shares, averaged over the world, on every step it ran.
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_program).count();
    std::array<double, 4> avg{stats.bubble_ratio, std::min(1.0, stats.communication / wall), 0.0, wall};
    metrics_.reduce(comms_.world, avg);
    // Every rank's update waits for the others' (the norm, the tied embedding): a barrier in the count.
    const double idle = pipeline::idle_slots(exec.programs(), true);
    for (auto& r : out) {
      r.bubble = avg[0];
      r.communication = std::min(1.0, r.communication + avg[1]);
      r.idle_slots = idle;
      r.stats.bubble_ratio = stats.bubble_ratio;
    }
    stats.loss = out.back().loss;
    out.back().stats = std::move(stats);
    return out;
  }

  [[nodiscard]] std::size_t step() const { return step_; }
  /** `GptTrainConfig::graph`: whether the step is captured (the steps from now on are launches of it). */
  [[nodiscard]] bool graph_captured() const {
    if constexpr (mpar::detail::graph_backend<B>)
      return graph_.captured();
    else
      return false;
  }
  /**
   * `GptTrainConfig::graph`: the operations the captured step holds (the nodes of the graph, where the backend
   * counts them; 0 before the capture).
   */
  [[nodiscard]] std::size_t graph_operations() const {
    if constexpr (mpar::detail::graph_backend<B>)
      return graph_.operations();
    else
      return 0;
  }

  /**
   * @brief Calls `before` just before each training step's forward and backward passes (the step's batch is
   * chosen; under bf16/f16 the weights are not rounded yet) and `after` just after them (the fp32 weights are
   * back, the gradients accumulated, nothing reduced or updated yet). A test builds the 2bw reference with
   * them: it swaps the previous weights in and out of an ordinary synchronous run by hand.
   */
  void on_passes(std::function<void()> before, std::function<void()> after) {
    before_passes_ = std::move(before);
    after_passes_ = std::move(after);
  }
  [[nodiscard]] const GptTrainConfig& config() const { return cfg_; }
  /** The element type of the GEMM operands in the passes: the precision's 16-bit type, or fp32. */
  [[nodiscard]] nn::ComputeType compute_type() const {
    switch (optimizer_->config().precision) {
      case parallel::Precision::bf16:
        return nn::ComputeType::bf16;
      case parallel::Precision::f16:
        return nn::ComputeType::f16;
      default:
        return nn::ComputeType::fp32;
    }
  }
  [[nodiscard]] const MeshCoord& coord() const { return coord_; }
  /** Every parameter this rank holds (the head's tied copy included). */
  [[nodiscard]] const std::vector<nn::Parameter*>& parameters() const { return all_params_; }
  [[nodiscard]] const pipeline::Programs& programs() const { return executor_->programs(); }
  [[nodiscard]] MeshComms<Comm>& comms() { return comms_; }
  /** The training data's identity (vocabulary size, token count, content hash), e.g. for a checkpoint manifest. */
  [[nodiscard]] data::DataFingerprint data_fingerprint() const { return data_.fingerprint(); }
  /** The optimizer side of the step (gradient synchronisation, norm, update), for inspection. */
  [[nodiscard]] const parallel::DistributedOptimizer<Comm, B, TensorComm>& optimizer() const { return *optimizer_; }
  /**
   * `GptTrainConfig::grad_topk_density`: what the last step's top-k compression sent over the data group from this
   * rank, against the dense all-reduce's bytes; empty before the first step or without compression.
   */
  [[nodiscard]] const std::optional<parallel::CompressionStatistics>& gradient_compression() const {
    return optimizer_->compression();
  }
  /**
   * @brief Calls `f` in every training step once the gradients are synchronised over the data group (and the tied
   * embedding's summed) and before the norm and the update: each parameter's gradient is then what the update applies.
   * For inspection (a test checks top-k's error feedback with it); not in a captured step's replays.
   */
  void on_gradients_synchronised(std::function<void()> f) { optimizer_->on_synchronised(std::move(f)); }

  /**
   * @brief Mean loss over `batches` global batches of `val` (collective): batch i is `val.batch(seed, i, ...)`,
   * so every layout evaluates the same sequences and reports the same value. Runs the step's pipeline
   * program on the current weights (16-bit rounded under bf16/f16, as training sees them; without dropout, as
   * PyTorch's `model.eval()`) and discards the gradients unreduced: the weights, the optimizer and the step count
   * are unchanged.
   */
  double evaluate(data::SourceRef val, std::size_t batches, std::uint64_t seed = 0) {
    require(batches >= 1, "evaluate: need at least one batch (--val-batches)");
    require(val.vocab_size() <= cfg_.model.vocab, "evaluate: the validation data ", val.describe(), " has ",
            val.vocab_size(), " ids, more than the model's vocabulary ", cfg_.model.vocab);
    double sum = 0;
    for (std::size_t i = 0; i < batches; ++i) {
      std::vector<nn::Act<Replicate>> inputs = split_microbatches(slicing_.local_batch(val, seed, i));
      Buffer<double> l = B::template allocate<double>(1);  // rank memory: the batch's loss, as in a training step
      B::run(ops::zero<double>{.n = 1, .x = l.data()});
      (void)run_passes(
          inputs, PassKind::evaluate, l.data(), 1.0f, [&](int mb) -> const auto& { return targets_[std::size_t(mb)]; });
      zero_grad();
      comms_.world.all_reduce(std::span<double>(l), ReduceOp::avg);  // data ranks saw different sequences
      sum += mpar::read_from_rank<B>(l.data());
    }
    return sum / double(batches);
  }

  /**
   * @brief This rank's parameters under their stable names (docs/train_gpt.md lists them), the head's
   * tied copy excluded (it is the embedding `embed.token.weight`). Each is this rank's block of the
   * named global tensor: `global_shape` and `local_box` say which.
   */
  [[nodiscard]] std::vector<std::pair<std::string, nn::Parameter*>> named_parameters() const {
    std::vector<std::pair<std::string, nn::Parameter*>> out;
    for (auto* p : opt_params_) out.emplace_back(p->name, p);
    return out;
  }
  /** This rank's parameter named `name`, or null when another rank (pipeline stage) holds it. */
  [[nodiscard]] nn::Parameter* parameter(std::string_view name) const {
    for (auto* p : opt_params_)
      if (p->name == name) return p;
    return nullptr;
  }

  /**
   * @brief Loads whole (unsharded) tensors into every layout and precision: `source(name, global_shape)`
   * returns the tensor's row-major values (exactly its global size) or an empty span to keep the current
   * ones. Each rank copies its own block; no communication, so call it on every rank with the same source.
   * The fp32 master copies are updated too, so under bf16/f16 the loaded values are what the next steps
   * start from (writing into `Parameter::value` directly would be overwritten by the master copy after
   * one step), and the head's tied copy receives the embedding. Returns the number of tensors loaded here.
   * Over a backend whose rank memory the host cannot touch the values are copied into pinned staging and the
   * parameters the source gave are uploaded together, with one host wait (io/staged_blocks.hpp); a source that
   * throws leaves every parameter as it was there (nothing is uploaded). HostBackend: written in place, no wait.
   */
  template <class Source>
  requires std::is_invocable_r_v<std::span<const float>, Source&, const std::string&, const std::vector<std::size_t>&>
      std::size_t load_weights(Source&& source) {
    reset_graph();  // a captured step would keep AdamW's count of before the load
    return with_gathered([&] {
      const std::size_t n = load_full_weights(source);
      store_gathered();
      return n;
    });
  }
  /**
   * @brief Calls `f()` with every parameter's full values in place, and returns its result: under ZeRO-3 the
   * weights are gathered first and released after (collective over the data group); otherwise they always are.
   * For inspection — a test comparing the weights of layouts — and for checkpoints.
   */
  template <class F>
  decltype(auto) with_full_parameters(F&& f) {
    return with_gathered(std::forward<F>(f));
  }

 private:
  /** ZeRO-3, while gathered: the (loaded) full values become the sharded masters. */
  void store_gathered() {
    for (auto* z : optimizer_->zeros())
      if (z->stage() == parallel::ZeroStage::parameters) z->store_gathered();
  }
  template <class Source>
  std::size_t load_full_weights(Source& source) {
    // The host writes each block where `blocks` points: the parameter itself, or its host staging.
    std::vector<io::LoadBlock> blocks;
    for (auto* p : all_params_) blocks.push_back(io::load_block(*p));
    io::StagedBlocks<B> staging;
    staging.redirect(blocks);
    std::vector<bool> filled(blocks.size(), false);
    std::size_t loaded = 0;
    for (std::size_t i = 0; i < all_params_.size(); ++i) {
      const nn::Parameter& p = *all_params_[i];
      const std::span<const float> full = source(p.name, p.global_shape);
      if (full.empty()) continue;
      require(full.size() == p.global_size(), "load_weights: '", p.name, "' has ", p.global_size(), " elements (shape ",
              io::shape_string(p.global_shape), ") but the source gave ", full.size());
      copy_block_from_full(p, full, blocks[i].data);
      filled[i] = true;
      if (&p != head_copy_) ++loaded;
    }
    staging.upload(filled);
    if (lag_) lag_->forget();  // 2bw: the next step's passes run on the loaded weights
    return loaded;
  }

 public:
  /** Bytes held now by kind (activations are transient: see the example's allocation tracking). */
  [[nodiscard]] MemoryBreakdown memory() const {
    MemoryBreakdown m;
    for (const auto* p : all_params_) {
      m.parameters += p->value.size() * sizeof(float);
      m.gradients += p->grad.size() * sizeof(float);
    }
    m.gradients += optimizer_->sync_gradient_elements() * sizeof(float);    // ZeRO's shards (and kept buckets)
    m.parameters += optimizer_->sharded_weight_elements() * sizeof(float);  // ZeRO-3: the weight shards
    if (lag_) m.parameters += lag_->bytes();                                // 2bw's second weight version
    m.gradients += optimizer_->compression_bytes();  // top-k's residuals: gradient entries not yet sent
    m.optimizer_states = optimizer_->state_elements() * sizeof(float);
    m.compute_copies = optimizer_->precision_bytes();  // the fp32 masters and 16-bit copies beside the weights
    return m;
  }

  /**
   * @brief Saves parameters, optimizer moments (AdamW, or ZeRO-1's sharded moments as flat ranges) and
   * the training state under `root` (collective). Each rank writes only blocks no lower rank holds;
   * any layout — with or without ZeRO-1 — can resume from the result. Over a stream-ordered backend the
   * blocks reach the writer through host staging (io/staged_blocks.hpp), with one host wait per save.
   * `keep_last` > 0 then removes all but the newest `keep_last` checkpoints under `root` (`io::SaveOptions`).
   */
  io::SaveResult save(const std::filesystem::path& root, std::size_t keep_last = 0) {
    // ZeRO-3 saves the full blocks, as ZeRO-1 does
    return with_gathered([&] { return save_gathered(root, keep_last); });
  }

 private:
  io::SaveResult save_gathered(const std::filesystem::path& root, std::size_t keep_last) {
    std::vector<io::SaveBlock> blocks = io::optimizer_blocks<const float>(*optimizer_);
    // 2bw: the older weight version, so that a resumed run's first step computes on it as this run's next would.
    // The head's tied copy is not saved: it mirrors the embedding, whose older version a resume loads into it.
    if (lag_ && lag_->has_previous())
      for (std::size_t k = 0; k < lag_->versioned().size(); ++k)
        if (lag_->versioned()[k] != head_copy_)
          blocks.push_back(io::state_block(*lag_->versioned()[k], previous_version_state,
                                           std::span<const float>(lag_->previous(k))));
    io::StagedBlocks<B> staging;  // the writer reads on the host: rank memory comes over first, one wait
    staging.download(blocks);
    io::TrainingState st;
    st.step = step_;
    st.data_position = step_;  // batches are a pure function of the step
    st.rng = {cfg_.data_seed, cfg_.model.seed};
    if (const auto* scaler = optimizer_->scaler())
      st.loss_scale = io::LossScaleState{scaler->scale(), std::uint64_t(scaler->good_steps_in_a_row()),
                                         std::uint64_t(scaler->skipped_steps())};
    st.user[optimizer_->sgd() ? "sgd.steps" : "adamw.steps"] = std::to_string(optimizer_->steps());
    st.user["optimizer"] = std::string(parallel::name_of(cfg_.optimizer));
    for (auto& [k, v] : run_identity().entries) st.user[k] = std::move(v);
    io::SaveOptions opts;
    opts.mesh = {cfg_.tp, cfg_.pp, cfg_.dp, cfg_.cp};
    opts.keep_last = keep_last;
    return with_host_world([&](auto& world) {  // the staging's wait left nothing queued
      return io::save_checkpoint(root, std::span<const io::SaveBlock>(blocks), st, world, opts);
    });
  }
  /**
   * Whether the checkpoint's host messages take the world communicator's host-memory twin: over a stream-ordered
   * backend, a communicator that wraps one (`inner()`, as `StreamOrderedCommunicator` wraps the threads or MPI
   * one). The twin is usable only while no call is queued, so each phase of host messages starts with
   * `quiet_for_host_messages()`. Without a twin (NCCL) the messages go through rank memory instead
   * (`HostMessageCommunicator`), ordered on the stream: no synchronisation needed.
   */
  static constexpr bool host_messages_by_twin = io::StagedBlocks<B>::staged && requires(Comm & c) { c.inner(); };
  /** Before host messages over the twin: the communicator's queued calls (ZeRO-3's gathers, say) are done. */
  static void quiet_for_host_messages() {
    if constexpr (host_messages_by_twin) B::synchronize();
  }
  /**
   * Runs `f(world)` with a world communicator whose calls on host memory have finished when they return, and
   * host memory as the thread's resource: the checkpoint's own messages (failures agreed on, the names each
   * rank holds, the manifest's parts) are host values the host writes and reads at once. Over a stream-ordered
   * backend that is the world's host-memory twin (see host_messages_by_twin; the caller has quieted it), or,
   * without one, a `HostMessageCommunicator` that carries each call through rank memory with one host wait.
   */
  template <class F>
  decltype(auto) with_host_world(F&& f) {
    if constexpr (host_messages_by_twin) {
      HostMemoryResource host;
      ScopedMemoryResource use(host);
      return f(comms_.world.inner());
    } else if constexpr (io::StagedBlocks<B>::staged) {
      HostMessageCommunicator<Comm, B> messages(comms_.world);  // before host memory is installed: rank buffers
      HostMemoryResource host;
      ScopedMemoryResource use(host);
      return f(messages);
    } else {
      return f(comms_.world);
    }
  }

 public:
  /**
   * @brief Runs `f(world)` (collective) with a world communicator for the program's own host values — a summary's
   * per-rank numbers, a trace's events, a directory name — and host memory as the thread's resource: the same path
   * the checkpoint's messages take (the world's host-memory twin after the stream is quiet, or rank memory with
   * one host wait, as over NCCL). A program never hands host buffers to the world itself: on a device they are
   * not rank memory.
   */
  template <class F>
  decltype(auto) host_messages(F&& f) {
    quiet_for_host_messages();
    return with_host_world(std::forward<F>(f));
  }

  /**
   * @brief Writes the whole model to the safetensors file `out` (collective), from any layout: saves a
   * checkpoint of this layout under `<out>.staging`, and world rank 0 reads it back as whole tensors
   * through the resharding loader and writes them (`io::export_safetensors`); the staging directory is
   * then removed. `hf_gpt2` writes GPT-2's names and shapes with the unpadded vocabulary `model.vocab`;
   * `hf_llama` (the Llama family) `LlamaForCausalLM`'s, and its `config.json` beside `out`.
   */
  void export_safetensors(const std::filesystem::path& out, io::WeightNaming naming = io::WeightNaming::mpar) {
    const auto& m = cfg_.model;
    require(naming != io::WeightNaming::hf_gpt2 || !m.is_llama(),
            "export_safetensors: a Llama model has no GPT-2 names; export it with LlamaForCausalLM's (hf_llama)");
    require(naming != io::WeightNaming::hf_llama || m.is_llama(),
            "export_safetensors: a GPT-2 model has no LlamaForCausalLM names; export it with GPT-2's (hf_gpt2)");
    std::optional<io::HfLlamaConfig> llama;
    if (naming == io::WeightNaming::hf_llama)
      llama = io::HfLlamaConfig{m.vocab,  m.hidden, m.ffn_size(), m.heads,   m.kv_head_count(),
                                m.layers, m.seq,    m.rope_theta, m.norm_eps};
    const std::filesystem::path staging = out.string() + ".staging";
    (void)save(staging);
    std::exception_ptr err;
    if (comms_.world.rank() == 0)
      err = io::detail::capture([&] {
        (void)io::export_safetensors(
            staging, out, naming, cfg_.model.vocab,
            {{"mpar.step", std::to_string(step_)}, {"mpar.vocab", std::to_string(cfg_.model.vocab)}}, llama);
        std::filesystem::remove_all(staging);
      });
    quiet_for_host_messages();  // ZeRO-3's release after the save, if any
    with_host_world([&](auto& world) { io::detail::agree(world, err, "export_safetensors"); });
  }

  /**
   * @brief Loads parameters and optimizer states saved with any layout and continues from its step
   * (collective). Refuses, before loading anything, a checkpoint of another run: other data (its
   * identity, see data_identity), other seeds, another model shape (layers, width, heads, sequence,
   * experts), or tensors this model lacks. A checkpoint of another optimizer loads the weights only:
   * the optimizer starts afresh and `LoadResult::warnings` says so. Over a stream-ordered backend the reader
   * fills host staging, uploaded with one host wait (io/staged_blocks.hpp); over the world's host-memory twin,
   * after one wait at the start that quiets the communicator for the checkpoint's host messages (and one more
   * under ZeRO-3, after its gathers), without a twin with one wait per host message instead. See docs/checkpoints.md.
   */
  io::LoadResult resume(const std::filesystem::path& path) {
    require(!path.empty(),
            "resume: the checkpoint path is empty; give a checkpoint directory (or the --save "
            "directory holding 'latest'), or leave --resume out to train from scratch");
    io::Manifest saved;
    std::filesystem::path dir;
    // Over the world's host-memory twin the checkpoint's host messages need a quiet communicator: one wait here,
    // one after the uploads.
    quiet_for_host_messages();
    with_host_world([&](auto& world) {
      io::detail::agree(world, io::detail::capture([&] {
                          dir = io::resolve_checkpoint(path);
                          saved = io::read_manifest(dir);
                        }),
                        "resume (reading the manifest)");
    });
    run_identity().check_same_run(saved, dir);
    const std::string saved_optimizer = train::saved_optimizer(saved);
    const std::string optimizer(parallel::name_of(cfg_.optimizer));
    const bool with_states = saved_optimizer == optimizer;
    std::vector<std::string> warnings;
    if (!with_states)
      warnings.push_back("resume: checkpoint " + dir.string() + " was saved with --optimizer " + saved_optimizer +
                         (saved_optimizer == "sgd" && optimizer == "sgd" ? " before momentum was saved" : "") +
                         "; its optimizer states are not used and --optimizer " + optimizer +
                         " starts afresh from the loaded weights");
    // 2bw's older weight version, saved by a 2bw run after its first step: loaded where this run is 2bw too (its
    // first step then computes on it), else acknowledged and dropped.
    std::vector<std::string> saved_previous;
    for (const auto& t : saved.tensors)
      if (t.name.ends_with(std::string("/") + previous_version_state)) saved_previous.push_back(t.name);
    const bool load_previous = lag_ && with_states && !saved_previous.empty();
    io::LoadResult res = with_gathered([&] {  // ZeRO-3: load into the full blocks, then keep this rank's shards
      std::vector<io::LoadBlock> blocks = io::optimizer_blocks<float>(*optimizer_, with_states);
      if (load_previous) {
        lag_->allocate_previous();
        for (std::size_t k = 0; k < lag_->versioned().size(); ++k)
          blocks.push_back(io::state_block(*lag_->versioned()[k], previous_version_state, lag_->previous(k)));
      }
      if (auto* z = optimizer_->zero();
          z && z->stage() == parallel::ZeroStage::parameters)  // its gathers are queued: quiet the twin again
        quiet_for_host_messages();
      check_model_holds(saved, blocks, with_states, dir, load_previous ? std::vector<std::string>{} : saved_previous);
      io::StagedBlocks<B> staging;  // the reader writes on the host: it fills staging, uploaded with one wait
      staging.redirect(blocks);
      io::LoadResult r = with_host_world(
          [&](auto& world) { return io::load_checkpoint(dir, std::span<const io::LoadBlock>(blocks), world); });
      staging.upload();
      store_gathered();
      return r;
    });
    res.warnings = std::move(warnings);
    if (lag_ && !load_previous && res.state.step > 0) {
      // A checkpoint without the older version (saved by another schedule): the first step after the resume runs
      // on the loaded weights (lag 0), where an uninterrupted 2bw run would have used the version before them.
      lag_->forget();
      res.warnings.push_back(
          "resume: checkpoint " + dir.string() +
          " holds no previous weight version this run can use (saved by another schedule, or with another "
          "--optimizer); the "
          "first step after the resume computes on the loaded weights (lag 0), so the run departs "
          "from an uninterrupted 2bw one there");
    } else if (lag_ && !load_previous) {
      lag_->forget();
    }
    if (!lag_ && !saved_previous.empty() && with_states)
      res.warnings.push_back("resume: checkpoint " + dir.string() +
                             " holds --schedule 2bw's previous weight version; this run's schedule does not lag, so "
                             "it is not used");
    if (cfg_.grad_topk_density > 0)
      res.warnings.push_back(
          "resume: --grad-topk's residuals (the gradient entries not yet sent) are not in checkpoints; they start "
          "at zero, so the run departs from an uninterrupted one there");
    step_ = std::size_t(res.state.step);
    if (with_states) {
      auto steps_of = [&](const char* key) {
        auto it = res.state.user.find(key);
        require(it != res.state.user.end(), "resume: checkpoint ", res.path.string(), " has no ", key, " entry");
        return std::size_t(std::stoull(it->second));
      };
      optimizer_->set_steps(steps_of(optimizer_->sgd() ? "sgd.steps" : "adamw.steps"));
    }
    if (auto* scaler = optimizer_->scaler(); scaler && res.state.loss_scale)
      scaler->restore(res.state.loss_scale->scale, std::size_t(res.state.loss_scale->good_steps),
                      std::size_t(res.state.loss_scale->skipped));
    copy_embedding_to_head();
    reset_graph();  // the step count moved: warm up and capture again
    return res;
  }

 private:
  /** Copies `p`'s local box out of the row-major whole tensor `full` into `block`, one innermost row at a time. */
  static void copy_block_from_full(const nn::Parameter& p, std::span<const float> full, std::span<float> block) {
    const std::size_t rank = p.global_shape.size();
    if (rank == 0 || block.empty()) return;
    const std::size_t inner = p.local_box[rank - 1].extent, rows = block.size() / inner;
    std::vector<std::size_t> idx(rank, 0);
    for (std::size_t r = 0; r < rows; ++r) {
      std::size_t rem = r;
      for (std::size_t d = rank - 1; d-- > 0;) {
        idx[d] = rem % p.local_box[d].extent;
        rem /= p.local_box[d].extent;
      }
      std::size_t g = 0;
      for (std::size_t d = 0; d + 1 < rank; ++d) g = g * p.global_shape[d] + p.local_box[d].offset + idx[d];
      g = g * p.global_shape[rank - 1] + p.local_box[rank - 1].offset;
      std::copy_n(full.begin() + std::ptrdiff_t(g), inner, block.begin() + std::ptrdiff_t(r * inner));
    }
  }
  /** What a checkpoint records of this run and a resume must find unchanged (manifest `user` entries). */
  [[nodiscard]] train::RunIdentity run_identity() const {
    train::RunIdentity id;
    id.entries = data_identity(data_);
    const auto& m = cfg_.model;
    auto add = [&](const char* key, const char* option, auto value) {
      id.entries[key] = std::to_string(value);
      id.options[key] = option;
    };
    add("data.seed", "--data-seed", cfg_.data_seed);
    add("model.seed", "--seed", m.seed);
    add("model.layers", "--layers", m.layers);
    add("model.hidden", "--hidden", m.hidden);
    add("model.heads", "--heads", m.heads);
    add("model.seq", "--seq", m.seq);
    add("model.experts", "--experts", m.experts);
    // The family is recorded for Llama only, so GPT-2's checkpoints (older ones included) keep their identity.
    id.options["model.family"] = "--model";
    id.defaults["model.family"] = std::string(name_of(ModelFamily::gpt2));
    if (m.is_llama()) {
      id.entries["model.family"] = std::string(name_of(m.family));
      add("model.kv_heads", "--kv-heads", m.kv_head_count());
      add("model.ffn", "--ffn", m.ffn_size());
    }
    if (m.experts > 0) {
      add("model.moe_every", "--moe-every", m.moe_every);
      add("model.moe_top_k", "--topk", m.moe_top_k);
    }
    return id;
  }
  /** Refuses a checkpoint holding tensors no rank of this model loads (collective; the caller left nothing queued). */
  void check_model_holds(const io::Manifest& saved, const std::vector<io::LoadBlock>& blocks, bool with_states,
                         const std::filesystem::path& dir, std::vector<std::string> unused = {}) {
    std::vector<std::string> names = std::move(unused);  // saved tensors this run drops on purpose
    for (const auto& b : blocks) names.push_back(b.name);
    with_host_world([&](auto& world) { train::check_loads_every_tensor(world, saved, names, with_states, dir); });
  }
  [[nodiscard]] std::size_t opt_elements() const {
    std::size_t n = 0;
    for (const auto* p : opt_params_) n += p->value.size();
    return n;
  }
  /** This rank's samples of step `step` of the training data, micro-batch after micro-batch (`train::BatchSlicing`). */
  [[nodiscard]] data::TokenBatch local_batch(std::size_t step) const {
    return slicing_.local_batch(data_, cfg_.data_seed, step);
  }
  /**
   * Tells every stage the step and where this rank's micro-batches sit in the step's batch, micro-batch id by id:
   * the dropout masks are keyed by them, so every layout drops the elements the single-rank run drops.
   */
  void set_token_coordinates(std::uint64_t step, std::size_t microbatches_per_step = 0) {
    const std::vector<std::size_t> first = slicing_.first_sequences();
    for (auto& s : stages_) s->set_token_coordinates(step, first, microbatches_per_step);
  }
  [[nodiscard]] train::BatchSlicing batch_slicing() const {
    return {cfg_.global_batch, std::size_t(cfg_.microbatches), cfg_.dp,     cfg_.cp,
            cfg_.ep,           cfg_.model.has_moe(),           coord_.data, coord_.context,
            coord_.expert};
  }
  /**
   * The mesh's data axis is data x context with context innermost (tensor, context, data, pipeline from the
   * innermost rank out): its coordinate d splits into the context rank d % cp and the data rank d / cp.
   */
  static MeshCoord split_context(MeshCoord c, std::size_t cp) {
    c.data /= cp;  // the mesh's coordinate holds data x context; its context factor is c.context already
    return c;
  }
  /**
   * Splits this rank's batch into micro-batches: the first stage's token inputs are returned, and every
   * micro-batch's targets are kept in `targets_` for the last stage's loss.
   */
  std::vector<nn::Act<Replicate>> split_microbatches(const data::TokenBatch& batch, int first_id = 0) {
    const std::size_t mb_tokens = cfg_.microbatch_size() * cfg_.model.seq / cfg_.cp;
    std::vector<nn::Act<Replicate>> inputs;
    if (first_id == 0) targets_.clear();
    targets_.resize(std::size_t(first_id + cfg_.microbatches));
    for (int mb = 0; mb < cfg_.microbatches; ++mb) {
      const auto lo = std::ptrdiff_t(std::size_t(mb) * mb_tokens), hi = lo + std::ptrdiff_t(mb_tokens);
      if (holds_first_) {
        const auto ids = std::span(batch.tokens).subspan(std::size_t(lo), mb_tokens);
        if constexpr (mpar::host_reads_rank_memory<B>) {
          inputs.push_back(Stage::tokens_as_activation(ids));
        } else {  // the host must not write rank memory: the first stage takes the ids as host values
          stages_.front()->set_tokens(first_id + mb, ids);
          inputs.push_back(nn::Act<Replicate>(nn::Activation({mb_tokens, 1}, uninitialized)));
        }
      }
      targets_[std::size_t(first_id + mb)].assign(batch.targets.begin() + lo, batch.targets.begin() + hi);
    }
    return inputs;
  }
  /**
   * The step's report from its statistics and host measurements, averaged over the world so every rank prints
   * the same numbers (`comm_s`: seconds in collectives and transfers; `t0`: the step's start).
   */
  StepReport report(std::size_t step, double lr, const parallel::StepStatistics& st, pipeline::StepStats stats,
                    std::chrono::steady_clock::time_point t0, double comm_s) {
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // Host measurements (times) and the dropped count (accumulated in rank memory by the MoE backward passes);
    // the losses came averaged with the optimizer's statistics.
    // [0, 3): averaged over the world; [3]: the slowest rank's wall time.
    std::array<double, 4> avg{stats.bubble_ratio, std::min(1.0, comm_s / wall), 0.0, wall};
    metrics_.reduce(comms_.world, avg);
    const std::array<double, 1> slowest{avg[3]};
    StepReport r;
    r.step = step;
    r.loss = st.loss;  // of the unscaled forward, averaged over the world with the statistics
    r.lr = lr;
    r.grad_norm = st.skipped ? 0.0 : st.grad_norm;
    r.aux_loss = st.aux_loss;
    r.dropped = std::size_t(std::llround(avg[2]));
    r.skipped = st.skipped;
    r.loss_scale = optimizer_->loss_scale();
    r.wall = slowest[0];
    r.bubble = avg[0];
    r.idle_slots = idle_slots_;
    r.communication = avg[1];
    r.tokens_per_second = double(cfg_.global_batch * cfg_.model.seq) / r.wall;
    stats.loss = st.loss;
    r.stats = std::move(stats);
    return r;
  }

  /**
   * `GptTrainConfig::graph`: the rank buffers a captured step reads its inputs from (every micro-batch's token ids,
   * then their targets; the learning rate) and the pinned staging the host writes them into. Refused on a backend
   * that cannot capture.
   */
  void build_graph_inputs() {
    if constexpr (!mpar::detail::graph_backend<B>) {
      throw config_error(mpar::detail::cat(
          "train: --graph (GptTrainConfig::graph) needs a backend that captures and replays a step (graph_backend: "
          "CudaBackend, StreamHostBackend, DiscreteHostBackend), but the ",
          B::name,
          " backend runs each operation as it is issued: there is nothing to capture. Fix: drop --graph, or train on "
          "CUDA"));
    } else {
      const std::size_t n = cfg_.local_batch() * cfg_.model.seq;
      graph_inputs_ = B::template allocate<std::int32_t>(2 * n);
      graph_lr_ = B::template allocate<float>(1);
      graph_inputs_staging_.emplace(2 * n);  // after init_rank: pinned for this rank's device
      graph_lr_staging_.emplace(1);
      graph_ = train::CapturedStep<B>(cfg_.graph_warmup);
    }
  }
  /** The next steps warm up eagerly and capture again (after a load, a resume: host state the graph froze). */
  void reset_graph() {
    if constexpr (mpar::detail::graph_backend<B>) graph_.reset();
  }

  /**
   * `GptTrainConfig::graph`'s step: the host writes the inputs into pinned staging (the previous step's statistics
   * wait passed the copies that read it), then issues the step eagerly (the warm-up), captures and launches it
   * (the first step after the warm-up), or launches the captured one; then reads the statistics (one wait) and
   * reports. The same numbers as `train_step` without `graph`, bit for bit (tests/stream/gpt_graph_stream_test.cpp).
   */
  /** What a run of the passes is for: a training step (eager or captured), or an evaluation. */
  enum class PassKind { train, evaluate };
  /**
   * The forward and backward passes of one batch, the one routine of training, evaluation and the captured step:
   * the 16-bit weights and `Autocast` around the executor's program, each micro-batch's loss added into `loss_sink`
   * (rank memory) against `targets(mb)` (host ids or a view of rank memory) and its gradient scaled by `loss_scale`.
   * An evaluation runs without dropout, without the hooks that start the data-parallel reduction (the caller
   * discards its gradients) and counts in no step's MoE statistics; the caller zeroes the loss sink and, for
   * training, points the MoE statistics at the step's.
   */
  template <class Targets>
  pipeline::StepStats run_passes(std::vector<nn::Act<Replicate>>& inputs, PassKind kind, double* loss_sink,
                                 float loss_scale, Targets&& targets, const pipeline::OptimizerFn& update = {},
                                 pipeline::Executor<Stage, Comm>* executor = nullptr) {
    const bool evaluation = kind == PassKind::evaluate;
    optimizer_->begin_compute();
    std::optional<nn::Autocast> autocast(std::in_place, compute_type());  // the GEMMs' operand type, this batch
    for (auto& s : stages_) {
      if (evaluation) s->on_gradients_final({}, cfg_.microbatches);  // no data-parallel buckets start
      s->begin_step();
      // Each rank's backward adds its own tokens' share of d aux; the average over the token group divides it by
      // the group's size again, so the share enters scaled by that size (and the loss scale, like the logits').
      s->set_moe_aux_gradient(float(cfg_.batch_ranks()) * loss_scale);
      if (evaluation) {
        s->set_moe_statistics({});  // an evaluation's passes count in no step's statistics
        s->set_training(false);     // no dropout: the next training step switches it back on
      }
    }
    pipeline::StepStats stats =
        (executor ? *executor : *executor_)
            .step(
                inputs,
                [&](const nn::Act<nn::FeatureShard>& logits, int mb, nn::Act<nn::FeatureShard>& dlogits) {
                  Stage& last = *stages_.back();
                  last.loss().forward_into(logits, targets(mb), mb, loss_sink, loss_weight());
                  dlogits = last.loss().logits_gradient(mb, loss_scale);
                  return 0.0;  // ignored: the executor runs with loss_on_host = false
                },
                update);
    autocast.reset();
    optimizer_->end_compute();
    if (evaluation && gradients_final_)
      for (auto& s : stages_) s->on_gradients_final(gradients_final_, cfg_.microbatches);
    return stats;
  }

  StepReport graph_train_step() {
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t step = step_;
    tensor_.reset();
    const double lr = schedule_(step);
    stage_graph_inputs(local_batch(step), lr);
    pipeline::StepStats stats;
    bool replayed = false;
    if constexpr (mpar::detail::graph_backend<B>) replayed = graph_.run([&] { stats = issue_graph_step(); });
    const parallel::StepStatistics st = optimizer_->read_statistics();
    ++step_;
    const double comm_s = replayed ? 0.0 : stats.communication + tensor_.seconds();
    StepReport r = report(step, lr, st, std::move(stats), t0, comm_s);
    r.replayed = replayed;
    return r;
  }
  /** The step's token ids, targets and learning rate into pinned staging, the ids checked against the vocabulary. */
  void stage_graph_inputs(const data::TokenBatch& batch, double lr) {
    const std::size_t n = batch.tokens.size();
    require(2 * n == graph_inputs_staging_->size() && batch.targets.size() == n, "GptTrainer (--graph): the batch of ",
            n, " tokens and ", batch.targets.size(), " targets does not fill the step's input buffers of ",
            graph_inputs_staging_->size() / 2);
    auto* staged = graph_inputs_staging_->data();
    for (std::size_t i = 0; i < n; ++i) {
      // In rank memory the layers cannot check them: an id outside the vocabulary would read outside the tables.
      require(batch.tokens[i] >= 0 && std::size_t(batch.tokens[i]) < cfg_.model.vocab && batch.targets[i] >= 0 &&
                  std::size_t(batch.targets[i]) < cfg_.model.vocab,
              "GptTrainer (--graph): token ", batch.tokens[i], " or target ", batch.targets[i], " at position ", i,
              " of step ", step_, " is outside the vocabulary of ", cfg_.model.vocab);
      staged[i] = batch.tokens[i];
      staged[n + i] = batch.targets[i];
    }
    graph_lr_staging_->data()[0] = float(lr);        // what AdamW::step would take as its host value
    note_host_access(2 * n * sizeof(std::int32_t));  // the step's inputs, written by the host
  }
  /**
   * Issues one step that a capture can record: the inputs copied from the pinned staging into the fixed rank
   * buffers, the passes on views of them, the optimizer's issue half with the learning rate in rank memory, the
   * gradients zeroed. Nothing here waits on the host or passes a value that changes from step to step.
   */
  pipeline::StepStats issue_graph_step() {
    const std::size_t n = graph_inputs_.size() / 2, mb_tokens = n / std::size_t(cfg_.microbatches);
    const std::int32_t* ids = graph_inputs_.data();
    B::template copy_from_host_async<std::int32_t>(2 * n, graph_inputs_staging_->data(), graph_inputs_.data());
    B::template copy_from_host_async<float>(1, graph_lr_staging_->data(), graph_lr_.data());
    std::vector<nn::Act<Replicate>> inputs;
    if (holds_first_)
      for (int mb = 0; mb < cfg_.microbatches; ++mb) {
        stages_.front()->set_tokens(mb, nn::RankTokens{ids + std::size_t(mb) * mb_tokens, mb_tokens});
        inputs.push_back(nn::Act<Replicate>(nn::Activation({mb_tokens, 1}, uninitialized)));  // shape only
      }
    if (before_passes_) before_passes_();
    optimizer_->zero_losses();
    // The targets are views of the fixed rank buffer; no loss scaling: validate refuses f16 with --graph.
    pipeline::StepStats stats = run_passes(inputs, PassKind::train, optimizer_->losses(), 1.0f, [&](int mb) {
      return nn::RankTokens{ids + n + std::size_t(mb) * mb_tokens, mb_tokens};
    });
    if (after_passes_) after_passes_();
    sum_tied_gradients();
    optimizer_->issue_step_in_rank(graph_lr_.data());
    copy_embedding_to_head();
    zero_grad();
    return stats;
  }

  /** The ranks with this rank's pipeline and tensor coordinates: they split each micro-batch (data x expert). */
  Comm replica_group(Comm& world) {
    if (cfg_.ep == 1) return same_group(comms_.data);
    return world.split(int(coord_.pipeline * cfg_.tp + coord_.tensor), int(coord_.data * cfg_.ep + coord_.expert));
  }

  /**
   * What each micro-batch's loss is added to the statistics with: 1/M for the mean over micro-batches, times pp
   * because only the last stage's ranks add theirs and the statistics are averaged over the world.
   */
  [[nodiscard]] double loss_weight() const { return double(cfg_.pp) / double(cfg_.microbatches); }

  static GptTrainConfig validated(GptTrainConfig c, const Comm& world) {
    c.pad_vocab_for_mesh();
    c.validate(std::size_t(world.size()));
    return c;
  }

  void build_stages() {
    const int P = int(cfg_.pp), V = cfg_.chunks, S = P * V;
    const pipeline::Partition part = cfg_.partition();  // validated: sizes, sum, no empty stage
    const int r = int(coord_.pipeline);
    for (int c = 0; c < V; ++c) {
      const int s = pipeline::global_stage(pipeline::ScheduleConfig{P, cfg_.microbatches, V, 1}, r, c);
      nn::Parameter* shared = (s == S - 1 && !stages_.empty() && stages_.front()->is_first())
                                  ? stages_.front()->token_embedding()
                                  : nullptr;
      stages_.push_back(std::make_unique<Stage>(tensor_, cfg_.model, s == 0, s == S - 1, part.begin(std::size_t(s)),
                                                part.end(std::size_t(s)) - part.begin(std::size_t(s)), shared,
                                                GptMoeGroups<TensorComm>{&expert_t_, &tokens_t_},
                                                cfg_.cp > 1 ? &context_t_ : nullptr));
    }
    holds_first_ = stages_.front()->is_first();
    holds_last_ = stages_.back()->is_last();
    std::vector<Stage*> chunks;
    for (auto& s : stages_) chunks.push_back(s.get());
    pipeline::ExecutorOptions eo;
    // The configuration's modes are per global stage. Full recomputation is the executor's, per local chunk (it
    // keeps the chunk's input and reruns its forward); selective is each block's attention. A stage whose blocks
    // differ recomputes block by block, each full block keeping its own input.
    for (int c = 0; c < V; ++c) {
      const auto s = std::size_t(pipeline::global_stage(pipeline::ScheduleConfig{P, cfg_.microbatches, V, 1}, r, c));
      const nn::Recompute mode = cfg_.recompute_of(s);
      const bool by_block = cfg_.mixed_blocks(s);
      eo.recompute.push_back(mode == nn::Recompute::full && !by_block);
      if (by_block)
        stages_[std::size_t(c)]->set_block_recompute(cfg_.recompute_blocks[s]);
      else if (mode == nn::Recompute::selective)
        stages_[std::size_t(c)]->set_recompute(mode);
    }
    eo.microbatch_tokens = cfg_.microbatch_size() * cfg_.model.seq / cfg_.cp;  // this context rank's tokens
    eo.boundary_cols = cfg_.model.hidden;  // every stage boundary is [tokens, hidden]
    eo.loss_on_host = false;               // the loss accumulates into the optimizer's statistics in rank memory
    pipeline::ScheduleConfig sc{P, cfg_.microbatches, V, 1};
    // A communicator that pairs messages in issue order (NCCL) exchanges them in groups; the ordered
    // placement is verified deadlock-free for that (the lazy one is not, for some schedules).
    if constexpr (mpar::detail::ordered_point_to_point<Comm>) sc.placement = pipeline::CommPlacement::ordered;
    executor_.emplace(pipe_, pipeline::make_programs(cfg_.schedule, sc), chunks, eo);
    executor_options_ = eo;
    idle_slots_ = pipeline::idle_slots(executor_->programs());
    // The optimizer updates everything but the head's tied copy, which receives the embedding's values.
    for (auto& s : stages_) {
      for (auto* p : s->parameters()) all_params_.push_back(p);
      for (auto* p : s->norm_parameters()) opt_params_.push_back(p);
    }
    const std::set<const nn::Parameter*> optimized(opt_params_.begin(), opt_params_.end());
    for (auto* p : all_params_)
      if (!optimized.contains(p)) {
        require(head_copy_ == nullptr, "GptTrainer: more than one parameter outside the optimizer on rank ",
                comms_.world.rank(), " (", head_copy_ ? head_copy_->name : "", ", ", p->name, ")");
        head_copy_ = p;
      }
    if (cfg_.schedule == pipeline::ScheduleKind::two_bw) lag_.emplace(all_params_);
  }

  /**
   * Zeroes every gradient once: through the optimizer (one operation over its gradient arena, which holds the
   * head's tied copy too; ZeRO-2/3 release them), the tied copy here only where the arena does not hold it.
   */
  void zero_grad() {
    optimizer_->zero_grad();
    if (head_copy_ && !optimizer_->zeroes_gradient_of(*head_copy_)) nn::zero_grad<B>(*head_copy_);
  }

  /**
   * Whether `train_steps(steps)` runs them as one program without a flush: 2bw in fp32 or bf16 (each version with
   * its own compute copies, `WeightLag`), not f16 (the loss scale an update may change is fixed for a program's
   * passes), not captured, and no `on_passes` hooks (they run around each step's passes, which overlap here).
   */
  [[nodiscard]] bool runs_without_flush(std::size_t steps) const {
    return steps > 1 && lag_ && cfg_.precision != parallel::Precision::f16 && !cfg_.graph && !before_passes_ &&
           !after_passes_;
  }
  /** The executor of a 2bw program of `steps` steps with the update inside (built once per number of steps). */
  pipeline::Executor<Stage, Comm>& flush_free_executor(std::size_t steps) {
    if (!flush_free_ || flush_free_steps_ != steps) {
      pipeline::ScheduleConfig sc{int(cfg_.pp), cfg_.microbatches, 1, int(steps)};
      if constexpr (mpar::detail::ordered_point_to_point<Comm>) sc.placement = pipeline::CommPlacement::ordered;
      pipeline::ExecutorOptions eo = executor_options_;
      eo.versions = pipeline::WeightVersions::per_batch;
      eo.caller_versions = {[this] { return lag_->has_previous(); }, [this] { lag_->keep_current(); },
                            [this] { lag_->swap(); }};
      std::vector<Stage*> chunks;
      for (auto& s : stages_) chunks.push_back(s.get());
      flush_free_.reset();
      flush_free_.emplace(pipe_, pipeline::make_programs(pipeline::ScheduleKind::two_bw, sc), chunks, eo);
      flush_free_steps_ = steps;
    }
    return *flush_free_;
  }

  /** First and last pipeline stage of each (tensor, data, expert) position share the tied embedding. */
  void build_embedding_group() {
    const bool end = coord_.pipeline == 0 || coord_.pipeline + 1 == cfg_.pp;
    const std::size_t data_context = coord_.data * cfg_.cp + coord_.context;
    const int color = end ? int((data_context * cfg_.ep + coord_.expert) * cfg_.tp + coord_.tensor)
                          : int(cfg_.tp * cfg_.cp * cfg_.dp * cfg_.ep + std::size_t(comms_.world.rank()));
    Comm pair = comms_.world.split(color, int(coord_.pipeline));  // collective: every rank splits
    if (cfg_.pp > 1 && cfg_.model.tied_head()) {  // one stage: the head is the embedding itself; Llama's is untied
      if (holds_first_)
        tied_ = train::TiedAcrossStages<Comm>(std::move(pair), *stages_.front()->token_embedding());
      else if (holds_last_)
        tied_ = train::TiedAcrossStages<Comm>(std::move(pair), *stages_.back()->head_weight());
    }
  }

  void build_optimizer() {
    parallel::OptimizerGroups<Comm, TensorComm> groups{
        &comms_.world, &tensor_, &pipe_, &data_comm_, &replica_comm_, cfg_.ep > 1 ? &comms_.expert : nullptr};
    parallel::OptimizerConfig oc = cfg_.optimizer_config();
    if (cfg_.zero == parallel::ZeroStage::
                         parameters)  // no bucket holds parameters of two units: each unit is gathered as whole buckets
      for (auto& s : stages_)
        for (const auto& u : s->units()) {
          if (u.empty()) continue;
          const auto it = std::find(opt_params_.begin(), opt_params_.end(), u.front());
          if (it != opt_params_.end()) oc.zero_unit_starts.push_back(std::size_t(it - opt_params_.begin()));
        }
    optimizer_.emplace(opt_params_, all_params_, oc, groups);
    if (cfg_.zero ==
        parallel::ZeroStage::
            parameters)  // ZeRO-3: each stage gathers a unit's weights around its use, prefetching the next
      for (auto& s : stages_) {
        auto units = std::make_shared<parallel::GatheredUnits<Zero>>(optimizer_->zeros(), s->units());
        s->on_unit_use([units](std::size_t u, std::size_t next, bool begin) { (*units)(u, next, begin); });
      }
    // Overlap: mark each layer's gradients ready as soon as the last micro-batch's backward is past it.
    // With the embedding split over two stages, its gradient is final only after the tied sum.
    if (cfg_.batch_ranks() * cfg_.cp > 1)  // the data-axis group: data x expert, or data x context
      gradients_final_ = [this](const std::vector<nn::Parameter*>& ps) {
        for (auto* p : ps)
          if (p != tied_.parameter()) optimizer_->gradient_ready(*p);
      };
    // The count even without a hook: a sequence-parallel stage then sums its norms' gradients once per step.
    for (auto& s : stages_) s->on_gradients_final(gradients_final_, cfg_.microbatches);
  }

  void sum_tied_gradients() { tied_.sum_gradients(); }
  void copy_embedding_to_head() {
    tied_.copy_first_to_last([this](nn::Parameter& end, auto&& copy) {
      // ZeRO-3: the first stage's embedding is sharded at rest; gather it for the broadcast.
      auto* z = optimizer_->zero();
      if (!z || z->stage() != parallel::ZeroStage::parameters || !holds_first_) return copy();
      nn::Parameter* const ends[] = {&end};
      const std::vector<std::size_t> gathered = z->buckets_of(std::span<nn::Parameter* const>(ends));
      for (std::size_t b : gathered) z->gather_begin(b);
      for (std::size_t b : gathered) z->gather_end(b);
      copy();
      for (std::size_t b : gathered) z->gather_release(b);
    });
  }
  /** Runs `f` with every parameter's full values in place (ZeRO-3 gathers them first and releases them after). */
  template <class F>
  decltype(auto) with_gathered(F&& f) {
    auto* z = optimizer_->zero();
    if (!z || z->stage() != parallel::ZeroStage::parameters) return f();
    struct Release {
      std::vector<Zero*> zeros;
      ~Release() {
        for (auto* z : zeros) z->release_all();
      }
    } release;
    for (auto* z : optimizer_->zeros()) {  // released again by `release` if a later gather throws
      z->gather_all();
      release.zeros.push_back(z);
    }
    return f();
  }
  /** The report's dropped count, accumulated in rank memory by the MoE backward passes (metrics slot 2). */
  double* report_slot_dropped() { return metrics_.accumulator(2); }
  /**
   * Before a step's passes: each micro-batch's loss stays in rank memory, added into the step's statistics (no host
   * read), scaled by 1/M and by pp, since only the last stage's ranks add theirs and the statistics average over the
   * world. Each MoE backward adds its micro-batch's load-balancing loss (weighted pp / M, as the losses) and its
   * dropped count (weighted as the report averages it: tensor ranks repeat the same routing) in rank memory.
   */
  void start_step_statistics() {
    optimizer_->zero_losses();
    if (!cfg_.model.has_moe()) return;
    B::run(ops::zero<double>{.n = 1, .x = report_slot_dropped()});
    parallel::MoeStatistics sinks{optimizer_->losses() + 1, double(cfg_.pp) / double(cfg_.microbatches),
                                  report_slot_dropped(), double(cfg_.world_size()) / double(cfg_.tp)};
    for (auto& s : stages_) s->set_moe_statistics(sinks);
  }
  /** The checkpoint state holding 2bw's older weight version beside each parameter ("<name>/2bw.previous"). */
  static constexpr const char* previous_version_state = "2bw.previous";
  GptTrainConfig cfg_;
  data::SourceRef data_;
  DynamicMesh mesh_;
  MeshComms<Comm> comms_;
  TensorComm tensor_;
  Comm pipe_, data_comm_;
  MeshCoord coord_;
  Comm replica_comm_;               ///< data x expert ranks of this (pipeline, tensor) position
  TensorComm expert_t_, tokens_t_;  ///< the MoE blocks' expert and token groups, timed
  TensorComm context_t_;            ///< the ring: the cp ranks of this (tensor, data, pipeline) position, timed
  train::BatchSlicing slicing_;     ///< which samples of each step's batch this rank trains on
  optim::WarmupCosine schedule_;
  std::vector<std::unique_ptr<Stage>> stages_;
  std::optional<pipeline::Executor<Stage, Comm>> executor_;
  pipeline::ExecutorOptions executor_options_;                 ///< executor_'s, for the flush-free 2bw executor
  std::optional<pipeline::Executor<Stage, Comm>> flush_free_;  ///< train_steps' 2bw program of several steps
  std::size_t flush_free_steps_ = 0;                           ///< the steps flush_free_'s program covers
  std::vector<nn::Parameter*> all_params_, opt_params_;
  std::vector<std::vector<std::int32_t>> targets_;
  bool holds_first_ = false, holds_last_ = false;
  train::TiedAcrossStages<Comm> tied_;  ///< this rank's end of an embedding split over two stages, if any
  /// The report over the world: bubble, communication share and dropped tokens averaged, the wall time maximised.
  train::StepMetrics<B, 3, 1> metrics_;
  nn::Parameter* head_copy_ = nullptr;  ///< the head's tied copy of the embedding on this rank (not optimized), if any
  typename Stage::GradientsFinalHook gradients_final_;  ///< starts the data-parallel buckets (empty: dp x ep = 1)
  /// Gradient synchronisation, norm, clipping, loss scaling, the update and the mixed-precision weights; its
  /// norm, scaling and update run on B, like the layers.
  std::optional<parallel::DistributedOptimizer<Comm, B, TensorComm>> optimizer_;
  std::size_t step_ = 0;
  double idle_slots_ = 0;                               ///< StepReport::idle_slots of the programs executor_ runs
  std::optional<train::WeightLag<B>> lag_;              ///< --schedule 2bw: the passes use the previous weight version
  std::function<void()> before_passes_, after_passes_;  ///< on_passes
  // GptTrainConfig::graph: the step's inputs in rank memory and their pinned staging, the captured step, and
  // how many eager steps preceded the capture.
  Buffer<std::int32_t> graph_inputs_;  ///< every micro-batch's token ids, then their targets
  Buffer<float> graph_lr_;             ///< the step's learning rate (AdamW::step_in_rank reads it)
  std::optional<typename B::template pinned_buffer<std::int32_t>> graph_inputs_staging_;
  std::optional<typename B::template pinned_buffer<float>> graph_lr_staging_;
  train::captured_step_for<B> graph_;
};

}  // namespace mpar::models

// A program that links mpar::trainers (MPAR_EXPLICIT_TRAINERS) sees the common specialisations as
// `extern template` wherever it includes this header, so none of its files compiles them again.
#if defined(MPAR_EXPLICIT_TRAINERS)
#include "mpar/models/gpt_trainer_instances.hpp"
#endif
