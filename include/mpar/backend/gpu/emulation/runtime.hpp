#pragma once
/**
 * @file The emulated CUDA runtime (MPAR_CUDA_EMULATION, a test build compiled by g++): include through
 * backend/gpu/runtime.hpp, never directly. docs/cuda.md ("The emulated runtime") says what it proves and what
 * only a GPU can.
 */
#include "mpar/backend/gpu/emulation/atomics.hpp"
#include "mpar/backend/gpu/emulation/cub.hpp"
#include "mpar/backend/gpu/emulation/cublas.hpp"
#include "mpar/backend/gpu/emulation/cudnn.hpp"
#include "mpar/backend/gpu/emulation/error.hpp"
#include "mpar/backend/gpu/emulation/fp16.hpp"
#include "mpar/backend/gpu/emulation/graphs.hpp"
#include "mpar/backend/gpu/emulation/launch.hpp"
#include "mpar/backend/gpu/emulation/math.hpp"
#include "mpar/backend/gpu/emulation/memory.hpp"
#include "mpar/backend/gpu/emulation/nccl.hpp"
#include "mpar/backend/gpu/emulation/qualifiers.hpp"
#include "mpar/backend/gpu/emulation/simt.hpp"
#include "mpar/backend/gpu/emulation/streams.hpp"
#include "mpar/backend/gpu/emulation/thread_builtins.hpp"
#include "mpar/backend/gpu/emulation/types.hpp"
#include "mpar/backend/gpu/emulation/warp.hpp"
