// train_gpt's CUDA part (compiled by nvcc when the CUDA backend is enabled): the same training loop
// as on the host, instantiated with CudaBackend, and --check-against-host, which runs the same steps
// on both backends from the same weights and data and compares them.
//
// Ranks: threads of this process by default, all on GPU 0, each rank its own stream, over the device
// communicator (peer reads and reduction kernels in device memory: NCCL's contract for ranks that share a
// GPU); with --comm nccl, threads of this process, rank r on GPU r, over NCCL; or one process per GPU under
// mpirun (the node-local rank picks the GPU) with NCCL for every mesh axis (see docs/cuda.md, "Training on
// CUDA"). The host never hands device memory to a host communicator.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <mpar/backend/gpu/runtime.hpp>  // the CUDA runtime, or its emulation (a test build)
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

/**
 * Runs `f(world)` on `n` thread ranks sharing GPU 0, each bound to it with its own stream, over one device
 * communicator group (collective; a rank that throws makes the others' next collective time out and throw).
 */
template <class F>
void run_device_threads(int n, F f) {
  (void)visible_gpus();  // throws, naming what to do, on a machine without a usable GPU
  auto comms = gpu::DeviceCommunicator::create(n, 0, "world");
  run_threads(n, [&](ThreadsCommunicator& w) {
    CudaBackend::init_rank(0);
    f(comms[std::size_t(w.rank())]);
  });
}

/**
 * Runs `f(world)` on `n` thread ranks, rank r on GPU r, joined to one NCCL communicator (NCCL's single-process,
 * several-GPU mode). A rank that throws destroys its communicator; its peers' next collective fails (after
 * NcclOptions::timeout on a GPU, at once on the emulated runtime).
 */
template <class F>
void run_nccl_threads(int n, F f) {
  const int gpus = visible_gpus();
  require(n <= gpus, "train_gpt --comm nccl: ", n, " ranks take ", n, " GPUs (one each), this machine has ", gpus,
          "; use fewer ranks, or drop --comm nccl to run the ranks as threads sharing GPU 0");
  const ncclUniqueId id = NcclCommunicator::make_unique_id();
  run_threads(n, [&](ThreadsCommunicator& w) {
    CudaBackend::init_rank(w.rank());
    NcclOptions opt;
    opt.name = "world";
    NcclCommunicator world(id, w.rank(), n, w.rank(), opt);
    f(world);
  });
}

/** Runs `f(world)` on `n` thread ranks over NCCL (`--comm nccl`) or the device communicator on GPU 0. */
template <class F>
void run_cuda_threads(const Options& o, int n, F f) {
  if (o.comm == "nccl")
    run_nccl_threads(n, f);
  else
    run_device_threads(n, f);
}

/** Losses and gradient norms of the first `steps` steps, as every rank reports them. */
struct Trajectory {
  std::vector<double> loss, grad_norm;
};

template <backend B, class Comm>
Trajectory record(Comm& world, const Options& o, std::size_t steps) {
  data::CharDataset ds(o.data, o.train.model.seq);
  models::GptTrainConfig cfg = o.train;
  cfg.model.vocab = ds.vocab_size();
  models::GptTrainer<Comm, B> tr(world, cfg, ds);
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
  run_cuda_threads(o, n, [&](auto& world) {
    Trajectory t = record<CudaBackend>(world, o, steps);
    if (world.rank() == 0) cuda = std::move(t);
  });
  std::printf("check-against-host: tp=%zu pp=%zu dp=%zu ep=%zu, %zu steps, %d thread ranks %s\n", o.train.tp,
              o.train.pp, o.train.dp, o.train.ep, steps, n,
              o.comm == "nccl" ? "over NCCL, one GPU each" : "on GPU 0 (device communicator)");
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
  run_cuda_threads(o, int(o.train.world_size()),
                   [&](auto& world) { train<CudaBackend>(world, o, false, exit_signal.get()); });
  return 0;
}

}  // namespace train_gpt
