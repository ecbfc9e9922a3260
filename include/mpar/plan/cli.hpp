#pragma once
/**
 * @file The `mpar-plan` command line: option parsing with errors that say what to change, the
 * ranked table, and JSON lines (one object per configuration). Kept in a header so tests drive it.
 */
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "mpar/core/error.hpp"
#include "mpar/plan/calibration.hpp"
#include "mpar/plan/search.hpp"
#include "mpar/plan/training_plan.hpp"

namespace mpar::plan {

/** @brief Everything `mpar-plan` was asked for. */
struct CliOptions {
  Problem problem;
  SearchSpace space;
  SearchOptions search;
  Calibration calibration;
  std::optional<std::string> calibration_file;
  std::optional<std::string> write_plan;  ///< --write-plan FILE: the best configuration as a training plan
  bool json = false;
  bool help = false;
};

/** The `--help` text. */
[[nodiscard]] inline std::string cli_usage() {
  return R"(mpar-plan: choose tensor/pipeline/data parallel sizes, micro-batching, schedule and recomputation
for a GPT-style model (GPT-2 or Llama) on a GPU cluster; prints the fastest configurations that fit in memory.

Required:
  --layers N  --hidden N  --heads N  --seq N  --vocab N    the model
  --global-batch N                                         sequences per optimizer step
  --gpus N  --gpus-per-node N                              the cluster
  --gpu-mem-gib X                                          memory per GPU, GiB
  --peak-tflops X                                          dense 16-bit peak per GPU, TFLOP/s
  --intra-node-gbps X                                      NVLink bandwidth per GPU per direction, GB/s (gigabytes)
  --inter-node-gbps X                                      network bandwidth per node per direction, GB/s (all NICs)
Optional (the decoder family, as train_gpt's flags):
  --model gpt2|llama       GPT-2's blocks (default) or Llama's: RMSNorm, rotary positions, grouped-query
                           attention, a SwiGLU MLP, no biases, an untied head
  --kv-heads N             Llama: key/value heads, dividing --heads (default: --heads); tp must divide it
  --ffn N                  Llama: the SwiGLU width (default 4 x --hidden)
Optional (mixture of experts: every --moe-every-th layer's MLP becomes --experts experts of width 4h):
  --experts N  --moe-every N (default 1)  --topk N (default 2)  --capacity X (default 1.25; 0: unlimited)
  --ep N                   expert parallelism: each MoE layer's experts split over N of the data-parallel
                           ranks (a divisor of dp and of --experts); searched when not given
  --expert-tp on|off       tensor parallelism inside the experts: each expert's width split over the tp
                           ranks (train_gpt --etp); both tried when not given
Optional (fix a dimension instead of searching it):
  --tp N  --pp N  --dp N  --microbatch-size N  --virtual-stages N
  --schedule gpipe|1f1b|interleaved_1f1b|zb_h1|zb_h2|2bw
  --asynchronous on|off    also try PipeDream-2BW (weights lag one step; off by default): taken where it is
                           faster and its second weight version fits (train_gpt runs it without a flush)
  --recompute none|selective|full  --zero1 on|off  --zero2 on|off  --zero3 on|off
  --sequence-parallel on|off
                           unfixed, recomputation is also chosen per pipeline rank: where some rank does not
                           fit without it, each takes the least that fits (the table says "mixed", the best
                           "recompute per stage"); --recompute MODE fixes MODE for every stage
  --recompute-mix blocks|stages|off
                           blocks (default): the per-rank mix, and per block inside each rank's stages the
                           fastest numbers of fully, selectively and not recomputed blocks that fit
                           ("full:none*3" in "recompute per stage"); stages: the per-rank mix only; off:
                           one setting for every stage
  --partition balanced|even
                           balanced (default): besides the even split of the layers over the pipeline
                           stages, try the cost-balanced one (embedding and head weighted in; a stage may
                           hold no layer), with the recomputation mixes above; even: only even splits
  --cp N|auto              context parallelism: each sequence split over N GPUs (ring attention; default 1);
                           tp x pp x dp share --gpus / N, and gradients reduce over dp x cp; auto searches
                           every N dividing --gpus whose 2 x N zig-zag chunks divide --seq
Optional (hardware and output):
  --hbm-gbps X             HBM bandwidth per GPU, GB/s (default 2039, A100 80 GB)
  --memory-fraction X      usable share of GPU memory (default 0.95)
  --memory-semantics mpar|megatron
                           mpar (default): as mpar's executor runs today, whole-chunk recomputation and
                           whole-row stage boundaries; megatron: per-layer checkpoints, token-sharded
                           boundaries
  --calibration FILE       JSON-lines measurements replacing the cost model's defaults
  --top N                  configurations to show (default 10)
  --json                   one JSON object per configuration and line instead of the table
  --write-plan FILE        write the best configuration (its layers per stage as printed, and its
                           recomputation per stage) as a training plan: train_gpt --plan FILE runs it
  --help
)";
}

namespace detail {

[[nodiscard]] inline std::size_t parse_count(std::string_view opt, std::string_view v) {
  std::size_t n = 0;
  bool ok = !v.empty();
  for (char ch : v) {
    if (ch < '0' || ch > '9')
      ok = false;
    else if (ok)
      n = n * 10 + std::size_t(ch - '0');
  }
  require(ok && n > 0 && v.size() < 19, opt, " expects a positive whole number, got '", v, "'");
  return n;
}
[[nodiscard]] inline double parse_positive(std::string_view opt, std::string_view v) {
  const std::string s(v);
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  require(!s.empty() && end == s.c_str() + s.size() && std::isfinite(x) && x > 0, opt,
          " expects a positive number, got '", v, "'");
  return x;
}
[[nodiscard]] inline bool parse_switch(std::string_view opt, std::string_view v) {
  if (v == "on" || v == "true" || v == "1") return true;
  if (v == "off" || v == "false" || v == "0") return false;
  throw config_error(mpar::detail::cat(opt, " expects on or off, got '", v, "'"));
}

}  // namespace detail

/** Parses `mpar-plan`'s arguments (without the program name). Throws config_error saying what to change. */
[[nodiscard]] inline CliOptions parse_cli(const std::vector<std::string>& args) {
  CliOptions o;
  o.problem.cluster.hbm_bandwidth = 2039e9;
  std::optional<std::size_t> layers, hidden, heads, seq, vocab, batch, gpus, per_node;
  std::optional<double> mem, peak, intra, inter;
  GptModel moe;            // only the mixture-of-experts and family fields are read
  std::string moe_option;  // the first of --moe-every, --topk, --capacity given (they need --experts)
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string opt = args[i], val;
    bool has_val = false;
    if (auto eq = opt.find('='); opt.rfind("--", 0) == 0 && eq != std::string::npos) {
      val = opt.substr(eq + 1), opt = opt.substr(0, eq), has_val = true;
    }
    require(opt.rfind("--", 0) == 0, "unexpected argument '", opt, "'; options start with -- (see --help)");
    if (opt == "--help" || opt == "-h") {
      o.help = true;
      continue;
    }
    if (opt == "--json") {
      o.json = true;
      continue;
    }
    if (!has_val) {
      require(i + 1 < args.size(), opt, " needs a value (see --help)");
      val = args[++i];
    }
    if (opt == "--layers")
      layers = detail::parse_count(opt, val);
    else if (opt == "--hidden")
      hidden = detail::parse_count(opt, val);
    else if (opt == "--heads")
      heads = detail::parse_count(opt, val);
    else if (opt == "--seq")
      seq = detail::parse_count(opt, val);
    else if (opt == "--vocab")
      vocab = detail::parse_count(opt, val);
    else if (opt == "--global-batch")
      batch = detail::parse_count(opt, val);
    else if (opt == "--gpus")
      gpus = detail::parse_count(opt, val);
    else if (opt == "--gpus-per-node")
      per_node = detail::parse_count(opt, val);
    else if (opt == "--gpu-mem-gib")
      mem = detail::parse_positive(opt, val);
    else if (opt == "--peak-tflops")
      peak = detail::parse_positive(opt, val);
    else if (opt == "--intra-node-gbps")
      intra = detail::parse_positive(opt, val);
    else if (opt == "--inter-node-gbps")
      inter = detail::parse_positive(opt, val);
    else if (opt == "--hbm-gbps")
      o.problem.cluster.hbm_bandwidth = detail::parse_positive(opt, val) * 1e9;
    else if (opt == "--tp")
      o.space.tp = detail::parse_count(opt, val);
    else if (opt == "--pp")
      o.space.pp = detail::parse_count(opt, val);
    else if (opt == "--dp")
      o.space.dp = detail::parse_count(opt, val);
    else if (opt == "--cp")
      o.space.cp = val == "auto" ? std::nullopt : std::optional(detail::parse_count("--cp (a size, or auto)", val));
    else if (opt == "--experts")
      moe.experts = detail::parse_count(opt, val);
    else if (opt == "--model") {
      const auto f = nn::model_family(val);
      require(f.has_value(), "--model '", val, "' is not known; use gpt2 or llama");
      moe.family = *f;
    } else if (opt == "--kv-heads")
      moe.kv_heads = detail::parse_count(opt, val);
    else if (opt == "--ffn")
      moe.ffn = detail::parse_count(opt, val);
    else if (opt == "--moe-every" || opt == "--topk" || opt == "--capacity") {
      if (moe_option.empty()) moe_option = opt;
      if (opt == "--moe-every") moe.moe_every = detail::parse_count(opt, val);
      if (opt == "--topk") moe.moe_top_k = detail::parse_count(opt, val);
      if (opt == "--capacity")
        moe.moe_capacity = val == "0" ? 0.0 : detail::parse_positive("--capacity (a factor, or 0: unlimited)", val);
    } else if (opt == "--ep")
      o.space.ep = detail::parse_count(opt, val);
    else if (opt == "--microbatch-size")
      o.space.microbatch_size = detail::parse_count(opt, val);
    else if (opt == "--virtual-stages")
      o.space.virtual_stages = detail::parse_count(opt, val);
    else if (opt == "--top")
      o.search.top_k = detail::parse_count(opt, val);
    else if (opt == "--zero1")
      o.space.zero1 = detail::parse_switch(opt, val);
    else if (opt == "--zero2")
      o.space.zero2 = detail::parse_switch(opt, val);
    else if (opt == "--zero3")
      o.space.zero3 = detail::parse_switch(opt, val);
    else if (opt == "--sequence-parallel")
      o.space.sequence_parallel = detail::parse_switch(opt, val);
    else if (opt == "--expert-tp")
      o.space.expert_tensor_parallel = detail::parse_switch(opt, val);
    else if (opt == "--asynchronous")
      o.space.asynchronous = detail::parse_switch(opt, val);
    else if (opt == "--partition") {
      require(val == "balanced" || val == "even", "--partition '", val, "' is not known; use balanced or even");
      o.space.balance_stages = val == "balanced";
    } else if (opt == "--calibration")
      o.calibration_file = val;
    else if (opt == "--write-plan") {
      require(!val.empty(), "--write-plan needs a file name");
      o.write_plan = val;
    } else if (opt == "--memory-fraction") {
      o.search.usable_memory_fraction = detail::parse_positive(opt, val);
      require(o.search.usable_memory_fraction <= 1,
              "--memory-fraction is a share of GPU memory; give a value in (0, 1], got ", val);
    } else if (opt == "--memory-semantics") {
      require(val == "mpar" || val == "megatron", "--memory-semantics '", val, "' is not known; use mpar or megatron");
      o.search.memory = val == "mpar" ? MemoryOptions::mpar_executor() : MemoryOptions::megatron();
    } else if (opt == "--schedule") {
      const auto s = parse_schedule(val);
      require(s.has_value(), "--schedule '", val,
              "' is not known; use gpipe, 1f1b, interleaved_1f1b, zb_h1, zb_h2 or 2bw");
      o.space.schedule = *s;
    } else if (opt == "--recompute-mix") {
      require(val == "blocks" || val == "stages" || val == "off", "--recompute-mix '", val,
              "' is not known; use blocks, stages or off");
      o.space.mix_recompute = val != "off";
      o.space.mix_block_recompute = val == "blocks";
    } else if (opt == "--recompute") {
      const auto r = parse_recompute(val);
      require(r.has_value(), "--recompute '", val, "' is not known; use none, selective or full");
      o.space.recompute = *r;
    } else {
      throw config_error(
          mpar::detail::cat("unknown option ", opt, "; see --help for the options mpar-plan understands"));
    }
  }
  if (o.help) return o;
  std::string missing;
  auto need = [&](bool present, const char* name) {
    if (!present) missing += std::string(missing.empty() ? "" : ", ") + name;
  };
  need(bool(layers), "--layers"), need(bool(hidden), "--hidden"), need(bool(heads), "--heads"),
      need(bool(seq), "--seq");
  need(bool(vocab), "--vocab"), need(bool(batch), "--global-batch"), need(bool(gpus), "--gpus");
  need(bool(per_node), "--gpus-per-node"), need(bool(mem), "--gpu-mem-gib"), need(bool(peak), "--peak-tflops");
  need(bool(intra), "--intra-node-gbps"), need(bool(inter), "--inter-node-gbps");
  require(missing.empty(), "missing ", missing,
          "; mpar-plan needs the model, the global batch and the cluster (see --help)");
  o.problem.model = GptModel{*layers, *hidden, *heads, *seq, *vocab};
  o.problem.model.experts = moe.experts, o.problem.model.moe_every = moe.moe_every;
  o.problem.model.moe_top_k = moe.moe_top_k, o.problem.model.moe_capacity = moe.moe_capacity;
  o.problem.model.family = moe.family, o.problem.model.kv_heads = moe.kv_heads, o.problem.model.ffn = moe.ffn;
  o.problem.global_batch = *batch;
  Cluster& c = o.problem.cluster;
  c.gpus = *gpus, c.gpus_per_node = *per_node, c.memory_bytes = *mem * gib, c.peak_flops = *peak * 1e12;
  c.intra_node_bandwidth = *intra * 1e9, c.inter_node_bandwidth = *inter * 1e9;
  o.problem.validate();
  if (const auto cp = o.space.cp) {
    require(*seq % (2 * *cp) == 0, "--cp ", *cp, " splits each sequence into 2 x cp = ", 2 * *cp,
            " zig-zag chunks, which --seq ", *seq, " does not divide; choose --seq a multiple of ", 2 * *cp,
            ", another --cp, or --cp auto");
    require(c.gpus % *cp == 0, "--cp ", *cp, " does not divide --gpus ", c.gpus, "; choose a divisor of --gpus");
  }
  require(moe_option.empty() || moe.experts > 0, moe_option,
          " describes the experts of MoE layers, but the model has none; add --experts N or drop ", moe_option);
  if (o.space.tp)
    require(*o.space.tp <= c.gpus_per_node && c.gpus_per_node % *o.space.tp == 0, "--tp ", *o.space.tp,
            " would spread a tensor-parallel group over nodes of ", c.gpus_per_node,
            " GPUs; choose a divisor of --gpus-per-node");
  if (o.space.schedule && *o.space.schedule != ScheduleKind::interleaved && o.space.virtual_stages)
    require(*o.space.virtual_stages == 1, "--virtual-stages ", *o.space.virtual_stages,
            " needs --schedule interleaved_1f1b");
  return o;
}

namespace detail {
/** Blocks per stage, `separator` between them; a run of three or more of one size as "4x16". */
[[nodiscard]] inline std::string layout(const std::vector<std::size_t>& sizes, const char* separator) {
  std::ostringstream os;
  for (std::size_t i = 0; i < sizes.size();) {
    std::size_t j = i;
    while (j < sizes.size() && sizes[j] == sizes[i]) ++j;
    os << (i ? separator : "") << sizes[i];
    if (j - i > 2)
      os << "x" << j - i;
    else
      for (std::size_t r = i + 1; r < j; ++r) os << separator << sizes[r];
    i = j;
  }
  return os.str();
}
[[nodiscard]] inline std::string fixed(double x, int digits) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << x;
  return os.str();
}
}  // namespace detail

/** One JSON object (one line) describing a candidate; `rank` is its 1-based position. */
[[nodiscard]] inline std::string candidate_json(const Candidate& c, std::size_t rank) {
  const ParallelConfig& k = c.config;
  std::ostringstream os;
  os << std::setprecision(6);
  os << "{\"rank\":" << rank << ",\"tp\":" << k.tp << ",\"pp\":" << k.pp << ",\"dp\":" << k.dp << ",\"cp\":" << k.cp
     << ",\"ep\":" << k.ep << ",\"microbatch_size\":" << k.microbatch_size << ",\"microbatches\":" << k.microbatches
     << ",\"schedule\":\"" << schedule_name(k.schedule) << "\",\"virtual_stages\":" << k.virtual_stages
     << ",\"recompute\":\"" << (k.mixed_recompute() ? "mixed" : recompute_name(k.recompute_of(0)))
     << "\",\"recompute_stages\":[";
  for (std::size_t i = 0; i < k.stages(); ++i) os << (i ? "," : "") << '"' << recompute_name(k.recompute_of(i)) << '"';
  os << "]";
  if (k.mixed_block_recompute()) {
    os << ",\"recompute_blocks\":[";
    for (std::size_t i = 0; i < k.stages(); ++i) {
      os << (i ? ",[" : "[");
      if (k.mixed_blocks(i))
        for (std::size_t b = 0; b < k.recompute_blocks[i].size(); ++b)
          os << (b ? "," : "") << '"' << recompute_name(k.recompute_blocks[i][b]) << '"';
      os << "]";
    }
    os << "]";
  }
  os << ",\"zero\":" << parallel::stage_number(k.zero)
     << ",\"sequence_parallel\":" << (k.sequence_parallel ? "true" : "false") << ",\"etp\":" << k.etp
     << ",\"memory_gib_per_gpu\":" << c.memory.total() / gib
     << ",\"memory_gib\":{\"parameters\":" << c.memory.parameters / gib << ",\"gradients\":" << c.memory.gradients / gib
     << ",\"optimizer\":" << c.memory.optimizer / gib << ",\"activations\":" << c.memory.activations / gib
     << ",\"communication\":" << c.memory.communication / gib
     << ",\"accumulated_gradients\":" << c.memory.accumulated_gradients / gib << "},\"step_seconds\":" << c.step_seconds
     << ",\"tflops_per_gpu\":" << c.tflops_per_gpu << ",\"bubble_fraction\":" << c.bubble_fraction
     << ",\"samples_per_second\":" << c.samples_per_second << ",\"pipeline_seconds\":" << c.pipeline_seconds
     << ",\"dp_exposed_seconds\":" << c.dp_exposed_seconds << ",\"optimizer_seconds\":" << c.optimizer_seconds
     << ",\"placement\":\"" << placement_name(c.ordering) << "\",\"stage_layers\":[";
  for (std::size_t i = 0; i < c.stage_layers.size(); ++i) os << (i ? "," : "") << c.stage_layers[i];
  os << "],\"partition\":\"" << (k.stage_layers.empty() ? "even" : "balanced") << "\"}";
  return os.str();
}

/** The readable report: the ranked table, why the rest were rejected, and the cost of breaking tensor-group locality. */
inline void print_table(std::ostream& out, const Plan& plan, const Problem& p) {
  out << "model: " << detail::fixed(p.model.parameters() / 1e9, 2) << " B parameters (" << p.model.layers
      << " layers, hidden " << p.model.hidden << ", " << p.model.heads << " heads, seq " << p.model.seq << ", vocab "
      << p.model.vocab
      << (p.model.experts > 0 ? mpar::detail::cat(", ", p.model.experts, " experts every ", p.model.moe_every,
                                                  " layer(s), top-", p.model.moe_top_k)
                              : std::string())
      << (p.model.is_llama() ? mpar::detail::cat(", llama: ", p.model.kv_head_count(),
                                                 " key/value heads, SwiGLU width ", p.model.ffn_size())
                             : std::string())
      << "); global batch " << p.global_batch << "; " << p.cluster.gpus << " GPUs, " << p.cluster.gpus_per_node
      << " per node\n";
  const bool cp_searched = plan.context_sizes.size() > 1;
  if (cp_searched) {
    out << "context parallelism searched over cp =";
    for (std::size_t i = 0; i < plan.context_sizes.size(); ++i) out << (i ? ", " : " ") << plan.context_sizes[i];
    out << " (cp GPUs share each sequence; tp x cp x pp x dp GPUs)\n";
  } else if (!plan.best.empty() && plan.best.front().config.cp > 1) {
    out << "context parallelism cp=" << plan.best.front().config.cp
        << ": every configuration below splits each sequence "
        << "over " << plan.best.front().config.cp << " GPUs (tp x pp x dp x cp GPUs)\n";
  }
  out << "searched " << plan.considered << " configurations";
  if (plan.balance_stages) out << " (" << plan.balanced << " of them also with a cost-balanced stage partition)";
  out << ", simulated " << plan.simulated << " pipelines (" << plan.verified_shapes << " schedule shapes verified)";
  if (plan.mixed > 0) {
    out << "; " << plan.mixed << " of the configurations recompute per pipeline rank";
    if (plan.mixed_blocks > 0) out << " (" << plan.mixed_blocks << " per block inside the stages)";
  }
  out << "\n\n";
  if (plan.best.empty()) {
    out << "no configuration fits; the closest rejections are listed below\n";
  } else {
    const bool ep_shown = p.model.experts > 0;
    out << "  #  tp" << (cp_searched ? "  cp" : "") << (ep_shown ? "  ep etp" : "")
        << "  pp    dp  mbs     m  schedule           v  recompute  zero  sp   mem GiB   step s  TFLOP/s  bubble  "
           "layers per stage\n";
    std::size_t i = 0;
    for (const Candidate& c : plan.best) {
      const ParallelConfig& k = c.config;
      char line[256];
      std::snprintf(line, sizeof line, "%3zu %3zu", ++i, k.tp);
      out << line;
      if (cp_searched) {
        std::snprintf(line, sizeof line, " %3zu", k.cp);
        out << line;
      }
      if (ep_shown) {
        std::snprintf(line, sizeof line, " %3zu %3zu", k.ep, k.etp);
        out << line;
      }
      std::snprintf(line, sizeof line, " %3zu %5zu %4zu %5zu  %-17s %2zu  %-9s  %-4d  %-3s %8.1f %8.3f %8.1f  %5.1f%%",
                    k.pp, k.dp, k.microbatch_size, k.microbatches, std::string(schedule_name(k.schedule)).c_str(),
                    k.virtual_stages,
                    k.mixed_recompute() ? "mixed" : std::string(recompute_name(k.recompute_of(0))).c_str(),
                    parallel::stage_number(k.zero), k.sequence_parallel ? "yes" : "no", c.memory.total() / gib,
                    c.step_seconds, c.tflops_per_gpu, 100 * c.bubble_fraction);
      out << line << "  " << (k.stage_layers.empty() ? "even" : detail::layout(c.stage_layers, "/")) << "\n";
    }
    const Candidate& b = plan.best.front();
    out << "\nbest: " << b.config << "\n  memory per GPU " << detail::fixed(b.memory.total() / gib, 1)
        << " GiB = parameters " << detail::fixed(b.memory.parameters / gib, 1) << " + gradients "
        << detail::fixed(b.memory.gradients / gib, 1) << " + optimizer " << detail::fixed(b.memory.optimizer / gib, 1)
        << " + activations " << detail::fixed(b.memory.activations / gib, 1) << " + buffers "
        << detail::fixed(b.memory.communication / gib, 1)
        << (b.memory.accumulated_gradients > 0
                ? " + accumulated gradients " + detail::fixed(b.memory.accumulated_gradients / gib, 1)
                : std::string())
        << " (pipeline rank " << b.memory.pipeline_rank << ")\n";
    if (b.config.pp > 1) {
      out << "  layers per stage " << detail::layout(b.stage_layers, " ") << " ("
          << (b.config.stage_layers.empty() ? "even" : "cost-balanced")
          << "; the embedding on stage 0, the head on stage " << b.stage_layers.size() - 1
          << (b.config.virtual_stages > 1 ? ", stage chunk x pp + rank" : "") << ")\n";
    }
    if (b.config.mixed_recompute())
      out << "  recompute per stage " << b.config.recompute_layout()
          << (b.config.mixed_block_recompute()
                  ? " (per block inside a stage, blocks joined by ':'; each pipeline rank the fastest that fits its "
                    "memory"
                  : " (each pipeline rank the least that fits its memory")
          << (b.config.virtual_stages > 1 ? ", stage chunk x pp + rank" : "") << ")\n";
    out << "  step " << detail::fixed(b.step_seconds, 3) << " s = pipeline " << detail::fixed(b.pipeline_seconds, 3)
        << " + exposed data-parallel reduction " << detail::fixed(b.dp_exposed_seconds, 3) << " + optimizer "
        << detail::fixed(b.optimizer_seconds, 3) << "\n";
    if (plan.broken_topology)
      out << "  with tensor-parallel groups spread over " << plan.broken_topology->placement.tensor.nodes
          << " nodes (data-parallel ranks innermost) the same configuration would take "
          << detail::fixed(plan.broken_topology->step_seconds, 3) << " s per step ("
          << detail::fixed(100 * (plan.broken_topology->step_seconds / b.step_seconds - 1), 1) << " % slower)\n";
  }
  if (!plan.rejected_by_kind.empty()) {
    out << "\nrejected:\n";
    for (const auto& [kind, n] : plan.rejected_by_kind) {
      out << "  " << kind << ": " << n;
      for (const Rejection& r : plan.rejected)
        if (r.kind == kind) {
          out << " (e.g. " << r.config << ": " << r.reason << ")";
          break;
        }
      out << "\n";
    }
  }
}

/** The plan of candidate `c` for `problem`, in train_gpt's terms (every plan the search prints is one it runs). */
[[nodiscard]] inline TrainingPlan training_plan_of(const Candidate& c, const Problem& problem) {
  const ParallelConfig& k = c.config;
  TrainingPlan p;
  const GptModel& m = problem.model;
  p.layers = m.layers, p.hidden = m.hidden, p.heads = m.heads, p.seq = m.seq, p.vocab = m.vocab;
  p.experts = m.experts, p.moe_every = m.moe_every, p.topk = m.moe_top_k;
  if (m.is_llama()) p.family = m.family, p.kv_heads = m.kv_heads, p.ffn = m.ffn;
  p.global_batch = problem.global_batch;
  p.tp = k.tp, p.pp = k.pp, p.v = k.virtual_stages, p.cp = k.cp, p.ep = k.ep;
  p.dp = k.dp / (k.ep ? k.ep : 1);  // train_gpt's --dp: the replicas besides the expert ranks
  p.schedule = k.schedule;
  p.microbatches = k.microbatches;
  p.zero = k.zero;
  p.sequence_parallel = k.sequence_parallel;
  p.etp = k.etp;
  p.stage_layers = c.stage_layers;
  p.recompute_stages.resize(c.stage_layers.size());
  for (std::size_t s = 0; s < p.recompute_stages.size(); ++s) p.recompute_stages[s] = k.recompute_of(s);
  if (k.mixed_block_recompute()) {
    p.recompute_blocks.assign(p.recompute_stages.size(), {});
    for (std::size_t s = 0; s < p.recompute_stages.size(); ++s)
      if (k.mixed_blocks(s)) p.recompute_blocks[s] = k.recompute_blocks[s];
  }
  p.validate();
  return p;
}

/** Runs `mpar-plan` on `args`; returns the process exit code. Errors go to `err` with a hint. */
inline int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  try {
    CliOptions o = parse_cli(args);
    if (o.help) {
      out << cli_usage();
      return 0;
    }
    if (o.calibration_file) {
      const std::string& f = *o.calibration_file;
      std::error_code ec;
      require(!std::filesystem::is_directory(f, ec), "--calibration: '", f,
              "' is a directory; give the path of a JSON-lines metrics file inside it");
      std::ifstream in(f);
      require(bool(in), "--calibration: cannot open '", f, "'; give the path of a JSON-lines metrics file");
      std::size_t measurements = 0;
      o.calibration = load_calibration(in, o.problem.cluster, o.calibration, 0.5, &measurements);
      require(!in.bad(), "--calibration: cannot read '", f, "'");
      require(measurements > 0, "--calibration: '", f,
              "' holds no measurements (no line with a \"metric\" of gemm, "
              "elementwise, collective or action); give a metrics file written by mpar's benchmarks, or leave "
              "--calibration out to use the defaults");
    }
    const CostModel cm(o.problem.model, o.problem.cluster, o.calibration);
    const Plan plan = search(o.problem, cm, o.space, o.search);
    if (o.json) {
      std::size_t i = 0;
      for (const Candidate& c : plan.best) out << candidate_json(c, ++i) << "\n";
    } else {
      print_table(out, plan, o.problem);
    }
    if (plan.best.empty()) return 2;
    if (o.write_plan) {
      try {
        write_training_plan(training_plan_of(plan.best.front(), o.problem), *o.write_plan);
      } catch (const config_error& e) {
        throw config_error(mpar::detail::cat("--write-plan ", *o.write_plan, ": ", e.what()));
      }
      if (!o.json)
        out << "\nwrote the best configuration's plan to " << *o.write_plan << "; train it with: train_gpt --plan "
            << *o.write_plan << "\n";
    }
    return 0;
  } catch (const config_error& e) {
    err << "mpar-plan: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace mpar::plan
