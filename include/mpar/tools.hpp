#pragma once
/**
 * @file Tool support, kept out of the umbrella header `mpar/mpar.hpp` because a training program
 * rarely needs it and every consumer would pay its compile time: the planner (memory and cost
 * models, topology, the strategy search and mpar-plan's options, `mpar/plan.hpp`), the
 * command-line option parser (`mpar::cli`, `mpar/cli/parser.hpp`) and trace output (Chrome trace JSON
 * and text timelines, `mpar/observe.hpp`; a pipeline timeline's trace, `mpar/pipeline/timeline_trace.hpp`).
 * Include this, or the one piece you use. Checkpoints are `mpar/io.hpp`.
 */
#include "mpar/cli/parser.hpp"
#include "mpar/observe.hpp"
#include "mpar/pipeline/timeline_trace.hpp"
#include "mpar/plan.hpp"
