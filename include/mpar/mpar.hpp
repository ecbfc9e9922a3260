#pragma once
/**
 * @file The umbrella header: what every training program needs and that does not need CUDA — the core
 * vocabulary, the host backend, the communicators, the layers, the optimizers, data parallelism and
 * ZeRO, the pipeline (schedules, verifier, executor). Everything else has its own umbrella,
 * so that its compile time is paid only by the programs that use it (docs/concepts.md, "Which header
 * holds what"):
 * - `mpar/io.hpp`: checkpoints (writer, publish protocol, readers, manifest, lock); the GPT trainer
 *   includes the parts it uses;
 * - `mpar/tools.hpp`: the planner, the command-line option parser, Chrome traces (`mpar/observe.hpp`,
 *   `mpar/pipeline/timeline_trace.hpp`), the pipeline simulator (`mpar/pipeline/simulator.hpp`) and a
 *   timeline's text picture (`mpar/pipeline/timeline_lanes_text.hpp`); a measured step summarised like a simulated
 *   one is `mpar/pipeline/summarise_measured.hpp`;
 * - `mpar/cuda.hpp` (with MPAR_ENABLE_CUDA): the CUDA backend and NCCL.
 * A budget keeps this header's cost near the standard library's (bench/compile_cost).
 */
#include "mpar/backend/host/host_backend.hpp"
#include "mpar/comm.hpp"
#include "mpar/core.hpp"
#include "mpar/nn.hpp"
#include "mpar/optim.hpp"
#include "mpar/parallel.hpp"
#include "mpar/pipeline.hpp"
#include "mpar/version.hpp"
