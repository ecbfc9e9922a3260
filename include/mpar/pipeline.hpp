#pragma once
/**
 * @file Pipeline parallelism: partitions, schedules, the verifier and the executor. The simulator
 * (`mpar/pipeline/simulator.hpp`: predicted timelines, `idle_slots`) and `summarise_measured`
 * (`mpar/pipeline/summarise_measured.hpp`) are tools, included where used (the simulator also by
 * `mpar/tools.hpp`): a training program does not compile them.
 */
#include "mpar/pipeline/action.hpp"
#include "mpar/pipeline/executor.hpp"
#include "mpar/pipeline/mean_squared_error.hpp"
#include "mpar/pipeline/partition.hpp"
#include "mpar/pipeline/pipeline_part.hpp"
#include "mpar/pipeline/run_pipeline_threads.hpp"
#include "mpar/pipeline/schedules.hpp"
#include "mpar/pipeline/static_schedule.hpp"
#include "mpar/pipeline/timeline.hpp"
#include "mpar/pipeline/verifier.hpp"
