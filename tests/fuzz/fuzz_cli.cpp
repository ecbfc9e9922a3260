// libFuzzer target: cli::Parser on arbitrary argument lists (arguments separated by NUL bytes).
// Every rejection must be a cli::usage_error; accepted values must respect their declared ranges.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "mpar/cli/parser.hpp"

using namespace mpar;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> storage;
  std::string cur;
  for (std::size_t i = 0; i < size && storage.size() < 64; ++i) {
    if (data[i] == 0) {
      storage.push_back(cur);
      cur.clear();
    } else {
      cur += char(data[i]);
    }
  }
  if (!cur.empty()) storage.push_back(cur);
  std::vector<std::string_view> args(storage.begin(), storage.end());

  enum class Mode { fast, exact } mode = Mode::fast;
  int tp = 1;
  std::size_t steps = 10;
  long long seed = -1;
  double lr = 3e-4;
  float clip = 1.0f;
  std::string dir, out = "out";
  bool single = false, verbose = false;
  cli::Parser p("fuzz", "Every kind of option.");
  p.positional("DIR", dir, "input");
  p.option("tp", tp, "tensor size").range(1, 64);
  p.option("steps", steps, "steps").required();
  p.option("seed", seed, "seed");
  p.option("lr", lr, "learning rate").range(0.0, 1.0);
  p.option("clip", clip, "clip");
  p.option("out", out, "output");
  p.choice("mode", mode, {{"fast", Mode::fast}, {"exact", Mode::exact}}, "mode");
  p.flag("single", single, "single");
  p.flag("verbose", verbose, "verbose");
  try {
    if (!p.parse(args)) {
      (void)p.help();
      return 0;
    }
  } catch (const cli::usage_error&) {
    return 0;
  }
  if (tp < 1 || tp > 64 || !(lr >= 0.0 && lr <= 1.0) || !p.given("steps") || !p.given("DIR")) std::abort();
  return 0;
}
