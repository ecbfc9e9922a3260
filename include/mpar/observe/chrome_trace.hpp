#pragma once
/**
 * @file Chrome trace-event JSON (the format chrome://tracing and https://ui.perfetto.dev open).
 *
 * Complete events (`ph:"X"`) with `ts`/`dur` in microseconds; `pid` and `tid` pick the row; metadata
 * events (`ph:"M"`, `process_name` / `thread_name`) label the rows so a reader sees "pipeline rank 2 /
 * compute" instead of numbers.
 */
#include <fstream>
#include <map>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "mpar/core/error.hpp"

namespace mpar::observe {

/** @brief One complete ("X") event: a named interval on row (pid, tid). Times in microseconds. */
struct TraceEvent {
  std::string name;
  std::string category;
  int pid = 0;
  int tid = 0;
  double ts_us = 0;
  double dur_us = 0;
  std::vector<std::pair<std::string, std::string>> args;  ///< shown in the viewer's detail pane (values are strings)
};

/** @brief Collects events and row names, then writes one trace-event JSON document. */
class ChromeTrace {
 public:
  void name_process(int pid, std::string name) { processes_[pid] = std::move(name); }
  void name_thread(int pid, int tid, std::string name) { threads_[{pid, tid}] = std::move(name); }
  void add(TraceEvent e) { events_.push_back(std::move(e)); }
  [[nodiscard]] const std::vector<TraceEvent>& events() const { return events_; }

  /** Writes `{"traceEvents":[...],"displayTimeUnit":"ms"}`. */
  void write(std::ostream& os) const {
    os << "{\"traceEvents\":[\n";
    bool first = true;
    auto sep = [&] {
      if (!first) os << ",\n";
      first = false;
    };
    for (const auto& [pid, name] : processes_) {
      sep();
      os << R"({"ph":"M","name":"process_name","pid":)" << pid << R"(,"tid":0,"args":{"name":)" << quote(name) << "}}";
      sep();
      os << R"({"ph":"M","name":"process_sort_index","pid":)" << pid << R"(,"tid":0,"args":{"sort_index":)" << pid
         << "}}";
    }
    for (const auto& [key, name] : threads_) {
      sep();
      os << R"({"ph":"M","name":"thread_name","pid":)" << key.first << R"(,"tid":)" << key.second
         << R"(,"args":{"name":)" << quote(name) << "}}";
    }
    for (const auto& e : events_) {
      sep();
      os << R"({"ph":"X","name":)" << quote(e.name) << R"(,"cat":)" << quote(e.category) << R"(,"pid":)" << e.pid
         << R"(,"tid":)" << e.tid << R"(,"ts":)" << number(e.ts_us) << R"(,"dur":)" << number(e.dur_us);
      if (!e.args.empty()) {
        os << R"(,"args":{)";
        for (std::size_t i = 0; i < e.args.size(); ++i)
          os << (i ? "," : "") << quote(e.args[i].first) << ":" << quote(e.args[i].second);
        os << "}";
      }
      os << "}";
    }
    os << "\n],\"displayTimeUnit\":\"ms\"}\n";
  }
  [[nodiscard]] std::string str() const {
    std::ostringstream os;
    write(os);
    return os.str();
  }
  /** Writes the JSON to `path`; throws config_error naming the path when it cannot be opened. */
  void save(const std::string& path) const {
    std::ofstream f(path);
    require(bool(f), "ChromeTrace::save: cannot open '", path, "' for writing");
    write(f);
  }

 private:
  static std::string quote(const std::string& s) {
    std::string o = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') o += '\\';
      if (static_cast<unsigned char>(c) < 0x20) continue;  // control characters have no place in row or event names
      o += c;
    }
    return o + "\"";
  }
  static std::string number(double v) {
    std::ostringstream os;
    os.precision(3);
    os << std::fixed << v;
    return os.str();
  }
  std::map<int, std::string> processes_;
  std::map<std::pair<int, int>, std::string> threads_;
  std::vector<TraceEvent> events_;
};

}  // namespace mpar::observe
