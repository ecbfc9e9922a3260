#pragma once
/**
 * @file `save_checkpoint`: each distinct block written once (by the lowest rank holding it) into that rank's data
 * file, rank 0 assembling the manifest, then published (checkpoint/publish.hpp).
 * Part of `mpar/io/checkpoint.hpp` (docs/checkpoints.md).
 */
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mpar/comm/communicator.hpp"
#include "mpar/core/memory_resource.hpp"
#include "mpar/io/checkpoint/agree.hpp"
#include "mpar/io/checkpoint/block_key.hpp"
#include "mpar/io/checkpoint/block_view.hpp"
#include "mpar/io/checkpoint/directory.hpp"
#include "mpar/io/checkpoint/gather_keys.hpp"
#include "mpar/io/checkpoint/options.hpp"
#include "mpar/io/checkpoint/publish.hpp"
#include "mpar/io/checkpoint/shard_file_writer.hpp"
#include "mpar/io/lock.hpp"
#include "mpar/io/manifest.hpp"

namespace mpar::io {

namespace detail {

/** A rank-local communicator of one rank, so that the single-process overloads share the code path. */
struct SoloGroup {
  [[nodiscard]] int rank() const { return 0; }
  [[nodiscard]] int size() const { return 1; }
  [[nodiscard]] std::string name() const { return "self"; }
  template <class T>
  void all_gather(std::span<const T> s, std::span<T> r) {
    std::copy(s.begin(), s.end(), r.begin());
  }
  template <class T>
  void broadcast(std::span<T>, int) {}
};

template <class C>
SaveResult save_impl(const std::filesystem::path& root, std::span<const SaveBlock> blocks, const TrainingState& state,
                     C& comm, const SaveOptions& opts) {
  const int rank = comm.rank(), p = comm.size();
  const auto staging = root / ("." + std::string("partial-") + step_dir_name(state.step));
  SaveResult result;
  // Rank 0 holds the directory's lock until the checkpoint is published (unless this process holds it
  // already): another job saving into the same directory is refused instead of mixing two checkpoints.
  std::optional<DirectoryLock> lock;

  // Phase 1: rank 0 prepares an empty staging directory (a crashed earlier attempt may have left one).
  agree(comm, capture([&] {
          for (const auto& b : blocks) check_block(b, "save_checkpoint");
          if (rank == 0) {
            if (!DirectoryLock::held_here(root)) lock.emplace(root);
            std::filesystem::create_directories(root);
            remove_all_path(staging, opts.hook);
            std::filesystem::create_directory(staging);
          }
        }),
        "save_checkpoint (preparing " + staging.string() + ")");

  // Phase 2: find replicas. Every rank publishes the identity keys of its blocks (std::uint64_t, exact); the
  // lowest rank holding a key writes it.
  std::vector<std::uint64_t> keys;
  for (const auto& b : blocks) keys.push_back(block_key(b.name, b.global_shape, b.box));
  const auto others = all_gather_keys(comm, std::span<const std::uint64_t>(keys));
  std::vector<bool> writes(blocks.size(), true);
  for (std::size_t i = 0; i < blocks.size(); ++i)
    for (int r = 0; r < rank && writes[i]; ++r)
      writes[i] = std::find(others[std::size_t(r)].begin(), others[std::size_t(r)].end(), keys[i]) ==
                  others[std::size_t(r)].end();

  // Phase 3: every rank writes its data file and its part of the manifest (an index).
  agree(comm, capture([&] {
          Manifest index;
          std::map<std::string, std::size_t> where;
          std::optional<ShardFileWriter> data;
          for (std::size_t i = 0; i < blocks.size(); ++i) {
            const auto& b = blocks[i];
            if (b.data.empty()) continue;  // an empty block (more ranks than rows) holds nothing to save
            if (!writes[i]) {
              ++result.blocks_replicated;
              continue;
            }
            if (!data) data.emplace(staging, rank_file_name(rank, "bin"), opts);
            auto [it, fresh] = where.try_emplace(b.name, index.tensors.size());
            if (fresh) index.tensors.push_back(TensorRecord{b.name, "f32", b.global_shape, b.layout, {}});
            auto& t = index.tensors[it->second];
            check(t.shape == b.global_shape, "save_checkpoint: tensor '", b.name, "' is given twice on rank ", rank,
                  " with shapes ", shape_string(t.shape), " and ", shape_string(b.global_shape));
            t.shards.push_back(data->append(b.box, b.data));
            ++result.blocks_written;
          }
          if (data) {
            result.bytes_written = data->size();
            data->finish();
          }
          write_file_durably(staging / rank_file_name(rank, "idx"), format_manifest(index), opts.hook);
        }),
        "save_checkpoint (writing shards)");

  // Phase 4: rank 0 merges the indexes into the manifest and publishes the checkpoint.
  Buffer<std::uint64_t> suffix{0};
  agree(comm, capture([&] {
          if (rank != 0) return;
          Manifest m;
          m.mesh = opts.mesh;
          m.state = state;
          std::map<std::string, std::size_t> where;
          for (int r = 0; r < p; ++r) {
            const auto file = staging / rank_file_name(r, "idx");
            const auto part = parse_manifest(read_small_file(file), file.string(), false);
            for (const auto& t : part.tensors) {
              auto [it, fresh] = where.try_emplace(t.name, m.tensors.size());
              if (fresh) {
                m.tensors.push_back(t);
                continue;
              }
              auto& have = m.tensors[it->second];
              check(have.shape == t.shape, "save_checkpoint: tensor '", t.name, "' has global shape ",
                    shape_string(have.shape), " on one rank and ", shape_string(t.shape), " on rank ", r);
              have.shards.insert(have.shards.end(), t.shards.begin(), t.shards.end());
            }
          }
          // Validate before publishing: every tensor must be tiled exactly by its shards.
          const std::string text = format_manifest(m);
          (void)parse_manifest(text, (staging / manifest_file_name).string());
          for (int r = 0; r < p; ++r) remove_all_path(staging / rank_file_name(r, "idx"), opts.hook);
          result.path = publish_checkpoint(root, staging, m, opts);
        }),
        "save_checkpoint (publishing the manifest)");
  // Everyone learns the final directory name (it differs from step-N only when re-saving the same step).
  if (rank == 0) {
    const std::string n = result.path.filename().string(), base = step_dir_name(state.step);
    suffix[0] = n.size() > base.size() ? std::stoull(n.substr(base.size() + 1)) : 0;
  }
  comm.broadcast(std::span<std::uint64_t>(suffix), 0);
  if (rank != 0)
    result.path = root / (step_dir_name(state.step) + (suffix[0] > 0 ? "." + std::to_string(suffix[0]) : ""));
  return result;
}

}  // namespace detail

/**
 * @brief Saves a checkpoint of step `state.step` under `root` (collective over `comm`).
 *
 * `blocks` are this rank's blocks; ranks holding the same block (same name, shape and box: data
 * replicas, tensor-replicated parameters) write it once, from the lowest rank. Publishes
 * `root/step-<step>` and then points `root/latest` at it; a failure or crash at any point leaves
 * the previous checkpoint as `latest`. Every rank throws if any rank fails.
 */
template <mpar::detail::collective_communicator C>
SaveResult save_checkpoint(const std::filesystem::path& root, std::span<const SaveBlock> blocks,
                           const TrainingState& state, C& comm, const SaveOptions& opts = {}) {
  return detail::save_impl(root, blocks, state, comm, opts);
}
/** @brief Single-process save: this process holds (at least one copy of) every block. */
inline SaveResult save_checkpoint(const std::filesystem::path& root, std::span<const SaveBlock> blocks,
                                  const TrainingState& state, const SaveOptions& opts = {}) {
  detail::SoloGroup solo;
  return detail::save_impl(root, blocks, state, solo, opts);
}

}  // namespace mpar::io
