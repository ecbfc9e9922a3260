#pragma once
/**
 * @file Distributed checkpoints with resharding: `save_checkpoint` and `load_checkpoint`; this header
 * gathers the parts, one idea per file under `mpar/io/checkpoint/`.
 *
 * Every rank passes the blocks it holds (parameters, optimizer states: any named fp32 block of a
 * global tensor, described by its global shape and local box). On save, each distinct block is
 * written by exactly one rank (the lowest rank holding it), into that rank's data file; rank 0
 * assembles the manifest. On load, every rank states the blocks it wants, in any layout, and reads
 * only the byte ranges of saved shards that overlap them, verifying chunk checksums on the way.
 *
 * Directory layout (see docs/checkpoints.md):
 * ```
 * DIR/latest                       name of the newest complete checkpoint, replaced atomically
 * DIR/step-00000100/manifest.txt   written last
 * DIR/step-00000100/rank-00003.bin shards written by rank 3, each followed by its chunk CRC table
 * DIR/.partial-step-00000100/      a save in progress; never read
 * ```
 */
#include "mpar/io/checkpoint/agree.hpp"
#include "mpar/io/checkpoint/block_key.hpp"
#include "mpar/io/checkpoint/block_view.hpp"
#include "mpar/io/checkpoint/difference.hpp"
#include "mpar/io/checkpoint/directory.hpp"
#include "mpar/io/checkpoint/load.hpp"
#include "mpar/io/checkpoint/options.hpp"
#include "mpar/io/checkpoint/publish.hpp"
#include "mpar/io/checkpoint/reader.hpp"
#include "mpar/io/checkpoint/save.hpp"
#include "mpar/io/checkpoint/shard_file_writer.hpp"
#include "mpar/io/checkpoint/shard_reader.hpp"
