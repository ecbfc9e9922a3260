// Training plans: the JSON text mpar-plan --write-plan writes and train_gpt --plan reads, read back whole, and
// damaged files (truncated, wrong types, unknown keys, negative or fractional sizes, stage lists that do not
// match) refused with an error that names the key.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "mpar/plan.hpp"

using namespace mpar;
using namespace mpar::plan;

namespace {

TrainingPlan sample_plan() {
  TrainingPlan p;
  p.layers = 5, p.hidden = 32, p.heads = 4, p.seq = 16, p.vocab = 65, p.global_batch = 8;
  p.tp = 2, p.pp = 2, p.v = 1, p.dp = 1;
  p.schedule = ScheduleKind::zb_h1;
  p.microbatches = 4;
  p.zero = ZeroStage::optimizer_states;
  p.stage_layers = {2, 3};
  p.recompute_stages = {Recompute::selective, Recompute::full};
  return p;
}

/** `text` with the first `from` replaced by `to` (which must be there: a test that edits nothing proves nothing). */
std::string edited(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("mpar_plan_" + std::to_string(::getpid()) + "_" + name)).string();
}

/** Gemma's 256 K vocabulary on a 32-block model over 64 A100s (as tests/plan/partition_plan_test.cpp). */
std::vector<std::string> large_vocabulary_problem() {
  return {"--layers",      "32",   "--hidden",          "4096",   "--heads",           "32",
          "--seq",         "4096", "--vocab",           "256000", "--global-batch",    "256",
          "--gpus",        "64",   "--gpus-per-node",   "8",      "--gpu-mem-gib",     "80",
          "--peak-tflops", "312",  "--intra-node-gbps", "300",    "--inter-node-gbps", "200"};
}

}  // namespace

TEST_CASE("a training plan reads back from its JSON text field for field", "[plan][plan_file]") {
  const TrainingPlan p = sample_plan();
  const std::string text = p.to_json();
  const TrainingPlan q = TrainingPlan::from_json(text);
  CHECK(q.layers == 5);
  CHECK(q.hidden == 32);
  CHECK(q.heads == 4);
  CHECK(q.seq == 16);
  CHECK(q.vocab == 65);
  CHECK(q.global_batch == 8);
  CHECK(q.tp == 2);
  CHECK(q.pp == 2);
  CHECK(q.v == 1);
  CHECK(q.dp == 1);
  CHECK(q.cp == 1);
  CHECK(q.ep == 1);
  CHECK(q.schedule == ScheduleKind::zb_h1);
  CHECK(q.microbatches == 4);
  CHECK(q.zero == ZeroStage::optimizer_states);
  CHECK(!q.sequence_parallel);
  CHECK(q.stage_layers == std::vector<std::size_t>{2, 3});
  CHECK(q.recompute_stages == std::vector<Recompute>{Recompute::selective, Recompute::full});
  CHECK(q.to_json() == text);
  // Through a file, and whitespace anywhere between tokens.
  const std::string f = temp_path("roundtrip.json");
  write_training_plan(p, f);
  CHECK(read_training_plan(f).to_json() == text);
  std::filesystem::remove(f);
  std::string spaced;
  for (char c : text) spaced += c == ',' ? std::string(" ,\t\r\n ") : std::string(1, c);
  CHECK(TrainingPlan::from_json(spaced).to_json() == text);
}

TEST_CASE("damaged plan files are refused, naming the key and what is wrong", "[plan][plan_file][errors]") {
  const std::string good = sample_plan().to_json();
  const auto refused = [](const std::string& text, const std::string& why) {
    INFO(text);
    CHECK_THROWS_WITH(TrainingPlan::from_json(text), Catch::Contains(why));
  };
  // Truncated anywhere: every prefix short of the closing brace.
  const std::size_t end = good.rfind('}');
  for (std::size_t n = 0; n < end + 1; ++n) {
    INFO("the first " << n << " characters");
    CHECK_THROWS_AS(TrainingPlan::from_json(good.substr(0, n)), config_error);
  }
  refused(good.substr(0, good.find("\"stage_layers\"")), "the text ends here: truncated?");
  // Wrong types.
  refused(edited(good, "\"tp\": 2", "\"tp\": \"2\""), "\"tp\" is a string; it must be a whole number");
  refused(edited(good, "\"schedule\": \"zb_h1\"", "\"schedule\": 3"), "\"schedule\" is a number; it must be a string");
  refused(edited(good, "\"sequence_parallel\": false", "\"sequence_parallel\": 0"),
          "\"sequence_parallel\" is a number; it must be true or false");
  refused(edited(good, "[\"selective\", \"full\"]", "[true, false]"),
          "\"recompute_stages\" holds a boolean; its entries are \"none\", \"selective\" or \"full\"");
  refused(edited(good, "[\"selective\", \"full\"]", "[\"selective\", \"partial\"]"),
          "\"recompute_stages\" holds 'partial'; its entries are \"none\", \"selective\" or \"full\"");
  refused(edited(good, "[2, 3]", "\"2,3\""), "\"stage_layers\" is a string; it must be an array");
  refused(edited(good, "\"model\": {", "\"model\": [{"), "or ',' after an array's element");
  refused("[" + good + "]", "the document is an array; a training plan is a JSON object");
  // Keys: unknown, missing, twice.
  refused(edited(good, "\"tp\": 2", "\"tp\": 2, \"tpp\": 2"), "the key \"tpp\" is not part of a training plan");
  refused(edited(good, "\"heads\": 4", "\"heads\": 4, \"head\": 4"), "the key \"model.head\" is not part of");
  refused(edited(good, "  \"cp\": 1,\n", ""), "the key \"cp\" is missing");
  refused(edited(good, "\"seq\": 16, ", ""), "the key \"model.seq\" is missing");
  refused(edited(good, "\"tp\": 2", "\"tp\": 2, \"tp\": 4"), "the key \"tp\" is given twice");
  // Sizes: negative, fractional, zero, beyond any count.
  refused(edited(good, "\"pp\": 2", "\"pp\": -2"), "\"pp\" is -2; it must not be negative");
  refused(edited(good, "[2, 3]", "[-1, 6]"), "\"stage_layers\" is -1; it must not be negative");
  refused(edited(good, "\"microbatches\": 4", "\"microbatches\": 2.5"), "\"microbatches\" is 2.5; it must be a whole");
  refused(edited(good, "\"layers\": 5", "\"layers\": 1e300"), "it must be a whole number");
  refused(edited(good, "\"dp\": 1", "\"dp\": 0"), "\"dp\" is 0; it must be at least 1");
  // Stage lists that do not match the layout or the model.
  refused(edited(good, "[2, 3]", "[2, 2]"), "\"stage_layers\" covers 4 blocks, but the model has \"layers\" 5");
  refused(edited(good, "[2, 3]", "[1, 1, 3]"), "\"stage_layers\" has 3 entries, but pp x v = 2 x 1 = 2 stages");
  refused(edited(good, "[\"selective\", \"full\"]", "[\"full\"]"),
          "\"recompute_stages\" has 1 entries, but pp x v = 2 stages");
  refused(edited(good, "\"v\": 1", "\"v\": 2"), "needs \"schedule\": \"interleaved_1f1b\"");
  refused(edited(good, "\"zb_h1\"", "\"zb_h3\""), "\"schedule\" 'zb_h3' is not known");
  refused(edited(good, "\"zero\": 1", "\"zero\": 4"), "a ZeRO stage is 0, 1, 2 or 3");
  // Not a plan, or another version of the format.
  refused(edited(good, "\"mpar-training-plan\"", "\"mpar-checkpoint\""), "this is not a training plan");
  refused(edited(good, "\"version\": 2", "\"version\": 1"), "\"version\" 1 is not one this build reads");
  // Text around and inside the value.
  refused(good + "{}", "text after the end of the JSON value");
  refused(edited(good, "\"zb_h1\"", "\"zb_\\q\""), "an unknown escape");
  refused(std::string(100, '[') + std::string(100, ']'), "nested deeper than 64");
  // Every byte changed at random: a config_error or a plan, never another exception or a crash.
  std::mt19937 rng(46);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string t = good;
    for (int k = 0; k < 1 + trial % 3; ++k) t[rng() % t.size()] = char(rng() % 128);
    try {
      (void)TrainingPlan::from_json(t);
    } catch (const config_error&) {}
  }
  // A file: its name in the error.
  const std::string f = temp_path("damaged.json");
  { std::ofstream(f) << good.substr(0, good.size() / 2); }
  CHECK_THROWS_WITH(read_training_plan(f),
                    Catch::Contains("the plan file '" + f + "': JSON: line") && Catch::Contains("truncated?"));
  std::filesystem::remove(f);
  CHECK_THROWS_WITH(read_training_plan(f), Catch::Contains("cannot open the plan file '" + f + "'"));
}

TEST_CASE("mpar-plan --write-plan writes the best configuration with the stage partition it printed",
          "[plan][plan_file][cli]") {
  const std::string f = temp_path("best.json");
  std::vector<std::string> args = large_vocabulary_problem();
  args.insert(args.end(), {"--pp", "8", "--top", "3", "--write-plan", f});
  std::ostringstream out, err;
  REQUIRE(run_cli(args, out, err) == 0);
  const TrainingPlan p = read_training_plan(f);
  std::filesystem::remove(f);
  CHECK_THAT(out.str(),
             Catch::Contains("wrote the best configuration's plan to " + f + "; train it with: train_gpt --plan " + f));
  // The table's best line, in the planner's terms (its dp holds the expert ranks: train_gpt's dp x ep).
  std::ostringstream best;
  const CliOptions o = parse_cli(args);
  const Plan plan = search(o.problem, CostModel(o.problem.model, o.problem.cluster), o.space, o.search);
  const Candidate& b = plan.best.front();
  best << b.config;
  CHECK_THAT(out.str(), Catch::Contains("best: " + best.str()));
  CHECK_THAT(out.str(), Catch::Contains("layers per stage " + mpar::plan::detail::layout(p.stage_layers, " ")));
  CHECK(p.stage_layers == b.stage_layers);
  CHECK(p.tp == b.config.tp);
  CHECK(p.pp == 8);
  // The head's logits weigh about five blocks: the cost-balanced split, not the even one (docs/planner.md).
  CHECK(!b.config.stage_layers.empty());
  CHECK(p.stage_layers != std::vector<std::size_t>(8, 4));
  CHECK(p.dp * p.ep == b.config.dp);
  CHECK(p.v == b.config.virtual_stages);
  CHECK(p.microbatches == b.config.microbatches);
  CHECK(p.schedule == b.config.schedule);
  CHECK(p.zero == b.config.zero);
  CHECK(p.recompute_stages == std::vector<Recompute>(p.stages(), b.config.recompute));
  CHECK(p.sequence_parallel == b.config.sequence_parallel);
  CHECK(p.layers == 32);
  CHECK(p.vocab == 256000);
  CHECK(p.global_batch == 256);
  std::size_t sum = 0;
  for (std::size_t n : p.stage_layers) sum += n;
  CHECK(sum == 32);
}

TEST_CASE("mpar-plan --write-plan writes selective recomputation and stages without blocks",
          "[plan][plan_file][cli][errors]") {
  const std::string f = temp_path("refused.json");
  std::vector<std::string> args = large_vocabulary_problem();
  // Selective recomputation is written (the attention layers run it): every stage says so.
  args.insert(args.end(), {"--recompute", "selective", "--write-plan", f});
  std::ostringstream out, err;
  CHECK(run_cli(args, out, err) == 0);
  const TrainingPlan selective = read_training_plan(f);
  CHECK(selective.recompute_stages == std::vector<Recompute>(selective.stages(), Recompute::selective));
  std::filesystem::remove(f);
  // At pp 4 with full recomputation the cost-balanced layout leaves the head's stage without blocks: a plan the
  // trainer runs like any other, written as it is.
  std::vector<std::string> empty_args = large_vocabulary_problem();
  empty_args.insert(empty_args.end(), {"--pp", "4", "--recompute", "full", "--top", "1", "--write-plan", f});
  std::ostringstream empty_out, empty_err;
  CHECK(run_cli(empty_args, empty_out, empty_err) == 0);
  const TrainingPlan written = read_training_plan(f);
  CHECK(std::count(written.stage_layers.begin(), written.stage_layers.end(), std::size_t(0)) > 0);
  std::filesystem::remove(f);
  // A cost-balanced partition that leaves a stage without blocks (next to a heavy head).
  Candidate c;
  c.config.tp = 2, c.config.pp = 4, c.config.dp = 8, c.config.microbatches = 8;
  c.config.stage_layers = c.stage_layers = {9, 10, 13, 0};
  const Problem problem{GptModel{32, 4096, 32, 4096, 256000}, Cluster{}, 256};
  const TrainingPlan p = training_plan_of(c, problem);
  CHECK(p.stage_layers == std::vector<std::size_t>{9, 10, 13, 0});
  CHECK(p.recompute_stages == std::vector<Recompute>(4, Recompute::none));
  CHECK(p.dp == 8);
}

TEST_CASE("a Llama plan records the family, the key/value heads and the SwiGLU width; a plan without them is GPT-2's",
          "[plan][plan_file][llama]") {
  TrainingPlan p = sample_plan();
  p.family = nn::ModelFamily::llama, p.kv_heads = 2, p.ffn = 88;
  const std::string text = p.to_json();
  CHECK(text.find("\"family\": \"llama\", \"kv_heads\": 2, \"ffn\": 88") != std::string::npos);
  const TrainingPlan q = TrainingPlan::from_json(text);
  CHECK(q.family == nn::ModelFamily::llama);
  CHECK(q.kv_heads == 2);
  CHECK(q.ffn == 88);
  CHECK(q.to_json() == text);
  // GPT-2's plan is written as before (readable by builds that know no family) and reads back as GPT-2 with 0, 0.
  const std::string gpt2 = sample_plan().to_json();
  CHECK(gpt2.find("family") == std::string::npos);
  const TrainingPlan g = TrainingPlan::from_json(gpt2);
  CHECK(g.family == nn::ModelFamily::gpt2);
  CHECK(g.kv_heads == 0);
  CHECK(g.ffn == 0);
  // Damaged: an unknown family, a wrong type, key/value heads that do not divide, Llama's sizes on GPT-2.
  CHECK_THROWS_WITH(TrainingPlan::from_json(edited(text, "\"llama\"", "\"llama2\"")),
                    Catch::Contains("\"model.family\" is 'llama2'; it is \"gpt2\" or \"llama\""));
  CHECK_THROWS_WITH(TrainingPlan::from_json(edited(text, "\"llama\"", "1")),
                    Catch::Contains("\"model.family\" is a number; it must be a string"));
  CHECK_THROWS_WITH(TrainingPlan::from_json(edited(text, "\"kv_heads\": 2", "\"kv_heads\": 3")),
                    Catch::Contains("\"model.kv_heads\" 3 must divide \"model.heads\" 4"));
  CHECK_THROWS_WITH(TrainingPlan::from_json(edited(text, "\"kv_heads\": 2", "\"kv_heads\": 1")),
                    Catch::Contains("be divisible by \"tp\" 2"));
  CHECK_THROWS_WITH(TrainingPlan::from_json(edited(text, "\"llama\"", "\"gpt2\"")),
                    Catch::Contains("\"model.kv_heads\" and \"model.ffn\" are Llama's"));
  CHECK_THROWS_WITH(TrainingPlan::from_json(edited(text, "\"ffn\": 88", "\"ffn\": -88")),
                    Catch::Contains("\"model.ffn\" is -88; it must not be negative"));
}

TEST_CASE("mpar-plan --model llama writes a Llama plan and prints the family", "[plan][plan_file][cli][llama]") {
  const std::string f = temp_path("llama.json");
  std::vector<std::string> args = {"--model",
                                   "llama",
                                   "--kv-heads",
                                   "2",
                                   "--ffn",
                                   "88",
                                   "--layers",
                                   "4",
                                   "--hidden",
                                   "32",
                                   "--heads",
                                   "4",
                                   "--seq",
                                   "16",
                                   "--vocab",
                                   "76",
                                   "--global-batch",
                                   "4",
                                   "--gpus",
                                   "2",
                                   "--gpus-per-node",
                                   "2",
                                   "--gpu-mem-gib",
                                   "1",
                                   "--peak-tflops",
                                   "1",
                                   "--intra-node-gbps",
                                   "10",
                                   "--inter-node-gbps",
                                   "10",
                                   "--write-plan",
                                   f};
  std::ostringstream out, err;
  REQUIRE(run_cli(args, out, err) == 0);
  CHECK(out.str().find("llama: 2 key/value heads, SwiGLU width 88") != std::string::npos);
  const TrainingPlan p = read_training_plan(f);
  std::filesystem::remove(f);
  CHECK(p.family == nn::ModelFamily::llama);
  CHECK(p.kv_heads == 2);
  CHECK(p.ffn == 88);
  CHECK(p.tp <= 2);
  // Llama's flags on GPT-2, and tp fixed against the key/value heads.
  args[1] = "gpt2";
  std::ostringstream out2, err2;
  CHECK(run_cli(args, out2, err2) == 1);
  CHECK(err2.str().find("--kv-heads 2 is Llama's (grouped-query attention); add --model llama") != std::string::npos);
  args[1] = "llama", args[3] = "1";
  args.insert(args.end(), {"--tp", "2"});
  std::ostringstream out3, err3;
  CHECK(run_cli(args, out3, err3) == 2);
  CHECK(out3.str().find("tp=2 does not divide the 1 key/value heads") != std::string::npos);
  args[1] = "mistral";
  std::ostringstream out4, err4;
  CHECK(run_cli(args, out4, err4) == 1);
  CHECK(err4.str().find("--model 'mistral' is not known; use gpt2 or llama") != std::string::npos);
}
