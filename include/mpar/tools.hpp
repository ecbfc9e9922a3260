#pragma once
/**
 * @file Tool support, kept out of the umbrella header `mpar/mpar.hpp` because a training program
 * rarely needs it and every consumer would pay its compile time: the planner (memory and cost
 * models, topology, the strategy search and mpar-plan's options, `mpar/plan.hpp`) and the
 * command-line option parser (`mpar::cli`, `mpar/io/cli.hpp`). Include this, or the one piece you use.
 */
#include "mpar/io/cli.hpp"
#include "mpar/plan.hpp"
