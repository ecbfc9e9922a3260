#pragma once
/**
 * @file The CUDA umbrella: the CUDA backend, its kernels, the NCCL communicator and the
 * several-ranks-on-one-GPU device communicator. Not included by mpar/mpar.hpp.
 *
 * Include from a translation unit compiled by nvcc (the kernels are templates in headers) that links
 * mpar::cuda; see docs/cuda.md.
 */
#include "mpar/mpar.hpp"
#include "mpar/backend/cuda/error.hpp"
#include "mpar/backend/cuda/types.hpp"
#include "mpar/backend/cuda/memory.hpp"
#include "mpar/backend/cuda/device_resource.hpp"
#include "mpar/backend/cuda/managed_resource.hpp"  // tests and user code only: not in the training path
#include "mpar/backend/cuda/context.hpp"
#include "mpar/backend/cuda/device_tensor.hpp"
#include "mpar/backend/cuda/gemm.hpp"
#include "mpar/backend/cuda/kernels.hpp"
#include "mpar/backend/cuda/classifier.hpp"
#include "mpar/backend/cuda/residual_layernorm.hpp"
#include "mpar/backend/cuda/moe_routing.hpp"
#include "mpar/backend/cuda/flash_attention.hpp"
#include "mpar/backend/cuda/sdpa.hpp"
#include "mpar/backend/cuda/graph.hpp"
#include "mpar/backend/cuda/cuda_backend.hpp"
#include "mpar/backend/cuda/device_communicator.hpp"
#include "mpar/comm/nccl.hpp"
