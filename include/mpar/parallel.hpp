#pragma once
/**
 * @file Data parallelism with overlapped gradient buckets, ZeRO-1, mixed-precision helpers, mixture of experts,
 * and the optimizer side of a training step composed of them (`DistributedOptimizer`).
 */
#include "mpar/parallel/buckets.hpp"
#include "mpar/parallel/data_parallel.hpp"
#include "mpar/parallel/distributed_optimizer.hpp"
#include "mpar/parallel/gradient_arena.hpp"
#include "mpar/parallel/mixed_precision.hpp"
#include "mpar/parallel/moe.hpp"
#include "mpar/parallel/parameter_arena.hpp"
#include "mpar/parallel/zero.hpp"
