#pragma once
/**
 * @file The umbrella header: everything in mpar that a training program needs and that does not need
 * CUDA. CUDA parts live behind `mpar/cuda.hpp` and the MPAR_ENABLE_CUDA option; the planner and the
 * command-line option parser behind `mpar/tools.hpp` (their compile time is not every consumer's).
 */
#include "mpar/version.hpp"
#include "mpar/core.hpp"
#include "mpar/backend/host/host_backend.hpp"
#include "mpar/comm.hpp"
#include "mpar/nn.hpp"
#include "mpar/optim.hpp"
#include "mpar/parallel.hpp"
#include "mpar/pipeline.hpp"
#include "mpar/observe.hpp"
#include "mpar/io.hpp"
