#pragma once
/**
 * @file Checkpoints: save and load with resharding (io/checkpoint.hpp), the manifest format
 * (io/manifest.hpp), the lock one saving job holds on its directory (io/lock.hpp), blocks from parameters and optimizer states (io/blocks.hpp),
 * (a distributed optimizer's training checkpoint in one call is io/training_checkpoint.hpp: include it, it brings
 * the optimizer);
 * the signal that stops a job at a step boundary to save before a scheduler kills it (io/exit_signal.hpp).
 * See docs/checkpoints.md. The command-line option parser (cli/parser.hpp) is in `mpar/tools.hpp`.
 */
#include "mpar/io/blocks.hpp"
#include "mpar/io/box.hpp"
#include "mpar/io/checkpoint.hpp"
#include "mpar/io/crc32.hpp"
#include "mpar/io/exit_signal.hpp"
#include "mpar/io/file.hpp"
#include "mpar/io/io_error.hpp"
#include "mpar/io/lock.hpp"
#include "mpar/io/manifest.hpp"
