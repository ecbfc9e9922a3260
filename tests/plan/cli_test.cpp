// mpar-plan's command line: parsing errors that say what to change, the table, and JSON lines.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include "mpar/plan.hpp"

using namespace mpar::plan;

namespace {
std::vector<std::string> base_args() {
  return {"--layers",      "24",   "--hidden",          "2048",  "--heads",           "16",
          "--seq",         "1024", "--vocab",           "32000", "--global-batch",    "256",
          "--gpus",        "64",   "--gpus-per-node",   "8",     "--gpu-mem-gib",     "80",
          "--peak-tflops", "312",  "--intra-node-gbps", "300",   "--inter-node-gbps", "200"};
}
std::vector<std::string> with(std::vector<std::string> a, std::initializer_list<std::string> more) {
  a.insert(a.end(), more);
  return a;
}
std::string error_of(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int rc = run_cli(args, out, err);
  CHECK(rc == 1);
  CHECK(out.str().empty());
  return err.str();
}
}  // namespace

TEST_CASE("mpar-plan parses the model, cluster and fixed dimensions", "[plan][cli]") {
  const CliOptions o =
      parse_cli(with(base_args(), {"--tp", "2", "--pp=4", "--schedule", "interleaved", "--recompute", "full", "--zero1",
                                   "on", "--microbatch-size", "2", "--top", "3", "--json"}));
  CHECK(o.problem.model.layers == 24);
  CHECK(o.problem.cluster.memory_bytes == 80 * gib);
  CHECK(o.problem.cluster.peak_flops == 312e12);
  CHECK(o.problem.cluster.inter_node_bandwidth == 200e9);
  CHECK(*o.space.tp == 2);
  CHECK(*o.space.pp == 4);
  CHECK(*o.space.schedule == ScheduleKind::interleaved);
  CHECK(*o.space.recompute == Recompute::full);
  CHECK(*o.space.zero1);
  CHECK(!o.space.zero2);  // not given: searched
  CHECK(*parse_cli(with(base_args(), {"--zero2", "on"})).space.zero2);
  CHECK(!*parse_cli(with(base_args(), {"--zero2", "off"})).space.zero2);
  CHECK(!o.space.zero3);  // not given: searched
  CHECK(*parse_cli(with(base_args(), {"--zero3", "on"})).space.zero3);
  CHECK(!*parse_cli(with(base_args(), {"--zero3", "off"})).space.zero3);
  CHECK(*o.space.microbatch_size == 2);
  CHECK(o.search.top_k == 3);
  CHECK(o.json);
  CHECK(!o.space.dp);
  CHECK(o.search.memory.recompute_whole_chunk);  // mpar's executor by default
  const CliOptions m = parse_cli(with(base_args(), {"--memory-semantics", "megatron"}));
  CHECK(!m.search.memory.recompute_whole_chunk);
  CHECK(!m.search.memory.sequence_parallel_whole_boundaries);
}

TEST_CASE("bad options give errors that say what to change", "[plan][cli]") {
  CHECK_THAT(error_of({"--layers", "24"}),
             Catch::Contains("missing --hidden, --heads") && Catch::Contains("see --help"));
  CHECK_THAT(error_of(with(base_args(), {"--tp", "two"})),
             Catch::Contains("--tp expects a positive whole number, got 'two'"));
  CHECK_THAT(error_of(with(base_args(), {"--tp", "0"})), Catch::Contains("--tp expects a positive whole number"));
  CHECK_THAT(error_of(with(base_args(), {"--gpu-mem-gib", "-3"})),
             Catch::Contains("--gpu-mem-gib expects a positive number"));
  CHECK_THAT(error_of(with(base_args(), {"--frobnicate", "1"})), Catch::Contains("unknown option --frobnicate"));
  CHECK_THAT(error_of(with(base_args(), {"--schedule", "zigzag"})),
             Catch::Contains("--schedule 'zigzag' is not known; use gpipe, 1f1b, interleaved_1f1b"));
  CHECK_THAT(error_of(with(base_args(), {"--recompute", "some"})), Catch::Contains("use none, selective or full"));
  CHECK_THAT(error_of(with(base_args(), {"--memory-semantics", "deepspeed"})), Catch::Contains("use mpar or megatron"));
  CHECK_THAT(error_of(with(base_args(), {"--zero1", "maybe"})), Catch::Contains("--zero1 expects on or off"));
  CHECK_THAT(error_of(with(base_args(), {"--zero2", "maybe"})), Catch::Contains("--zero2 expects on or off"));
  CHECK_THAT(error_of(with(base_args(), {"--zero3", "maybe"})), Catch::Contains("--zero3 expects on or off"));
  CHECK_THAT(error_of(with(base_args(), {"--tp", "16"})), Catch::Contains("choose a divisor of --gpus-per-node"));
  CHECK_THAT(error_of(with(base_args(), {"--tp", "2", "--pp", "4", "--dp", "4"})),
             Catch::Contains("make the product equal --gpus"));
  CHECK_THAT(error_of(with(base_args(), {"--heads", "15"})),
             Catch::Contains("--hidden 2048 is not divisible by --heads 15"));
  CHECK_THAT(error_of(with(base_args(), {"--gpus", "60"})), Catch::Contains("use a multiple of 8"));
  CHECK_THAT(error_of(with(base_args(), {"--memory-fraction", "1.5"})), Catch::Contains("(0, 1]"));
  CHECK_THAT(error_of(with(base_args(), {"--calibration", "/nonexistent/metrics.jsonl"})),
             Catch::Contains("cannot open"));
  // A directory, an empty file or a file without one measurement would silently plan with the defaults.
  const auto tmp = std::filesystem::temp_directory_path() / ("mpar_plan_cli_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  CHECK_THAT(error_of(with(base_args(), {"--calibration", tmp.string()})),
             Catch::Contains("--calibration: '" + tmp.string() + "' is a directory"));
  std::ofstream(tmp / "empty.jsonl").flush();
  CHECK_THAT(error_of(with(base_args(), {"--calibration", (tmp / "empty.jsonl").string()})),
             Catch::Contains("empty.jsonl' holds no measurements"));
  std::ofstream(tmp / "foreign.jsonl") << "{\"metric\":\"step_time\",\"seconds\":1.5}\n";
  CHECK_THAT(error_of(with(base_args(), {"--calibration", (tmp / "foreign.jsonl").string()})),
             Catch::Contains("foreign.jsonl' holds no measurements"));
  std::filesystem::remove_all(tmp);
  CHECK_THAT(error_of(with(base_args(), {"--tp"})), Catch::Contains("--tp needs a value"));
  CHECK_THAT(error_of(with(base_args(), {"--schedule", "1f1b", "--virtual-stages", "2"})),
             Catch::Contains("needs --schedule interleaved_1f1b"));
  std::ostringstream out, err;
  CHECK(run_cli({"--help"}, out, err) == 0);
  CHECK_THAT(out.str(), Catch::Contains("--intra-node-gbps"));
}

TEST_CASE("JSON output prints one object per configuration with the documented fields", "[plan][cli]") {
  std::ostringstream out, err;
  REQUIRE(run_cli(with(base_args(), {"--json", "--top", "4"}), out, err) == 0);
  std::istringstream lines(out.str());
  std::string line;
  std::size_t n = 0;
  double previous = 0;
  while (std::getline(lines, line)) {
    ++n;
    const auto j = mpar::plan::detail::parse_json_object(line, n);
    for (const char* k : {"tp", "pp", "dp", "microbatch_size", "microbatches", "memory_gib_per_gpu", "step_seconds",
                          "tflops_per_gpu", "bubble_fraction", "virtual_stages"})
      CHECK(j.number.count(k) == 1);
    for (const char* k : {"schedule", "recompute"}) CHECK(j.text.count(k) == 1);
    CHECK(j.number.at("tp") * j.number.at("pp") * j.number.at("dp") == 64);
    CHECK(j.number.at("memory_gib_per_gpu") < 80);
    CHECK(j.number.at("step_seconds") >= previous);
    previous = j.number.at("step_seconds");
    CHECK(parse_schedule(j.text.at("schedule")).has_value());
  }
  CHECK(n == 4);
}

TEST_CASE("the table shows the ranking, the rejections and the cost of a broken placement", "[plan][cli]") {
  std::ostringstream out, err;
  REQUIRE(run_cli(with(base_args(), {"--tp", "8"}), out, err) == 0);
  const std::string s = out.str();
  CHECK_THAT(s, Catch::Contains("TFLOP/s") && Catch::Contains("bubble") && Catch::Contains("mem GiB"));
  CHECK_THAT(s, Catch::Contains("rejected:"));
  CHECK_THAT(s, Catch::Contains("tensor-parallel groups spread over"));
  CHECK_THAT(s, Catch::Contains("% slower"));
}

TEST_CASE("the table's zero column shows the ZeRO stage of each row", "[plan][cli]") {
  for (const char* stage : {"1", "2", "3"}) {
    std::vector<std::string> args = base_args();
    for (const char* s : {"1", "2", "3"})
      args = with(args, {std::string("--zero") + s, std::string(s) <= std::string(stage) ? "on" : "off"});
    std::ostringstream out, err;
    INFO("ZeRO-" << stage << ": " << err.str());
    REQUIRE(run_cli(args, out, err) == 0);
    std::istringstream table(out.str());
    std::string line;
    while (std::getline(table, line) && line.find("recompute  zero") == std::string::npos) {}
    std::vector<std::string> headers, first;
    std::istringstream h(line);
    for (std::string w; h >> w;) headers.push_back(w);
    REQUIRE(std::getline(table, line));
    std::istringstream r(line);
    for (std::string w; r >> w;) first.push_back(w);
    const auto column = std::find(headers.begin(), headers.end(), "zero") - headers.begin();
    REQUIRE(std::size_t(column) < first.size());
    CHECK(first[std::size_t(column)] == stage);
  }
}

TEST_CASE("mpar-plan --cp fixes context parallelism: every configuration splits each sequence over cp GPUs",
          "[plan][cli][context]") {
  CHECK(parse_cli(base_args()).space.cp == 1);
  CHECK(parse_cli(with(base_args(), {"--cp", "4"})).space.cp == 4);
  CHECK_THAT(
      error_of(with(base_args(), {"--cp", "3"})),
      Catch::Contains("--cp 3 splits each sequence into 2 x cp = 6 zig-zag chunks, which --seq 1024 does not divide"));
  CHECK_THAT(error_of(with(base_args(), {"--cp", "0"})),
             Catch::Contains("--cp (a size, or auto) expects a positive whole number, got '0'"));
  CHECK_THAT(error_of(with(base_args(), {"--cp", "automatic"})),
             Catch::Contains("--cp (a size, or auto) expects a positive whole number, got 'automatic'"));
  CHECK_THAT(error_of(with(base_args(), {"--tp", "2", "--pp", "4", "--dp", "8", "--cp", "2"})),
             Catch::Contains("--tp 2 x --pp 4 x --dp 8 x --cp 2 = 128 GPUs, but --gpus is 64"));
  std::ostringstream out, err;
  REQUIRE(run_cli(with(base_args(), {"--json", "--top", "4", "--cp", "2"}), out, err) == 0);
  std::istringstream lines(out.str());
  std::string line;
  std::size_t n = 0;
  while (std::getline(lines, line)) {
    ++n;
    const auto j = mpar::plan::detail::parse_json_object(line, n);
    CHECK(j.number.at("cp") == 2);
    CHECK(j.number.at("tp") * j.number.at("pp") * j.number.at("dp") * j.number.at("cp") == 64);
  }
  CHECK(n == 4);
}

TEST_CASE("mpar-plan --cp auto searches context parallelism and shows each row's cp", "[plan][cli][context]") {
  CHECK_FALSE(parse_cli(with(base_args(), {"--cp", "auto"})).space.cp.has_value());
  // A long sequence, where splitting it pays: 32 k tokens.
  std::vector<std::string> args = base_args();
  *(std::find(args.begin(), args.end(), "--seq") + 1) = "32768";
  std::ostringstream out, err;
  REQUIRE(run_cli(with(args, {"--cp", "auto", "--top", "3"}), out, err) == 0);
  const std::string table = out.str();
  INFO(table);
  CHECK_THAT(table, Catch::Contains("context parallelism searched over cp = 1, 2, 4, 8, 16, 32, 64"));
  CHECK_THAT(table, Catch::Contains("  #  tp  cp  pp    dp  mbs"));
  // The best row's cp column agrees with the "best:" line, which names cp when it is above 1.
  std::istringstream lines(table);
  std::string line;
  while (std::getline(lines, line) && line.rfind("  1 ", 0) != 0) {}
  std::istringstream row(line);
  std::size_t rank = 0, tp = 0, cp = 0;
  REQUIRE(row >> rank >> tp >> cp);
  CHECK(cp > 1);
  CHECK_THAT(table, Catch::Contains("best: tp=" + std::to_string(tp)) && Catch::Contains(" cp=" + std::to_string(cp)));
  // Without --cp auto the table keeps its columns (no cp column) and every row keeps sequences whole.
  std::ostringstream fixed_out;
  REQUIRE(run_cli(args, fixed_out, err) == 0);
  CHECK_THAT(fixed_out.str(), Catch::Contains("  #  tp  pp    dp  mbs"));
  CHECK_THAT(fixed_out.str(), !Catch::Contains("context parallelism"));
}
