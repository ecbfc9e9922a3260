#pragma once
/**
 * @file The calibration path: measured GEMM and elementwise rates, collective timings and per-layer
 * action times, read from a JSON-lines metrics file, replace the cost model's defaults.
 *
 * One JSON object per line; lines whose "metric" is not one of these are ignored, so a general
 * metrics stream can be passed as is:
 * ```
 * {"metric":"gemm","flops":2.1e12,"seconds":0.0105}
 * {"metric":"elementwise","bytes":4.0e9,"seconds":0.0025}
 * {"metric":"collective","op":"all_reduce","ranks":8,"nodes":1,"bytes":1.0e9,"seconds":0.0061}
 * {"metric":"action","op":"forward","layers":4,"tp":8,"microbatch_size":1,"recompute":"full","seconds":0.052}
 * ```
 * Collective lines with one node calibrate the intra-node link, the others the inter-node link
 * (per GPU, as the ring model uses it). With two or more sizes per link both latency and bandwidth
 * are fitted (least squares on the alpha-beta model); with one size only the bandwidth.
 * Action lines give per-layer seconds for (tp, micro-batch size, recompute); "backward" (whole) is
 * split into input and weight halves by `weight_share`, as the pipeline simulator does for timelines.
 */
#include <cctype>
#include <cmath>
#include <istream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "mpar/core/error.hpp"
#include "mpar/plan/collective_cost.hpp"
#include "mpar/plan/cost_model.hpp"

namespace mpar::plan {

namespace detail {

/** A flat JSON object: string, number and boolean members (nested values are skipped). */
struct JsonLine {
  std::map<std::string, std::string> text;
  std::map<std::string, double> number;
};

/** Parses one line; throws config_error naming the line and the column on malformed input. */
[[nodiscard]] inline JsonLine parse_json_object(const std::string& s, std::size_t line_no) {
  std::size_t i = 0;
  auto fail = [&](const char* what) -> JsonLine {  // never returns; the type lets call sites `return fail(...)`
    throw config_error(mpar::detail::cat("calibration line ", line_no, ", column ", i + 1, ": ", what, " in: ", s));
  };
  auto ws = [&] {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  };
  auto str = [&](std::string& out) -> bool {
    if (i >= s.size() || s[i] != '"') return false;
    ++i;
    while (i < s.size() && s[i] != '"') {
      if (s[i] == '\\' && i + 1 < s.size()) ++i;
      out += s[i++];
    }
    if (i >= s.size()) return false;
    ++i;
    return true;
  };
  JsonLine j;
  ws();
  if (i >= s.size() || s[i] != '{') return fail("expected '{'");
  ++i;
  ws();
  if (i < s.size() && s[i] == '}') return j;
  while (true) {
    ws();
    std::string key;
    if (!str(key)) return fail("expected a quoted member name");
    ws();
    if (i >= s.size() || s[i] != ':') return fail("expected ':'");
    ++i;
    ws();
    if (i >= s.size()) return fail("missing value");
    if (s[i] == '"') {
      std::string v;
      if (!str(v)) return fail("unterminated string");
      j.text[key] = v;
    } else if (s[i] == '{' || s[i] == '[') {
      int depth = 0;
      bool in_str = false;
      for (; i < s.size(); ++i) {
        if (in_str) {
          if (s[i] == '\\')
            ++i;
          else if (s[i] == '"')
            in_str = false;
        } else if (s[i] == '"')
          in_str = true;
        else if (s[i] == '{' || s[i] == '[')
          ++depth;
        else if ((s[i] == '}' || s[i] == ']') && --depth == 0) {
          ++i;
          break;
        }
      }
      if (depth != 0) return fail("unbalanced brackets");
    } else if (s.compare(i, 4, "true") == 0) {
      j.number[key] = 1, i += 4;
    } else if (s.compare(i, 5, "false") == 0) {
      j.number[key] = 0, i += 5;
    } else if (s.compare(i, 4, "null") == 0) {
      i += 4;
    } else {
      const char* b = s.c_str() + i;
      char* e = nullptr;
      const double v = std::strtod(b, &e);
      if (e == b) return fail("expected a value");
      j.number[key] = v;
      i += std::size_t(e - b);
    }
    ws();
    if (i < s.size() && s[i] == ',') {
      ++i;
      continue;
    }
    if (i < s.size() && s[i] == '}') break;
    return fail("expected ',' or '}'");
  }
  return j;
}

/** One timing of a collective, reduced to the alpha-beta regressors: t = hops * alpha + volume / bandwidth. */
struct LinkSample {
  double hops, volume, seconds;
};

/** Least-squares alpha and bandwidth; latency kept at `alpha0` when one size or a negative fit. */
[[nodiscard]] inline Link fit_link(const std::vector<LinkSample>& xs, double alpha0) {
  double shh = 0, shv = 0, svv = 0, sht = 0, svt = 0;
  for (const auto& x : xs)
    shh += x.hops * x.hops, shv += x.hops * x.volume, svv += x.volume * x.volume, sht += x.hops * x.seconds,
        svt += x.volume * x.seconds;
  const double det = shh * svv - shv * shv;
  if (xs.size() >= 2 && std::abs(det) > 1e-12 * shh * svv) {
    const double alpha = (sht * svv - shv * svt) / det, inv_bw = (shh * svt - shv * sht) / det;
    if (alpha >= 0 && inv_bw > 0) return {1.0 / inv_bw, alpha};
  }
  // Bandwidth only: minimise sum (t - hops*alpha0 - volume/bw)^2 over 1/bw.
  double num = 0;
  for (const auto& x : xs) num += x.volume * (x.seconds - x.hops * alpha0);
  require(num > 0 && svv > 0,
          "calibration: collective timings are faster than the latency alone; check the units (seconds, bytes)");
  return {svv / num, alpha0};
}

}  // namespace detail

/**
 * Reads a JSON-lines metrics stream into `base` (whose other fields are kept), for clusters with
 * `gpus_per_node` GPUs per node.
 */
[[nodiscard]] inline Calibration load_calibration(std::istream& in, const Cluster& cluster, Calibration base = {},
                                                  double weight_share = 0.5, std::size_t* measurements = nullptr) {
  std::size_t used = 0;  // lines with a metric this model reads
  double gemm_f = 0, gemm_t = 0, ew_b = 0, ew_t = 0;
  std::vector<detail::LinkSample> intra, inter;
  struct Acc {
    double f = 0, nf = 0, bi = 0, nbi = 0, bw = 0, nbw = 0;
  };
  std::map<std::tuple<std::size_t, std::size_t, Recompute>, Acc> actions;
  std::string line;
  std::size_t no = 0;
  while (std::getline(in, line)) {
    ++no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const detail::JsonLine j = detail::parse_json_object(line, no);
    auto num = [&](const char* k) {
      auto it = j.number.find(k);
      require(it != j.number.end(), "calibration line ", no, ": metric '", j.text.at("metric"), "' needs a numeric \"",
              k, "\"");
      return it->second;
    };
    auto it = j.text.find("metric");
    if (it == j.text.end()) continue;
    const std::string& metric = it->second;
    if (metric == "gemm" || metric == "elementwise" || metric == "collective" || metric == "action") ++used;
    if (metric == "gemm") {
      gemm_f += num("flops"), gemm_t += num("seconds");
    } else if (metric == "elementwise") {
      ew_b += num("bytes"), ew_t += num("seconds");
    } else if (metric == "collective") {
      const std::string op = j.text.count("op") ? j.text.at("op") : "";
      const double n = num("ranks"), k = num("nodes"), bytes = num("bytes"), t = num("seconds");
      require(n >= 2 && k >= 1 && std::fmod(n, k) == 0, "calibration line ", no, ": a collective over ", n,
              " ranks on ", k, " nodes cannot be fitted (need ranks >= 2, spread evenly)");
      double hops = 0, volume = 0;
      if (op == "all_reduce")
        hops = 2 * (n - 1), volume = 2 * (n - 1) / n * bytes;
      else if (op == "reduce_scatter" || op == "all_gather")
        hops = n - 1, volume = (n - 1) / n * bytes;
      else
        throw config_error(mpar::detail::cat("calibration line ", no, ": collective op '", op,
                                             "' is not one of all_reduce, reduce_scatter, all_gather"));
      // Across nodes the ring's bottleneck is per_node NICs in parallel (see collective_cost.hpp): scale to one GPU's share.
      if (k > 1)
        inter.push_back({hops, volume / (n / k), t});
      else
        intra.push_back({hops, volume, t});
    } else if (metric == "action") {
      const double layers = num("layers"), t = num("seconds");
      require(layers > 0, "calibration line ", no, ": \"layers\" must be positive");
      const auto rc = parse_recompute(j.text.count("recompute") ? j.text.at("recompute") : "none");
      require(rc.has_value(), "calibration line ", no, ": \"recompute\" must be none, selective or full");
      Acc& a = actions[{std::size_t(num("tp")), std::size_t(num("microbatch_size")), *rc}];
      const std::string op = j.text.count("op") ? j.text.at("op") : "";
      const double per = t / layers;
      if (op == "forward")
        a.f += per, a.nf += 1;
      else if (op == "backward_input")
        a.bi += per, a.nbi += 1;
      else if (op == "backward_weight")
        a.bw += per, a.nbw += 1;
      else if (op == "backward")
        a.bi += per * (1 - weight_share), a.nbi += 1, a.bw += per * weight_share, a.nbw += 1;
      else
        throw config_error(mpar::detail::cat("calibration line ", no, ": action op '", op,
                                             "' is not one of forward, backward, backward_input, backward_weight"));
    }
  }
  if (measurements) *measurements = used;
  if (gemm_t > 0) base.gemm_flops_per_s = gemm_f / gemm_t;
  if (ew_t > 0) base.elementwise_bytes_per_s = ew_b / ew_t;
  if (!intra.empty()) base.intra = detail::fit_link(intra, cluster.intra_node_latency);
  if (!inter.empty()) base.inter = detail::fit_link(inter, cluster.inter_node_latency);
  for (const auto& [key, a] : actions) {
    require(a.nf > 0 && a.nbi > 0, "calibration: action timings for tp=", std::get<0>(key),
            ", microbatch_size=", std::get<1>(key), " need both a forward and a backward");
    base.layer_costs[key] = {a.f / a.nf, a.bi / a.nbi, a.nbw > 0 ? a.bw / a.nbw : 0.0};
  }
  return base;
}

/** Convenience: reads a calibration from a JSON-lines string. */
[[nodiscard]] inline Calibration load_calibration(const std::string& text, const Cluster& cluster,
                                                  Calibration base = {}) {
  std::istringstream in(text);
  return load_calibration(in, cluster, std::move(base));
}

}  // namespace mpar::plan
