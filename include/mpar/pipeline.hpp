#pragma once
/** @file Pipeline parallelism: partitions, schedules, the verifier, the simulator and the executor. */
#include "mpar/pipeline/action.hpp"
#include "mpar/pipeline/executor.hpp"
#include "mpar/pipeline/partition.hpp"
#include "mpar/pipeline/pipeline_part.hpp"
#include "mpar/pipeline/run_threads.hpp"
#include "mpar/pipeline/schedules.hpp"
#include "mpar/pipeline/simulator.hpp"
#include "mpar/pipeline/static_schedule.hpp"
#include "mpar/pipeline/timeline.hpp"
#include "mpar/pipeline/verifier.hpp"
