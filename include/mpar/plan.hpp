#pragma once
/**
 * @file The planner: memory model, cost model, topology, and the strategy search that picks tensor,
 * pipeline and data parallel sizes, micro-batching, schedule and recomputation for a model and cluster.
 */
#include "mpar/plan/calibration.hpp"
#include "mpar/plan/cli.hpp"
#include "mpar/plan/collective_cost.hpp"
#include "mpar/plan/cost_model.hpp"
#include "mpar/plan/memory_model.hpp"
#include "mpar/plan/model.hpp"
#include "mpar/plan/parallel_config.hpp"
#include "mpar/plan/pipeline_timing.hpp"
#include "mpar/plan/search.hpp"
#include "mpar/plan/stage_partition.hpp"
#include "mpar/plan/topology.hpp"
#include "mpar/plan/training_plan.hpp"
