#pragma once
/**
 * @file A training plan: the layout `mpar-plan` chose (sizes, schedule, micro-batching, ZeRO, the blocks and the
 * recomputation of every pipeline stage: none, selective or full) with the model and batch it was planned for, as a value and as a
 * JSON file that `mpar-plan --write-plan` writes and `train_gpt --plan` reads (docs/planner.md, "Plan files").
 * Reading is strict: a missing or unknown key, a wrong type, a negative or fractional size, or stage lists that
 * do not match the layout and the model are refused by a `config_error` naming the key and the fix.
 */
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpar/core/error.hpp"
#include "mpar/core/json.hpp"
#include "mpar/nn/model_family.hpp"
#include "mpar/plan/parallel_config.hpp"

namespace mpar::plan {

/**
 * @brief A layout for `train_gpt`, in its options' terms: `dp` is train_gpt's --dp (data-parallel replicas
 * besides the expert ranks: the planner's dp / ep), `microbatches` per data-parallel rank and step, stage s of
 * `stage_layers` and `recompute_stages` is chunk x pp + rank (`pipeline::global_stage`).
 */
struct TrainingPlan {
  static constexpr std::string_view format_name = "mpar-training-plan";
  /// 2: "recompute_stages" holds "none", "selective" or "full" per stage (version 1 held true / false).
  /// 3: besides, "recompute_blocks" holds per stage a list of its blocks' modes (an empty list: every block as the
  /// stage). A plan without per-block modes is written as version 2, as before; both are read.
  static constexpr std::size_t format_version = 3;
  static constexpr std::size_t per_stage_format_version = 2;

  // The model and batch the plan was made for: train_gpt refuses to run it on another.
  std::size_t layers = 0, hidden = 0, heads = 0, seq = 0, vocab = 0;
  std::size_t experts = 0, moe_every = 1, topk = 2;
  /// Written for Llama only ("family", "kv_heads", "ffn" in "model"); a plan without them is GPT-2's with 0 and 0.
  nn::ModelFamily family = nn::ModelFamily::gpt2;
  std::size_t kv_heads = 0, ffn = 0;  ///< as train_gpt's --kv-heads and --ffn (0: heads, 4 x hidden)
  std::size_t global_batch = 0;
  // The layout.
  std::size_t tp = 1, pp = 1, v = 1, dp = 1, cp = 1, ep = 1;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  std::size_t microbatches = 1;
  ZeroStage zero = ZeroStage::none;
  bool sequence_parallel = false;
  /// The experts' tensor-parallel size (train_gpt's --etp): 1, or tp (each expert split over the tensor group).
  /// Written when it is not 1; a plan without it keeps whole experts.
  std::size_t etp = 1;
  std::vector<std::size_t> stage_layers;    ///< blocks per global stage, pp x v entries summing to `layers`
  std::vector<Recompute> recompute_stages;  ///< per global stage: what its backward recomputes
  /// Empty, or per global stage nothing (every block as `recompute_stages`) or one mode per block of the stage, the
  /// most of them being the stage's mode (`ParallelConfig::recompute_blocks`).
  std::vector<std::vector<Recompute>> recompute_blocks;

  [[nodiscard]] std::size_t stages() const { return pp * v; }
  [[nodiscard]] std::size_t gpus() const { return tp * cp * pp * dp * ep; }

  /** Throws config_error unless the plan is whole: sizes positive, schedule known, stage lists matching. */
  void validate() const {
    for (const auto& [name, n] : {std::pair<const char*, std::size_t>{"layers", layers},
                                  {"hidden", hidden},
                                  {"heads", heads},
                                  {"seq", seq},
                                  {"vocab", vocab},
                                  {"moe_every", moe_every},
                                  {"topk", topk},
                                  {"global_batch", global_batch},
                                  {"tp", tp},
                                  {"pp", pp},
                                  {"v", v},
                                  {"dp", dp},
                                  {"cp", cp},
                                  {"ep", ep},
                                  {"microbatches", microbatches}})
      require(n >= 1, "plan: \"", name, "\" is 0; it must be at least 1");
    require(v == 1 || schedule == ScheduleKind::interleaved, "plan: \"v\" is ", v,
            " model chunks per pipeline rank, which needs \"schedule\": \"interleaved_1f1b\"");
    require(stage_layers.size() == stages(), "plan: \"stage_layers\" has ", stage_layers.size(),
            " entries, but pp x v = ", pp, " x ", v, " = ", stages(), " stages; give one block count per stage");
    std::size_t sum = 0;
    for (std::size_t n : stage_layers) sum += n;
    require(sum == layers, "plan: \"stage_layers\" covers ", sum, " blocks, but the model has \"layers\" ", layers,
            "; the counts must sum to the model's layers");
    require(recompute_stages.size() == stages(), "plan: \"recompute_stages\" has ", recompute_stages.size(),
            " entries, but pp x v = ", stages(), " stages; give one mode per stage");
    require(recompute_blocks.empty() || recompute_blocks.size() == stages(), "plan: \"recompute_blocks\" has ",
            recompute_blocks.size(), " entries, but pp x v = ", stages(),
            " stages; give one list per stage (an empty one: every block as the stage)");
    for (std::size_t s = 0; s < recompute_blocks.size(); ++s) {
      const std::vector<Recompute>& b = recompute_blocks[s];
      if (b.empty()) continue;
      require(b.size() == stage_layers[s], "plan: \"recompute_blocks\" of stage ", s, " has ", b.size(),
              " modes, but the stage holds ", stage_layers[s], " blocks (\"stage_layers\"); give one mode per block");
      const Recompute most = *std::max_element(b.begin(), b.end());
      require(most == recompute_stages[s], "plan: the blocks of stage ", s, " recompute at most ", recompute_name(most),
              " (\"recompute_blocks\"), but \"recompute_stages\" says ", recompute_name(recompute_stages[s]),
              "; a stage's mode is the most its blocks recompute");
    }
    require(etp >= 1 && (etp == 1 || (etp == tp && experts > 0)), "plan: \"etp\" ", etp,
            " must be 1 or, with experts, \"tp\" ", tp,
            ": the experts split over the whole tensor group or not at all");
    if (family != nn::ModelFamily::llama) {
      require(kv_heads == 0 && ffn == 0,
              "plan: \"model.kv_heads\" and \"model.ffn\" are Llama's; with them, "
              "\"model.family\" must be \"llama\"");
      return;
    }
    const std::size_t kv = kv_heads ? kv_heads : heads;
    require(heads % kv == 0 && kv % tp == 0, "plan: \"model.kv_heads\" ", kv, " must divide \"model.heads\" ", heads,
            " and be divisible by \"tp\" ", tp);
  }

  /** The plan as a JSON document, one key per line. */
  [[nodiscard]] std::string to_json() const {
    std::ostringstream os;
    const auto list = [&](const auto& values) {
      os << "[";
      for (std::size_t i = 0; i < values.size(); ++i) {
        if constexpr (std::is_same_v<std::decay_t<decltype(values)>, std::vector<Recompute>>)
          os << (i ? ", " : "") << json_quoted(recompute_name(values[i]));
        else
          os << (i ? ", " : "") << values[i];
      }
      os << "]";
    };
    os << "{\n  \"format\": " << json_quoted(format_name)
       << ",\n  \"version\": " << (recompute_blocks.empty() ? per_stage_format_version : format_version)
       << ",\n  \"model\": {\"layers\": " << layers << ", \"hidden\": " << hidden << ", \"heads\": " << heads
       << ", \"seq\": " << seq << ", \"vocab\": " << vocab << ", \"experts\": " << experts
       << ", \"moe_every\": " << moe_every << ", \"topk\": " << topk;
    if (family == nn::ModelFamily::llama)
      os << ", \"family\": " << json_quoted(nn::name_of(family)) << ", \"kv_heads\": " << kv_heads
         << ", \"ffn\": " << ffn;
    os << "},\n  \"global_batch\": " << global_batch << ",\n  \"tp\": " << tp << ",\n  \"pp\": " << pp
       << ",\n  \"v\": " << v << ",\n  \"dp\": " << dp << ",\n  \"cp\": " << cp << ",\n  \"ep\": " << ep
       << ",\n  \"schedule\": " << json_quoted(schedule_name(schedule)) << ",\n  \"microbatches\": " << microbatches
       << ",\n  \"zero\": " << parallel::stage_number(zero)
       << ",\n  \"sequence_parallel\": " << (sequence_parallel ? "true" : "false");
    if (etp != 1) os << ",\n  \"etp\": " << etp;
    os << ",\n  \"stage_layers\": ";
    list(stage_layers);
    os << ",\n  \"recompute_stages\": ";
    list(recompute_stages);
    if (!recompute_blocks.empty()) {
      os << ",\n  \"recompute_blocks\": [";
      for (std::size_t i = 0; i < recompute_blocks.size(); ++i) {
        os << (i ? ", " : "");
        list(recompute_blocks[i]);
      }
      os << "]";
    }
    os << "\n}\n";
    return os.str();
  }

  /** Reads a plan from its JSON text; throws config_error naming the key and what is wrong with it. */
  [[nodiscard]] static TrainingPlan from_json(std::string_view text) {
    const JsonValue doc = parse_json(text);
    const JsonValue::Object* top = doc.object();
    require(top != nullptr, "plan: the document is ", doc.kind(), "; a training plan is a JSON object");
    TrainingPlan p;
    Fields f(*top, "");
    const std::string* format = f.string("format");
    require(*format == format_name, "plan: \"format\" is '", *format, "', not '", format_name,
            "'; this is not a training plan written by mpar-plan --write-plan");
    const std::size_t version = f.count("version");
    require(version == format_version || version == per_stage_format_version, "plan: \"version\" ", version,
            " is not one this build reads (", per_stage_format_version, " or ", format_version,
            "); write the plan again with this build's mpar-plan");
    {
      Fields m(f.object("model"), "model.");
      p.layers = m.count("layers"), p.hidden = m.count("hidden"), p.heads = m.count("heads");
      p.seq = m.count("seq"), p.vocab = m.count("vocab"), p.experts = m.count("experts");
      p.moe_every = m.count("moe_every"), p.topk = m.count("topk");
      if (m.has("family")) {  // absent: a GPT-2 plan (as every plan written before Llama)
        const std::string& family = *m.string("family");
        const std::optional<nn::ModelFamily> known = nn::model_family(family);
        require(known.has_value(), "plan: \"model.family\" is '", family, "'; it is \"gpt2\" or \"llama\"");
        p.family = *known;
      }
      if (m.has("kv_heads")) p.kv_heads = m.count("kv_heads");
      if (m.has("ffn")) p.ffn = m.count("ffn");
      m.no_others();
    }
    p.global_batch = f.count("global_batch");
    p.tp = f.count("tp"), p.pp = f.count("pp"), p.v = f.count("v"), p.dp = f.count("dp");
    p.cp = f.count("cp"), p.ep = f.count("ep");
    const std::string& schedule = *f.string("schedule");
    const auto kind = parse_schedule(schedule);
    require(kind.has_value() && schedule_name(*kind) == schedule, "plan: \"schedule\" '", schedule,
            "' is not known; use gpipe, 1f1b, interleaved_1f1b, zb_h1, zb_h2 or 2bw");
    p.schedule = *kind;
    p.microbatches = f.count("microbatches");
    const std::size_t zero = f.count("zero");
    require(zero <= 3, "plan: \"zero\" is ", zero, "; a ZeRO stage is 0, 1, 2 or 3");
    p.zero = parallel::zero_stage_from_number(static_cast<long long>(zero));
    p.sequence_parallel = f.boolean("sequence_parallel");
    if (f.has("etp")) p.etp = f.count("etp");
    for (const JsonValue& e : f.array("stage_layers")) p.stage_layers.push_back(Fields::count_of(e, "stage_layers"));
    const auto mode_of = [](const JsonValue& e, const char* key) {
      const std::string* name = e.string();
      require(name != nullptr, "plan: \"", key, "\" holds ", e.kind(),
              "; its entries are \"none\", \"selective\" or \"full\"");
      const std::optional<Recompute> r = parse_recompute(*name);
      require(r.has_value(), "plan: \"", key, "\" holds '", *name,
              "'; its entries are \"none\", \"selective\" or \"full\"");
      return *r;
    };
    for (const JsonValue& e : f.array("recompute_stages")) p.recompute_stages.push_back(mode_of(e, "recompute_stages"));
    if (version >= format_version) {
      for (const JsonValue& stage : f.array("recompute_blocks")) {
        const JsonValue::Array* blocks = stage.array();
        require(blocks != nullptr, "plan: \"recompute_blocks\" holds ", stage.kind(),
                "; it holds one list of modes per stage (an empty one: every block as the stage)");
        p.recompute_blocks.emplace_back();
        for (const JsonValue& e : *blocks) p.recompute_blocks.back().push_back(mode_of(e, "recompute_blocks"));
      }
    }
    f.no_others();
    p.validate();
    return p;
  }

 private:
  /** The keys of one JSON object, each taken once by type; `no_others` refuses what no one took. */
  class Fields {
   public:
    Fields(const JsonValue::Object& o, std::string prefix) : o_(o), prefix_(std::move(prefix)), taken_(o.size()) {}
    const JsonValue& get(const char* key) {
      for (std::size_t i = 0; i < o_.size(); ++i)
        if (o_[i].first == key) return taken_[i] = true, o_[i].second;
      throw config_error(mpar::detail::cat("plan: the key \"", prefix_, key, "\" is missing"));
    }
    static std::size_t count_of(const JsonValue& v, std::string_view key) {
      const double* x = v.number();
      require(x != nullptr, "plan: \"", key, "\" is ", v.kind(), "; it must be a whole number");
      require(*x >= 0, "plan: \"", key, "\" is ", *x, "; it must not be negative");
      require(*x == std::floor(*x) && *x < 9.0e15, "plan: \"", key, "\" is ", *x, "; it must be a whole number");
      return std::size_t(*x);
    }
    std::size_t count(const char* key) { return count_of(get(key), prefix_ + key); }
    [[nodiscard]] bool has(const char* key) const {
      for (const auto& kv : o_)
        if (kv.first == key) return true;
      return false;
    }
    const std::string* string(const char* key) {
      const JsonValue& v = get(key);
      require(v.string() != nullptr, "plan: \"", prefix_, key, "\" is ", v.kind(), "; it must be a string");
      return v.string();
    }
    bool boolean(const char* key) {
      const JsonValue& v = get(key);
      require(v.boolean() != nullptr, "plan: \"", prefix_, key, "\" is ", v.kind(), "; it must be true or false");
      return *v.boolean();
    }
    const JsonValue::Array& array(const char* key) {
      const JsonValue& v = get(key);
      require(v.array() != nullptr, "plan: \"", prefix_, key, "\" is ", v.kind(), "; it must be an array");
      return *v.array();
    }
    const JsonValue::Object& object(const char* key) {
      const JsonValue& v = get(key);
      require(v.object() != nullptr, "plan: \"", prefix_, key, "\" is ", v.kind(), "; it must be an object");
      return *v.object();
    }
    void no_others() const {
      for (std::size_t i = 0; i < o_.size(); ++i)
        require(taken_[i], "plan: the key \"", prefix_, o_[i].first,
                "\" is not part of a training plan (a misspelling, or a newer format?)");
    }

   private:
    const JsonValue::Object& o_;
    std::string prefix_;
    std::vector<bool> taken_;
  };
};

/** Reads the plan file `path`; errors name the file. */
[[nodiscard]] inline TrainingPlan read_training_plan(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  require(bool(in), "cannot open the plan file '", path, "'; give the file mpar-plan --write-plan wrote");
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return TrainingPlan::from_json(text.str());
  } catch (const config_error& e) {
    throw config_error(mpar::detail::cat("the plan file '", path, "': ", e.what()));
  }
}

/** Writes `p` to `path` (replacing it); throws config_error when it cannot. */
inline void write_training_plan(const TrainingPlan& p, const std::string& path) {
  p.validate();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  require(bool(out), "cannot write the plan file '", path, "'");
  out << p.to_json();
  out.flush();
  require(bool(out), "cannot write the plan file '", path, "'");
}

}  // namespace mpar::plan
