#pragma once
// The training loop of train_gpt, shared by its host part (train_host.cpp) and its CUDA part
// (train_cuda.cu): the checks before a run, progress lines, the summary, advice and the generated sample.
// The options are in options.hpp, which main.cpp parses.
#include <unistd.h>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <mpar/data/token_file.hpp>
#include <mpar/data/token_range.hpp>
#include <mpar/data/token_vector.hpp>
#include <mpar/io/exit_signal.hpp>
#include <mpar/io/file.hpp>
#include <mpar/io/lock.hpp>
#include <mpar/models/gpt_config_from_hf.hpp>
#include <mpar/models/gpt_generate.hpp>
#include <mpar/models/gpt_trainer_instances.hpp>
#include <mpar/mpar.hpp>
#include <mpar/observe/allocations.hpp>
#include <mpar/pipeline/timeline_lanes_text.hpp>
#include <mpar/pipeline/timeline_trace.hpp>
#include <mpar/plan/memory_model.hpp>
#include <mpar/plan/pipeline_timing.hpp>

#include "options.hpp"

namespace train_gpt {

namespace fs = std::filesystem;
using namespace mpar;

/**
 * The checks of --data before it is read: a directory, a device or a pipe (/dev/zero would be read
 * forever) or a file larger than --max-data-mib is refused, naming the file and the option.
 */
inline bool is_token_file(const std::string& path) { return path.ends_with(".bin") || path.ends_with(".npy"); }
/** The vocabulary of a token file: --vocab, else GPT-2's 50257. */
inline std::size_t token_file_vocab(const Options& o) { return o.vocab ? o.vocab : 50257; }

inline void check_data_file(const Options& o) {
  std::error_code ec;
  const auto st = fs::status(o.data, ec);
  require(st.type() != fs::file_type::not_found, "train_gpt: cannot open '", o.data, "' (--data): no such file");
  require(!ec, "train_gpt: cannot read --data '", o.data, "': ", ec.message());
  require(st.type() != fs::file_type::directory, "train_gpt: --data '", o.data,
          "' is a directory; give a text file inside it");
  require(st.type() == fs::file_type::regular, "train_gpt: --data '", o.data,
          "' is not a regular file (a device or a pipe has no end to read to); give a text file");
  if (is_token_file(o.data)) return;  // memory-mapped, not read whole; its header is checked when it is opened
  const auto bytes = fs::file_size(o.data, ec);
  require(!ec, "train_gpt: cannot read --data '", o.data, "': ", ec.message());
  require(bytes <= o.max_data_mib * (std::size_t(1) << 20), "train_gpt: --data '", o.data, "' is ", bytes >> 20,
          " MiB, more than --max-data-mib ", o.max_data_mib,
          " (the text is read whole into memory); raise --max-data-mib "
          "or give a smaller file");
}

/**
 * The files the run writes, checked before it trains: `--export` replaces the file at its path (a staging
 * directory renamed into place), `--metrics` and `--trace` truncate theirs. None may be an input of the run
 * (`--data`, `--val-data`) or a directory, `--export` not a device either (it would replace the device node),
 * and each one's directory must exist; `--export` must be able to create its staging directory there.
 */
inline void check_output_paths(const Options& o) {
  const std::pair<const char*, const std::string*> outputs[] = {
      {"--export", &o.export_path}, {"--metrics", &o.metrics}, {"--trace", &o.trace}};
  const std::pair<const char*, const std::string*> inputs[] = {{"--data", &o.data}, {"--val-data", &o.val_data}};
  auto same_file = [](const std::string& a, const std::string& b) {
    std::error_code ec;
    return a == b || (fs::exists(a, ec) && fs::exists(b, ec) && fs::equivalent(a, b, ec));
  };
  for (std::size_t i = 0; i < std::size(outputs); ++i) {
    const auto& [name, path] = outputs[i];
    if (path->empty()) continue;
    std::error_code ec;
    const auto st = fs::status(*path, ec);
    require(st.type() != fs::file_type::directory, "train_gpt: ", name, " '", *path,
            "' is a directory; give a file name (inside it, say)");
    require(std::string_view(name) != "--export" || st.type() == fs::file_type::not_found ||
                st.type() == fs::file_type::regular,
            "train_gpt: --export '", *path,
            "' exists and is not a regular file (a device or a pipe), which the export ",
            "would replace; give a file name");
    for (const auto& [in_name, in_path] : inputs)
      require(in_path->empty() || !same_file(*path, *in_path), "train_gpt: ", name, " '", *path, "' is the ", in_name,
              " file; writing it would destroy the input: give another file name");
    for (std::size_t j = i + 1; j < std::size(outputs); ++j)
      require(outputs[j].second->empty() || !same_file(*path, *outputs[j].second), "train_gpt: ", name, " and ",
              outputs[j].first, " both write '", *path, "'; give each its own file");
    const fs::path dir = fs::path(*path).parent_path().empty() ? fs::path(".") : fs::path(*path).parent_path();
    require(fs::is_directory(dir, ec), "train_gpt: ", name, " '", *path, "': its directory '", dir.string(),
            "' does not exist; create it first");
  }
  if (!o.save.empty()) {
    // A new run into a directory that already holds another run's checkpoints would point its `latest` back at
    // this run's earlier steps and leave the two runs' checkpoints side by side. Continuing that run (--resume from
    // the directory or from one of its checkpoints) is what such a directory is for.
    std::error_code ec;
    const fs::path latest = fs::path(o.save) / io::latest_file_name;
    if (fs::exists(latest, ec)) {
      const fs::path resume(o.resume);
      const bool continues =
          !o.resume.empty() && (fs::equivalent(resume, o.save, ec) || fs::equivalent(resume.parent_path(), o.save, ec));
      std::string newest;
      std::getline(std::ifstream(latest), newest);
      require(continues, "train_gpt: --save '", o.save, "' already holds the checkpoints of another run (latest: ",
              newest.empty() ? std::string("unreadable") : newest,
              "); this run would mix its own with them and move 'latest' back. Continue that run with --resume ",
              o.save, ", or give an empty or new --save directory");
    }
  }
  if (!o.export_path.empty()) {
    // What the export does at the end, tried now: a directory created beside the file, and removed.
    const std::string why = io::cannot_create_beside(o.export_path);
    require(why.empty(), "train_gpt: --export '", o.export_path,
            "' cannot be written (creating a directory beside it failed: ", why,
            "); give a path in a writable directory");
  }
}

/**
 * Per-rank memory of the configuration from the planner's memory model (docs/planner.md), for the
 * fullest pipeline rank: parameters, gradients, optimizer states and fp32 masters, activations of
 * the schedule's peak in-flight micro-batches, communication buffers; with experts, each rank's E / ep of
 * every MoE layer (states sharded over the dp ranks holding them under ZeRO) and the MoE layers' state.
 */
/** The model as the planner counts it (parameters, FLOPs, memory): the padded vocabulary is what the layers compute. */
inline plan::GptModel planner_model(const models::GptConfig& m) {
  plan::GptModel model{m.layers, m.hidden, m.heads, m.seq, m.padded_vocab()};
  model.experts = m.experts, model.moe_every = m.moe_every, model.moe_top_k = m.moe_top_k;
  model.moe_capacity = m.moe_capacity;
  // Llama's blocks as the planner counts them (GPT-2's MLP is counted 4h wide whatever --ffn says).
  if (m.is_llama()) model.family = m.family, model.kv_heads = m.kv_heads, model.ffn = m.ffn;
  return model;
}

inline plan::MemoryEstimate estimate_rank_memory(const models::GptTrainConfig& cfg) {
  const plan::GptModel model = planner_model(cfg.model);
  plan::ParallelConfig c;
  c.tp = cfg.tp, c.pp = cfg.pp, c.dp = cfg.batch_ranks(), c.cp = cfg.cp, c.ep = cfg.ep;
  c.microbatch_size = cfg.microbatch_size(), c.microbatches = std::size_t(cfg.microbatches);
  c.schedule = cfg.schedule;
  c.virtual_stages = std::size_t(cfg.chunks);
  // Each stage in its own mode (none, selective or full), as the memory model counts them per rank.
  c.recompute = cfg.recompute_of(0);
  c.recompute_stages = cfg.recompute_stages;
  c.recompute_blocks = cfg.recompute_blocks;  // and each block in its own, where a stage's blocks differ
  c.stage_layers = cfg.stage_layers;          // the fullest pipeline rank under an uneven partition
  c.sequence_parallel = cfg.model.sequence_parallel;
  c.etp = cfg.model.expert_tp;
  c.zero = cfg.zero;
  plan::Precision p = plan::Precision::fp32_host(cfg.optimizer == parallel::UpdateRule::adamw ? 8 : 4);
  if (cfg.precision != parallel::Precision::fp32)
    p.master_bytes = 4;  // the fp32 masters beside the 16-bit-rounded weights
  plan::MemoryOptions mo;
  mo.attention_dropout = cfg.model.dropout > 0;
  mo.dp_bucket_bytes = double(cfg.bucket_bytes);
  plan::ActivationPeaks peaks;
  return plan::peak_memory(model, c, p, peaks(c), mo);
}

/** The per-rank memory budget: --mem-limit-gib, else physical memory over the ranks of this machine. */
inline double rank_memory_limit(const Options& o) {
  if (o.mem_limit_gib > 0) return o.mem_limit_gib * double(1ull << 30);
  const double phys = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGE_SIZE));
  return phys / double(local_ranks(o));
}

/**
 * Everything checked before any rank starts or allocates (config_error naming what to change): the
 * mesh against the model and the ranks this machine can run, what --sample needs of the text, and the
 * per-rank memory the configuration needs against the budget.
 */
inline void preflight(const Options& o) {
  check_data_file(o);
  check_output_paths(o);
  require(o.init_from.empty() || fs::is_regular_file(o.init_from), "train_gpt: --init-from '", o.init_from,
          "' is not a file; give a safetensors file (train_gpt --export, or a Hugging Face model.safetensors)");
  models::GptTrainConfig cfg = o.train;
  if (is_token_file(o.data)) {
    cfg.model.vocab = data::TokenFile(o.data, token_file_vocab(o), o.train.model.seq).vocab_size();
  } else {
    const data::CharDataset ds(o.data, o.train.model.seq);
    cfg.model.vocab = ds.vocab_size();
    bool has_newline = false;
    for (std::size_t i = 0; i < ds.vocab_size(); ++i) has_newline = has_newline || ds.decode(std::int32_t(i)) == '\n';
    require(o.sample == 0 || has_newline, "train_gpt: --data '", o.data,
            "' has no newline, which --sample uses to start the generated text; give "
            "--sample 0 or a text with lines");
  }
  // A Hugging Face model to start from (main.cpp took its sizes from config.json) predicts its tokenizer's ids.
  require(o.init_from.empty() || o.train.model.vocab == 0 || o.train.model.vocab == cfg.model.vocab,
          "train_gpt: --init-from '", o.init_from, "' is a model of ", o.train.model.vocab,
          " token ids (its config.json), but --data '", o.data, "' has ", cfg.model.vocab,
          "; train on data tokenized for that model (a token file, with --vocab ", o.train.model.vocab, ")");
  require(o.plan_vocab == 0 || o.plan_vocab == cfg.model.vocab, "train_gpt: the plan '", o.plan,
          "' was made for a vocabulary of ", o.plan_vocab, ", but --data '", o.data, "' has ", cfg.model.vocab,
          " token ids; plan again with mpar-plan --vocab ", cfg.model.vocab);
  cfg.pad_vocab_for_mesh();
  cfg.validate(cfg.world_size());
  const plan::MemoryEstimate e = estimate_rank_memory(cfg);
  const double limit = rank_memory_limit(o);
  // One unit for every number, the largest that still shows the smaller of the need and the budget:
  // --mem-limit-gib 0.0001 reads 104.86 KiB, not 0.00 GiB.
  const double smaller = std::min(e.total(), limit);
  const auto [unit, unit_name] = smaller >= double(1ull << 30)   ? std::pair(double(1ull << 30), "GiB")
                                 : smaller >= double(1ull << 20) ? std::pair(double(1ull << 20), "MiB")
                                                                 : std::pair(1024.0, "KiB");
  auto g = [unit, unit_name](double b) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.2f %s", b / unit, unit_name);
    return std::string(buf);
  };
  require(e.total() <= limit, "train_gpt: each rank needs about ", g(e.total()), " (parameters ", g(e.parameters),
          " + gradients ", g(e.gradients), " + optimizer states ", g(e.optimizer), " + activations ", g(e.activations),
          " + communication buffers ", g(e.communication), ", pipeline rank ", e.pipeline_rank, "), more than the ",
          g(limit), " per rank available (",
          o.mem_limit_gib > 0 ? std::string("--mem-limit-gib")
                              : "physical memory / " + std::to_string(local_ranks(o)) + " ranks",
          "): use --recompute, --zero 1, 2 or 3, more --pp stages, ",
          cfg.tp > 1 && !cfg.model.sequence_parallel && cfg.cp == 1 && cfg.model.experts == 0 ? "--sequence-parallel, "
                                                                                              : "",
          cfg.model.experts > 0 ? "the experts over more ranks (--ep), " : "",
          cfg.model.experts > 0 && cfg.tp > 1 && cfg.model.expert_tp == 1
              ? "each expert split over the tensor ranks (--etp " + std::to_string(cfg.tp) + "), "
              : std::string(),
          "fewer sequences per micro-batch (--batch, --microbatches), a smaller model, or set --mem-limit-gib");
}

inline std::string human(double v) {
  char buf[32];
  if (v >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}
/** A number for the --metrics file: JSON has no NaN or infinity, so a diverged step's loss is written as null. */
inline std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}
inline std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}
inline std::string duration(double s) {
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%dh%02dm", int(s / 3600), int(std::fmod(s, 3600) / 60));
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s / 60), int(std::fmod(s, 60)));
  else
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  return buf;
}

/**
 * Every pipeline rank's events of one step, gathered to world rank 0 (collective; serialised as doubles). The
 * events are host values, so they travel as the trainer's host messages, never as host buffers handed to the world.
 */
template <class Trainer>
std::optional<pipeline::Timeline> gather_timeline(Trainer& tr, const pipeline::StepStats& st) {
  const bool contributes = tr.coord().tensor == 0 && tr.coord().data == 0 && tr.coord().context == 0;
  std::vector<double> mine;
  if (contributes)
    for (const auto& e : st.timeline.events)
      mine.insert(mine.end(), {double(tr.coord().pipeline), double(int(e.lane)), double(int(e.action.op)),
                               double(e.action.mb), double(e.action.chunk), double(e.action.peer), e.start, e.end});
  std::vector<double> all;
  const int lead = tr.host_messages([&](auto& world) {
    std::vector<double> n{double(mine.size())};
    world.all_reduce(std::span<double>(n), ReduceOp::max);
    mine.resize(static_cast<std::size_t>(n[0]), -1.0);  // padding rows have rank -1
    all.resize(static_cast<std::size_t>(n[0]) * static_cast<std::size_t>(world.size()));
    world.gather(std::span<const double>(mine), std::span<double>(all), 0);
    return world.rank();
  });
  if (lead != 0) return std::nullopt;
  pipeline::Timeline t = st.timeline;
  t.events.clear();
  for (std::size_t i = 0; i + 8 <= all.size(); i += 8) {
    if (all[i] < 0) continue;
    pipeline::TimelineEvent e;
    e.rank = int(all[i]);
    e.lane = pipeline::Lane(int(all[i + 1]));
    e.action = pipeline::Action{pipeline::Op(int(all[i + 2])), int(all[i + 3]), int(all[i + 4]), int(all[i + 5])};
    e.start = all[i + 6];
    e.end = all[i + 7];
    t.events.push_back(e);
  }
  return t;
}

/**
 * Temperature-0.8 sampling (models::generate) from a single-rank copy of the trained model, loaded from
 * `ckpt`, starting from a full context of newlines; called by one rank. The copy is a host model on a one-rank
 * threads group in host memory, whatever the training ranks' backend and communicator. Long samples report
 * their progress on stderr (the sample itself goes to stdout) every `progress_s` seconds (0: after every
 * character).
 */
inline std::string generate(const models::GptConfig& mc, const data::CharDataset& ds, const fs::path& ckpt,
                            std::size_t n, std::uint64_t seed, double progress_s) {
  if (n == 0) return {};
  HostMemoryResource host;  // a device rank's thread has its device memory installed
  ScopedMemoryResource use(host);
  using TC = observe::TimedCommunicator<ThreadsCommunicator>;
  TC solo(ThreadsCommunicator::single());
  models::GptPipelinePart<TC> model(solo, mc, true, true, 0, mc.layers);
  std::vector<io::LoadBlock> blocks;
  for (auto* p : model.parameters())
    blocks.push_back({p->name, p->global_shape, io::BoxN(p->local_box.begin(), p->local_box.end()), p->layout,
                      std::span<float>(p->value)});
  (void)io::load_checkpoint(ckpt, std::span<const io::LoadBlock>(blocks));
  const std::vector<std::int32_t> ctx(mc.seq, ds.encode('\n'));
  const auto t0 = std::chrono::steady_clock::now();
  auto last_report = t0;
  const auto report = [&](std::size_t done, std::size_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (done == total || std::chrono::duration<double>(now - last_report).count() < progress_s) return;
    last_report = now;
    const double s = std::chrono::duration<double>(now - t0).count();
    std::fprintf(stderr, "sampling: %zu/%zu characters, %s left\n", done, total,
                 duration(s / double(done) * double(total - done)).c_str());
  };
  const std::vector<std::int32_t> ids =
      models::generate(model, ctx, n, models::SamplingConfig{0.8, 0, seed, 0x5a3b1eull}, report);
  std::string out;
  for (auto id : ids) out += ds.decode(id);
  return out;
}

/**
 * How many steps the next `train_steps` call runs. Under 2bw they are one program without a flush (the trainer runs
 * them so in fp32; otherwise step by step), ending where the loop acts between steps: validation, a checkpoint, the
 * traced step, the last step. A stop signal is honoured after the program. Other schedules: one step.
 */
inline std::size_t steps_in_one_program(std::size_t step, const models::GptTrainConfig& cfg, const Options& o,
                                        bool validates) {
  if (cfg.schedule != pipeline::ScheduleKind::two_bw) return 1;
  std::size_t end = std::min(cfg.steps, step + std::size_t(pipeline::PipeDream2BW::steps_per_program));
  auto stop_at_multiple = [&](std::size_t every) {
    if (every > 0) end = std::min(end, (step / every + 1) * every);
  };
  if (validates) stop_at_multiple(o.val_every);
  if (!o.save.empty()) stop_at_multiple(o.save_every);
  if (!o.trace.empty() && o.trace_step >= step) end = std::min(end, o.trace_step + 1);
  return std::max<std::size_t>(1, end - step);
}

/**
 * Stops a run that can no longer train, before it writes a checkpoint or weights that are not numbers. The report
 * is the same on every rank, so every rank throws. Two cases: an update was applied with a non-finite loss or
 * gradient norm (the weights are now NaN or infinite: fp32 and bf16 apply every update), or f16's loss scaler
 * skipped a step that ran with its smallest scale (`scale_before`: f16 overflows unscaled, and every later step
 * would be skipped too).
 */
inline void stop_if_diverged(const models::StepReport& r, double scale_before, const models::GptTrainConfig& cfg,
                             const Options& o) {
  const std::string resume = o.save.empty() || o.save_every == 0
                                 ? ""
                                 : "; --resume " + o.save + " restarts from its last checkpoint (every " +
                                       std::to_string(o.save_every) + " steps)";
  if (!r.skipped && !(std::isfinite(r.loss) && std::isfinite(r.grad_norm)))
    throw std::runtime_error(
        mpar::detail::cat("train_gpt: the run diverged at step ", r.step + 1, ": loss ", r.loss, ", gradient norm ",
                          r.grad_norm, ", and ", parallel::name_of(cfg.precision),
                          " applies every update, so the weights are no longer finite; stopped before "
                          "anything else is written. Lower --lr (now ",
                          cfg.lr, "), keep --clip at 1 (now ", cfg.clip, ") or raise --warmup", resume));
  if (r.skipped && scale_before <= optim::LossScalerConfig{}.min_scale)
    throw std::runtime_error(mpar::detail::cat(
        "train_gpt: the run diverged at step ", r.step + 1, ": f16 overflowed (loss ", r.loss,
        ") with the loss scale already at its minimum (", scale_before,
        "), so every further step would be skipped too; stopped. The weights are those of the last step applied, "
        "and so are those of any checkpoint saved since. Start again with --precision bf16, whose range is fp32's, "
        "or a lower --lr (now ",
        cfg.lr, ")"));
}

/**
 * The process's hold on --exit-signal for the whole run (null with `--exit-signal none`): made before any rank
 * starts, so that the signal never ends the process between the checks and the first step.
 */
inline std::unique_ptr<io::ExitSignal> hold_exit_signal(const Options& o) {
  return o.exit_signal ? std::make_unique<io::ExitSignal>(o.exit_signal) : nullptr;
}

/** `arg` as a POSIX shell reads it back: unchanged when it is plain, else in single quotes. */
inline std::string shell_quoted(const std::string& arg) {
  const bool plain = !arg.empty() && arg.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789_./=:,@%+-") == std::string::npos;
  if (plain) return arg;
  std::string q = "'";
  for (char c : arg) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/**
 * The command that continues a stopped run: the one given, with any --resume replaced by `--resume SAVE` (the
 * directory whose `latest` names the checkpoint just saved), quoted for a shell.
 */
inline std::string resume_command(const Options& o) {
  std::string cmd;
  for (std::size_t i = 0; i < o.command.size(); ++i) {
    const std::string& a = o.command[i];
    if (i > 0 && a == "--resume") {
      ++i;  // and its value
      continue;
    }
    if (i > 0 && a.starts_with("--resume=")) continue;
    cmd += (cmd.empty() ? "" : " ") + shell_quoted(a);
  }
  return cmd + " --resume " + shell_quoted(o.save);
}

/**
 * Trains on every rank of `world` with backend `B` (collective); rank 0 prints progress and the summary.
 * Thread ranks start after main() ran `preflight`; with one process per rank each process runs it here.
 * `exit_signal` (null: none) stops the run after the step in which any rank received it: every rank saves the
 * checkpoint (with --save) and returns, and rank 0 prints how to resume.
 */
template <backend B, class Comm>
void train(Comm& world, const Options& o, bool process_per_rank, const io::ExitSignal* exit_signal) {
  const bool lead = world.rank() == 0;
  // Thread ranks share the process's counters; an MPI process holds one rank.
  observe::AllocationCounter& mem = observe::rank_counter(process_per_rank ? 0 : std::size_t(world.rank()));
  observe::track_this_thread(&mem);
  // One process per rank (MPI) checks here what thread ranks check in main() before they start; the
  // --save directory is locked (and so known to be writable) for the whole run.
  std::optional<io::DirectoryLock> save_lock;
  if (process_per_rank) {
    preflight(o);
    if (lead && !o.save.empty()) save_lock.emplace(o.save);
  }
  // Training data: a token file (.bin, .npy) or characters of a text; validation data of the same kind.
  const std::size_t token_vocab = token_file_vocab(o);
  std::optional<data::CharDataset> chars;
  std::optional<data::TokenFile> tokens, val_tokens;
  std::optional<data::TokenVector> val_chars, char_ids;
  using Split = std::pair<data::TokenRange<data::TokenFile>, data::TokenRange<data::TokenFile>>;
  using CharSplit = std::pair<data::TokenRange<data::TokenVector>, data::TokenRange<data::TokenVector>>;
  std::optional<Split> split;
  std::optional<CharSplit> char_split;
  if (is_token_file(o.data))
    tokens.emplace(o.data, token_vocab, o.train.model.seq);
  else
    chars.emplace(o.data, o.train.model.seq);
  std::optional<data::SourceRef> val;
  if (o.val_split > 0) {
    // A held-out tail: training samples only the head, validation only the tail.
    if (tokens) {
      split.emplace(data::split_tail(*tokens, o.val_split, o.train.model.seq));
    } else {
      char_ids.emplace(chars->ids(), chars->vocab_size(), o.train.model.seq, "text '" + o.data + "'");
      char_split.emplace(data::split_tail(*char_ids, o.val_split, o.train.model.seq));
    }
  }
  const data::SourceRef src = split        ? data::SourceRef(split->first)
                              : char_split ? data::SourceRef(char_split->first)
                              : chars      ? data::SourceRef(*chars)
                                           : data::SourceRef(*tokens);
  if (split) val.emplace(split->second);
  if (char_split) val.emplace(char_split->second);
  if (!o.val_data.empty()) {
    if (tokens) {
      require(is_token_file(o.val_data), "train_gpt: --val-data '", o.val_data, "' must be a token file like --data '",
              o.data, "'");
      val.emplace(val_tokens.emplace(o.val_data, token_vocab, o.train.model.seq));
    } else {
      // Characters encoded with the training text's vocabulary, so the ids mean the same.
      std::ifstream in(o.val_data, std::ios::binary);
      require(bool(in), "train_gpt: cannot open --val-data '", o.val_data, "'");
      std::vector<std::int32_t> ids;
      for (char c; in.get(c);) ids.push_back(chars->encode(c));
      val.emplace(
          val_chars.emplace(std::move(ids), chars->vocab_size(), o.train.model.seq, "text '" + o.val_data + "'"));
    }
  } else if (o.val_every > 0 && !val) {
    val.emplace(src);  // other batches of the training data (another seed): a check, not a held-out set
  }
  models::GptTrainConfig cfg = o.train;
  cfg.model.vocab = src.vocab_size();
  std::optional<models::GptTrainer<Comm, B>> trainer;
  try {
    trainer.emplace(world, cfg, src);
  } catch (const std::bad_alloc& e) {
    throw std::runtime_error(mpar::detail::cat(
        "train_gpt: ran out of memory building the model (", e.what(), "); the estimate before starting was ",
        estimate_rank_memory(cfg).total() / double(1ull << 30),
        " GiB per rank: lower --mem-limit-gib to what the machine really has free"));
  }
  auto& tr = *trainer;
  cfg = tr.config();  // with the vocabulary padding the mesh needs
  // Under mpirun each process parsed its own command line: what the loop around the trainer does (validation,
  // checkpoints, the export, the sample) must agree too; the trainer has checked the model, layout and data.
  tr.require_same_settings({{"--val-data", o.val_data},
                            {"--val-split", std::to_string(o.val_split)},
                            {"--val-every", std::to_string(o.val_every)},
                            {"--val-batches", std::to_string(o.val_batches)},
                            {"--export", o.export_path},
                            {"--hf-gpt2", o.hf_gpt2 ? "on" : "off"},
                            {"--hf-llama", o.hf_llama ? "on" : "off"},
                            {"--save", o.save},
                            {"--save-every", std::to_string(o.save_every)},
                            {"--keep-last", std::to_string(o.keep_last)},
                            {"--resume", o.resume},
                            {"--init-from", o.init_from},
                            {"--sample", std::to_string(o.sample)},
                            {"--trace", o.trace},
                            {"--trace-step", std::to_string(o.trace_step)},
                            {"--exit-signal", o.exit_signal ? io::signal_name(o.exit_signal) : "none"}},
                           "train_gpt");
  const bool held_out = !o.val_data.empty() || o.val_split > 0;
  const std::uint64_t val_seed = held_out ? cfg.data_seed : cfg.data_seed ^ 0x76616cull;

  if (!o.resume.empty()) {
    auto res = tr.resume(o.resume);
    require(tr.step() < cfg.steps, "train_gpt: --steps ", cfg.steps, " is not beyond the step of checkpoint ",
            res.path.string(), ", which has completed ", tr.step(), " steps; give --steps greater than ", tr.step(),
            " to train on");
    if (lead) {
      for (const auto& w : res.warnings) std::fprintf(stderr, "train_gpt: warning: %s\n", w.c_str());
      std::printf("resumed from %s at step %zu (saved with tp=%zu pp=%zu dp=%zu cp=%zu)\n", res.path.c_str(), tr.step(),
                  res.saved_mesh.tp, res.saved_mesh.pp, res.saved_mesh.dp, res.saved_mesh.cp);
    }
  }
  // With --resume the checkpoint holds the weights (and the optimizer and data position): --init-from then only
  // gave the sizes (so that the command a stopped run prints, the original plus --resume, continues it).
  if (!o.init_from.empty() && o.resume.empty()) {
    // Every rank reads its own blocks of the whole tensors (any layout, precision and ZeRO stage).
    std::optional<io::HfLlamaConfig> llama;
    if (o.hf_llama) llama = models::hf_llama_config(cfg.model);
    io::SafetensorsWeights weights(o.init_from,
                                   o.hf_gpt2    ? io::WeightNaming::hf_gpt2
                                   : o.hf_llama ? io::WeightNaming::hf_llama
                                                : io::WeightNaming::mpar,
                                   llama);
    (void)tr.load_weights(weights);
    require(weights.missing().empty(), "train_gpt: --init-from '", o.init_from, "' has no tensor for '",
            weights.missing().front(), "' (", weights.missing().size(),
            " missing); it holds another model: give the sizes it was saved with",
            o.hf_gpt2 || o.hf_llama ? "" : ", or --hf-gpt2 / --hf-llama for Hugging Face names");
    if (lead) std::printf("initialised every weight from %s\n", o.init_from.c_str());
  }
  if (lead) {
    if (chars)
      std::printf(
          "mpar train_gpt: %zu parameters, vocab %zu (padded %zu), text %s (%zu chars, unigram entropy %.3f nats)\n",
          cfg.model.parameter_count(), chars->vocab_size(), cfg.model.padded_vocab(), chars->path().c_str(),
          chars->size(), chars->unigram_entropy());
    else
      std::printf("mpar train_gpt: %zu parameters, vocab %zu (padded %zu), data %s\n", cfg.model.parameter_count(),
                  src.vocab_size(), cfg.model.padded_vocab(), src.describe().c_str());
    if (val)
      std::printf("validation: %zu batches of %s every %zu steps\n", o.val_batches, val->describe().c_str(),
                  o.val_every);
    if (cfg.model.is_llama())
      std::printf("model: llama, %zu key/value heads, SwiGLU width %zu, rotary theta %g\n", cfg.model.kv_head_count(),
                  cfg.model.ffn_size(), cfg.model.rope_theta);
    if (cfg.model.experts > 0)
      std::printf(
          "mixture of experts: %zu experts (top-%zu, capacity factor %g, aux coefficient %g) in %s, "
          "spread over ep=%zu%s\n",
          cfg.model.experts, cfg.model.moe_top_k, cfg.model.moe_capacity, double(cfg.model.moe_aux_weight),
          cfg.model.moe_every == 1 ? "every block"
                                   : ("every " + std::to_string(cfg.model.moe_every) + "-th block").c_str(),
          cfg.ep, cfg.model.expert_tp > 1 ? (", each expert split over tp=" + std::to_string(cfg.tp)).c_str() : "");
    if (cfg.cp > 1)
      std::printf(
          "context parallelism: each sequence of %zu split over cp=%zu ranks (zig-zag chunks of %zu, ring "
          "attention); ranks ordered tensor, context, data, pipeline\n",
          cfg.model.seq, cfg.cp, cfg.model.seq / (2 * cfg.cp));
    std::printf(
        "mesh tp=%zu pp=%zu dp=%zu ep=%zu on %d %s ranks | schedule %s, %d micro-batches of %zu sequences%s | "
        "%s%s%s%s%s\n",
        cfg.tp, cfg.pp, cfg.dp, cfg.ep, world.size(), world.name().c_str(),
        std::string(pipeline::schedule_name(cfg.schedule)).c_str(), cfg.microbatches, cfg.microbatch_size(),
        cfg.chunks > 1 ? (", " + std::to_string(cfg.chunks) + " chunks").c_str() : "",
        std::string(parallel::name_of(cfg.precision)).c_str(),
        cfg.zero != parallel::ZeroStage::none ? (", " + std::string(parallel::name_of(cfg.zero))).c_str() : "",
        cfg.recompute ? ", recompute" : "", cfg.model.sequence_parallel ? ", sequence parallel" : "",
        cfg.grad_topk_density > 0 ? (", gradients top-k " + json_number(cfg.grad_topk_density)).c_str() : "");
    if (!cfg.stage_layers.empty() || !cfg.recompute_stages.empty()) {
      const std::string flags = models::GptTrainConfig::join_recompute(cfg.recompute_stages, cfg.recompute_blocks);
      std::printf("blocks per stage %s (stage = chunk x pp + rank)%s%s\n",
                  models::GptTrainConfig::join_counts(cfg.partition().sizes()).c_str(),
                  flags.empty() ? "" : ", recompute per stage ", flags.c_str());
    }
  }
  std::ofstream metrics;
  if (lead && !o.metrics.empty()) {
    metrics.open(o.metrics);
    require(bool(metrics), "train_gpt: cannot write --metrics file '", o.metrics, "'");
  }

  double sum_time = 0, sum_bubble = 0, sum_comm = 0, sum_tps = 0, last_loss = 0, first_loss = 0;
  std::size_t measured = 0;
  std::int64_t peak_step_bytes = 0;
  const std::size_t first_step = tr.step();
  double scale_before = std::numeric_limits<double>::infinity();  // the loss scale a step runs with (f16)
  const auto t_start = std::chrono::steady_clock::now();
  while (tr.step() < cfg.steps) {
    const std::int64_t live_before = mem.live.load();
    mem.reset_peak();
    std::vector<models::StepReport> reports;
    try {
      reports = tr.train_steps(steps_in_one_program(tr.step(), cfg, o, bool(val)));
    } catch (const std::bad_alloc& e) {
      throw std::runtime_error(
          mpar::detail::cat("train_gpt: ran out of memory in step ", tr.step(), " (", e.what(),
                            "); use --recompute, --zero 1, 2 or 3, more --pp stages or fewer "
                            "sequences per micro-batch, or lower --mem-limit-gib to what is really free"));
    }
    peak_step_bytes = std::max(peak_step_bytes, mem.peak.load() - live_before);
    for (const models::StepReport& r : reports) {
      if (r.step == first_step) first_loss = r.loss;
      last_loss = r.loss;
      if (r.step > first_step || cfg.steps - first_step == 1) {  // the first step warms caches up
        sum_time += r.wall;
        sum_bubble += r.bubble;
        sum_comm += r.communication;
        sum_tps += r.tokens_per_second;
        ++measured;
      }
      if (!o.trace.empty() && r.step == o.trace_step) {
        auto t = gather_timeline(tr, r.stats);
        if (t) {
          std::ofstream f(o.trace);
          pipeline::to_chrome_trace(*t).write(f);
          f.flush();
          require(bool(f), "train_gpt: writing the trace of step ", r.step, " to --trace '", o.trace,
                  "' failed (the directory is not writable, or the disk is full)");
          std::printf("wrote the Chrome trace of step %zu to %s (open in https://ui.perfetto.dev)\n%s", r.step,
                      o.trace.c_str(), pipeline::text_timeline(*t, 0, 100).c_str());
        }
      }
      if (lead && metrics.is_open())
        metrics << "{\"step\": " << r.step << ", \"loss\": " << json_number(r.loss) << ", \"lr\": " << r.lr
                << ", \"grad_norm\": " << json_number(r.grad_norm)
                << ", \"skipped\": " << (r.skipped ? "true" : "false") << ", \"loss_scale\": " << r.loss_scale
                << ", \"step_seconds\": " << r.wall << ", \"tokens_per_second\": " << r.tokens_per_second
                << ", \"bubble\": " << r.bubble << ", \"idle_slots\": " << r.idle_slots
                << ", \"communication\": " << r.communication << ", \"aux_loss\": " << json_number(r.aux_loss)
                << ", \"dropped\": " << r.dropped << "}\n";
      if (lead && metrics.is_open())
        require(bool(metrics.flush()), "train_gpt: writing step ", r.step, " to --metrics '", o.metrics,
                "' failed (is the disk full?)");
      if (lead && !o.quiet && (r.step % o.log_every == 0 || r.step + 1 == cfg.steps)) {
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
        const double done = double(r.step + 1 - first_step) / double(cfg.steps - first_step);
        const int width = 20, filled = int(done * width + 0.5);
        char moe[64] = "";
        if (cfg.model.experts > 0) std::snprintf(moe, sizeof moe, "  aux %.4f  dropped %zu", r.aux_loss, r.dropped);
        // 2bw: how many updates behind the weights this step's passes used were (0 at the first step, then 1).
        if (cfg.schedule == pipeline::ScheduleKind::two_bw)
          std::snprintf(moe + std::strlen(moe), sizeof moe - std::strlen(moe), "  lag %zu", r.weight_lag);
        // With a pipeline: the bubble as a count from the programs (idle slots over the ranks, F one slot, B two),
        // next to the measured share; the planner predicts the same count.
        char slots[32] = "";
        if (cfg.pp > 1) std::snprintf(slots, sizeof slots, " (%g slots)", r.idle_slots);
        char skip[64] = "";
        if (r.skipped) std::snprintf(skip, sizeof skip, "  (overflow: step skipped, loss scale now %g)", r.loss_scale);
        std::printf(
            "step %5zu/%zu  loss %.4f%s  %s tok/s  %6.1f ms  bubble %4.1f%%%s  comm %4.1f%%  [%s%s] %s left%s\n",
            r.step + 1, cfg.steps, r.loss, moe, human(r.tokens_per_second).c_str(), r.wall * 1e3, r.bubble * 100, slots,
            r.communication * 100, std::string(std::size_t(filled), '#').c_str(),
            std::string(std::size_t(width - filled), '.').c_str(), duration(elapsed / done - elapsed).c_str(), skip);
        std::fflush(stdout);
      }
      stop_if_diverged(r, scale_before, cfg, o);
      scale_before = r.loss_scale;
    }
    const models::StepReport& r = reports.back();
    if (val && o.val_every > 0 && (tr.step() % o.val_every == 0 || tr.step() == cfg.steps)) {
      const double vl = tr.evaluate(*val, o.val_batches, val_seed);
      if (lead) std::printf("step %5zu/%zu  validation loss %.4f\n", tr.step(), cfg.steps, vl);
      if (lead && metrics.is_open())
        metrics << "{\"step\": " << r.step << ", \"val_loss\": " << json_number(vl) << "}\n";
    }
    fs::path saved;  // this step's checkpoint
    if (!o.save.empty() && o.save_every > 0 && tr.step() % o.save_every == 0 && tr.step() < cfg.steps) {
      saved = tr.save(o.save, o.keep_last).path;
      if (lead) std::printf("saved %s\n", saved.c_str());
    }
    // A scheduler's notice: every rank stops after the same step (one all-reduce of the flag), saves, returns.
    if (exit_signal && tr.step() < cfg.steps &&
        tr.host_messages([&](auto& w) { return io::exit_requested(w, *exit_signal); })) {
      if (!o.save.empty() && saved.empty()) saved = tr.save(o.save, o.keep_last).path;
      if (!lead) return;
      const std::string signal = io::signal_name(exit_signal->signal());
      if (saved.empty()) {
        std::printf(
            "stopped by %s after step %zu of %zu; nothing saved (no --save): give --save DIR to be able "
            "to resume a stopped run\n",
            signal.c_str(), tr.step(), cfg.steps);
      } else {
        std::printf("stopped by %s after step %zu of %zu, checkpoint %s\nresume with: %s\n", signal.c_str(), tr.step(),
                    cfg.steps, saved.c_str(), resume_command(o).c_str());
      }
      std::fflush(stdout);
      return;
    }
  }

  if (!o.export_path.empty()) {
    const io::WeightNaming naming = o.hf_gpt2    ? io::WeightNaming::hf_gpt2
                                    : o.hf_llama ? io::WeightNaming::hf_llama
                                                 : io::WeightNaming::mpar;
    tr.export_safetensors(o.export_path, naming);
    if (lead)
      std::printf("exported the weights to %s%s\n", o.export_path.c_str(),
                  o.hf_gpt2    ? " (GPT-2 names)"
                  : o.hf_llama ? " (LlamaForCausalLM names; config.json beside it)"
                               : "");
  }

  // Checkpoint (also the source of the single-rank copy that generates the sample).
  fs::path ckpt;
  std::string tmp_dir;
  if (!o.save.empty()) {
    ckpt = tr.save(o.save, o.keep_last).path;
    if (lead) std::printf("saved %s\n", ckpt.c_str());
  } else if (o.sample > 0 && chars) {
    tmp_dir = (fs::temp_directory_path() / ("mpar-train-gpt-" + std::to_string(::getpid()))).string();
    std::vector<double> pid{double(::getpid())};
    tr.host_messages([&](auto& w) { w.broadcast(std::span<double>(pid), 0); });  // one directory for the job
    tmp_dir = (fs::temp_directory_path() / ("mpar-train-gpt-" + std::to_string(long(pid[0])))).string();
    ckpt = tr.save(tmp_dir).path;
  }

  // Summary: per-rank memory, averages, advice, a sample.
  const auto m = tr.memory();
  const std::vector<double> mine{double(m.parameters), double(m.gradients), double(m.optimizer_states),
                                 double(m.compute_copies), double(peak_step_bytes)};
  std::vector<double> all(5 * std::size_t(world.size()));
  tr.host_messages([&](auto& w) { w.gather(std::span<const double>(mine), std::span<double>(all), 0); });
  const std::string sample = lead && o.sample > 0 && chars
                                 ? generate(cfg.model, *chars, ckpt, o.sample, cfg.model.seed, o.sample_progress_s)
                                 : "";
  // --grad-topk: the data-parallel bytes of a step over all ranks, sent and as a dense all-reduce would take them,
  // and the residuals held back (squares summed over the ranks).
  std::vector<double> compression{0, 0, 0};
  if (cfg.grad_topk_density > 0) {
    if (const auto& c = tr.gradient_compression())
      compression = {double(c->sent_bytes), double(c->dense_bytes), c->residual_l2 * c->residual_l2};
    tr.host_messages([&](auto& w) { w.all_reduce(std::span<double>(compression), ReduceOp::sum); });
  }
  world.barrier();
  if (!tmp_dir.empty() && lead) fs::remove_all(tmp_dir);
  if (!lead) return;

  const double n = double(std::max<std::size_t>(measured, 1));
  const double avg_bubble = sum_bubble / n, avg_comm = sum_comm / n;
  char entropy[48] = "";
  if (chars) std::snprintf(entropy, sizeof entropy, " (unigram entropy %.3f)", chars->unigram_entropy());
  std::printf("\nsummary: loss %.4f -> %.4f%s | %s tok/s | %.1f ms/step | bubble %.1f%% | comm %.1f%%\n", first_loss,
              last_loss, entropy, human(sum_tps / n).c_str(), sum_time / n * 1e3, avg_bubble * 100, avg_comm * 100);
  // The same numbers for scripts (scripts/gpu-check.sh takes MFU from it): the mean time of the measured steps (the
  // first is warm-up), and the model's FLOPs per step as the planner counts them (plan::GptModel::model_flops:
  // 72 B s l h^2 (1 + s/(6h)) + 6 B s h V, no recomputation), so that model_tflops / peak is the model FLOPs
  // utilisation.
  const double step_seconds = sum_time / n, step_flops = planner_model(cfg.model).model_flops(double(cfg.global_batch));
  std::printf(
      "throughput: {\"tokens_per_second\": %.6g, \"step_seconds\": %.6g, \"measured_steps\": %zu, "
      "\"model_flops_per_step\": %.17g, \"model_tflops\": %.6g, \"ranks\": %d, \"precision\": \"%s\", "
      "\"layers\": %zu, \"hidden\": %zu, \"heads\": %zu, \"seq\": %zu, \"padded_vocab\": %zu, \"batch\": %zu, "
      "\"microbatch\": %zu}\n",
      double(cfg.global_batch * cfg.model.seq) / step_seconds, step_seconds, measured, step_flops,
      step_flops / step_seconds / 1e12, world.size(), std::string(parallel::name_of(cfg.precision)).c_str(),
      cfg.model.layers, cfg.model.hidden, cfg.model.heads, cfg.model.seq, cfg.model.padded_vocab(), cfg.global_batch,
      cfg.microbatch_size());
  if (cfg.grad_topk_density > 0 && compression[1] > 0)
    std::printf(
        "gradient compression: top-k %g with error feedback over dp=%zu: %s sent per step (all ranks) instead of the "
        "dense all-reduce's %s, %.1fx less; residual held back %.3g (norm); final loss %.4f\n",
        cfg.grad_topk_density, cfg.dp * cfg.cp, mib(compression[0]).c_str(), mib(compression[1]).c_str(),
        compression[1] / compression[0], std::sqrt(compression[2]), last_loss);
  std::printf("peak memory per rank (parameters + gradients + optimizer states + 16-bit copies + activations%s):\n",
              observe::allocation_tracking_enabled() ? ", measured" : ", not measured");
  double worst = 0;
  for (int r = 0; r < world.size(); ++r) {
    const double* v = &all[std::size_t(r) * 5];
    const double total = v[0] + v[1] + v[2] + v[3] + v[4];
    worst = std::max(worst, total);
    const MeshCoord c = DynamicMesh(cfg.tp, cfg.pp, cfg.dp * cfg.cp, cfg.ep).coord(std::size_t(r));  // data x context
    std::printf("  rank %d (t%zu%s p%zu d%zu e%zu): %s = %s + %s + %s + %s + %s\n", r, c.tensor,
                cfg.cp > 1 ? (" c" + std::to_string(c.data % cfg.cp)).c_str() : "", c.pipeline, c.data / cfg.cp,
                c.expert, mib(total).c_str(), mib(v[0]).c_str(), mib(v[1]).c_str(), mib(v[2]).c_str(),
                mib(v[3]).c_str(), mib(v[4]).c_str());
  }
  if (!sample.empty()) std::printf("\nsample:\n%s\n", sample.c_str());

  // Advice, once, when the numbers look bad.
  std::vector<std::string> advice;
  if (cfg.pp > 1 && avg_bubble > 0.30)
    advice.push_back("pipeline bubble " + std::to_string(int(avg_bubble * 100)) +
                     "%: raise --microbatches (bubble ~ (P-1)/(M+P-1); M >= 4P keeps it under ~20%) or use "
                     "--schedule interleaved_1f1b --chunks 2");
  if (world.size() > 1 && avg_comm > 0.40)
    advice.push_back("communication " + std::to_string(int(avg_comm * 100)) + "% of the step: " +
                     (cfg.dp > 1
                          ? std::string("use bigger --bucket-kib") +
                                (cfg.grad_topk_density == 0 && cfg.zero == parallel::ZeroStage::none && cfg.ep == 1 &&
                                         cfg.precision != parallel::Precision::f16
                                     ? ", fewer data-parallel ranks (--dp) or top-k compression (--grad-topk 0.01)"
                                     : " or fewer data-parallel ranks (--dp)")
                          : std::string()) +
                     (cfg.dp > 1 && cfg.tp > 1 ? ", or " : "") +
                     (cfg.tp > 1 ? "a smaller --tp (keep tensor groups on fast links)" : std::string()) +
                     (cfg.dp == 1 && cfg.tp == 1 ? "fewer ranks (--pp, --ep, --cp)" : std::string()) +
                     "; on one machine the ranks share its cores");
  const double limit = rank_memory_limit(o);
  if (worst > 0.8 * limit)
    advice.push_back("peak memory " + mib(worst) + " is near the per-rank limit " + mib(limit) +
                     ": use --recompute, --zero 1, 2 or 3, more --pp, or fewer sequences per micro-batch");
  // Reached only by an f16 run whose last step overflowed and was skipped (a diverged run stops in the loop).
  if (!std::isfinite(last_loss))
    advice.push_back(
        "the last step's loss is not finite (f16 overflowed; the step was skipped and the weights kept): lower --lr, "
        "keep --clip at 1, or use --precision bf16 (f16 overflows where bf16 does not)");
  if (!advice.empty()) {
    std::printf("\nadvice:\n");
    for (const auto& a : advice) std::printf("  - %s\n", a.c_str());
  }
  // The last line says the run completed (scripts and tests check it, with the exit status).
  std::printf("done: steps %zu-%zu of %zu in %s%s%s\n", first_step + 1, cfg.steps, cfg.steps,
              duration(std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count()).c_str(),
              ckpt.empty() || !tmp_dir.empty() ? "" : ", checkpoint ",
              ckpt.empty() || !tmp_dir.empty() ? "" : ckpt.c_str());
  std::fflush(stdout);
}

}  // namespace train_gpt
