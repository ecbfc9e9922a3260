#pragma once
// Small helpers shared by mpar's benchmarks: timing, medians and the closing JSON line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace mpar::bench {

/** Seconds taken by one call of `f`. */
template <class F>
double time_once(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

/**
 * Runs `ours` and `baseline` alternately `reps` times after one warm-up each, so both see the same
 * machine conditions, and returns their median times.
 */
template <class A, class B>
std::pair<double, double> paired_medians(int reps, A&& ours, B&& baseline) {
  ours();
  baseline();
  std::vector<double> a, b;
  for (int r = 0; r < reps; ++r) {
    a.push_back(time_once(ours));
    b.push_back(time_once(baseline));
  }
  return {median(a), median(b)};
}

/** The closing line every benchmark prints: ratio > 1 means mpar is better. `extra` is raw JSON members. */
/** The 1-minute load average (/proc/loadavg) as a JSON number, or null: timings on a busy machine are noise. */
inline std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string first;
  f >> first;
  return first.empty() ? "null" : first;
}

/** The closing JSON line; the load average is added unless `extra` already reports it. */
inline void print_result_json(const std::string& bench, double ours, double baseline, const std::string& unit,
                              bool higher_is_better, std::string extra = "") {
  const double ratio = higher_is_better ? ours / baseline : baseline / ours;
  if (extra.find("\"loadavg\"") == std::string::npos)
    extra += (extra.empty() ? "" : ", ") + std::string("\"loadavg\": ") + load_average();
  std::printf("{\"bench\": \"%s\", \"ours\": %.6g, \"baseline\": %.6g, \"unit\": \"%s\", \"ratio\": %.4f, %s}\n",
              bench.c_str(), ours, baseline, unit.c_str(), ratio, extra.c_str());
}

inline bool has_flag(int argc, char** argv, const std::string& flag) {
  for (int i = 1; i < argc; ++i)
    if (argv[i] == flag) return true;
  return false;
}

}  // namespace mpar::bench
