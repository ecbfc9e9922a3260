#pragma once
/**
 * @file How a checkpoint is saved and loaded (`SaveOptions`, `LoadOptions`) and what a save or load did on a rank
 * (`SaveResult`, `LoadStats`, `LoadResult`).
 * Part of `mpar/io/checkpoint.hpp` (docs/checkpoints.md).
 */
#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "mpar/io/file.hpp"
#include "mpar/io/manifest.hpp"

namespace mpar::io {

/** @brief How a checkpoint is saved. */
struct SaveOptions {
  MeshShape mesh;                   ///< recorded as the layout it was saved with
  std::size_t chunk_elems = 16384;  ///< elements per checksummed chunk (64 KiB): the read granularity
  std::size_t write_chunk_bytes = std::size_t(1) << 20;
  std::size_t keep_last = 0;  ///< 0 keeps every checkpoint; n > 0 removes all but the newest n
  IoHook hook;                ///< sees every disk-changing operation (tests inject crashes here)
};

/** @brief What a save did on this rank. */
struct SaveResult {
  std::filesystem::path path;         ///< the checkpoint directory
  std::size_t blocks_written = 0;     ///< blocks this rank wrote
  std::size_t blocks_replicated = 0;  ///< blocks skipped because a lower rank holds the same block
  std::size_t bytes_written = 0;      ///< data and tables this rank wrote
};

/** @brief How a checkpoint is loaded. */
struct LoadOptions {
  /** Read every overlapping shard whole and check its CRC-32 too (more I/O; chunks are always checked). */
  bool verify_whole_shards = false;
};

/** @brief I/O a load did on this rank: the test of "no rank reads the whole model". */
struct LoadStats {
  std::size_t bytes_needed = 0;  ///< 4 x the elements of the requested blocks
  std::size_t bytes_read = 0;    ///< data and checksum bytes read from shard files
  std::size_t reads = 0;         ///< positioned reads issued
  std::size_t files_opened = 0;
};

/** @brief A loaded checkpoint's training state and where it came from. */
struct LoadResult {
  TrainingState state;
  std::filesystem::path path;
  MeshShape saved_mesh;
  LoadStats stats;
  std::vector<std::string> warnings;  ///< what a caller of the load chose to skip (e.g. another optimizer's states)
};

}  // namespace mpar::io
