#pragma once
/**
 * @file `load_checkpoint`: every rank reads, in any layout, only the byte ranges of saved shards that overlap the blocks
 * it asks for; every rank throws if any rank fails.
 * Part of `mpar/io/checkpoint.hpp` (docs/checkpoints.md).
 */
#include <filesystem>
#include <span>

#include "mpar/comm/communicator.hpp"
#include "mpar/io/checkpoint/agree.hpp"
#include "mpar/io/checkpoint/block_view.hpp"
#include "mpar/io/checkpoint/options.hpp"
#include "mpar/io/checkpoint/reader.hpp"

namespace mpar::io {

namespace detail {
/** Fills `blocks` from the checkpoint `path` designates; rank-local, no communication. */
inline LoadResult load_local(const std::filesystem::path& path, std::span<const LoadBlock> blocks,
                             const LoadOptions& opts) {
  CheckpointReader reader(path, opts);
  reader.read(blocks);
  return LoadResult{reader.manifest().state, reader.path(), reader.manifest().mesh, reader.stats(), {}};
}

}  // namespace detail

/**
 * @brief Loads `blocks` (any layout: each says its global shape and box) from the checkpoint `path`
 * designates (a checkpoint directory, or a root with `latest`), reading only the overlapping byte
 * ranges. Returns the training state. Every rank throws if any rank fails.
 */
template <mpar::detail::collective_communicator C>
LoadResult load_checkpoint(const std::filesystem::path& path, std::span<const LoadBlock> blocks, C& comm,
                           const LoadOptions& opts = {}) {
  LoadResult res;
  detail::agree(comm, detail::capture([&] { res = detail::load_local(path, blocks, opts); }), "load_checkpoint");
  return res;
}
/** @brief Rank-local load: no communication. */
inline LoadResult load_checkpoint(const std::filesystem::path& path, std::span<const LoadBlock> blocks,
                                  const LoadOptions& opts = {}) {
  return detail::load_local(path, blocks, opts);
}

}  // namespace mpar::io
