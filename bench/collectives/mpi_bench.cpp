// The MPI side of the collectives benchmark (run under mpirun by bench_collectives): the
// MpiCommunicator table, and all_reduce of float through MpiCommunicator against raw
// MPI_Allreduce(MPI_IN_PLACE) on the same buffers, measured alternately. Last line: JSON.
#include <cstdio>
#include <vector>

#include "collectives_table.hpp"
#include "mpar/comm/mpi.hpp"

using namespace mpar;
using namespace mpar::bench;

int main(int argc, char** argv) {
  MpiEnvironment env(&argc, &argv);
  const bool smoke = has_flag(argc, argv, "--smoke");
  const std::size_t key_bytes = smoke ? (1u << 20) : (16u << 20);
  run_mpi([&](MpiCommunicator& c) {
    auto rows = measure_collectives(c, smoke);
    if (c.rank() == 0) print_table("MpiCommunicator", c.size(), rows);
    // Side by side at the headline size: raw MPI and the wrapper alternate, medians of each.
    const std::size_t n = key_bytes / sizeof(float);
    std::vector<float> x(n, 1.0f);
    const int iters = iterations_for(key_bytes, smoke), reps = smoke ? 1 : 7;
    std::vector<double> raw, ours;
    for (int r = 0; r < reps; ++r) {
      raw.push_back(time_collective(
          c, 1, iters, [&] { MPI_Allreduce(MPI_IN_PLACE, x.data(), int(n), MPI_FLOAT, MPI_SUM, c.native()); }));
      ours.push_back(time_collective(c, 1, iters, [&] { c.all_reduce(std::span<float>(x), ReduceOp::sum); }));
    }
    const double traw = median(raw), tours = median(ours);
    if (c.rank() == 0) {
      std::printf(
          "# all_reduce %zu bytes: raw MPI_Allreduce %.2f us (%.3f GB/s), MpiCommunicator %.2f us (%.3f GB/s)\n",
          key_bytes, traw * 1e6, double(key_bytes) / traw / 1e9, tours * 1e6, double(key_bytes) / tours / 1e9);
      std::printf("{\"raw_mpi_algbw\": %.6g, \"mpicomm_algbw\": %.6g}\n", double(key_bytes) / traw / 1e9,
                  double(key_bytes) / tours / 1e9);
    }
  });
  return 0;
}
