#pragma once
/**
 * @file `CheckpointReader`: an open checkpoint — its validated manifest, and rank-local reads of any blocks from it.
 * Part of `mpar/io/checkpoint.hpp` (docs/checkpoints.md).
 */
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "mpar/io/box.hpp"
#include "mpar/io/checkpoint/agree.hpp"
#include "mpar/io/checkpoint/block_view.hpp"
#include "mpar/io/checkpoint/directory.hpp"
#include "mpar/io/checkpoint/options.hpp"
#include "mpar/io/checkpoint/shard_reader.hpp"
#include "mpar/io/manifest.hpp"

namespace mpar::io {

/**
 * @brief An open checkpoint: its validated manifest, and reads of any blocks from it (rank-local).
 * Files are opened on first use and kept open; `stats()` counts the I/O.
 */
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::filesystem::path& path, LoadOptions opts = {})
      : path_(resolve_checkpoint(path)), opts_(opts), reader_(path_, stats_) {
    const auto file = path_ / manifest_file_name;
    manifest_ = parse_manifest(read_small_file(file), file.string());
  }

  [[nodiscard]] const Manifest& manifest() const { return manifest_; }
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  [[nodiscard]] LoadStats stats() {
    reader_.add_io_to_stats();
    return stats_;
  }

  /** Fills every block; checks the whole request against the manifest before reading anything. */
  void read(std::span<const LoadBlock> blocks) {
    const auto manifest_path = (path_ / manifest_file_name).string();
    for (const auto& b : blocks) {
      detail::check_block(b, "load_checkpoint");
      if (b.data.empty()) continue;  // nothing to fill (a rank with an empty block of a tensor)
      const TensorRecord* t = manifest_.find(b.name);
      detail::check(t != nullptr, "checkpoint ", manifest_path, " has no tensor '", b.name,
                    "': it was saved from a different model (or the parameter was renamed)");
      detail::check(t->shape == b.global_shape, "checkpoint ", manifest_path, ": tensor '", b.name, "' has shape ",
                    shape_string(t->shape), " but the model expects ", shape_string(b.global_shape),
                    ": it was saved from a different model");
    }
    for (const auto& b : blocks) {
      if (b.data.empty()) continue;
      stats_.bytes_needed += b.data.size_bytes();
      const TensorRecord* t = manifest_.find(b.name);
      for (const auto& s : t->shards)
        if (auto inter = intersect(s.box, b.box)) reader_.read(*t, s, b, *inter, opts_.verify_whole_shards);
    }
  }

  /**
   * The whole tensor `name`, row-major, however many shards it was saved in: what compares two checkpoints of
   * different layouts (a run against the single rank). Throws naming the tensor when the checkpoint lacks it.
   */
  [[nodiscard]] std::vector<float> read_whole(const std::string& name) {
    const TensorRecord* t = manifest_.find(name);
    detail::check(t != nullptr, "checkpoint ", (path_ / manifest_file_name).string(), " has no tensor '", name, "'");
    std::vector<float> values(volume(t->shape));
    const LoadBlock whole{t->name, t->shape, full_box(t->shape), t->layout, std::span<float>(values)};
    read(std::span<const LoadBlock>(&whole, 1));
    return values;
  }

 private:
  std::filesystem::path path_;
  LoadOptions opts_;
  LoadStats stats_;
  detail::ShardReader reader_;
  Manifest manifest_;
};

}  // namespace mpar::io
