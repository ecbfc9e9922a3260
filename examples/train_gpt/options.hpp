#pragma once
// train_gpt's options and the entry points main.cpp calls. main.cpp includes only this and the option
// parser: the training loop (train.hpp) is compiled in train_host.cpp and train_cuda.cu, so the file that
// parses the command line compiles in a few seconds (docs/performance.md, "Compile cost").
#include <algorithm>
#include <csignal>
#include <cstddef>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include <mpar/data/char_dataset.hpp>
#include <mpar/models/gpt_trainer.hpp>

namespace train_gpt {

using namespace mpar;

struct Options {
  models::GptTrainConfig train;
  std::string data = data::default_text_path;
  std::size_t vocab = 0;  ///< token files: the tokenizer's vocabulary (0: GPT-2's 50257)
  std::string val_data;   ///< validation data (empty: other batches of --data)
  std::size_t val_every = 0, val_batches = 4;
  double val_split = 0;     ///< hold out this last fraction of --data for validation
  std::string export_path;  ///< safetensors file written at the end
  std::string init_from;    ///< safetensors weights the run starts from (its own export, or a Hugging Face model)
  bool hf_gpt2 = false;     ///< --export and --init-from under GPT-2's names
  bool hf_llama = false;    ///< --export and --init-from under LlamaForCausalLM's names (with a config.json)
  std::string metrics, trace, save, resume;
  std::size_t trace_step = 1, save_every = 0, sample = 200, log_every = 10;
  std::size_t keep_last = 0;        ///< checkpoints kept in --save, the newest (0: every one)
  std::size_t max_data_mib = 1024;  ///< --data larger than this is refused (it is read whole into memory)
  std::size_t bucket_kib = 1024;
  long long warmup = -1;
  double mem_limit_gib = 0;
  double sample_progress_s = 10;  ///< seconds between progress lines of a long --sample (0: every character)
  bool quiet = false;
  std::string backend = "host";     ///< host, or cuda (a build with the CUDA backend)
  bool check_against_host = false;  ///< run --check-steps steps on the CUDA backend and on the host, compare
  bool check_layout = false;        ///< run --check-steps steps in the layout and on one rank, compare
  std::size_t check_steps = 5;
  /** auto: NCCL for --backend cuda under mpirun, else the host transport (threads, or MPI under mpirun); nccl; mpi. */
  std::string comm = "auto";
  /** The signal that stops the run after the current step, with a checkpoint in --save (0: none; docs/train_gpt.md). */
  int exit_signal = SIGTERM;
  std::vector<std::string> command;  ///< the command line as given, for the resume hint of a stopped run
  std::string plan;                  ///< --plan FILE: the layout mpar-plan --write-plan chose
  std::size_t plan_vocab = 0;        ///< the vocabulary that plan was made for, checked against the data's
};

/** True when the program was started by mpirun (every process is then one rank). */
inline bool under_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
}

/** Ranks this process runs: all of them as threads, one under mpirun. */
inline std::size_t local_ranks(const Options& o) {
  if (!under_mpirun()) return o.train.world_size();
  if (const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE"))
    return std::max<std::size_t>(1, std::size_t(std::atoll(v)));
  return 1;
}

/** At most this many thread ranks in one process: beyond it threads only thrash the machine. */
inline std::size_t max_thread_ranks() {
  return std::max<std::size_t>(64, 16 * std::max(1u, std::thread::hardware_concurrency()));
}

/**
 * The mesh against the model (heads over tp, layers over stages, the schedule) before any data is read: throws
 * config_error naming what to change (train_host.cpp).
 */
void check_mesh(const models::GptTrainConfig& t);

/**
 * Runs the configuration on the host backend (train_host.cpp): one process per rank under mpirun (MPI), else
 * every rank a thread of this process, after the data and the whole configuration are checked. Returns the
 * exit status.
 */
int run_host(const Options& o, int* argc, char*** argv);

/**
 * --check-layout (train_host.cpp): trains --check-steps steps in the configured layout on thread ranks and on one rank
 * from the same seeds and data, prints every step's losses and the largest parameter difference against the
 * precision's tolerance (`models::check_layout`). Returns 0 when they agree, 1 when not.
 */
int run_layout_check(const Options& o);

/** The line main prints for a failure: one "train_gpt: " in front, a rank's "rank N: " kept (train_host.cpp). */
std::string error_line(const std::exception& e);

#if defined(MPAR_HAVE_CUDA)
/** The CUDA part (train_cuda.cu): trains with CudaBackend, or with --check-against-host compares it to the host. */
int run_cuda(const Options& o, int* argc, char*** argv);
#endif

}  // namespace train_gpt
