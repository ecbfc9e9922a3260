// train_gpt: a character-level GPT trained with tensor x pipeline x data (x expert) parallelism.
//
// Threads are the default transport (every rank a thread of this process); started under mpirun
// (and built with MPI), every process is one rank. See docs/train_gpt.md for every option.
//
// This file parses the command line and calls the host part (train_host.cpp) or the CUDA part
// (train_cuda.cu): it includes no training code, so it compiles in a few seconds.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <mpar/cli/parser.hpp>
#include <mpar/io/hf_config.hpp>
#include <mpar/models/gpt_config_from_hf.hpp>
#include <mpar/nn/recompute.hpp>
#include <mpar/observe/track_allocations.hpp>
#include <mpar/plan/training_plan.hpp>

#include "options.hpp"

using namespace mpar;
using train_gpt::Options;

namespace {

/** The comma-separated entries of `text`, empty ones kept (each list's parser refuses them, naming the entry). */
std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::size_t from = 0;
  for (std::size_t comma; (comma = text.find(',', from)) != std::string::npos; from = comma + 1)
    out.push_back(text.substr(from, comma - from));
  out.push_back(text.substr(from));
  return out;
}

/** "1,3,2" as counts; throws naming the option and the fix on anything else (an empty entry, a sign, a letter). */
std::vector<std::size_t> parse_count_list(const char* option, const std::string& text) {
  std::vector<std::size_t> out;
  for (const std::string& item : split_commas(text)) {
    const bool digits = !item.empty() && item.size() < 10 && item.find_first_not_of("0123456789") == std::string::npos;
    require(digits, "train_gpt: --", option, " '", text, "': '", item,
            "' is not a whole number; give comma-separated counts, one per pipeline stage (e.g. 1,3)");
    out.push_back(std::size_t(std::stoul(item)));
  }
  return out;
}

/**
 * --recompute-stages: one mode per stage, none, selective or full (0 and 1: none and full, as before), or a stage's
 * blocks' modes joined by ':' ("full:none,selective"; "none*3" repeats a mode): into `stages` (per stage, the most
 * its blocks recompute) and `blocks` (per stage its blocks' modes, empty for a stage given one mode; all empty when
 * no stage is given per block).
 */
void parse_recompute_list(const std::string& text, std::vector<nn::Recompute>& stages,
                          std::vector<std::vector<nn::Recompute>>& blocks) {
  stages.clear(), blocks.clear();
  const auto mode = [&](const std::string& item, bool in_block_list) {
    const std::optional<nn::Recompute> r = item == "0" && !in_block_list   ? nn::Recompute::none
                                           : item == "1" && !in_block_list ? nn::Recompute::full
                                                                           : nn::parse_recompute(item);
    require(r.has_value(), "train_gpt: --recompute-stages '", text, "': '", item,
            "' is not a recomputation mode; give one of none, selective or full (or 0, 1) per pipeline stage, "
            "comma-separated (e.g. selective,none), or a stage's blocks' modes joined by ':' (e.g. full:none,none)");
    return *r;
  };
  bool per_block = false;
  for (const std::string& item : split_commas(text)) {
    blocks.emplace_back();
    if (item.find(':') == std::string::npos && item.find('*') == std::string::npos) {
      stages.push_back(mode(item, false));
      continue;
    }
    per_block = true;
    std::size_t from = 0;
    while (true) {
      const std::size_t to = item.find(':', from);
      std::string one = item.substr(from, to == std::string::npos ? std::string::npos : to - from);
      std::size_t times = 1;
      if (const std::size_t star = one.find('*'); star != std::string::npos) {
        const std::string n = one.substr(star + 1);
        require(
            !n.empty() && n.size() < 6 && n.find_first_not_of("0123456789") == std::string::npos && std::stoul(n) >= 1,
            "train_gpt: --recompute-stages '", text, "': '", one,
            "' repeats a mode by a count that is not a whole number of at least 1 (e.g. none*3)");
        times = std::stoul(n);
        one.resize(star);
      }
      const nn::Recompute r = mode(one, true);
      blocks.back().insert(blocks.back().end(), times, r);
      if (to == std::string::npos) break;
      from = to + 1;
    }
    stages.push_back(*std::max_element(blocks.back().begin(), blocks.back().end()));
  }
  if (!per_block) blocks.clear();
}

/**
 * Sets the layout and the model sizes from the plan file `o.plan`. A flag given beside --plan must say what the
 * plan says: a layout flag that differs contradicts it, a model flag that differs means the plan was made for
 * another model; each error names the flag, both values and the fix.
 */
void apply_plan(const cli::Parser& p, Options& o) {
  const plan::TrainingPlan plan = plan::read_training_plan(o.plan);
  auto& t = o.train;
  const auto take = [&](const char* flag, auto& target, auto planned) {
    using T = std::decay_t<decltype(target)>;
    const auto shown = [](auto v) {  // as the flag is written
      if constexpr (std::is_same_v<decltype(v), pipeline::ScheduleKind>)
        return std::string(pipeline::schedule_name(v));
      else if constexpr (std::is_same_v<decltype(v), parallel::ZeroStage>)
        return std::to_string(parallel::stage_number(v));
      else
        return v;
    };
    require(!p.given(flag) || target == T(planned), "train_gpt: --", flag, " ", shown(target),
            " contradicts the plan '", o.plan, "', which has ", shown(planned), "; drop --", flag,
            " (the plan sets it) or give ", shown(planned));
    target = T(planned);
  };
  const auto model = [&](const char* flag, std::size_t& target, std::size_t planned) {
    require(!p.given(flag) || target == planned, "train_gpt: the plan '", o.plan, "' was made for --", flag, " ",
            planned, ", but --", flag, " ", target, " is given; drop --", flag,
            " (the plan sets it) or plan again for this model");
    target = planned;
  };
  model("layers", t.model.layers, plan.layers);
  model("hidden", t.model.hidden, plan.hidden);
  model("heads", t.model.heads, plan.heads);
  model("seq", t.model.seq, plan.seq);
  model("experts", t.model.experts, plan.experts);
  if (plan.experts > 0) {
    model("moe-every", t.model.moe_every, plan.moe_every);
    model("topk", t.model.moe_top_k, plan.topk);
  }
  const auto family = [](models::ModelFamily f) { return std::string(models::name_of(f)); };
  require(!p.given("model") || t.model.family == plan.family, "train_gpt: the plan '", o.plan,
          "' was made for --model ", family(plan.family), ", but --model ", family(t.model.family),
          " is given; drop --model (the plan sets it) or plan again for this model");
  t.model.family = plan.family;
  model("kv-heads", t.model.kv_heads, plan.kv_heads);
  model("ffn", t.model.ffn, plan.ffn);
  take("batch", t.global_batch, plan.global_batch);
  take("tp", t.tp, plan.tp);
  take("pp", t.pp, plan.pp);
  take("dp", t.dp, plan.dp);
  take("cp", t.cp, plan.cp);
  take("ep", t.ep, plan.ep);
  take("chunks", t.chunks, plan.v);
  take("schedule", t.schedule, plan.schedule);
  take("microbatches", t.microbatches, plan.microbatches);
  take("sequence-parallel", t.model.sequence_parallel, plan.sequence_parallel);
  take("etp", t.model.expert_tp, plan.etp);
  require(!p.given("zero1") || plan.zero == parallel::ZeroStage::optimizer_states,
          "train_gpt: --zero1 contradicts the plan '", o.plan, "', which has ZeRO stage ",
          parallel::stage_number(plan.zero), "; drop --zero1 (the plan sets it)");
  take("zero", t.zero, plan.zero);
  const auto flags = [](const std::vector<nn::Recompute>& f, const std::vector<std::vector<nn::Recompute>>& b) {
    return models::GptTrainConfig::join_recompute(f, b);
  };
  const std::string planned_layers = models::GptTrainConfig::join_counts(plan.stage_layers);
  require(!p.given("stage-layers") || t.stage_layers == plan.stage_layers, "train_gpt: --stage-layers ",
          models::GptTrainConfig::join_counts(t.stage_layers), " contradicts the plan '", o.plan, "', which has ",
          planned_layers, "; drop --stage-layers (the plan sets it) or give ", planned_layers);
  t.stage_layers = plan.stage_layers;
  const bool all = std::all_of(plan.recompute_stages.begin(), plan.recompute_stages.end(),
                               [](nn::Recompute r) { return r == nn::Recompute::full; });
  const bool all_blocks = std::all_of(plan.recompute_blocks.begin(), plan.recompute_blocks.end(), [](const auto& b) {
    return std::all_of(b.begin(), b.end(), [](nn::Recompute r) { return r == nn::Recompute::full; });
  });
  const std::string planned = flags(plan.recompute_stages, plan.recompute_blocks);
  require(!t.recompute || (all && all_blocks), "train_gpt: --recompute contradicts the plan '", o.plan,
          "', which recomputes ", planned, " only; drop --recompute (the plan sets it)");
  // The same modes, whether a stage's blocks are spelled out alike or the stage is given one mode.
  const auto per_block = [](const std::vector<nn::Recompute>& stages,
                            const std::vector<std::vector<nn::Recompute>>& blocks, const std::vector<std::size_t>& n) {
    std::vector<std::vector<nn::Recompute>> out(stages.size());
    for (std::size_t s = 0; s < stages.size(); ++s)
      out[s] = s < blocks.size() && !blocks[s].empty() ? blocks[s] : std::vector<nn::Recompute>(n[s], stages[s]);
    return out;
  };
  require(
      !p.given("recompute-stages") || (t.recompute_stages.size() == plan.recompute_stages.size() &&
                                       per_block(t.recompute_stages, t.recompute_blocks, plan.stage_layers) ==
                                           per_block(plan.recompute_stages, plan.recompute_blocks, plan.stage_layers)),
      "train_gpt: --recompute-stages ", flags(t.recompute_stages, t.recompute_blocks), " contradicts the plan '",
      o.plan, "', which has ", planned, "; drop --recompute-stages (the plan sets it) or give ", planned);
  t.recompute = false;
  t.recompute_stages = plan.recompute_stages;
  t.recompute_blocks = plan.recompute_blocks;
  o.plan_vocab = plan.vocab;
}

Options parse(int argc, char** argv) {
  Options o;
  auto& t = o.train;
  t.model.hidden = 64;
  t.model.heads = 4;
  t.model.layers = 4;
  t.model.seq = 64;
  t.global_batch = 16;
  t.microbatches = 4;
  t.steps = 1200;  // about 30 s at tp 2 x pp 2 on two idle cores: long enough for the sample to show words
  o.command.assign(argv, argv + argc);
  cli::Parser p("train_gpt", "Trains a character-level GPT with tensor, pipeline and data parallelism.");
  p.option("data", o.data,
           "training data: a text file (characters), or a token file X.bin (llm.c) or X.npy (uint16/uint32)");
  p.option("vocab", o.vocab, "vocabulary of a token file (0: 50257, GPT-2's); ignored for text").range(0, 1 << 30);
  p.option("val-data", o.val_data, "validation data, the same kind as --data (default: other batches of --data)");
  p.option("val-split", o.val_split, "hold out this last fraction of --data for validation (instead of --val-data)")
      .range(0, 0.9);
  p.option("val-every", o.val_every, "report the validation loss every N steps (0: never)").range(0, 1 << 30);
  p.option("val-batches", o.val_batches, "global batches per validation").range(1, 1 << 20);
  p.option("export", o.export_path, "write the trained weights to this safetensors file at the end");
  p.option("init-from", o.init_from,
           "start from the weights of this safetensors file: an --export of another run (any layout), or a Hugging "
           "Face model with --hf-gpt2 or --hf-llama, whose config.json beside it gives the model's sizes");
  p.flag("hf-gpt2", o.hf_gpt2,
         "--export and --init-from under Hugging Face GPT-2 names and shapes (transformer.wte.weight, ...)");
  p.flag("hf-llama", o.hf_llama,
         "--export and --init-from (a --model llama run) under Hugging Face LlamaForCausalLM names and shapes, with a "
         "config.json beside the file");
  p.option("beta1", t.beta1, "AdamW beta1").range(0, 0.999999);
  p.option("beta2", t.beta2, "AdamW beta2").range(0, 0.999999);
  p.option("eps", t.eps, "AdamW epsilon").range(1e-30, 1);
  p.option("weight-decay", t.weight_decay, "AdamW decoupled weight decay (matrices and embeddings only)").range(0, 10);
  p.option("max-data-mib", o.max_data_mib, "refuse a text --data larger than this (a text is read whole into memory)")
      .range(1, 1 << 24);
  p.option("layers", t.model.layers, "transformer blocks").range(1, 4096);
  p.option("hidden", t.model.hidden, "model width").range(1, 1 << 20);
  p.option("heads", t.model.heads, "attention heads").range(1, 4096);
  p.choice("model", t.model.family, {{"gpt2", models::ModelFamily::gpt2}, {"llama", models::ModelFamily::llama}},
           "decoder family: GPT-2's blocks, or Llama's (RMSNorm, rotary positions, grouped-query attention, SwiGLU, "
           "no biases, an untied head)");
  p.option("kv-heads", t.model.kv_heads,
           "--model llama: key/value heads of grouped-query attention, dividing --heads (0: as many as --heads)")
      .range(0, 4096);
  p.option("ffn", t.model.ffn, "MLP width (0: 4 x --hidden)").range(0, 1 << 24);
  p.option("rope-theta", t.model.rope_theta, "--model llama: the rotary embedding's frequency base").range(1, 1e12);
  p.option("seq", t.model.seq, "sequence length (characters)").range(2, 1 << 20);
  p.option("dropout", t.model.dropout, "dropout probability").range(0, 0.9);
  p.option("tp", t.tp, "tensor-parallel size").range(1, 1024);
  p.option("pp", t.pp, "pipeline-parallel size").range(1, 1024);
  p.option("dp", t.dp, "data-parallel size").range(1, 1024);
  p.option("cp", t.cp,
           "context-parallel size: each sequence split over N ranks in zig-zag chunks, attention by a "
           "ring (host backend; --seq a multiple of 2N)")
      .range(1, 1024);
  p.option("ep", t.ep, "expert-parallel size: ranks the experts are spread over (needs --experts)").range(1, 1024);
  p.option("experts", t.model.experts, "experts per MoE block (0: dense MLPs everywhere)").range(0, 1 << 16);
  p.option("topk", t.model.moe_top_k, "experts each token is routed to").range(1, 1 << 16);
  p.option("capacity", t.model.moe_capacity, "MoE capacity factor (<= 0: unlimited, no token dropped)").range(-1, 1e6);
  p.option("moe-every", t.model.moe_every, "every n-th block is MoE (1: all, 2: every other)").range(1, 4096);
  p.option("aux-coef", t.model.moe_aux_weight, "coefficient of the MoE load-balancing loss").range(0, 1e3);
  p.option("etp", t.model.expert_tp,
           "the experts' tensor-parallel size: 1 keeps whole experts on every tensor rank, --tp splits each "
           "expert's width over the tensor group")
      .range(1, 1024);
  std::vector<std::pair<std::string, pipeline::ScheduleKind>> schedules;
  for (auto k : pipeline::all_schedules) schedules.emplace_back(pipeline::schedule_name(k), k);
  p.choice("schedule", t.schedule, std::move(schedules), "pipeline schedule");
  p.option("microbatches", t.microbatches, "micro-batches per step and data-parallel rank").range(1, 1 << 16);
  p.option("chunks", t.chunks, "model chunks per pipeline rank (interleaved_1f1b)").range(1, 64);
  p.option("plan", o.plan,
           "train the layout of this plan file (mpar-plan --write-plan): sizes, schedule, micro-batches, ZeRO, blocks "
           "and recomputation per stage, and the model sizes; flags given beside it must agree with it");
  p.flag("recompute", t.recompute, "recompute activations in backward (keep only stage inputs)");
  std::string stage_layers, recompute_stages;
  p.option("stage-layers", stage_layers,
           "blocks per pipeline stage, comma-separated (e.g. 1,3): pp x chunks counts, stage = chunk x pp + rank, "
           "summing to --layers; a stage may hold none, beside the embedding or the head (default: the even split)");
  p.option("recompute-stages", recompute_stages,
           "what each pipeline stage recomputes in backward, comma-separated in the order of --stage-layers: none, "
           "selective (the attention core's probabilities) or full (the stage's forward); 0 and 1 mean none and "
           "full (e.g. full,selective; instead of --recompute); a stage may list its blocks' modes joined by ':' "
           "(e.g. full:none,none*2 for 2 + 2 blocks; mode*N repeats a mode)");
  p.flag("sequence-parallel", t.model.sequence_parallel,
         "sequence parallelism: layer norms, residuals and dropout on each tensor rank's block of the tokens; "
         "all-gathers and reduce-scatters instead of all-reduces (dense models, --cp 1)");
  using parallel::Precision, parallel::UpdateRule;
  p.choice("precision", t.precision, {{"fp32", Precision::fp32}, {"bf16", Precision::bf16}, {"f16", Precision::f16}},
           "compute precision (fp32 masters)");
  p.choice("optimizer", t.optimizer, {{"adamw", UpdateRule::adamw}, {"sgd", UpdateRule::sgd}}, "optimizer");
  int zero = 0;
  bool zero1 = false;
  p.option("zero", zero,
           "ZeRO stage over the data axis: 0 off, 1 optimizer states sharded, 2 gradients too, 3 parameters too "
           "(gathered per block around its forward and backward)")
      .range(0, 3);
  p.flag("zero1", zero1, "the same as --zero 1");
  p.flag("graph", t.graph,
         "capture the training step once and replay it (CUDA Graphs; --backend cuda): --graph-warmup eager steps, "
         "then the capture, then one launch per step (one rank, tp or dp; fp32 or bf16 AdamW without ZeRO)");
  p.option("graph-warmup", t.graph_warmup, "eager steps before --graph captures the step").range(1, 1 << 30);
  p.option("batch", t.global_batch, "sequences per step (global)").range(1, 1 << 24);
  p.option("steps", t.steps, "optimizer steps").range(1, 1 << 30);
  p.option("lr", t.lr, "peak learning rate").range(0, 10);
  p.option("min-lr", t.min_lr, "final learning rate of the cosine decay").range(0, 10);
  p.option("warmup", o.warmup, "warm-up steps (-1: a tenth of --steps)").range(-1, 1 << 30);
  p.option("clip", t.clip, "global gradient-norm clip (0: off)").range(0, 1e9);
  p.option("bucket-kib", o.bucket_kib, "data-parallel bucket size in KiB").range(1, 1 << 22);
  p.option("grad-topk", t.grad_topk_density,
           "top-k gradient compression over the data-parallel ranks: each sends this share of every gradient (its "
           "largest entries plus what it held back before; error feedback) instead of the dense all-reduce; 0: off "
           "(--dp > 1, no --zero, --ep 1, fp32 or bf16, host backend)")
      .range(0, 1);
  p.option("seed", t.model.seed, "initialisation seed");
  p.option("data-seed", t.data_seed, "batch sampling seed");
  p.option("metrics", o.metrics, "write one JSON object per step to this file");
  p.option("trace", o.trace, "write the Chrome trace of step --trace-step to this file");
  p.option("trace-step", o.trace_step, "which step --trace records");
  p.option("save", o.save, "checkpoint directory");
  p.option("save-every", o.save_every, "save every N steps (0: only at the end)");
  p.option("keep-last", o.keep_last, "keep only the newest N checkpoints in --save (0: every one)");
  p.option("resume", o.resume, "resume from this checkpoint (any tp/pp/dp layout)");
  p.choice("exit-signal", o.exit_signal,
           {{"SIGTERM", SIGTERM}, {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}, {"SIGHUP", SIGHUP}, {"none", 0}},
           "the signal (a scheduler's notice before it kills the job) that stops the run after the current step, "
           "saves a checkpoint to --save and prints how to resume; exit status 0 (none: the signal ends the process "
           "at once). Ctrl-C (SIGINT) always ends it at once");
  p.option("sample", o.sample, "characters to generate at the end (0: none)").range(0, 1 << 20);
  p.option("sample-progress-s", o.sample_progress_s,
           "seconds between the progress lines (stderr) of a long --sample (0: after every character)")
      .range(0, 86400);
  p.option("log-every", o.log_every, "print a progress line every N steps").range(1, 1 << 30);
  p.option("mem-limit-gib", o.mem_limit_gib,
           "memory per rank: a configuration estimated to need more is refused before it starts (default: physical "
           "memory / ranks on this machine)")
      .range(0, 1 << 24);
  p.flag("quiet", o.quiet, "no per-step progress lines");
  p.choice("backend", o.backend, {{"host", "host"}, {"cuda", "cuda"}},
           "compute backend: host (CPU) or cuda (thread ranks share GPU 0; under mpirun one GPU per process, NCCL)");
  p.flag("check-against-host", o.check_against_host,
         "run --check-steps steps on the CUDA backend and on the host from the same weights and data; compare the "
         "losses and gradient norms (exit 1 on a mismatch)");
  p.flag("check-layout", o.check_layout,
         "train --check-steps steps in the given layout and on one rank from the same seeds and data; compare every "
         "step's loss and every parameter against the precision's tolerance (exit 1 when they differ)");
  p.option("check-steps", o.check_steps, "steps of --check-against-host and --check-layout").range(1, 1 << 20);
  p.choice("comm", o.comm, {{"auto", "auto"}, {"nccl", "nccl"}, {"mpi", "mpi"}},
           "communicator: auto (NCCL for --backend cuda under mpirun, else threads or MPI), nccl (--backend cuda: "
           "one GPU per rank, thread ranks or mpirun's processes), mpi (MPI over host memory, under mpirun; "
           "--backend host)");
  if (!p.parse(argc, argv)) {
    std::cout << p.help();
    std::exit(0);
  }
  // Options that would otherwise be ignored or fail later, deep inside training.
  require(!p.given("mem-limit-gib") || o.mem_limit_gib > 0,
          "train_gpt: --mem-limit-gib must be positive (GiB per rank); "
          "leave it out to use physical memory / ranks");
  require(!p.given("resume") || !o.resume.empty(),
          "train_gpt: --resume is empty; give a checkpoint directory (or the "
          "--save directory holding 'latest'), or leave --resume out to train from scratch");
  require(o.save_every == 0 || !o.save.empty(), "train_gpt: --save-every ", o.save_every,
          " needs --save DIR to say where the checkpoints go");
  require(o.keep_last == 0 || !o.save.empty(), "train_gpt: --keep-last ", o.keep_last,
          " needs --save DIR, whose old checkpoints it removes");
  require(o.trace.empty() || o.trace_step < t.steps, "train_gpt: --trace-step ", o.trace_step,
          " is beyond the last step (", t.steps - 1, " with --steps ", t.steps,
          "; steps count from 0): nothing would be traced");
  require(!p.given("trace-step") || !o.trace.empty(),
          "train_gpt: --trace-step needs --trace FILE to say where the trace goes");
  require(!o.hf_gpt2 || !o.export_path.empty() || !o.init_from.empty(),
          "train_gpt: --hf-gpt2 names the tensors of --export and --init-from; give --export FILE.safetensors or "
          "--init-from FILE.safetensors, or drop --hf-gpt2");
  require(!o.hf_gpt2 || !o.hf_llama, "train_gpt: give one of --hf-gpt2 and --hf-llama");
  // A Hugging Face model to start from keeps its sizes in the config.json beside it (as save_pretrained and
  // --export --hf-llama write it): the model is built to them, and sizes also given must agree.
  if (!o.init_from.empty() && (o.hf_gpt2 || o.hf_llama)) {
    models::apply_hf_config_beside(t.model, o.init_from, p, "train_gpt");
  }
  require(!o.hf_llama || t.model.is_llama(),
          "train_gpt: --hf-llama writes LlamaForCausalLM's tensor names, which a --model gpt2 run does not have; add "
          "--model llama, or use --hf-gpt2 for GPT-2's names");
  require(!o.hf_llama || !o.export_path.empty() || !o.init_from.empty(),
          "train_gpt: --hf-llama names the tensors of --export and --init-from; give --export DIR/model.safetensors "
          "or --init-from DIR/model.safetensors, or drop --hf-llama");
  require(!p.given("check-steps") || o.check_against_host || o.check_layout,
          "train_gpt: --check-steps sets how many steps --check-against-host or --check-layout compares; add one of "
          "them, or drop --check-steps");
  if (o.check_layout) {
    require(!o.check_against_host,
            "train_gpt: --check-layout and --check-against-host are two checks; run them one at a time");
    require(o.backend == "host" && !train_gpt::under_mpirun(),
            "train_gpt: --check-layout runs the layout and the single rank as thread ranks of this process on the "
            "host backend; run it without mpirun and without --backend cuda (the layout's mesh is the same)");
    for (const char* given :
         {"resume", "save", "save-every", "export", "metrics", "trace", "val-data", "val-split", "val-every"})
      require(!p.given(given),
              "train_gpt: --check-layout trains two runs of --check-steps steps from scratch and "
              "writes nothing; drop --",
              given, " (or drop --check-layout to train)");
    require(o.check_steps <= t.steps, "train_gpt: --check-steps ", o.check_steps, " exceeds --steps ", t.steps,
            " (the steps checked are the first of the run configured); give --check-steps at most ", t.steps);
  }
  require(!p.given("graph-warmup") || t.graph,
          "train_gpt: --graph-warmup sets the eager steps before --graph captures the step; add --graph, or drop "
          "--graph-warmup");
  require(o.val_every == 0 || o.val_every <= t.steps, "train_gpt: --val-every ", o.val_every, " is beyond --steps ",
          t.steps, ": no validation would run; give --val-every at most ", t.steps);
  require(!(zero1 && p.given("zero") && zero != 1), "train_gpt: --zero1 and --zero ", zero, " ask for ",
          zero == 0 ? "ZeRO-1 and for none" : "two ZeRO stages", "; give one");
  t.zero = parallel::zero_stage_from_number(zero1 ? 1 : zero);
  require(t.min_lr <= t.lr, "train_gpt: --min-lr ", t.min_lr, " exceeds --lr ", t.lr,
          " (the cosine schedule decays from --lr to --min-lr); give --min-lr at most --lr",
          t.lr == 0 ? " (--lr 0 needs --min-lr 0)" : "");
  if (p.given("stage-layers")) t.stage_layers = parse_count_list("stage-layers", stage_layers);
  if (p.given("recompute-stages")) parse_recompute_list(recompute_stages, t.recompute_stages, t.recompute_blocks);
  if (p.given("plan")) {
    require(!o.plan.empty(), "train_gpt: --plan is empty; give the file mpar-plan --write-plan wrote");
    apply_plan(p, o);
  }
  // (After the plan, which may set the family.)
  require(t.model.is_llama() || (!p.given("kv-heads") && !p.given("rope-theta")),
          "train_gpt: --kv-heads and --rope-theta are Llama's; add --model llama, or drop them");
  require(!o.hf_gpt2 || !t.model.is_llama(),
          "train_gpt: --hf-gpt2 writes GPT-2's tensor names, which a --model llama run does not have; use --hf-llama "
          "(LlamaForCausalLM's names), or drop --hf-gpt2 (--export then writes mpar's names)");
  t.bucket_bytes = o.bucket_kib * 1024;
  t.warmup = o.warmup >= 0 ? std::size_t(o.warmup) : t.steps / 10;
  require(t.warmup <= t.steps, "train_gpt: --warmup ", t.warmup, " exceeds --steps ", t.steps,
          " (the learning rate would never reach --lr); give --warmup at most ", t.steps);
  require(o.comm != "nccl" || o.backend == "cuda",
          "train_gpt: --comm nccl carries device memory, one GPU per rank: use it with --backend cuda (the host "
          "backend's thread ranks use the threads communicator, its processes --comm mpi)");
  // MPI reads the buffers it is given on the host, unordered with a device's streams: device memory would fault or
  // race. NCCL is the transport for device memory.
  require(o.comm != "mpi" || o.backend != "cuda",
          "train_gpt: --comm mpi takes host memory, and --backend cuda's buffers are device memory; use --comm nccl "
          "(the default under mpirun with --backend cuda), or --backend host with --comm mpi");
  require(o.comm != "mpi" || train_gpt::under_mpirun(),
          "train_gpt: --comm mpi needs mpirun (thread ranks use the threads communicator)");
  require(!t.graph || (o.backend == "cuda" && !o.check_against_host),
          "train_gpt: --graph captures the step on the GPU (CUDA Graphs); the host backend (and --check-against-host's "
          "host run) issues each operation as it runs, so there is nothing to capture: use --backend cuda without "
          "--check-against-host, or drop --graph");
  require(!t.graph || t.world_size() == 1 || (train_gpt::under_mpirun() && o.comm != "mpi"), "train_gpt: --graph on ",
          t.world_size(),
          " thread ranks: the device communicator meets at host barriers, which a captured step cannot hold, and NCCL "
          "over thread ranks (--comm nccl) has not been proven under capture; run one process per GPU under mpirun "
          "(NCCL), or --graph on one rank");
  require(o.val_split == 0 || o.val_data.empty(), "train_gpt: give --val-data or --val-split, not both");
  require(t.grad_topk_density == 0 || (o.backend == "host" && !o.check_against_host), "train_gpt: --grad-topk ",
          t.grad_topk_density,
          " selects each gradient's largest entries on the host, and --backend cuda's gradients are device memory; "
          "use --backend host, or drop --grad-topk");
  // Mesh and MoE checks that need no data file, before any rank starts.
  require(
      t.cp == 1 || (o.backend == "host" && !o.check_against_host), "train_gpt: --cp ", t.cp,
      " runs on the host backend only (ring attention's CUDA kernels are checked per operation but have not "
      "trained on a GPU yet; docs/context-parallel.md); use --backend host without --check-against-host, or --cp 1");
  require(t.ep == 1 || t.model.experts > 0, "train_gpt: --ep ", t.ep,
          " spreads experts, but the model has none; add --experts N (a multiple of ", t.ep, ") or use --ep 1");
  require(t.model.experts == 0 || t.model.experts % t.ep == 0, "train_gpt: --experts ", t.model.experts,
          " does not divide over --ep ", t.ep, "; use --experts as a multiple of ", t.ep, " or an --ep dividing ",
          t.model.experts);
  require(t.model.experts == 0 || t.model.moe_top_k <= t.model.experts, "train_gpt: --topk ", t.model.moe_top_k,
          " exceeds --experts ", t.model.experts, "; route each token to at most --experts experts");
  // Thread ranks are threads of this process: beyond a limit they only thrash the machine.
  require(train_gpt::under_mpirun() || o.backend == "cuda" || t.world_size() <= train_gpt::max_thread_ranks(),
          "train_gpt: tp x cp x pp x dp x ep = ", t.tp, " x ", t.cp, " x ", t.pp, " x ", t.dp, " x ", t.ep, " = ",
          t.world_size(), " thread ranks in one process, more than the ", train_gpt::max_thread_ranks(),
          " this machine with ", std::max(1u, std::thread::hardware_concurrency()),
          " cores can run; use a smaller mesh, or start one process "
          "per rank with mpirun");
  // The mesh against the model (heads over tp, layers over stages, the schedule), before any data is read.
  train_gpt::check_mesh(t);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    if (o.check_layout) return train_gpt::run_layout_check(o);
    if (o.backend == "cuda" || o.check_against_host) {
#if defined(MPAR_HAVE_CUDA)
      return train_gpt::run_cuda(o, &argc, &argv);
#else
      throw config_error(
          "train_gpt: --backend cuda and --check-against-host need a build with the CUDA backend "
          "(configure with -DMPAR_ENABLE_CUDA=ON on a machine with the CUDA toolkit)");
#endif
    }
    return train_gpt::run_host(o, &argc, &argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", train_gpt::error_line(e).c_str());
    return 2;
  }
}
