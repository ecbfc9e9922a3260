#pragma once
/**
 * @file Tool support, kept out of the umbrella header `mpar/mpar.hpp` because a training program
 * rarely needs it and every consumer would pay its compile time: the planner (memory and cost
 * models, topology, the strategy search and mpar-plan's options, `mpar/plan.hpp`), the
 * command-line option parser (`mpar::cli`, `mpar/cli/parser.hpp`) and trace output (Chrome trace JSON
 * and text timelines, `mpar/observe.hpp`; a pipeline timeline's trace and text picture,
 * `mpar/pipeline/timeline_trace.hpp` and `timeline_lanes_text.hpp`) and the pipeline simulator (`simulator.hpp`).
 * Include this, or the one piece you use. Checkpoints are `mpar/io.hpp`. A measured pipeline step summarised
 * like a simulated one is `mpar/pipeline/summarise_measured.hpp`, not included here: it needs the executor
 * (the umbrella header), which the planner does not.
 */
#include "mpar/cli/parser.hpp"
#include "mpar/observe.hpp"
#include "mpar/pipeline/simulator.hpp"
#include "mpar/pipeline/timeline_lanes_text.hpp"
#include "mpar/pipeline/timeline_trace.hpp"
#include "mpar/plan.hpp"
