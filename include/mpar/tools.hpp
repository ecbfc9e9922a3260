#pragma once
/**
 * @file Tool support, kept out of the umbrella header `mpar/mpar.hpp` because a training program
 * rarely needs it and every consumer would pay its compile time: the planner (memory and cost
 * models, topology, the strategy search and mpar-plan's options, `mpar/plan.hpp`), the
 * command-line option parser (`mpar::cli`, `mpar/cli/parser.hpp`) and trace output (Chrome trace JSON
 * and text timelines, `mpar/observe.hpp`; a pipeline timeline's trace and text picture,
 * `mpar/pipeline/timeline_trace.hpp` and `text_timeline.hpp`) and the pipeline simulator (`simulator.hpp`,
 * `summarise_measured.hpp`: predicted and measured steps summarised alike).
 * Include this, or the one piece you use. Checkpoints are `mpar/io.hpp`.
 */
#include "mpar/cli/parser.hpp"
#include "mpar/observe.hpp"
#include "mpar/pipeline/simulator.hpp"
#include "mpar/pipeline/summarise_measured.hpp"
#include "mpar/pipeline/text_timeline.hpp"
#include "mpar/pipeline/timeline_trace.hpp"
#include "mpar/plan.hpp"
