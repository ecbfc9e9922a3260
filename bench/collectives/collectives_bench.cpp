// Collectives benchmark: the threads communicator's nccl-tests-style table, then the MPI side
// (MpiCommunicator and raw OpenMPI MPI_Allreduce, launched with mpirun -np <ranks>), then one JSON
// line comparing all_reduce of 16 MiB float on 2 ranks: threads vs raw MPI_Allreduce (algbw),
// threads vs one memcpy of the buffer (time), and MpiCommunicator vs raw MPI (algbw).
//
//   bench_collectives [--smoke] [--ranks N] [--no-mpi]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "collectives_table.hpp"
#include "mpar/comm/threads.hpp"

using namespace mpar;
using namespace mpar::bench;

namespace {

/** Reads a number `"key": value` from a JSON line; negative when absent. */
double json_number(const std::string& line, const std::string& key) {
  const auto k = line.find("\"" + key + "\"");
  if (k == std::string::npos) return -1;
  return std::strtod(line.c_str() + line.find(':', k) + 1, nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  const bool smoke = has_flag(argc, argv, "--smoke");
  int ranks = 2;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--ranks") ranks = std::atoi(argv[i + 1]);
  const std::size_t key_bytes = smoke ? (1u << 20) : (16u << 20);

  std::vector<CollRow> rows;
  double t_ar = 0, mc = 0;
  run_threads(ranks, [&](ThreadsCommunicator& c) {
    auto r = measure_collectives(c, smoke);
    // The headline pair, measured alternately so both see the same machine: all_reduce of the
    // buffer, and one memcpy of it by rank 0 while the other ranks wait.
    const std::size_t n = key_bytes / sizeof(float);
    std::vector<float> x(n, 1.0f), src(n, 2.0f), dst(n, 0.0f);
    const int iters = iterations_for(key_bytes, smoke), reps = smoke ? 1 : 9;
    std::vector<double> ar, cp;
    for (int rep = 0; rep < reps; ++rep) {
      ar.push_back(time_collective(c, 1, iters, [&] { c.all_reduce(std::span<float>(x), ReduceOp::sum); }));
      cp.push_back(time_collective(c, 1, iters, [&] {
        if (c.rank() == 0) std::memcpy(dst.data(), src.data(), n * sizeof(float));
      }));
    }
    if (c.rank() == 0) {
      rows = std::move(r);
      t_ar = median(ar);
      mc = median(cp);
    }
  });
  print_table("ThreadsCommunicator", ranks, rows);
  std::printf("# %zu bytes, medians of alternating runs: all_reduce %.2f us, memcpy %.2f us\n", key_bytes, t_ar * 1e6,
              mc * 1e6);

  // The MPI side runs as a separate job; its last line is JSON with the two all_reduce numbers.
  double raw = -1, comm = -1;
#if defined(MPAR_BENCH_MPIEXEC) && defined(MPAR_BENCH_MPI_BINARY)
  if (!has_flag(argc, argv, "--no-mpi")) {
    const std::string cmd = std::string(MPAR_BENCH_MPIEXEC) + " -np " + std::to_string(ranks) +
                            " --allow-run-as-root --oversubscribe " + MPAR_BENCH_MPI_BINARY +
                            (smoke ? " --smoke" : "") + " 2>&1";
    std::fflush(stdout);
    if (FILE* f = popen(cmd.c_str(), "r")) {
      char buf[4096];
      std::string last;
      while (std::fgets(buf, sizeof buf, f)) {
        std::string line(buf);
        if (line.rfind("{", 0) == 0)
          last = line;
        else
          std::fputs(buf, stdout);
      }
      const int rc = pclose(f);
      raw = json_number(last, "raw_mpi_algbw");
      comm = json_number(last, "mpicomm_algbw");
      if (rc != 0) std::printf("# the MPI job failed (status %d): %s\n", rc, cmd.c_str());
    }
  }
#endif
  const double ours = t_ar > 0 ? double(key_bytes) / t_ar / 1e9 : 0;
  char extra[512];
  std::snprintf(extra, sizeof extra,
                "\"size_bytes\": %zu, \"ranks\": %d, \"threads_time_us\": %.2f, \"memcpy_time_us\": %.2f, "
                "\"threads_vs_memcpy_time\": %.3f, \"mpicomm_algbw\": %.4g, \"raw_mpi_algbw\": %.4g, "
                "\"mpicomm_vs_raw_mpi\": %.4f, \"smoke\": %s",
                key_bytes, ranks, t_ar * 1e6, mc * 1e6, mc > 0 ? t_ar / mc : 0, comm, raw,
                (comm > 0 && raw > 0) ? comm / raw : 0.0, smoke ? "true" : "false");
  if (raw > 0) {
    print_result_json("all_reduce_f32_threads_vs_openmpi", ours, raw, "GB/s", true, extra);
  } else {
    std::printf(
        "{\"bench\": \"all_reduce_f32_threads_vs_openmpi\", \"ours\": %.6g, \"baseline\": null, "
        "\"unit\": \"GB/s\", \"ratio\": null, %s}\n",
        ours, extra);
  }
  return t_ar > 0 ? 0 : 1;
}
