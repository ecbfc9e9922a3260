#pragma once
// nccl-tests-style measurement of every collective over any communicator: time per call, algorithm
// bandwidth (bytes / time) and bus bandwidth (algbw x the operation's traffic factor).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "mpar/comm/communicator.hpp"

namespace mpar::bench {

struct CollRow {
  std::string op;
  std::size_t bytes = 0;
  double seconds = 0, algbw = 0, busbw = 0;  // GB/s = 1e9 bytes/s
};

/** nccl-tests' bus bandwidth factors (doc/PERFORMANCE.md). */
inline double bus_factor(const std::string& op, int p) {
  if (op == "all_reduce") return 2.0 * (p - 1) / p;
  if (op == "broadcast" || op == "reduce") return 1.0;
  return double(p - 1) / p;  // all_gather, reduce_scatter, all_to_all
}

inline std::vector<std::size_t> bench_sizes(bool smoke) {
  if (smoke) return {4u << 10, 64u << 10, 1u << 20};
  std::vector<std::size_t> s;
  for (std::size_t b = 4u << 10; b <= (64u << 20); b *= 4) s.push_back(b);
  return s;
}

/**
 * Seconds per call of `op` on every rank (collective): `iters` calls between two barriers, the
 * median of `reps` such runs. Every rank returns the same number (rank 0's clock is broadcast).
 */
template <class Comm, class Op>
double time_collective(Comm& c, int reps, int iters, Op&& op) {
  op();  // warm-up: page faults, first-touch, lazy connection set-up
  op();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    c.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) op();
    c.barrier();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters);
  }
  std::vector<double> m{median(t)};
  c.broadcast(std::span<double>(m), 0);
  return m[0];
}

inline int iterations_for(std::size_t bytes, bool smoke) {
  const std::size_t budget = smoke ? (8u << 20) : (256u << 20);
  return int(std::clamp<std::size_t>(budget / bytes, 2, smoke ? 20 : 1000));
}

/** Measures all_reduce, reduce_scatter, all_gather, broadcast and all_to_all of float buffers. */
template <class Comm>
std::vector<CollRow> measure_collectives(Comm& c, bool smoke) {
  const int p = c.size(), reps = smoke ? 1 : 5;
  std::vector<CollRow> rows;
  for (std::size_t bytes : bench_sizes(smoke)) {
    const std::size_t n = bytes / sizeof(float);
    std::vector<float> a(n, 1.0f), b(n, 0.0f);
    const Block mine = block_of(n, std::size_t(p), std::size_t(c.rank()));
    std::vector<float> part(mine.extent, 1.0f);
    const std::size_t n_a2a = n / std::size_t(p) * std::size_t(p);
    const int iters = iterations_for(bytes, smoke);
    auto add = [&](const std::string& op, double s) {
      rows.push_back({op, bytes, s, double(bytes) / s / 1e9, double(bytes) / s / 1e9 * bus_factor(op, p)});
    };
    add("all_reduce", time_collective(c, reps, iters, [&] { c.all_reduce(std::span<float>(a), ReduceOp::sum); }));
    add("reduce_scatter",
        time_collective(c, reps, iters, [&] { c.reduce_scatter(a, std::span<float>(part), ReduceOp::sum); }));
    add("all_gather", time_collective(c, reps, iters, [&] { c.all_gather(part, std::span<float>(b)); }));
    add("broadcast", time_collective(c, reps, iters, [&] { c.broadcast(std::span<float>(a), 0); }));
    add("all_to_all", time_collective(c, reps, iters, [&] {
          c.all_to_all(std::span<const float>(a).first(n_a2a), std::span<float>(b).first(n_a2a));
        }));
  }
  return rows;
}

inline void print_table(const char* title, int p, const std::vector<CollRow>& rows) {
  std::printf("# %s, %d ranks, float\n", title, p);
  std::printf("# %-15s %12s %12s %12s %12s\n", "op", "size(B)", "time(us)", "algbw(GB/s)", "busbw(GB/s)");
  for (auto& r : rows)
    std::printf("  %-15s %12zu %12.2f %12.3f %12.3f\n", r.op.c_str(), r.bytes, r.seconds * 1e6, r.algbw, r.busbw);
  std::fflush(stdout);
}

inline const CollRow* find_row(const std::vector<CollRow>& rows, const std::string& op, std::size_t bytes) {
  for (auto& r : rows)
    if (r.op == op && r.bytes == bytes) return &r;
  return nullptr;
}

}  // namespace mpar::bench
