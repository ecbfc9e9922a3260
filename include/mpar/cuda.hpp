#pragma once
/**
 * @file The CUDA umbrella: the CUDA backend, its kernels, the NCCL communicator and the
 * several-ranks-on-one-GPU device communicator. Not included by mpar/mpar.hpp.
 *
 * Include from a translation unit compiled by nvcc (the kernels are templates in headers) that links
 * mpar::cuda; see docs/cuda.md.
 */
#include "mpar/backend/gpu/classifier.hpp"
#include "mpar/backend/gpu/context.hpp"
#include "mpar/backend/gpu/cuda_backend.hpp"
#include "mpar/backend/gpu/cuda_error.hpp"
#include "mpar/backend/gpu/device_resource.hpp"
#include "mpar/backend/gpu/device_tensor.hpp"
#include "mpar/backend/gpu/element_types.hpp"
#include "mpar/backend/gpu/flash_attention.hpp"
#include "mpar/backend/gpu/gemm.hpp"
#include "mpar/backend/gpu/graph.hpp"
#include "mpar/backend/gpu/kernels.hpp"
#include "mpar/backend/gpu/memory.hpp"
#include "mpar/backend/gpu/moe_routing.hpp"
#include "mpar/backend/gpu/residual_layernorm.hpp"
#include "mpar/backend/gpu/sdpa.hpp"
#include "mpar/comm/nccl/device_communicator.hpp"
#include "mpar/comm/nccl/nccl_communicator.hpp"
// Not emulated: managed memory (never used in training; the emulation hands out only memory the host cannot touch).
#if !defined(MPAR_CUDA_EMULATION)
#include "mpar/backend/gpu/managed_resource.hpp"  // tests and user code only: not in the training path
#endif
#include "mpar/mpar.hpp"
