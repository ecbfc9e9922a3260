// cli::Parser: both option spellings, every value kind, ranges, choices, flags, positionals,
// required options, defaults, help text, and error messages that name the option and the fix.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "mpar/cli/parser.hpp"

using namespace mpar;

namespace {
enum class Schedule { gpipe, one_f_one_b };

struct Args {
  std::string dir;
  int tp = 1;
  std::size_t steps = 100;
  long long seed = -1;
  double lr = 3e-4;
  float clip = 1.0f;
  std::string out = "ckpt";
  Schedule schedule = Schedule::one_f_one_b;
  bool single = false;
  cli::Parser parser{"train", "Trains a model."};
  Args() {
    parser.positional("DIR", dir, "data directory");
    parser.option("tp", tp, "tensor-parallel size").range(1, 64);
    parser.option("steps", steps, "optimizer steps");
    parser.option("seed", seed, "random seed");
    parser.option("lr", lr, "learning rate").range(0.0, 1.0).required();
    parser.option("clip", clip, "gradient clipping norm");
    parser.option("out", out, "checkpoint directory");
    parser.choice("schedule", schedule, {{"gpipe", Schedule::gpipe}, {"1f1b", Schedule::one_f_one_b}},
                  "pipeline schedule");
    parser.flag("single", single, "one rank");
  }
  bool parse(std::vector<std::string_view> a) { return parser.parse(a); }
};
}  // namespace

TEST_CASE("cli: both spellings, every kind of value, defaults kept", "[io][cli]") {
  Args a;
  REQUIRE(
      a.parse({"data", "--tp", "4", "--lr=0.001", "--seed", "-7", "--clip=+2.5", "--schedule", "gpipe", "--single"}));
  CHECK(a.dir == "data");
  CHECK(a.tp == 4);
  CHECK(a.lr == 0.001);
  CHECK(a.seed == -7);
  CHECK(a.clip == 2.5f);
  CHECK(a.schedule == Schedule::gpipe);
  CHECK(a.single);
  CHECK(a.steps == 100);  // default
  CHECK(a.out == "ckpt");
  CHECK(a.parser.given("tp"));
  CHECK_FALSE(a.parser.given("steps"));
}

TEST_CASE("cli: -- ends options; negative numbers are values", "[io][cli]") {
  Args a;
  REQUIRE(a.parse({"--lr", "0.5", "--seed", "-3", "--", "--weird-dir"}));
  CHECK(a.dir == "--weird-dir");
  CHECK(a.seed == -3);
}

TEST_CASE("cli: --help returns false and the help lists everything", "[io][cli]") {
  Args a;
  CHECK_FALSE(a.parse({"--help"}));
  const std::string h = a.parser.help();
  CHECK_THAT(h, Catch::Contains("usage: train [options] DIR"));
  CHECK_THAT(h, Catch::Contains("--tp N") && Catch::Contains("in [1, 64], default 1"));
  CHECK_THAT(h, Catch::Contains("--lr X") && Catch::Contains("required"));
  CHECK_THAT(h, Catch::Contains("gpipe|1f1b, default 1f1b"));
  CHECK_THAT(h, Catch::Contains("--single"));
}

TEST_CASE("cli: a fractional bound reads as it was written, in the help and in the error", "[io][cli]") {
  double ratio = 0.5;
  cli::Parser p{"t", "Tests bounds."};
  p.option("ratio", ratio, "a share").range(0.1, 0.9);
  CHECK_THAT(p.help(), Catch::Contains("in [0.1, 0.9]"));
  std::string error = "no error";
  try {
    p.parse(std::vector<std::string_view>{"--ratio", "0.95"});
  } catch (const cli::usage_error& e) {
    error = e.what();
  }
  CHECK_THAT(error, Catch::Contains("option --ratio: 0.95 is out of range; give a value in [0.1, 0.9]"));
}

TEST_CASE("cli: errors name the option and what to change", "[io][cli]") {
  auto err = [](std::vector<std::string_view> args) {
    Args a;
    try {
      a.parse(args);
    } catch (const cli::usage_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(err({"d", "--lr", "1", "--tp", "0"}),
             Catch::Contains("option --tp: 0 is out of range; give a value in [1, 64]"));
  CHECK_THAT(err({"d", "--lr", "fast"}), Catch::Contains("option --lr: expected a number, got 'fast'"));
  CHECK_THAT(err({"d", "--lr", "1", "--tp", "2.5"}), Catch::Contains("option --tp: expected an integer, got '2.5'"));
  CHECK_THAT(err({"d", "--lr", "1", "--steps", "-1"}), Catch::Contains("expected a non-negative integer"));
  CHECK_THAT(err({"d", "--lr", "1", "--tp", "99999999999"}), Catch::Contains("does not fit"));
  CHECK_THAT(err({"d", "--lr", "inf"}), Catch::Contains("finite"));
  CHECK_THAT(err({"d", "--lr", "1", "--schedule", "zb"}),
             Catch::Contains("option --schedule: 'zb' is not one of: gpipe, 1f1b"));
  CHECK_THAT(err({"d", "--lr", "1", "--tpp", "2"}), Catch::Contains("unknown option --tpp (did you mean --tp?)"));
  CHECK_THAT(err({"d", "--lr", "1", "-x"}), Catch::Contains("unknown option -x"));
  CHECK_THAT(err({"d"}), Catch::Contains("missing required option --lr (learning rate)"));
  CHECK_THAT(err({"--lr", "1"}), Catch::Contains("missing argument DIR"));
  CHECK_THAT(err({"d", "e", "--lr", "1"}), Catch::Contains("unexpected argument 'e'"));
  CHECK_THAT(err({"d", "--lr"}), Catch::Contains("option --lr needs a value (a number), e.g. --lr X"));
  CHECK_THAT(err({"d", "--lr", "--tp", "2"}), Catch::Contains("option --lr needs a value"));
  CHECK_THAT(err({"d", "--lr", "1", "--lr", "2"}), Catch::Contains("option --lr is given twice"));
  CHECK_THAT(err({"d", "--lr", "1", "--single=yes"}), Catch::Contains("flag and takes no value"));
}

TEST_CASE("cli: declaring an option twice is a programming error", "[io][cli]") {
  int x = 0, y = 0;
  cli::Parser p("p");
  p.option("x", x, "x");
  CHECK_THROWS_WITH(p.option("x", y, "again"), Catch::Contains("option name 'x'") && Catch::Contains("declared twice"));
  std::string s;
  CHECK_THROWS_WITH(p.option("s", s, "a string").range(0, 1), Catch::Contains("range() on non-numeric option --s"));
}
