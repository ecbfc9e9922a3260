// train_gpt's CUDA part (compiled by nvcc when the CUDA backend is enabled): the same training loop
// as on the host, instantiated with CudaBackend, and --check-against-host, which runs the same steps
// on both backends from the same weights and data and compares them.
//
// Ranks: threads of this process by default (rank r uses GPU r mod the visible GPUs, each rank its
// own stream, the threads communicator over its device memory), or one process per rank under
// mpirun (the node-local rank picks the GPU) with NCCL for every mesh axis, or MPI over device
// memory with --comm mpi (see docs/cuda.md, "Training on CUDA").
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <mpar/cuda.hpp>
#if defined(MPAR_HAVE_MPI)
#include <mpar/comm/mpi.hpp>
#endif

#include "train.hpp"

namespace train_gpt {

namespace {

int visible_gpus() {
  int n = 0;
  const cudaError_t st = cudaGetDeviceCount(&n);
  require(st == cudaSuccess && n > 0, "train_gpt --backend cuda: no CUDA device (",
          st == cudaSuccess ? "0 devices" : cudaGetErrorString(st),
          "); this machine has no usable GPU (or driver): train on the CPU with --backend host");
  return n;
}

/** The GPU of a rank: its node-local rank (from the launcher, for mpirun) or its world rank, modulo the GPUs. */
int device_of(int rank) {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* v = std::getenv(var)) return std::atoi(v) % visible_gpus();
  return rank % visible_gpus();
}

/** Losses and gradient norms of the first `steps` steps, as every rank reports them. */
struct Trajectory {
  std::vector<double> loss, grad_norm;
};

template <backend B>
Trajectory record(ThreadsCommunicator& world, const Options& o, std::size_t steps) {
  data::CharDataset ds(o.data, o.train.model.seq);
  models::GptTrainConfig cfg = o.train;
  cfg.model.vocab = ds.vocab_size();
  models::GptTrainer<ThreadsCommunicator, B> tr(world, cfg, ds);
  Trajectory t;
  for (std::size_t i = 0; i < steps; ++i) {
    const models::StepReport r = tr.train_step();
    t.loss.push_back(r.loss);
    t.grad_norm.push_back(r.grad_norm);
  }
  return t;
}

/**
 * Runs the configured job for --check-steps steps on the host, then on CUDA, and compares step by
 * step. Tolerances (fp32 on both sides; cuBLAS is true fp32): losses within 1e-4 relative, gradient
 * norms within 1e-3 relative — the device sums in another order, and the optimizer carries the
 * difference from step to step.
 */
int check_against_host(const Options& o) {
  const int n = int(o.train.world_size());
  const std::size_t steps = o.check_steps;
  Trajectory host, cuda;
  run_threads(n, [&](ThreadsCommunicator& world) {
    Trajectory t = record<HostBackend>(world, o, steps);
    if (world.rank() == 0) host = std::move(t);
  });
  run_threads(n, [&](ThreadsCommunicator& world) {
    CudaBackend::init_rank(device_of(world.rank()));
    Trajectory t = record<CudaBackend>(world, o, steps);
    if (world.rank() == 0) cuda = std::move(t);
  });
  std::printf("check-against-host: tp=%zu pp=%zu dp=%zu ep=%zu, %zu steps, %d GPU(s)\n", o.train.tp, o.train.pp,
              o.train.dp, o.train.ep, steps, visible_gpus());
  std::printf("%5s  %12s  %12s  %9s  %12s  %12s  %9s\n", "step", "host loss", "cuda loss", "rel diff", "host |g|",
              "cuda |g|", "rel diff");
  double worst_loss = 0, worst_norm = 0;
  for (std::size_t i = 0; i < steps; ++i) {
    const double dl = std::abs(cuda.loss[i] - host.loss[i]) / std::max(std::abs(host.loss[i]), 1e-12);
    const double dg = std::abs(cuda.grad_norm[i] - host.grad_norm[i]) / std::max(std::abs(host.grad_norm[i]), 1e-12);
    worst_loss = std::max(worst_loss, dl);
    worst_norm = std::max(worst_norm, dg);
    std::printf("%5zu  %12.6f  %12.6f  %9.2e  %12.6f  %12.6f  %9.2e\n", i + 1, host.loss[i], cuda.loss[i], dl,
                host.grad_norm[i], cuda.grad_norm[i], dg);
  }
  const bool ok = worst_loss <= 1e-4 && worst_norm <= 1e-3 && std::isfinite(worst_loss) && std::isfinite(worst_norm);
  std::printf("check-against-host: %s (largest loss difference %.2e, limit 1e-4; gradient norm %.2e, limit 1e-3)\n",
              ok ? "PASSED" : "FAILED", worst_loss, worst_norm);
  return ok ? 0 : 1;
}

}  // namespace

int run_cuda(const Options& o, int* argc, char*** argv) {
  if (o.check_against_host) {
    require(!under_mpirun(), "train_gpt --check-against-host: run it without mpirun (it starts thread ranks itself)");
    return check_against_host(o);
  }
  if (under_mpirun()) {
#if defined(MPAR_HAVE_MPI)
    MpiEnvironment env(argc, argv);
    const auto exit_signal = hold_exit_signal(o);  // after MPI's start, which may install handlers of its own
    // run_mpi turns an exception on any rank into MPI_Abort, so no rank waits for a failed one.
    run_mpi([&](MpiCommunicator& mpi) {
      if (o.comm == "mpi") {
        CudaBackend::init_rank(device_of(mpi.rank()));
        train<CudaBackend>(mpi, o, true, exit_signal.get());
        return;
      }
      // NCCL for every mesh axis: one GPU per process (two on one GPU would fail inside NCCL's setup).
      MPI_Comm node = MPI_COMM_NULL;
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
      int local_ranks = 1;
      MPI_Comm_size(node, &local_ranks);
      MPI_Comm_free(&node);
      require(local_ranks <= visible_gpus(), "train_gpt: rank ", mpi.rank(), ": ", local_ranks,
              " processes on this node share ", visible_gpus(),
              " GPU(s); NCCL needs one GPU per process (start at most ", visible_gpus(),
              " per node, or use --comm mpi)");
      NcclOptions nopt;
      nopt.name = "world";
      NcclCommunicator world = NcclCommunicator::from_mpi(MPI_COMM_WORLD, nopt);
      CudaBackend::init_rank(world.device());
      train<CudaBackend>(world, o, true, exit_signal.get());
    });
    return 0;
#else
    (void)argc;
    (void)argv;
    throw config_error("train_gpt: started under mpirun, but this build has no MPI; rebuild with MPAR_ENABLE_MPI=ON");
#endif
  }
  (void)argc;
  (void)argv;
  const auto exit_signal = hold_exit_signal(o);
  preflight(o);  // as for host thread ranks: checked before any rank starts, --save locked for the run
  std::optional<io::DirectoryLock> save_lock;
  if (!o.save.empty()) save_lock.emplace(o.save);
  run_threads(int(o.train.world_size()), [&](ThreadsCommunicator& world) {
    CudaBackend::init_rank(device_of(world.rank()));
    train<CudaBackend>(world, o, false, exit_signal.get());
  });
  return 0;
}

}  // namespace train_gpt
